"""SQLite's cache store: calls on the Trio thread that never wait there for the file's write lock
(one that meets it goes to a worker thread and completes when the lock is free), a write inside
the backend's own transaction refused, and the WAL the loop's writes leave checkpointed off the
loop so it does not grow without bound."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Any

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends.sqlite import cache as cache_sqlite
from nursery_jobs.backends.sqlite import SqliteBackend


def _hold_write_lock(path: str, seconds: float, held: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO nj_cache VALUES ('other', '1', 0, 1e12, 1e12) ON CONFLICT DO NOTHING")
        held.set()
        time.sleep(seconds)
        conn.execute("COMMIT")
    finally:
        conn.close()


async def test_a_write_that_meets_the_files_lock_waits_on_a_thread_not_on_the_loop(tmp_path: Any) -> None:
    path = str(tmp_path / "jobs.db")
    async with nj.open_runtime(nj.App(), backend=SqliteBackend(path), queues=[]) as rt:
        await rt.cache.set("k", "before", ttl=60)  # the store is open, its table made
        held = threading.Event()
        locker = threading.Thread(target=_hold_write_lock, args=(path, 1.0, held))
        locker.start()
        try:
            while not held.is_set():
                await trio.sleep(0.01)
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await trio.sleep(0.01)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(tick)
                assert await rt.cache.get("k") == "before"  # a reader never waits for the writer
                await rt.cache.set("k", "after", ttl=60)
                nursery.cancel_scope.cancel()
            assert ticks >= 5  # the loop ran while the write waited for the lock (blocked, it ticks once)
        finally:
            locker.join()
        assert await rt.cache.get("k") == "after"


async def test_a_cache_write_inside_the_backends_own_transaction_is_refused(tmp_path: Any) -> None:
    async with nj.open_runtime(nj.App(), backend=SqliteBackend(str(tmp_path / "jobs.db")), queues=[]) as rt:
        async with rt.transaction():
            with pytest.raises(nj.ConfigError, match="write to the cache after the block"):
                await rt.cache.set("k", 1, ttl=60)
        await rt.cache.set("k", 1, ttl=60)


async def test_the_wal_of_the_loops_writes_is_checkpointed_off_the_loop(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(cache_sqlite, "CHECKPOINT_EVERY", 50)
    path = str(tmp_path / "jobs.db")
    async with nj.open_runtime(nj.App(), backend=SqliteBackend(path), queues=[]) as rt:
        value = "x" * 2_000
        for i in range(50):
            await rt.cache.set(f"k{i}", value, ttl=60)
        after_one_round = os.path.getsize(path + "-wal")
        for i in range(50, 300):
            await rt.cache.set(f"k{i}", value, ttl=60)
        # Checkpointed every 50 writes, the WAL is reused from its start: without it, it would
        # be about six times the size it had after the first 50.
        assert os.path.getsize(path + "-wal") < 2 * after_one_round
