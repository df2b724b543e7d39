"""SQLite's side of transactions: one writer, so the runtime's own writes wait for none inside
the block (they are refused), one transaction at a time with a bounded wait, and the caller's
own `sqlite3.Connection` in each of Python's transaction modes. What every backend does with
transactions is in tests/contract/test_transactional.py."""

from __future__ import annotations

import sqlite3

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends.sqlite import SqliteBackend

app = nj.App()


@app.job()
async def index(ctx: nj.JobContext, doc_id: int) -> None:
    pass


def _backend(tmp_path) -> SqliteBackend:
    backend = SqliteBackend(str(tmp_path / "jobs.db"), synchronous="NORMAL")
    backend.poll_interval = 60.0
    return backend


async def test_inside_the_block_only_enqueue_tx_writes(tmp_path):
    async with nj.open_runtime(app, backend=_backend(tmp_path), queues=[]) as rt:
        async with rt.transaction() as conn:
            kept = await index.enqueue_tx(conn, doc_id=1)
            with pytest.raises(nj.ConfigError, match="would wait for the transaction's own write lock"):
                await index.enqueue(doc_id=2)
            with pytest.raises(nj.ConfigError, match="would wait for the transaction's own write lock"):
                await rt.cancel(kept)
            with pytest.raises(nj.ConfigError, match="inside another on the same SQLite file"):
                async with rt.transaction():
                    pass
            with pytest.raises(nj.JobNotFound):  # reads work, and see nothing uncommitted
                await rt.get_job(kept)
        assert (await rt.get_job(kept)).state is nj.JobState.AVAILABLE
        assert await rt.cancel(kept) is nj.JobState.CANCELLED  # after the block: as usual


async def test_a_second_transaction_waits_a_bounded_time(tmp_path):
    backend = _backend(tmp_path)
    backend.acquire_timeout = 0.3
    async with nj.open_runtime(app, backend=backend, queues=[]) as rt:
        release = trio.Event()
        inside = trio.Event()

        async def hold() -> None:
            async with rt.transaction() as conn:
                await conn.execute("CREATE TABLE t (x)")
                inside.set()
                await release.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold)
            await inside.wait()
            with pytest.raises(nj.BackendUnavailable, match="transaction connection .* was busy for 0.3 s"):
                async with rt.transaction():
                    pass
            release.set()
        async with rt.transaction() as conn:
            cur = await conn.execute("INSERT INTO t VALUES (1)")
            assert cur.rowcount == 1


@pytest.mark.parametrize("mode", ["implicit", "autocommit", "same-thread"])
async def test_the_callers_connection_in_each_transaction_mode(tmp_path, mode):
    backend = _backend(tmp_path)
    async with nj.open_runtime(app, backend=backend, queues=[]) as rt:
        conn = sqlite3.connect(
            backend.path,
            isolation_level=None if mode == "autocommit" else "",
            check_same_thread=mode == "same-thread",
        )
        try:
            job_id = await index.enqueue_tx(conn, doc_id=1)
            if mode == "autocommit":
                assert not conn.in_transaction  # committed at once, as enqueue commits
                assert (await rt.get_job(job_id)).state is nj.JobState.AVAILABLE
                return
            assert conn.in_transaction  # begun for the caller's own commit() or rollback()
            conn.rollback()
            with pytest.raises(nj.JobNotFound):
                await rt.get_job(job_id)
            job_id = await index.enqueue_tx(conn, doc_id=2)
            conn.commit()
            assert (await rt.get_job(job_id)).args == {"doc_id": 2}
        finally:
            conn.close()
