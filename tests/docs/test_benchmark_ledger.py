"""benchmarks/RESULTS.md is a ledger with one row per benchmark script, and every row's command runs.

The table at the top of RESULTS.md names every script of benchmarks/ (a file with a ``__main__``
block; the modules the scripts share have none) exactly once, in a command run from the
repository root: a script added without a row fails here, and so does a row whose script is gone.
Then every row's command runs with ``--smoke`` (tiny sizes, one round; ``--check`` is never
passed, so no speed is judged), all of them at once in subprocesses, so the whole check lasts about
as long as its slowest run. Each must exit 0 and print what it measures, and none may leave a
database of its own behind (`nj_bench_<tag>_<its pid>`, benchmarks/pg_common.py).

The PostgreSQL scripts use the server the PostgreSQL tests use (tests/pgutil.py), and the soak a
private cluster of its own (tests/pg_cluster.py): without either, the smoke runs are skipped off
CI and failed under CI=true.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tests import pg_cluster, pgutil

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
LEDGER = BENCH / "RESULTS.md"
COLUMNS = ["Benchmark", "Command", "Compared with, in the same run", "Target", "Last figures", "Commit, date"]
COMMAND = re.compile(r"`(\.venv/bin/python (benchmarks/(\w+\.py))(?: [^`]*)?)`")
COMMIT_AND_DATE = re.compile(r"\b[0-9a-f]{7,40}\b.*\b20\d\d-\d\d-\d\d\b")
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|tmp|home|root|opt|srv|mnt|var|usr)/|\bflock\b")
# The scripts read the same admin URL as the test suite.
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "NJ_BENCH_PG_URL": pgutil.ADMIN_URL}
TIMEOUT = 240  # a smoke run takes seconds; the bound is for a loaded 2-core machine, not a speed claim

# What each smoke run must print: the labels of what it measures (a script that silently stopped
# measuring one fails), and what it must not.
PRINTS: dict[str, tuple[str, ...]] = {
    "memory_throughput.py": ("throughput ratio", "idle enqueue -> start p50", "memory per queued job"),
    "memory_instructions.py": ("smoke run: every side ran",),
    "postgres_throughput.py": (
        "throughput ratio, 1 process", "worker process(es)", "enqueue one-by-one ratio", "enqueue_many ratio",
        "idle enqueue -> start p50", "idle enqueue -> start p99", "idle enqueue -> receipt p50",
    ),
    "postgres_production.py": (
        "rows, 1 workers: loop / runtime", "rows, 8 workers: loop / runtime", "-row drain, 1 workers", "2 processes / 1",
        "runs with an outcome left unwritten", "idle enqueue -> start p50", "idle enqueue -> start p99",
    ),
    "cpu_accounting.py": (
        "(a) loop", "(b) runtime, 1 process", "(c) 2 processes", "(a1) loop, 1 process", "(a2) loop, 2 processes",
        "(c1) 1 process", "server µs/job", "machine idle %", "xacts/job", "(a1) -> (a2)", "(c1) -> (c)",
        "ceiling 2/1 at 1-proc cost/job", "smoke run: nothing judged",
    ),
    "bridge.py": (
        "(a) former infra: thread + cancel watcher", "(b) AsyncConnection via trio-asyncio", "(c) sync psycopg",
        "(d) infra PgPool.run: Trio-native waits", "cancelled pg_sleep",
    ),
    "sqlite_throughput.py": (
        "throughput ratio", "idle enqueue -> start p50", "idle enqueue -> receipt p50", "cross-process enqueue -> start p50",
        "wake-ups off (poll 1 s): start p50", "one wake-up send",
    ),
    "postgres_soak.py": (
        "claim buffers (hit + read)", "n_dead_tup", "heap MB", "index jobs_available MB", "autovacuums:", "HOT updates: 0 of",
        "drained:", "smoke run: nothing judged",
    ),
    "concurrency_keys.py": ("keys (limit 1)", "overshoot", "latency", "\npostgres ", "\nsqlite ", "\nmemory "),
    "rate_limits.py": ("worst window", "backlog over its rate", "with / without", "drain x", "\npostgres ", "\nsqlite ", "\nmemory "),
    "outbox_relay.py": (
        "relay events/s", "relay / enqueue_many", "return -> receipt p50 ms", "smoke run: nothing judged",
        "\npostgres ", "\nsqlite ", "\nmemory ",
    ),
    "hooks.py": ("CPU per attempt", "empty: ", "prometheus: ", "otel: ", "scrape under load", "smoke run: nothing judged"),
    "batches.py": ("batch 100 jobs/s (x single)", "\npostgres ", "\nsqlite ", "\nmemory "),
    "cache.py": (
        "memory get µs", "sqlite get µs", "sqlite set µs", "postgres get/s", "postgres set p50 ms",
        "computations for", "slowest caller - computation ms", "plain Trio", "postgres, 3 processes", "smoke run: nothing judged",
    ),
    "bounded_queues.py": (
        "bounded near full µs", "free / no bound", "smoke run: nothing judged", "\npostgres ", "\nsqlite ", "\nmemory ",
    ),
}  # fmt: skip
MUST_NOT_PRINT = {
    "postgres_production.py": ("unwritten: ",),  # the runs left no outcome behind, even tiny ones
    "postgres_soak.py": ("jobs_due",),  # migration 0005 dropped it
}


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def ledger_rows() -> list[list[str]]:
    """The cells of every row of the first table of RESULTS.md, its header checked."""
    lines = LEDGER.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    header, rule, *rows = lines[start:end]
    assert cells(header) == COLUMNS, f"RESULTS.md's table has the columns {cells(header)}, not {COLUMNS}"
    assert set(rule) <= set("|-: "), rule
    return [cells(row) for row in rows]


def scripts() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py") if 'if __name__ == "__main__":' in p.read_text(encoding="utf-8"))


def ledger_commands() -> dict[str, str]:
    """Script name -> the command its row states."""
    commands: dict[str, str] = {}
    for row in ledger_rows():
        assert len(row) == len(COLUMNS), f"a row of {len(row)} cells, not {len(COLUMNS)} (a '|' in a cell?): {row}"
        match = COMMAND.fullmatch(row[1])
        assert match, f"{row[0]}: the command {row[1]!r} is not `.venv/bin/python benchmarks/<script>.py [options]`"
        assert match.group(3) not in commands, f"two rows run {match.group(2)}"
        assert COMMIT_AND_DATE.search(row[5]), f"{row[0]}: {row[5]!r} names no commit and date (YYYY-MM-DD)"
        commands[match.group(3)] = match.group(1)
    return commands


def test_the_ledger_has_one_row_per_benchmark_script() -> None:
    listed = set(ledger_commands())
    on_disk = set(scripts())
    assert len(on_disk) >= 13, on_disk  # the glob found the scripts
    assert listed == on_disk, (
        f"benchmark scripts with no row in RESULTS.md's table: {sorted(on_disk - listed)}; "
        f"rows whose script is not in benchmarks/: {sorted(listed - on_disk)}"
    )
    assert set(PRINTS) == on_disk, "every script says here what its smoke run prints"


def test_the_ledger_names_no_path_of_the_benchmark_machine() -> None:
    text = LEDGER.read_text(encoding="utf-8")
    found = [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in MACHINE_PATH.finditer(text)]
    assert not found, f"RESULTS.md names paths or locks of the machine it ran on: {found}"


def test_the_ledger_checks_catch_what_they_forbid() -> None:
    assert cells("| a | `b` |") == ["a", "`b`"]
    assert COMMAND.fullmatch("`.venv/bin/python benchmarks/bridge.py`")
    assert COMMAND.fullmatch("`.venv/bin/python benchmarks/bridge.py --rounds 3`")
    assert not COMMAND.fullmatch("`flock -x /x .venv/bin/python benchmarks/bridge.py`")
    assert not COMMAND.fullmatch("`.venv/bin/python /abs/benchmarks/bridge.py`")
    assert COMMIT_AND_DATE.search("0a842dd, 2026-12-04") and not COMMIT_AND_DATE.search("main, 2026-12-04")
    assert [m.group(0) for m in MACHINE_PATH.finditer("flock -x /work/locks/bench, /tmp/x, /proc/stat, a/tmp/b")] == [
        "flock", "/work/", "/tmp/",
    ]  # fmt: skip


def require_servers() -> None:
    try:
        with pgutil.admin_connect() as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        pgutil.unreachable(" ".join(str(exc).split()))
    if pg_cluster.find_bindir() is None:
        pg_cluster._missing("no PostgreSQL server binaries (initdb) for the soak's private cluster")


def leftover_bench_databases() -> list[str]:
    with pgutil.admin_connect() as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'nj\\_bench\\_%'").fetchall()
    return [r[0] for r in rows]


@pytest.mark.timeout(TIMEOUT + 60)  # the runs' own bound fires first and says more
def test_every_ledger_command_runs_in_smoke_mode(tmp_path: Path) -> None:
    require_servers()
    runs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for script, command in ledger_commands().items():
            _python, *args = shlex.split(command)
            with open(tmp_path / f"{script}.out", "wb") as out, open(tmp_path / f"{script}.err", "wb") as err:
                runs[script] = subprocess.Popen(
                    [sys.executable, *args, "--smoke"], cwd=ROOT, env=ENV, stdin=subprocess.DEVNULL, stdout=out,
                    stderr=err, start_new_session=True,  # its own process group: its worker processes go with it
                )  # fmt: skip
        deadline = time.monotonic() + TIMEOUT
        for proc in runs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        for proc in runs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    problems = []
    left = leftover_bench_databases()
    for script, proc in runs.items():
        out = (tmp_path / f"{script}.out").read_text(errors="replace")
        err = (tmp_path / f"{script}.err").read_text(errors="replace")
        if proc.returncode != 0:
            what = f"still running after {TIMEOUT} s" if proc.returncode == -signal.SIGKILL else f"exit {proc.returncode}"
            problems.append(f"{script}: {what}\n{out[-3000:]}\n{err[-3000:]}")
            continue
        missing = [label for label in PRINTS[script] if label not in out]
        unwanted = [label for label in MUST_NOT_PRINT.get(script, ()) if label in out]
        mine = [name for name in left if name.endswith(f"_{proc.pid}")]
        if missing or unwanted or mine:
            problems.append(f"{script}: does not print {missing}, prints {unwanted}, left databases {mine}\n{out[-3000:]}")
    assert not problems, "\n\n".join(problems)
