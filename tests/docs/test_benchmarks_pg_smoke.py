"""The durable-backend benchmark scripts run, as users run them: subprocesses in ``--quick`` mode.

No speed is asserted (``--check`` is never passed): these tests only keep the scripts from
rotting. Each run is bounded by a subprocess timeout. The PostgreSQL scripts need the server the
PostgreSQL tests use (tests/pgutil.py): off CI an unreachable server skips them, under CI=true it
fails them. Each script creates and drops its own throwaway database.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests import pg_cluster, pgutil

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
# The scripts read the same admin URL as the test suite.
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "NJ_BENCH_PG_URL": pgutil.ADMIN_URL}
TIMEOUT = 240  # --quick takes seconds; the bound is for a loaded 2-core machine, not a speed claim
pytestmark = pytest.mark.timeout(TIMEOUT + 60)  # the subprocess's own bound fires first and says more


@pytest.fixture
def postgres_reachable() -> None:
    try:
        with pgutil.admin_connect() as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        pgutil.unreachable(" ".join(str(exc).split()))


def run_quick(script: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """Run a script with `flags` (``--quick`` when none are given); it must exit 0, and a
    PostgreSQL one must have dropped every database it made (`nj_bench_<tag>_<its pid>`,
    benchmarks/pg_common.py) by the time it exits."""
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / script), *(flags or ("--quick",))],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, f"exit {proc.returncode}\n{stdout}\n{stderr}"
    if script.startswith(("postgres_", "bridge", "outbox_relay", "cpu_")):
        left = [name for name in leftover_bench_databases() if name.endswith(f"_{proc.pid}")]
        assert not left, f"{script} left its databases behind: {left}\n{stdout}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def leftover_bench_databases() -> list[str]:
    with pgutil.admin_connect() as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'nj\\_bench\\_%'").fetchall()
    return [r[0] for r in rows]


@pytest.mark.usefixtures("postgres_reachable")
def test_postgres_throughput_quick_mode_runs() -> None:
    out = run_quick("postgres_throughput.py").stdout
    for metric in (
        "throughput ratio, 1 process",
        "worker process(es)",
        "enqueue one-by-one ratio",
        "enqueue_many ratio",
        "idle enqueue -> start p50",
        "idle enqueue -> start p99",
        "idle enqueue -> receipt p50",
    ):
        assert metric in out, out


@pytest.mark.usefixtures("postgres_reachable")
def test_bridge_quick_mode_runs() -> None:
    out = run_quick("bridge.py").stdout
    for label in (
        "(a) former infra: thread + cancel watcher",
        "(b) AsyncConnection via trio-asyncio",
        "(c) sync psycopg",
        "(d) infra PgPool.run: Trio-native waits",
        "cancelled pg_sleep",
    ):
        assert label in out, out


@pytest.mark.usefixtures("postgres_reachable")
def test_postgres_production_smoke_mode_runs() -> None:
    out = run_quick("postgres_production.py", "--smoke").stdout
    for metric in (
        "rows, 1 workers: loop / runtime",
        "rows, 8 workers: loop / runtime",
        "-row drain, 1 workers",
        "2 processes / 1",
        "runs with an outcome left unwritten",
        "idle enqueue -> start p50",
        "idle enqueue -> start p99",
    ):
        assert metric in out, out
    assert "unwritten: " not in out, out  # the runs left no outcome behind, even tiny ones


def test_postgres_soak_smoke_mode_runs() -> None:
    """The soak runs on a private cluster of its own (it needs the server binaries, not the
    shared server): ~20 s of enqueue and drain with retention on, sampled every 2 s."""
    if pg_cluster.find_bindir() is None:
        pg_cluster._missing("no PostgreSQL server binaries (initdb) for the soak's private cluster")
    result = subprocess.run(
        [sys.executable, str(BENCH / "postgres_soak.py"), "--smoke"],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    out = result.stdout
    for metric in ("claim buffers (hit + read)", "n_dead_tup", "heap MB", "index jobs_available MB",
                   "autovacuums:", "HOT updates: 0 of", "drained:", "smoke run: nothing judged"):  # fmt: skip
        assert metric in out, out
    assert "jobs_due" not in out, out  # migration 0005 dropped it


def test_sqlite_throughput_quick_mode_runs() -> None:
    out = run_quick("sqlite_throughput.py").stdout
    metrics = ("throughput ratio", "idle enqueue -> start p50", "idle enqueue -> receipt p50",
               "cross-process enqueue -> start p50", "wake-ups off (poll 1 s): start p50", "one wake-up send")  # fmt: skip
    for metric in metrics:
        assert metric in out, out


@pytest.mark.usefixtures("postgres_reachable")
def test_rate_limits_quick_mode_runs() -> None:
    out = run_quick("rate_limits.py").stdout
    for label in ("worst window", "backlog over its rate", "with / without", "drain x"):
        assert label in out, out


@pytest.mark.usefixtures("postgres_reachable")
def test_concurrency_keys_quick_mode_runs() -> None:
    out = run_quick("concurrency_keys.py", "--quick", "--backends", "postgres").stdout
    for label in ("keys (limit 1)", "overshoot", "latency"):
        assert label in out, out
    assert not [name for name in leftover_bench_databases() if "_keyed_" in name]


@pytest.mark.usefixtures("postgres_reachable")
def test_cpu_accounting_smoke_mode_runs() -> None:
    out = run_quick("cpu_accounting.py", "--smoke").stdout
    for label in ("(a) loop", "(b) runtime, 1 process", "(c) 2 processes", "(a1) loop, 1 process", "(a2) loop, 2 processes",
                  "(c1) 1 process", "server µs/job", "machine idle %", "xacts/job", "(a1) -> (a2)", "(c1) -> (c)",
                  "ceiling 2/1 at 1-proc cost/job", "smoke run: nothing judged"):  # fmt: skip
        assert label in out, out


@pytest.mark.usefixtures("postgres_reachable")
def test_outbox_relay_smoke_mode_runs() -> None:
    out = run_quick("outbox_relay.py", "--smoke").stdout
    for label in ("relay events/s", "relay / enqueue_many", "return -> receipt p50 ms", "smoke run: nothing judged"):
        assert label in out, out
    for backend in ("postgres", "sqlite", "memory"):
        assert f"\n{backend} " in out, out


@pytest.mark.usefixtures("postgres_reachable")
def test_batches_quick_mode_runs() -> None:
    out = run_quick("batches.py").stdout
    for backend in ("postgres", "sqlite", "memory"):
        assert f"\n{backend} " in out, out
    assert "batch 100 jobs/s (x single)" in out
    assert not [name for name in leftover_bench_databases() if "_batches_" in name]


@pytest.mark.usefixtures("postgres_reachable")
def test_bounded_queues_smoke_mode_runs() -> None:
    out = run_quick("bounded_queues.py", "--smoke").stdout
    for label in ("bounded near full µs", "free / no bound", "smoke run: nothing judged"):
        assert label in out, out
    for backend in ("postgres", "sqlite", "memory"):
        assert f"\n{backend} " in out, out
