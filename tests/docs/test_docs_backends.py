"""docs/backends.md, docs/guarantees.md, docs/transactions.md, docs/outbox.md and README.md: every code block there
is code that runs.

Each ```python block of these pages is one of:

- an excerpt of this file, copied verbatim: a test below (pytest runs it like any other);
- a complete program, run here as a subprocess that must exit 0 (and, when the page shows its
  output in a ```text block right after it, print exactly that). Programs that read
  `DATABASE_URL` get a throwaway PostgreSQL database, migrated with the page's own
  `nursery-jobs migrate` command;
- one of the programs the pages run with arguments (`service.py`, `crash.py`) or with several
  backend URLs (`index.py`): a dedicated test runs the commands the page shows.

The messages the pages quote (the migrate command's output, the start-up errors, the import-order
warning) are produced here and compared with the pages' text.

PostgreSQL follows tests/pgutil.py: off CI an unreachable server skips those tests with a reason;
under CI=true it fails them. Every wait is bounded; every process started here is killed and
reaped when its test ends.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends.postgres import PostgresBackend
from nursery_jobs.cli import main as cli_main
from tests import pgutil

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = [DOCS / "backends.md", DOCS / "guarantees.md", DOCS / "transactions.md", DOCS / "outbox.md", ROOT / "README.md"]
THIS_FILE = Path(__file__)
NJ_CLI = str(Path(sys.executable).with_name("nursery-jobs"))
BASE_ENV = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "JOBS_URL")}
ENV = {**BASE_ENV, "PYTHONUNBUFFERED": "1"}
RUN_TIMEOUT = 60  # a bound for a loaded 2-core machine, not a speed claim

# Blocks a dedicated test runs, found by a string only they contain.
DEDICATED = {
    "index": 'os.environ.get("JOBS_URL", "memory://")',
    "service": '"""service.py:',
    "crash": '"""crash.py:',
}


# -- the pages' blocks ---------------------------------------------------------------------------

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def page_blocks() -> list[tuple[str, int, str, str | None]]:
    """(page, line, python code, the ```text block right after it or None) for every block."""
    out = []
    for path in PAGES:
        page = str(path.relative_to(ROOT))
        text = path.read_text()
        fences = list(FENCE.finditer(text))
        for i, match in enumerate(fences):
            if match.group(1) != "python":
                continue
            output = None
            if i + 1 < len(fences):
                nxt = fences[i + 1]
                if nxt.group(1) == "text" and not text[match.end() : nxt.start()].strip():
                    output = nxt.group(2)
            out.append((page, text.count("\n", 0, match.start()) + 1, match.group(2), output))
    return out


BLOCKS = page_blocks()


def is_excerpt(code: str) -> bool:
    return code in THIS_FILE.read_text()


def dedicated_block(name: str) -> str:
    found = [code for _, _, code, _ in BLOCKS if DEDICATED[name] in code]
    assert len(found) == 1, f"expected one block containing {DEDICATED[name]!r}, found {len(found)}"
    return found[0]


PROGRAMS = [b for b in BLOCKS if not is_excerpt(b[2]) and not any(m in b[2] for m in DEDICATED.values())]


def test_every_block_is_an_excerpt_a_program_or_dedicated() -> None:
    assert len(BLOCKS) >= 14, [f"{page}:{line}" for page, line, _, _ in BLOCKS]
    for name in DEDICATED:
        dedicated_block(name)
    excerpts = [b for b in BLOCKS if is_excerpt(b[2])]
    # An excerpt must be a whole top-level definition of this file, so a test really runs it.
    for page, line, code, _ in excerpts:
        assert re.match(r"(async )?def \w+\(", code), f"{page}:{line} is an excerpt but not a whole def"
    assert len(excerpts) + len(PROGRAMS) + len(DEDICATED) == len(BLOCKS)


def test_the_index_lists_the_new_pages() -> None:
    index = (DOCS / "index.md").read_text()
    assert "(backends.md)" in index and "(guarantees.md)" in index


# -- running programs ----------------------------------------------------------------------------


def run_program(code: str, cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = cwd / "block.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=cwd,
        env=env or ENV,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )


class Background:
    """A program started in the background, its stdout read with a bound."""

    def __init__(self, script: Path, *args: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            cwd=script.parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.seen = b""

    def read_until(self, pattern: str, timeout: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if re.search(pattern, self.seen.decode(errors="replace"), re.MULTILINE):
                    return self.seen.decode()
                if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    continue
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                self.seen += chunk
        if re.search(pattern, self.seen.decode(errors="replace"), re.MULTILINE):
            return self.seen.decode()
        self.kill()
        pytest.fail(f"no line matching {pattern!r} within {timeout} s:\n{self.describe()}")

    def describe(self) -> str:
        err = b""
        if self.proc.poll() is not None and self.proc.stderr is not None:
            err = self.proc.stderr.read()
        return f"stdout:\n{self.seen.decode(errors='replace')}\nstderr:\n{err.decode(errors='replace')}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def background():
    started: list[Background] = []

    def start(script: Path, *args: str, env: dict[str, str]) -> Background:
        bg = Background(script, *args, env=env)
        started.append(bg)
        return bg

    yield start
    for bg in started:
        bg.kill()
        for stream in (bg.proc.stdout, bg.proc.stderr):
            if stream is not None:
                stream.close()


# -- PostgreSQL: one throwaway database for the pages' programs ---------------------------------


def migrate_cli(url: str, *args: str) -> str:
    """The `nursery-jobs migrate` console script, as the page runs it."""
    result = subprocess.run(
        [NJ_CLI, "migrate", "--database-url", url, *args], capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def migrate_in_process(url: str, *args: str) -> str:
    """The same command's code without a new interpreter (the console script is run above)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["migrate", "--database-url", url, *args]) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def docs_db(pg_url: str):
    """A database of its own, migrated by the pages' command: schema `jobs` (`--schema jobs`, as
    the pages show it) and the default `nursery_jobs` (the programs' DATABASE_URL)."""
    url = pgutil.create_database("_docs")  # tagged and named as the session's: same cleanup
    try:
        outputs = [
            migrate_cli(url, "--schema", "jobs"),
            migrate_in_process(url, "--schema", "jobs"),
            migrate_in_process(url),
        ]
        yield url, outputs
    finally:
        pgutil.drop_database(url)


def test_the_migrate_command_prints_what_the_page_shows(docs_db) -> None:
    _, (first, second, default) = docs_db
    page = (DOCS / "backends.md").read_text()
    assert "nursery-jobs migrate --database-url postgresql://app@db.internal/app --schema jobs" in page
    assert f"```text\n{first}```" in page
    assert first == "schema 'jobs': applied 0001_initial.sql, 0002_claim_due_only.sql, 0003_args_as_text.sql, 0004_plans_that_hold.sql, 0005_less_bloat.sql, 0006_concurrency_keys.sql, 0008_schedules_and_locks.sql, 0009_outbox.sql, 0010_rate_limits.sql, 0011_parked_keys.sql, 0012_parked_counted.sql, 0013_claim_in_one_statement.sql, 0014_rate_parking.sql, 0015_claim_reasons.sql, 0016_lock_keys_planned_once.sql, 0017_unpark_wakes_its_queue.sql, 0018_rate_time_under_the_lock.sql, 0019_lock_fencing_tokens.sql, 0022_drop_claim_held.sql, 0023_cache.sql\n"
    assert f"`{second.strip()}`" in page  # up to date
    assert default == "schema 'nursery_jobs': applied 0001_initial.sql, 0002_claim_due_only.sql, 0003_args_as_text.sql, 0004_plans_that_hold.sql, 0005_less_bloat.sql, 0006_concurrency_keys.sql, 0008_schedules_and_locks.sql, 0009_outbox.sql, 0010_rate_limits.sql, 0011_parked_keys.sql, 0012_parked_counted.sql, 0013_claim_in_one_statement.sql, 0014_rate_parking.sql, 0015_claim_reasons.sql, 0016_lock_keys_planned_once.sql, 0017_unpark_wakes_its_queue.sql, 0018_rate_time_under_the_lock.sql, 0019_lock_fencing_tokens.sql, 0022_drop_claim_held.sql, 0023_cache.sql\n"


@pytest.mark.parametrize("page,line,code,output", PROGRAMS, ids=[f"{p}:{n}" for p, n, _, _ in PROGRAMS])
def test_every_program_on_the_pages_runs(page, line, code, output, tmp_path, request) -> None:
    env = ENV
    if "DATABASE_URL" in code:
        url, _ = request.getfixturevalue("docs_db")
        env = {**ENV, "DATABASE_URL": url}
    result = run_program(code, tmp_path, env=env)
    assert result.returncode == 0, f"{page}:{line} failed:\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    if output is not None:
        assert result.stdout == output, f"{page}:{line} printed:\n{result.stdout}\nthe page shows:\n{output}"
    if page == "README.md":
        assert result.stdout == "completed\n"  # what its comment says it prints


# -- the dedicated programs ----------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["memory", "sqlite", "postgresql"])
def test_the_index_program_runs_on_every_backend(backend, tmp_path, request) -> None:
    code = dedicated_block("index")
    if backend == "postgresql":
        url, _ = request.getfixturevalue("docs_db")
        jobs_url = f"{url}?schema=jobs"  # the schema the page's migrate command made
    else:
        jobs_url = {"memory": "memory://", "sqlite": "sqlite:///jobs.db"}[backend]
    result = run_program(code, tmp_path, env={**ENV, "JOBS_URL": jobs_url})
    assert result.returncode == 0, f"{jobs_url}:\n{result.stdout}\n{result.stderr}"
    if backend == "postgresql":  # the job id depends on what ran before in the schema
        # backend.url names the database in full (no password here to leave out)
        assert re.fullmatch(re.escape(jobs_url) + r": job \d+ completed\n", result.stdout), result.stdout
    else:
        assert result.stdout == f"{jobs_url}: job 1 completed\n"
        assert f"# {result.stdout.strip()}" in (DOCS / "backends.md").read_text()


def test_service_py_runs_as_the_page_says(tmp_path, docs_db, background) -> None:
    url, _ = docs_db
    script = tmp_path / "service.py"
    script.write_text(dedicated_block("service"))
    env = {**ENV, "DATABASE_URL": url}
    worker = background(script, "worker", env=env)
    worker.read_until(r"^worker \d+ ready$", timeout=30)

    web = subprocess.run(
        [sys.executable, str(script), "web"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    assert web.returncode == 0, web.stderr
    assert web.stdout == "doc 1: completed\ndoc 2: completed\ndoc 3: completed\n"

    worker.proc.send_signal(signal.SIGTERM)
    assert worker.proc.wait(timeout=30) == 0, worker.describe()

    usage = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert usage.returncode == 1 and "python service.py worker" in usage.stderr


def test_crash_py_runs_as_the_page_says(tmp_path, background) -> None:
    code = dedicated_block("crash")
    page = (DOCS / "guarantees.md").read_text()
    shown = re.search(r"```text\n\$ python crash\.py work & sleep 2; kill -9 \$!\n(.*?)```", page, re.DOTALL)
    assert shown, "the page shows the demo's commands and output"
    script = tmp_path / "crash.py"
    script.write_text(code)

    work = background(script, "work", env=ENV)
    work.read_until(r"^job 1: attempt 1 starts$", timeout=30)
    work.proc.send_signal(signal.SIGKILL)
    assert work.proc.wait(timeout=10) == -signal.SIGKILL

    rescue = subprocess.run(
        [sys.executable, str(script), "rescue"], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    assert rescue.returncode == 0, rescue.stderr
    stamp = re.compile(r"heartbeating at [\d.]+")
    got = stamp.sub("heartbeating at T", rescue.stdout)
    expected_stdout = "".join(
        line + "\n" for line in shown.group(1).splitlines() if line.startswith("job 1:") and "attempt 1" not in line
    )
    assert got == stamp.sub("heartbeating at T", expected_stdout)
    assert "rescued 1 jobs whose worker stopped heartbeating: [1]" in rescue.stderr


# -- messages the pages quote --------------------------------------------------------------------


async def test_the_startup_errors_are_the_ones_the_page_quotes(pg_url) -> None:
    page = " ".join((DOCS / "backends.md").read_text().split())
    app = nj.App()
    with pytest.raises(nj.ConfigError) as missing:
        async with nj.open_runtime(app, backend=f"{pg_url}?schema=never_migrated_docs"):
            pass
    # the hint carries the URL it was given, ready to copy: the page's own URL in its place
    assert str(missing.value).replace("never_migrated_docs", "jobs").replace(pg_url, "postgresql://app@db.internal/app") in page
    with pytest.raises(nj.BackendUnavailable) as unreachable:
        async with nj.open_runtime(app, backend="postgresql://postgres@127.0.0.1:1/nothing"):
            pass
    message = str(unreachable.value)
    assert message.startswith("cannot connect to PostgreSQL at postgresql://postgres@127.0.0.1:1/nothing?schema=nursery_jobs (")
    assert message.endswith("); check the URL and that the server is running")
    assert "`cannot connect to PostgreSQL at <url> (...); check the URL and that the server is running`" in page


def test_the_import_order_facts_the_page_states() -> None:
    code = (
        "import sys\n"
        "import nursery_jobs\n"
        "assert 'psycopg' not in sys.modules and 'trio_asyncio' not in sys.modules\n"
        "import psycopg, psycopg.waiting, asyncio\n"
        "import nursery_jobs.infra.aio\n"
        "print(psycopg.waiting.get_running_loop is asyncio.get_running_loop)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"
    page = " ".join((DOCS / "backends.md").read_text().split())
    assert "imports may come in any order" in page


# -- excerpts: docs/backends.md ------------------------------------------------------------------


async def test_a_backend_instance_outlives_its_runtime(tmp_path) -> None:
    app = nj.App()

    @app.job()
    async def export(ctx: nj.JobContext, report: int) -> None:
        await trio.sleep(0.01)

    url = f"sqlite:///{tmp_path}/jobs.db"
    backend = nj.open_backend(url)  # an instance: open_runtime leaves it open
    try:
        async with nj.open_runtime(app, backend=backend, queues=[]):  # enqueue only
            job_id = await export.enqueue(report=7)
        # That runtime is gone; the backend is still open and the job still there.
        assert (await backend.get_job(job_id)).state is nj.JobState.AVAILABLE

        async with nj.open_runtime(app, backend=backend) as rt:  # a restart that works the queue
            receipt = await rt.wait(job_id, timeout=5.0)
        assert receipt.state is nj.JobState.COMPLETED
    finally:
        await backend.close()

    # A URL is opened and closed by open_runtime; the file kept the job.
    async with nj.open_runtime(app, backend=url, queues=[]) as rt:
        job = await rt.get_job(job_id)
    assert (job.state, job.attempt) == (nj.JobState.COMPLETED, 1)


async def test_retention_deletes_final_jobs_after_their_keep_period(autojump_clock) -> None:
    defaults = nj.RuntimeSettings()
    assert (defaults.keep_completed, defaults.keep_cancelled, defaults.keep_discarded) == (86400, 86400, 604800)
    assert defaults.retention_interval == 300

    app = nj.App()

    @app.job()
    async def ping(ctx: nj.JobContext) -> None:
        pass

    settings = nj.RuntimeSettings(keep_completed=3600.0)  # completed jobs: one hour
    async with nj.open_runtime(app, settings=settings) as rt:
        job_id = await ping.enqueue()
        assert (await rt.wait(job_id, timeout=5.0)).state is nj.JobState.COMPLETED
        await trio.sleep(3600 + 300)  # keep_completed, then at most one retention_interval
        with pytest.raises(nj.JobNotFound):
            await rt.get_job(job_id)


# -- excerpts: docs/guarantees.md ----------------------------------------------------------------


def test_heartbeat_and_rescue_settings() -> None:
    s = nj.RuntimeSettings()
    assert (s.heartbeat_interval, s.rescue_after, s.rescue_interval) == (5.0, 60.0, 15.0)
    with pytest.raises(nj.ConfigError, match="must be at least 3 x heartbeat_interval"):
        nj.RuntimeSettings(heartbeat_interval=30.0)  # 60 s would be only two heartbeats


async def test_a_graceful_shutdown_gives_the_attempt_back_at_once(tmp_path) -> None:
    app = nj.App()
    attempts = []

    @app.job(timeout=None)
    async def export(ctx: nj.JobContext, report: int) -> None:
        attempts.append(ctx.attempt)
        if len(attempts) == 1:
            await trio.sleep(3600)  # still running when the grace ends

    backend = nj.open_backend(f"sqlite:///{tmp_path}/jobs.db")
    try:
        async with nj.open_runtime(app, backend=backend, grace=0.5) as rt:
            job_id = await export.enqueue(report=7)
            while not attempts:
                await trio.sleep(0.01)
        assert rt.interrupted == [job_id]
        job = await backend.get_job(job_id)
        assert (job.state, job.attempt, job.errors) == (nj.JobState.AVAILABLE, 0, ())

        async with nj.open_runtime(app, backend=backend) as rt:  # the next process, or a restart
            assert (await rt.wait(job_id, timeout=5.0)).state is nj.JobState.COMPLETED
        assert attempts == [1, 1]  # the same attempt number: it was given back
    finally:
        await backend.close()


async def test_cancel_a_pending_job_and_a_running_one(autojump_clock) -> None:
    app = nj.App()
    seen = []

    @app.job(timeout=None)
    async def crawl(ctx: nj.JobContext, site: str) -> None:
        try:
            await trio.sleep(3600)
        finally:
            seen.append((site, ctx.cancel_reason))

    async with nj.open_runtime(app) as rt:
        later = await crawl.options(delay=60).enqueue(site="later")
        running = await crawl.enqueue(site="now")
        await trio.sleep(1)
        assert await rt.cancel(later) is nj.JobState.CANCELLED  # pending: at once
        assert await rt.cancel(running) is nj.JobState.RUNNING  # running: requested...
        assert (await rt.wait(running, timeout=5.0)).state is nj.JobState.CANCELLED  # ...and done
        assert await rt.cancel(running) is nj.JobState.CANCELLED  # final: left alone
        await trio.sleep(120)  # long past the delayed job's run_at
    assert seen == [("now", "cancel")]  # the pending job never started


def backend_for_long_jobs(database_url: str) -> PostgresBackend:
    """An outage longer than 10 s stops the runtime, so the supervisor restarts it and says so."""
    return PostgresBackend(database_url, schema="nursery_jobs", outage_timeout=10.0)


async def test_backend_for_long_jobs_runs_jobs(docs_db) -> None:
    url, _ = docs_db
    app = nj.App()

    @app.job()
    async def ping(ctx: nj.JobContext) -> None:
        pass

    backend = backend_for_long_jobs(url)
    assert backend.outage_timeout == 10.0
    async with nj.open_runtime(app, backend=backend) as rt:
        assert (await rt.wait(await ping.enqueue(), timeout=10.0)).state is nj.JobState.COMPLETED
    await backend.close()


async def test_a_queue_starts_jobs_by_priority_then_due_time_then_id(autojump_clock) -> None:
    app = nj.App()
    app.queue("reports", max_workers=1, timeout=60)
    ran = []

    @app.job(queue="reports")
    async def report(ctx: nj.JobContext, name: str) -> None:
        ran.append(name)

    backend = nj.MemoryBackend()
    async with nj.open_runtime(app, backend=backend, queues=[]):  # enqueue only: nothing runs yet
        await report.enqueue(name="a")
        await report.options(delay=5).enqueue(name="b: due at 5 s")
        await report.enqueue(name="c")
        await report.options(priority=10).enqueue(name="d: priority 10")
        await trio.sleep(10)  # all four are due now
    async with nj.open_runtime(app, backend=backend):  # one worker works the queue
        await trio.sleep(1)
    assert ran == ["d: priority 10", "a", "c", "b: due at 5 s"]
