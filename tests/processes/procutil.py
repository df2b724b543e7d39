"""Helpers for the process-level tests: spawn `worker.py` processes, wait on them with bounds,
read what they executed, and read the jobs table directly.

Every wait here is bounded, and every process a test spawns is killed (SIGKILL) and reaped when
the test ends, whatever happened. Worker output goes to files, never to pipes, so a chatty
worker can never block on a full pipe nobody reads.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import attrs
import psycopg
import pytest

WORKER = str(Path(__file__).with_name("worker.py"))

# A SIGKILLed worker's jobs come back about 2 s after the kill. rescue_after is 10 heartbeats,
# so a live worker on a loaded 2-core CI machine is not mistaken for a dead one.
FAST_RESCUE = ("--heartbeat-interval", "0.2", "--rescue-after", "2", "--rescue-interval", "0.2")


@attrs.frozen
class Store:
    """Where the jobs live: the backend URL for `worker.py`, and how the test reads it directly."""

    url: str
    kind: str  # "postgres" | "sqlite"
    conninfo: str | None = None
    schema: str | None = None
    path: str | None = None

    @classmethod
    def postgres(cls, db_url: str, schema: str) -> Store:
        sep = "&" if "?" in db_url else "?"
        return cls(url=f"{db_url}{sep}schema={schema}", kind="postgres", conninfo=db_url, schema=schema)

    @classmethod
    def sqlite(cls, path: Path) -> Store:
        return cls(url=f"sqlite:///{path}?synchronous=normal", kind="sqlite", path=str(path))


def poll_opts(store: Store) -> tuple[str, ...]:
    """SQLite's wake-ups between processes are hints that a full socket queue may drop: poll
    quickly, so that a test never waits a whole second for a dropped one."""
    return ("--poll-interval", "0.1") if store.kind == "sqlite" else ()


@attrs.frozen
class JobRow:
    id: int
    kind: str
    state: str
    attempt: int
    interrupted: int
    errors: tuple[str, ...]


def fetch_jobs(store: Store) -> dict[int, JobRow]:
    """Every job row, read straight from the database (not through the runtime)."""
    cols = "id, kind, state, attempt, interrupted, errors"
    if store.kind == "postgres":
        assert store.conninfo is not None and store.schema is not None
        with psycopg.connect(store.conninfo, autocommit=True, connect_timeout=5) as conn:
            rows = conn.execute(
                psycopg.sql.SQL("SELECT " + cols + " FROM {}.jobs").format(psycopg.sql.Identifier(store.schema))
            ).fetchall()
        decoded = [(r[0], r[1], r[2], r[3], r[4], r[5] or []) for r in rows]
    else:
        assert store.path is not None
        conn = sqlite3.connect(store.path, timeout=10)
        try:
            rows = conn.execute(f"SELECT {cols} FROM nj_jobs").fetchall()
        finally:
            conn.close()
        decoded = [(r[0], r[1], r[2], r[3], r[4], json.loads(r[5]) if r[5] else []) for r in rows]
    return {
        r[0]: JobRow(r[0], r[1], r[2], r[3], r[4], tuple(str(e.get("message")) for e in r[5])) for r in decoded
    }


@contextlib.contextmanager
def jobs_inserted_under_write_lock(store: Store, count: int, *, kind: str = "record", queue: str = "procs"):
    """Take the jobs table's write lock, insert `count` available jobs in that same transaction,
    and hold both until the block ends; then commit. While the block runs, every claim a worker
    attempts waits for the lock (SQLite: BEGIN IMMEDIATE waits on busy_timeout; PostgreSQL:
    LOCK TABLE ... IN EXCLUSIVE MODE blocks the claim's UPDATE) and then sees the new jobs."""
    now = time.time()
    rows = [(kind, queue, json.dumps({"n": n}), "available", 25, 0, now, now) for n in range(count)]
    cols = "(kind, queue, args, state, max_attempts, priority, run_at, created_at)"
    if store.kind == "postgres":
        assert store.conninfo is not None and store.schema is not None
        table = psycopg.sql.SQL("{}.jobs").format(psycopg.sql.Identifier(store.schema))
        with psycopg.connect(store.conninfo, connect_timeout=5) as conn:  # not autocommit: one transaction
            conn.execute(psycopg.sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(table))
            with conn.cursor() as cur:
                cur.executemany(
                    psycopg.sql.SQL("INSERT INTO {} " + cols + " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)").format(
                        table
                    ),
                    rows,
                )
            yield
            conn.commit()
    else:
        assert store.path is not None
        conn = sqlite3.connect(store.path, timeout=10, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(f"INSERT INTO nj_jobs {cols} VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            yield
            conn.execute("COMMIT")
        finally:
            conn.close()


def running_ids(store: Store, conn: Any = None) -> set[int]:
    """The ids of the `running` rows; one indexed query, on `conn` if given (a psycopg
    connection opened beforehand, so a caller that times the read does not time a connect)."""
    if store.kind == "postgres":
        assert store.conninfo is not None and store.schema is not None
        query = psycopg.sql.SQL("SELECT id FROM {}.jobs WHERE state = 'running'").format(psycopg.sql.Identifier(store.schema))
        if conn is not None:
            return {r[0] for r in conn.execute(query).fetchall()}
        with psycopg.connect(store.conninfo, autocommit=True, connect_timeout=5) as own:
            return {r[0] for r in own.execute(query).fetchall()}
    return {j.id for j in fetch_jobs(store).values() if j.state == "running"}


def state_counts(jobs: Mapping[int, JobRow]) -> dict[str, int]:
    return dict(collections.Counter(j.state for j in jobs.values()))


@attrs.frozen
class Execution:
    ev: str
    id: int
    attempt: int
    pid: int
    n: int
    t: float


def read_executions(log_dir: Path, *, live: bool = False) -> list[Execution]:
    """Every record every worker wrote, in time order. A torn last line (a process killed
    mid-write) fails loudly here, unless `live`: while workers run, a read can land in the
    middle of another process's `os.write` to the same file (a reader of a regular file takes
    no lock against a writer), so the last, unterminated line of a file is left for the next
    read."""
    out = []
    for path in sorted(log_dir.glob("exec-*.jsonl")):
        text = path.read_text()
        if live and not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]
        for line in text.splitlines():
            if line:
                out.append(Execution(**json.loads(line)))
    out.sort(key=lambda e: e.t)
    return out


def starts_by_job(execs: Iterable[Execution]) -> dict[int, list[Execution]]:
    by: dict[int, list[Execution]] = collections.defaultdict(list)
    for e in execs:
        if e.ev == "start":
            by[e.id].append(e)
    return by


def count_records(log_dir: Path, ev: str) -> int:
    """Fast count of one kind of record (for progress polling)."""
    needle = f'"ev": "{ev}"'
    return sum(p.read_text().count(needle) for p in log_dir.glob("exec-*.jsonl"))


def wait_until(predicate: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class Proc:
    """One spawned `worker.py` process, its output in files."""

    def __init__(self, popen: subprocess.Popen[bytes], name: str, out: Path, err: Path) -> None:
        self.popen = popen
        self.name = name
        self.out_path = out
        self.err_path = err
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def describe(self) -> str:
        return (
            f"{self.name} (pid {self.pid}, returncode {self.popen.poll()})\n"
            f"--- stdout (tail) ---\n{self.stdout()[-2000:]}\n--- stderr (tail) ---\n{self.stderr()[-6000:]}"
        )

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while "READY" not in self.stdout():
            if self.popen.poll() is not None:
                pytest.fail(f"{self.name} exited before it was ready:\n{self.describe()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name} not ready after {timeout:g} s:\n{self.describe()}")
            time.sleep(0.02)

    def wait(self, timeout: float) -> int:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} still running after {timeout:g} s:\n{self.describe()}")

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL and reap (bounded)."""
        if self.popen.poll() is None:
            self.popen.kill()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that survives SIGKILL
            pass


class Spawner:
    """Starts worker processes for one test and kills every one of them at the end."""

    def __init__(self, base: Path, app_name: str) -> None:
        self.base = base
        self.app_name = app_name
        self.log_dir = base / "execs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        self._seq = 0

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env["PGAPPNAME"] = self.app_name  # lets a test find (and terminate) exactly these connections
        return env

    def _files(self, name: str) -> tuple[Path, Path]:
        self._seq += 1
        return self.base / f"{self._seq:02d}-{name}.out", self.base / f"{self._seq:02d}-{name}.err"

    def worker(self, store_url: str, *extra: str, name: str = "worker", drain: float | None = 1.0) -> Proc:
        out, err = self._files(name)
        argv = [sys.executable, WORKER, "work", "--backend", store_url, "--log-dir", str(self.log_dir)]
        if drain is not None:
            argv += ["--drain", str(drain)]
        argv += list(extra)
        with open(out, "wb") as fout, open(err, "wb") as ferr:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fout, stderr=ferr, env=self.env())
        proc = Proc(popen, name, out, err)
        self.procs.append(proc)
        return proc

    def script(self, path: str, *argv: str, name: str) -> Proc:
        """Start another script of this folder (`python path argv...`), its output in files."""
        out, err = self._files(name)
        with open(out, "wb") as fout, open(err, "wb") as ferr:
            popen = subprocess.Popen(
                [sys.executable, path, *argv], stdin=subprocess.DEVNULL, stdout=fout, stderr=ferr, env=self.env()
            )
        proc = Proc(popen, name, out, err)
        self.procs.append(proc)
        return proc

    def run_worker_cli(self, *argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run `worker.py` to completion (bounded) and return its result."""
        return subprocess.run(
            [sys.executable, WORKER, *argv],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(),
        )

    def enqueue(
        self,
        store_url: str,
        count: int = 0,
        *,
        sleep: float = 0.0,
        first: int = 0,
        raw: Iterable[tuple[str, str]] = (),
        timeout: float = 60.0,
        keys: int = 0,
        key_prefix: str = "k",
        rate_keys: int = 0,
    ) -> list[int]:
        raw = list(raw)
        argv = ["enqueue", "--backend", store_url, "--count", str(count), "--first", str(first), "--sleep", str(sleep)]
        if keys:
            argv += ["--keys", str(keys), "--key-prefix", key_prefix]
        if rate_keys:
            argv += ["--rate-keys", str(rate_keys)]
        for kind, args_json in raw:
            argv += ["--raw", kind, args_json]
        result = self.run_worker_cli(*argv, timeout=timeout)
        assert result.returncode == 0, f"enqueue failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        line = next(x for x in result.stdout.splitlines() if x.startswith("IDS "))
        ids: list[int] = json.loads(line[4:])
        assert len(ids) == count + len(raw), ids
        return ids

    def kill_all(self) -> None:
        for proc in self.procs:
            proc.kill()


def wait_all_exit(procs: Iterable[Proc], timeout: float) -> dict[str, int]:
    """Wait for every process (one shared deadline); returns name -> returncode."""
    deadline = time.monotonic() + timeout
    codes = {}
    for proc in procs:
        codes[proc.name] = proc.wait(max(0.1, deadline - time.monotonic()))
    return codes


def assert_clean_exit(proc: Proc, code: int | None = None) -> None:
    rc = proc.popen.returncode if code is None else code
    assert rc == 0, f"{proc.name} exited with {rc}:\n{proc.describe()}"
    assert "Traceback" not in proc.stderr(), f"{proc.name} printed a traceback:\n{proc.describe()}"


__all__ = [
    "FAST_RESCUE",
    "Execution",
    "JobRow",
    "Proc",
    "Spawner",
    "Store",
    "assert_clean_exit",
    "count_records",
    "fetch_jobs",
    "jobs_inserted_under_write_lock",
    "poll_opts",
    "read_executions",
    "running_ids",
    "starts_by_job",
    "state_counts",
    "wait_all_exit",
    "wait_until",
]

