"""Fixtures of the process-level tests: a spawner that always cleans up, and the stores.

`pg_store` uses the session's throwaway database (`pg_url`, from tests/conftest.py) and a fresh
migrated schema per test, so an unreachable server skips off CI and fails under CI=true.
"""

from __future__ import annotations

import itertools
import os

import pytest

from tests import pgutil
from tests.processes.procutil import Spawner, Store

_counter = itertools.count(1)


@pytest.fixture
def spawner(tmp_path):
    sp = Spawner(tmp_path, app_name=f"nj_proc_{os.getpid()}_{next(_counter)}")
    try:
        yield sp
    finally:
        sp.kill_all()


@pytest.fixture
def pg_store(pg_url) -> Store:
    return Store.postgres(pg_url, pgutil.new_schema(pg_url))


@pytest.fixture
def sqlite_store(tmp_path) -> Store:
    return Store.sqlite(tmp_path / "jobs.db")


@pytest.fixture(params=["postgres", "sqlite"])
def store(request) -> Store:
    """Each durable backend in turn."""
    return request.getfixturevalue("pg_store" if request.param == "postgres" else "sqlite_store")
