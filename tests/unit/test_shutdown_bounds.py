"""Shutdown stays bounded when the backend stops answering (a database that hangs without
closing the connection): `open_runtime` exits within `grace + 3 * flush_bound` and says which
outcomes it could not write."""

from __future__ import annotations

import faulthandler
import logging

import pytest
import trio

import nursery_jobs as nj


class HangingBackend(nj.MemoryBackend):
    """Memory, until `hang` is set: then outcome writes, or claims, never answer."""

    def __init__(self) -> None:
        super().__init__()
        self.hang_finish = False
        self.hang_claim = False

    async def finish_many(self, outcomes):
        if self.hang_finish:
            await trio.sleep_forever()
        await super().finish_many(outcomes)

    async def claim(self, queue, limit):
        if self.hang_claim:
            await trio.sleep_forever()
        return await super().claim(queue, limit)


@pytest.fixture(autouse=True)
def _fail_loudly_if_the_shutdown_hangs():
    # A shutdown that waits in a shield for ever deadlocks MockClock too (no deadline left to
    # jump to): without this a regression would hang the suite instead of failing it.
    faulthandler.dump_traceback_later(60, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _app() -> nj.App:
    app = nj.App()

    @app.job(timeout=None)
    async def work(ctx: nj.JobContext, seconds: float) -> None:
        await trio.sleep(seconds)

    return app


async def test_outcome_writes_that_never_answer_cannot_hang_the_shutdown(autojump_clock, caplog):
    backend = HangingBackend()
    settings = nj.RuntimeSettings(grace=1, flush_bound=0.5)
    with trio.fail_after(100):  # a hang shows up as this error, not as a stuck test
        async with nj.open_runtime(_app(), backend=backend, settings=settings) as rt:
            quick = await rt.enqueue("work", {"seconds": 0})
            assert (await rt.wait(quick, timeout=5)).done
            backend.hang_finish = True
            done_soon = await rt.enqueue("work", {"seconds": 0.5})
            cut = await rt.enqueue("work", {"seconds": 60})
            await trio.sleep(0.1)
            t0 = trio.current_time()
        elapsed = trio.current_time() - t0
    assert elapsed <= 1 + 3 * 0.5 + 1e-6
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("did not take the last outcomes within flush_bound (0.5 s)" in e for e in errors), errors
    unwritten = next(e for e in errors if "not written" in e)
    assert f"job {done_soon}" in unwritten and f"job {cut}" in unwritten


async def test_a_claim_that_never_answers_is_cut_at_the_flush_bound(autojump_clock, caplog):
    backend = HangingBackend()
    backend.never_yields = False  # claims round-trip, as on a durable backend
    settings = nj.RuntimeSettings(grace=1, flush_bound=0.5)
    with trio.fail_after(100):
        async with nj.open_runtime(_app(), backend=backend, settings=settings) as rt:
            backend.hang_claim = True
            await rt.enqueue("work", {"seconds": 0})  # wakes the fetcher into a claim that hangs
            await trio.sleep(0.1)
            t0 = trio.current_time()
        elapsed = trio.current_time() - t0
    assert elapsed <= 1 + 3 * 0.5 + 1e-6
    assert "did not answer within flush_bound (0.5 s)" in caplog.text
