from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from tests import pg_cluster, pgutil

# nursery_jobs.pytest_plugin: the entry point loads it where the package is installed; named here
# too so the suite runs in an environment installed before the entry point existed.
pytest_plugins = ["tests.timeouts", "nursery_jobs.pytest_plugin"]

_AS_CTRL_C = (signal.SIGTERM, signal.SIGHUP)
_RUN_DIR = pytest.StashKey[Path]()

# xdist workers for `-n auto` (pyproject.toml's addopts). The suite mostly waits -- on
# PostgreSQL, on worker and pytest subprocesses, on private clusters -- so more workers than the
# two cores overlap those waits; past 4, on two cores, they only contend for CPU.
WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """PYTEST_XDIST_AUTO_NUM_WORKERS, when set, wins (xdist's own hook reads it)."""
    return None if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") else WORKERS


def _as_ctrl_c(signum: int, frame: object) -> None:
    # Whatever handles Ctrl-C at this moment (Python's, or Trio's inside a run) handles it, called
    # here rather than by sending SIGINT: a SIGINT sent from this handler would only be looked at
    # when the interpreter next checks for signals, and a blocking call entered before that
    # would hold it for the whole call.
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        os.kill(os.getpid(), signal.SIGINT)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The long tests (those that declare a time bound above the default: whole suites or
    benchmarks in a subprocess) start first, one worker's share at a time: a long test left for
    the end of a worker's share held the run's end by itself. xdist's worksteal hands each
    worker a contiguous share of this order (and an idle worker steals from the tail of a busy
    one), so the long tests are dealt to the heads of the shares; every worker computes the same
    order, as xdist requires."""
    if not config.getini("timeout"):
        return  # a session without this suite's ini (a planted one): no default to compare with
    default = float(config.getini("timeout"))

    def declared_long(item: pytest.Item) -> bool:
        marker = item.get_closest_marker("timeout")
        bound = marker.args[0] if marker and marker.args else marker.kwargs.get("timeout") if marker else None
        return bound is not None and float(bound) > default

    long = [item for item in items if declared_long(item)]
    if not long:
        return
    rest = [item for item in items if not declared_long(item)]
    workers = max(1, int(getattr(config, "workerinput", {}).get("workercount", 1)))
    heads: list[list[pytest.Item]] = [long[i::workers] for i in range(workers)]
    ordered: list[pytest.Item] = []
    left = len(items)
    for i, head in enumerate(heads):
        share = left // (workers - i)  # what worksteal sends this worker first
        tail = max(0, share - len(head))
        ordered += head + rest[:tail]
        del rest[:tail]
        left -= share
    items[:] = ordered + rest


def pytest_sessionstart(session: pytest.Session) -> None:
    """SIGTERM and SIGHUP (a CI job's end, a closed terminal) stop the run as Ctrl-C does, so
    the session's teardown still drops what it made; by default they would end the process on
    the spot and leave the throwaway database behind."""
    for sig in _AS_CTRL_C:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _as_ctrl_c)


def pytest_sessionfinish(session: pytest.Session) -> None:
    for sig in _AS_CTRL_C:
        if signal.getsignal(sig) is _as_ctrl_c:
            signal.signal(sig, signal.SIG_DFL)


def pytest_configure(config: pytest.Config) -> None:
    """The run's controller (xdist's, or the only process) gives its processes a directory to
    leave their pids in when they make a database (tests/pgutil.py, RUN_DIR); workers inherit it."""
    if not hasattr(config, "workerinput"):
        run_dir = tempfile.mkdtemp(prefix="nj_test_run_")
        os.environ[pgutil.RUN_DIR] = run_dir
        config.stash[_RUN_DIR] = Path(run_dir)


def pytest_unconfigure(config: pytest.Config) -> None:
    """In the controller, once xdist has brought its workers down (in its sessionfinish, which
    runs before this): drop what a worker killed before the end of its teardown left."""
    run_dir = config.stash.get(_RUN_DIR, None)
    if run_dir is not None:
        try:
            pgutil.drop_of_gone_workers(run_dir)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_url():
    """URL of a throwaway PostgreSQL database for this test session, dropped at the end even if
    the run fails or is interrupted; leftovers of earlier runs that are gone are dropped first."""
    pgutil.drop_leftovers()
    url = pgutil.create_database()
    try:
        yield url
    finally:
        pgutil.drop_database(url)


@pytest.fixture
def no_other_sweeps():
    """For a test that kills a run and checks what the sweep does to what it left: no other
    test's, session's or run's sweep (tests/pgutil.py) runs while it does."""
    with pgutil.no_other_sweeps():
        yield


@pytest.fixture
def private_cluster():
    """A PostgreSQL server of this test's own (tests/pg_cluster.py), for tests that restart,
    stop or reconfigure a server: never the shared one. Removed when the test ends."""
    with pg_cluster.private_cluster() as cluster:
        yield cluster
