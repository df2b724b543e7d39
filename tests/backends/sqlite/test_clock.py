"""SQLite's clock: Unix time by default, so a wall-clock `run_at` maps onto it unchanged."""

from __future__ import annotations

import contextlib
import sqlite3
import time

import trio

from nursery_jobs.backends import NewJob
from nursery_jobs.backends.sqlite import SqliteBackend


def test_a_unix_time_clock_has_a_wall_offset_of_exactly_zero(tmp_path):
    assert SqliteBackend(str(tmp_path / "jobs.db")).wall_offset() == 0.0


async def test_a_trio_clock_is_mapped_by_one_pair_of_readings(tmp_path, autojump_clock):
    backend = SqliteBackend(str(tmp_path / "jobs.db"), clock=trio.current_time)
    offset = backend.wall_offset()
    assert abs(trio.current_time() - offset - time.time()) < 5
    await trio.sleep(600)
    assert backend.wall_offset() == offset


async def test_a_claim_reads_its_time_once_it_holds_the_write_lock(tmp_path):
    """Another process holds the write lock while the claim waits for it, and the clock moves
    on meanwhile: the claim's start is counted (`attempted_at`, and the rate key's record) at
    the time it got the lock, not at the time it began to wait. A rate counts starts at that
    time, and the handler starts right after the claim commits."""

    clock = [1_000.0]
    path = str(tmp_path / "jobs.db")
    backend = SqliteBackend(path, clock=lambda: clock[0])  # read from the claim's own thread
    await backend.open()
    try:
        [job] = await backend.insert_many([NewJob("k", "q", "{}", 0, None, 3, None, None, None, "api", 5, 1.0)])
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(backend.claim, "q", 1)
                await trio.sleep(0.2)  # the claim is waiting for the lock (busy_timeout)
                clock[0] = 1_005.0
                other.execute("COMMIT")
        finally:
            other.close()
        info = await backend.get_job(job.id)
        with contextlib.closing(sqlite3.connect(path)) as reader:
            (starts,) = reader.execute("SELECT starts FROM nj_rate WHERE key = 'api'").fetchone()
    finally:
        await backend.close()
    assert info.attempted_at == 1_005.0 and starts == "[1005.0]"
