"""Errors the server returns for a statement are reported as what they are, not as a lost
connection: raised at once, naming the SQLSTATE and the server's text, never retried. psycopg
files several such classes (53, 54, 55, ...) under `OperationalError`, the class of a dropped
connection too, so the backend classifies by SQLSTATE. A real lost connection keeps its
retries (tests/backends/postgres/test_robustness.py drives those through a proxy)."""

from __future__ import annotations

import random
import string
from typing import Any

import psycopg
import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import NewJob
from nursery_jobs.backends.postgres import PostgresBackend
from nursery_jobs.infra.pg import TrioConnection
from tests import pgutil


_BIG_KEY = "".join(random.Random(0).choices(string.ascii_letters + string.digits, k=4000))
"""A unique_key too large for the btree index behind unique keys (about 2.7 KB after
compression, so random characters: 'x' * 3000 compresses to a few bytes and fits)."""


async def _open(pg_url: str, outage_timeout: float = 5.0) -> PostgresBackend:
    # outage_timeout 5 s: long enough that a retry loop would show as several calls.
    backend = PostgresBackend(pg_url, schema=pgutil.new_schema(pg_url), outage_timeout=outage_timeout)
    backend.check_budget(1)
    await backend.open()
    return backend


def _raising(sqlstate: str, calls: list[int], *, times: int = 1_000) -> Any:
    """A call that fails with `sqlstate` on the server (the first `times` calls), then answers."""

    async def fn(conn: TrioConnection) -> str:
        calls.append(1)
        if len(calls) <= times:
            await conn.execute(
                f"DO $$ BEGIN RAISE EXCEPTION 'raised by the test' USING ERRCODE = '{sqlstate}'; END $$"
            )
        cur = await conn.execute("SELECT 'answered'")
        row = await cur.fetchone()
        assert row is not None
        return str(row[0])

    return fn


@pytest.mark.parametrize(
    "sqlstate, cls, says",
    [
        ("54000", psycopg.errors.ProgramLimitExceeded, "returned an error for the statement"),
        ("54001", psycopg.errors.StatementTooComplex, "returned an error for the statement"),
        ("55P03", psycopg.errors.LockNotAvailable, "returned an error for the statement"),
        ("55006", psycopg.errors.ObjectInUse, "returned an error for the statement"),
        ("22012", psycopg.errors.DivisionByZero, "returned an error for the statement"),
        ("23505", psycopg.errors.UniqueViolation, "returned an error for the statement"),
        ("53100", psycopg.errors.DiskFull, "out of a resource"),
        ("53200", psycopg.errors.OutOfMemory, "out of a resource"),
        ("58030", psycopg.errors.IoError, "out of a resource"),
    ],
)
@pytest.mark.parametrize("retry", [True, False])
async def test_a_statement_error_is_raised_at_once_naming_it(pg_url, caplog, sqlstate, cls, says, retry):
    backend = await _open(pg_url)
    calls: list[int] = []
    try:
        with trio.fail_after(10):
            with pytest.raises(nj.BackendUnavailable if "resource" in says else nj.BackendError) as failed:
                await backend._run(_raising(sqlstate, calls), retry=retry)
            message = str(failed.value)
            assert isinstance(failed.value.__cause__, cls)
            assert f"SQLSTATE {sqlstate} {cls.__name__}: raised by the test" in message
            assert says in message
            assert "connection lost" not in message and "unavailable" not in message
            assert calls == [1]  # not retried
            assert "retrying" not in caplog.text
            # the connection was fine all along: the next call on the pool answers
            assert await backend._run(_raising(sqlstate, calls, times=0)) == "answered"
    finally:
        await backend.close()


async def test_a_deadlock_is_retried_when_the_call_is_safe_to_repeat(pg_url, caplog):
    backend = await _open(pg_url)
    calls: list[int] = []
    try:
        with trio.fail_after(10):
            assert await backend._run(_raising("40P01", calls, times=2)) == "answered"
        assert len(calls) == 3
        assert "SQLSTATE 40P01 DeadlockDetected" in caplog.text
    finally:
        await backend.close()


async def test_a_write_rolled_back_by_the_server_says_nothing_was_written(pg_url):
    backend = await _open(pg_url)
    calls: list[int] = []
    try:
        with trio.fail_after(10):
            with pytest.raises(nj.BackendUnavailable, match=r"rolled the write back \(SQLSTATE 40001 .*nothing of it"):
                await backend._run(_raising("40001", calls), retry=False)
        assert calls == [1]
    finally:
        await backend.close()


@pytest.mark.parametrize("retry", [True, False])
async def test_a_lost_connection_keeps_its_handling(pg_url, retry):
    # No SQLSTATE: psycopg's own report of a connection that went away.
    backend = await _open(pg_url, outage_timeout=2.0)
    calls: list[int] = []

    async def drops_once(conn: TrioConnection) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return "answered"

    try:
        with trio.fail_after(10):
            if retry:
                assert await backend._run(drops_once) == "answered"
                assert len(calls) == 2
            else:
                with pytest.raises(nj.BackendUnavailable, match="connection lost during a write whose outcome is unknown"):
                    await backend._run(drops_once, retry=False)
                assert calls == [1]
    finally:
        await backend.close()


async def test_an_oversized_unique_key_is_not_reported_as_a_lost_connection(pg_url, caplog):
    backend = await _open(pg_url)
    job = NewJob(kind="k", queue="q", args_json="{}", max_attempts=3, priority=0, run_at=None, unique_key=_BIG_KEY)
    try:
        with trio.fail_after(10):
            with pytest.raises(nj.BackendError) as failed:
                await backend.insert_many([job])
        message = str(failed.value)
        assert "SQLSTATE 54000 ProgramLimitExceeded: index row size" in message
        assert "connection lost" not in message
        assert "retrying" not in caplog.text
    finally:
        await backend.close()


async def test_an_oversized_unique_key_through_the_runtime(pg_url):
    # The runtime refuses such a key before it reaches the server, on every backend alike.
    app = nj.App()

    @app.job()
    async def noop(ctx: nj.JobContext) -> None:
        pass

    backend = PostgresBackend(pg_url, schema=pgutil.new_schema(pg_url))
    with trio.fail_after(30):
        async with nj.open_runtime(app, backend=backend, queues=[]) as rt:
            with pytest.raises(nj.ConfigError, match="over the limit") as failed:
                await rt.enqueue("noop", {}, unique_key=_BIG_KEY)
            # the runtime is still fine
            assert (await rt.get_job(await rt.enqueue("noop", {}))).state is nj.JobState.AVAILABLE
        await backend.close()
    assert "connection lost" not in str(failed.value)
