"""PostgreSQL's side of `rt.transaction()`: the lent connection's session, the transaction
slots the connection budget leaves, a failed statement caught inside the block. What every
backend does with transactions is in tests/contract/test_transactional.py."""

from __future__ import annotations

import pytest
import trio

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
