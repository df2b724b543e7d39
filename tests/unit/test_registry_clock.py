"""The test harness's virtual time on SQLite (`tests/registry.py`): the clock never jumps while a
statement of a watched backend runs on its thread, also while the backend's own `transaction()`
block is open. There a write of the backend's connection may be waiting for the block's write
lock (not counted: the block ends only when virtual time goes on), but a read never waits for it
(WAL), so it is work under way; uncounted, the clock jumped to the next deadline while a
`get_job` or a service's read ran beside an open block."""

from __future__ import annotations

import time

import pytest
import trio

from tests import registry


def test_the_clock_waits_for_a_read_while_a_transaction_block_is_open(request: pytest.FixtureRequest) -> None:
    backend = registry.get("sqlite").new_store(request).open()
    clock = registry.query_aware_clock(0.0, registry.watched(request))

    def slow_read() -> int:
        time.sleep(0.2)  # a read that takes its time, as any may on a loaded machine
        assert backend._conn is not None
        (n,) = backend._conn.execute("SELECT count(*) FROM nj_jobs").fetchone()
        return int(n)

    async def main() -> tuple[float, float, int]:
        await backend.open()
        try:
            async with backend.transaction():
                before = trio.current_time()
                with trio.move_on_after(30):  # the deadline a jump would go to
                    n = await backend._call(slow_read)
                return before, trio.current_time(), n
        finally:
            await backend.close()

    before, after, n = trio.run(main, clock=clock)
    assert n == 0 and after == before  # before the harness counted reads: after == before + 30
