"""The conformance suite: every backend behaviour, written once, run against every backend.

A backend is done when this whole folder passes on it. Tests get `make_backend`, a factory for
a fresh backend instance of the parametrised kind (call it once per test; pass the same instance
to two runtimes to model a restart), and run on virtual time (`autojump_clock`).

Durable backends do their I/O on threads, which MockClock's autojump cannot see: with a
threshold of 0 the clock would jump while a query runs. For them the clock jumps only after
the loop has been idle for a while in real time (`_AUTOJUMP`), longer than any local query.
"""

from __future__ import annotations

from typing import Callable

import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs.backends.sqlite import SqliteBackend
from tests import pgutil

BACKENDS = ["memory", "sqlite", "postgres"]
_AUTOJUMP = {"memory": 0.0, "sqlite": 0.05, "postgres": 0.05}


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_backend(backend_name: str, tmp_path, request: pytest.FixtureRequest) -> Callable[[], nj.Backend]:
    def memory() -> nj.Backend:
        return nj.MemoryBackend()

    def sqlite() -> nj.Backend:
        backend = SqliteBackend(str(tmp_path / "jobs.db"), synchronous="NORMAL", clock=trio.current_time)
        # One process: every wake-up is pushed in-process, so the cross-process poll only
        # costs real time per virtual second here (each poll is a thread hop before autojump).
        backend.poll_interval = 60.0
        return backend

    def postgres() -> nj.Backend:
        from nursery_jobs.backends.postgres import PostgresBackend

        url = request.getfixturevalue("pg_url")
        backend = PostgresBackend(url, schema=pgutil.new_schema(url), clock=trio.current_time, poll_interval=60.0)
        return backend

    return {"memory": memory, "sqlite": sqlite, "postgres": postgres}[backend_name]


@pytest.fixture
def autojump_clock(backend_name: str) -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=_AUTOJUMP[backend_name])
