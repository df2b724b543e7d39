"""PostgreSQL for tests: a throwaway database per test session, a fresh schema per test.

The server is the machine's local PostgreSQL (127.0.0.1:5432, trust auth), or NJ_TEST_PG_URL.
Off CI an unreachable server skips the PostgreSQL tests with a reason; under CI=true it fails
them, so a broken server can never turn the suite green by skipping.
"""

from __future__ import annotations

import itertools
import os

import psycopg
import pytest

ADMIN_URL = os.environ.get("NJ_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
_counter = itertools.count(1)


def admin_connect() -> psycopg.Connection:
    return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)


def unreachable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required in CI and cannot be reached: {reason}")
    pytest.skip(f"PostgreSQL not reachable: {reason}")


def create_database() -> str:
    """A new empty database; returns its URL."""
    name = f"nj_test_{os.getpid()}"
    try:
        with admin_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        unreachable(str(exc).strip())
    base, _, _ = ADMIN_URL.rpartition("/")
    return f"{base}/{name}"


def drop_database(url: str) -> None:
    name = url.rpartition("/")[2]
    with admin_connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def new_schema(url: str) -> str:
    """A fresh, migrated schema name in the test database."""
    from nursery_jobs.backends.postgres import migrate

    schema = f"t{next(_counter)}_{os.getpid()}"
    migrate(url, schema)
    return schema
