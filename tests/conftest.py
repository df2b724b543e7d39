from __future__ import annotations

import os
import signal

import pytest

from tests import pg_cluster, pgutil

# nursery_jobs.pytest_plugin: the entry point loads it where the package is installed; named here
# too so the suite runs in an environment installed before the entry point existed.
pytest_plugins = ["tests.timeouts", "nursery_jobs.pytest_plugin"]

_AS_CTRL_C = (signal.SIGTERM, signal.SIGHUP)


def _as_ctrl_c(signum: int, frame: object) -> None:
    # Whatever handles Ctrl-C at this moment (Python's, or Trio's inside a run) handles it.
    os.kill(os.getpid(), signal.SIGINT)


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
def private_cluster():
    """A PostgreSQL server of this test's own (tests/pg_cluster.py), for tests that restart,
    stop or reconfigure a server: never the shared one. Removed when the test ends."""
    with pg_cluster.private_cluster() as cluster:
        yield cluster
