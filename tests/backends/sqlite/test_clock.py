"""SQLite's clock: Unix time by default, so a wall-clock `run_at` maps onto it unchanged."""

from __future__ import annotations

import time

import trio

from nursery_jobs.backends.sqlite import SqliteBackend


def test_a_unix_time_clock_has_a_wall_offset_of_exactly_zero(tmp_path):
    assert SqliteBackend(str(tmp_path / "jobs.db")).wall_offset() == 0.0


async def test_a_trio_clock_is_mapped_by_one_pair_of_readings(tmp_path, autojump_clock):
    backend = SqliteBackend(str(tmp_path / "jobs.db"), clock=trio.current_time)
    offset = backend.wall_offset()
    assert abs(trio.current_time() - offset - time.time()) < 5
    await trio.sleep(600)
    assert backend.wall_offset() == offset
