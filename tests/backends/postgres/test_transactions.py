"""PostgreSQL's side of `rt.transaction()`: the lent connection's session, the transaction
slots the connection budget leaves, a failed statement caught inside the block. What every
backend does with transactions is in tests/contract/test_transactional.py."""

from __future__ import annotations

import contextlib
import inspect

import psycopg
import psycopg.rows
import pytest
import trio
from psycopg.rows import tuple_row

import nursery_jobs as nj
from nursery_jobs.backends.postgres import PostgresBackend
from tests import pgutil


def _backend(url: str, **kwargs) -> PostgresBackend:
    return PostgresBackend(url, schema=pgutil.new_schema(url), **kwargs)


async def _show(conn, name: str) -> str:
    cur = await conn.execute(f"SHOW {name}")
    return str((await cur.fetchone())[0])


async def test_the_lent_connection_plans_the_services_queries_as_usual(pg_url):
    backend = _backend(pg_url)
    await backend.open()
    try:
        async with backend.transaction() as conn:
            assert (await _show(conn, "enable_seqscan"), await _show(conn, "plan_cache_mode"), await _show(conn, "jit")) == (
                "on", "auto", "on"
            )
        # The runtime's own statements keep the pool's settings (POOL_SESSION).
        async with backend.pool.connection() as conn:
            assert (await _show(conn, "enable_seqscan"), await _show(conn, "plan_cache_mode"), await _show(conn, "jit")) == (
                "off", "force_generic_plan", "off"
            )
    finally:
        await backend.close()


async def test_the_runtimes_statements_are_never_jit_compiled(pg_url):
    """A generic plan's cost on a large table passes `jit_above_cost` (the claim's on 1M rows
    did: 20 ms of compiling per 0.2 ms claim); with the threshold at 0, a pooled connection still
    compiles nothing, and a lent transaction is back on the server's JIT."""
    backend = _backend(pg_url)
    await backend.open()
    try:
        async with backend.pool.connection() as conn:
            await conn.execute("SET jit_above_cost = 0")
            cur = await conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM {backend.schema}.jobs")
            plan = (await cur.fetchone())[0][0]
            await conn.execute("RESET jit_above_cost")
        assert "JIT" not in plan, plan
    finally:
        await backend.close()


async def test_transactions_get_the_pool_the_workers_do_not_plan_for(pg_url):
    backend = _backend(pg_url, pool_size=6)
    backend.check_budget(1)  # 1 worker + 2 = 3 of the 6 connections: 3 are left for transactions
    backend.acquire_timeout = 0.3
    await backend.open()
    try:
        held = trio.Event()
        opened = []

        async def hold() -> None:
            async with backend.transaction():
                opened.append(1)
                await held.wait()

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(hold)
            with trio.fail_after(10):
                while len(opened) < 3:
                    await trio.sleep(0.01)
            with pytest.raises(nj.BackendUnavailable, match="no transaction slot free within 0.3 s: 3 transactions"):
                async with backend.transaction():
                    pass
            held.set()
        async with backend.transaction():
            assert backend.pool.checked_out == 1
        assert backend.pool.checked_out == 0
    finally:
        await backend.close()


async def test_a_pool_with_no_connection_left_refuses_transactions(pg_url):
    backend = _backend(pg_url, pool_size=2, pool_share=1)
    backend.check_budget(0)
    await backend.open()
    try:
        with pytest.raises(nj.ConfigError, match="no connection is left for rt.transaction"):
            async with backend.transaction():
                pass
    finally:
        await backend.close()


async def test_an_error_caught_inside_the_block_rolls_the_transaction_back(pg_url):
    app = nj.App()

    @app.job()
    async def index(ctx: nj.JobContext, doc_id: int) -> None:
        pass

    backend = _backend(pg_url)
    async with nj.open_runtime(app, backend=backend, queues=[]) as rt:
        with pytest.raises(nj.BackendError, match="failed inside the block"):
            async with rt.transaction() as conn:
                job_id = await index.enqueue_tx(conn, doc_id=1)
                try:
                    await conn.execute("SELECT no_such_column FROM pg_class")
                except Exception:
                    pass  # swallowed: the transaction is aborted all the same
        with pytest.raises(nj.JobNotFound):
            await rt.get_job(job_id)
        # The block's session went back to the pool. The runtime's own services (the rescuer,
        # retention, the listener) take sessions too, so one may be out at this instant: the
        # count must come back to 0 within a bound, which a session the block kept never does.
        with trio.fail_after(10):
            while backend.pool.checked_out:
                await trio.sleep(0.01)


def _app_with_a_job() -> tuple[nj.App, nj.JobKind]:
    app = nj.App()

    @app.job()
    async def index(ctx: nj.JobContext, doc_id: int) -> None:
        pass

    return app, index


async def _prepared(conn) -> list[str]:
    cur = await conn.execute("SELECT statement FROM pg_prepared_statements")
    return [text for (text,) in await cur.fetchall()]


async def test_the_lent_connection_runs_a_script_and_prepares_as_psycopg_does(pg_url):
    """Before: every statement on the lent connection was prepared at its first use, so a
    script of several statements failed ("cannot insert multiple commands into a prepared
    statement"). The service's statements now follow psycopg's default threshold, while the
    runtime's own (here the enqueue's insert, on the same connection) are still prepared."""
    app, index = _app_with_a_job()
    backend = _backend(pg_url)
    s = backend.schema
    async with nj.open_runtime(app, backend=backend, queues=[]) as rt:
        async with rt.transaction() as conn:
            await conn.execute(f"CREATE TABLE {s}.a (id int); CREATE TABLE {s}.b (id int); CREATE TABLE {s}.c (id int)")
            await index.enqueue_tx(conn, doc_id=1)
            default = inspect.signature(psycopg.AsyncConnection.connect).parameters["prepare_threshold"].default
            assert conn.prepare_threshold == default == 5
            for _ in range(default):
                await conn.execute(f"INSERT INTO {s}.a VALUES (%s)", (1,))
            prepared = await _prepared(conn)
            assert [t for t in prepared if f"INSERT INTO \"{s}\".jobs" in t], prepared  # the runtime's: at once
            assert not [t for t in prepared if f"{s}.a" in t], prepared  # the service's: not yet
            await conn.execute(f"INSERT INTO {s}.a VALUES (%s)", (1,))
            assert [t for t in await _prepared(conn) if f"{s}.a" in t]  # past psycopg's threshold
        async with rt.transaction() as conn:
            cur = await conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename IN ('a', 'b', 'c')", (s,))
            assert (await cur.fetchone())[0] == 3


async def _session(conn) -> dict[str, object]:
    cur = conn.cursor(row_factory=tuple_row)
    await cur.execute(
        "SELECT current_setting('synchronous_commit'), current_setting('enable_seqscan'), current_setting('search_path'),"
        " current_setting('statement_timeout'), current_user::text,"
        " (SELECT count(*) FROM pg_listening_channels()),"
        " (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),"
        " (SELECT count(*) FROM pg_cursors), (SELECT count(*) FROM pg_class WHERE relpersistence = 't')"
    )
    names = ("synchronous_commit", "enable_seqscan", "search_path", "statement_timeout", "role", "listens", "locks", "cursors", "temp")
    return dict(zip(names, await cur.fetchone()))


async def _leave_traces(conn) -> None:
    for statement in (
        "SET synchronous_commit = off", "SET enable_seqscan = on", "SET search_path = nowhere",
        "SET statement_timeout = 0", "SET ROLE pg_monitor", "LISTEN somewhere", "SELECT pg_advisory_lock(42)",
        "DECLARE kept CURSOR WITH HOLD FOR SELECT 1", "CREATE TEMP TABLE scratch (id int)",
    ):  # fmt: skip
        await conn.execute(statement)
    conn.row_factory = psycopg.rows.dict_row
    conn.prepare_threshold = 0
    conn.add_notice_handler(lambda diag: None)


async def test_what_the_block_leaves_on_the_session_is_undone_before_the_pool_has_it_back(pg_url):
    """Before: a `SET` in a committed block outlived it on the pooled connection, where the
    runtime's own statements then ran (`synchronous_commit = off` on a connection the pool
    takes as durable), and so did a session advisory lock (held for ever), a LISTEN, a held
    cursor, a temporary table, and the psycopg settings the block changed."""
    backend = _backend(pg_url, pool_size=4)
    await backend.open()
    try:
        async with backend.pool.connection() as conn:
            clean = await _session(conn)
        for fail in (False, True):
            with contextlib.suppress(ValueError):
                async with backend.transaction() as conn:
                    lent = conn
                    await _leave_traces(conn)
                    if fail:
                        raise ValueError("the request failed")
            async with backend.pool.connection() as conn:
                assert conn is lent  # the most recently used connection: the one the block had
                assert await _session(conn) == clean, fail
                assert (conn.row_factory, conn.prepare_threshold, conn._notice_handlers) == (tuple_row, 5, [])
    finally:
        await backend.close()


async def test_a_lent_connection_whose_autocommit_was_changed_is_not_pooled_again(pg_url):
    backend = _backend(pg_url, pool_size=4)
    await backend.open()
    try:
        async with backend.transaction() as conn:
            lent = conn
            await conn.execute("COMMIT")  # the block ends the transaction itself, then changes the mode
            await conn.set_autocommit(False)
        assert lent.closed
        async with backend.pool.connection() as conn:
            assert conn is not lent and conn.autocommit
    finally:
        await backend.close()
