"""`nj.run(main, main_grace=...)` and `rt.shutdown_requested`: a service's main drains before the jobs do.

`run`'s body (`runtime._serve`) runs here inside the test's own Trio run, under the autojump
MockClock, and the signals are real ones sent to this process (Trio's signal receiver takes
them), so every duration below is exact virtual time.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import AsyncIterator

import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs.runtime import _serve


def _app(log: list) -> nj.App:
    app = nj.App()

    @app.job(timeout=None)
    async def work(ctx: nj.JobContext, seconds: float) -> None:
        log.append(("start", ctx.id, trio.current_time()))
        try:
            await trio.sleep(seconds)
            log.append(("done", ctx.id, trio.current_time()))
        except trio.Cancelled:
            log.append((ctx.cancel_reason, ctx.id, trio.current_time()))
            raise

    return app


def _signal() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


async def test_a_main_that_drains_within_main_grace_finishes_its_work_and_is_not_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list = []
    app = _app(log)
    seen: dict[str, object] = {}

    async def main(rt: nj.Runtime) -> str:
        t0 = trio.current_time()
        _signal()
        await rt.shutdown_requested.wait()  # a server's shutdown_trigger
        seen["requested_at"] = trio.current_time() - t0
        seen["closing"] = rt.closing
        # The request in flight goes on: it enqueues, its job runs, its receipt arrives.
        await trio.sleep(3)
        job_id = await rt.enqueue("work", {"seconds": 1})
        seen["receipt"] = (await rt.wait(job_id, timeout=5)).state
        seen["returned_at"] = trio.current_time() - t0
        return "drained"

    assert await _serve(main, app, "memory://", None, None, None, 10) is None  # after a signal: None
    assert seen == {
        "requested_at": 0,
        "closing": False,
        "receipt": nj.JobState.COMPLETED,
        "returned_at": 4,
    }


async def test_a_main_that_does_not_return_is_cancelled_when_main_grace_ends(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    app = _app([])
    ended: list[float] = []

    async def main(rt: nj.Runtime) -> None:
        t0 = trio.current_time()
        _signal()
        try:
            await trio.sleep(3600)  # ignores shutdown_requested
        finally:
            ended.append(trio.current_time() - t0)

    with caplog.at_level(logging.WARNING, logger="nursery_jobs"):
        assert await _serve(main, app, "memory://", None, None, None, 5) is None
    assert ended == [5]
    assert "main did not return within main_grace (5 s) after the signal" in caplog.text


async def test_the_jobs_grace_begins_when_main_has_returned(autojump_clock: trio.testing.MockClock) -> None:
    log: list = []
    app = _app(log)

    async def main(rt: nj.Runtime) -> None:
        await rt.enqueue("work", {"seconds": 9})
        await trio.sleep(1)
        _signal()
        await rt.shutdown_requested.wait()
        await trio.sleep(4)  # the drain: the job runs on meanwhile

    t0 = trio.current_time()
    await _serve(main, app, "memory://", 5, None, None, 30)
    # Started at 0, main returned at 5, the job's 5 s grace ends at 10: its 9 s finish inside it.
    assert [entry[0] for entry in log] == ["start", "done"]
    assert log[1][2] - t0 == 9


async def test_a_second_signal_cancels_main_and_skips_the_jobs_grace(autojump_clock: trio.testing.MockClock) -> None:
    log: list = []
    app = _app(log)
    ended: list[float] = []

    async def main(rt: nj.Runtime) -> None:
        await rt.enqueue("work", {"seconds": 3600})
        await trio.sleep(1)
        t0 = trio.current_time()
        _signal()
        await trio.sleep(2)
        _signal()
        try:
            await trio.sleep(3600)
        finally:
            ended.append(trio.current_time() - t0)

    await _serve(main, app, "memory://", 60, None, None, 60)
    assert ended == [2]
    assert [entry[0] for entry in log] == ["start", "shutdown"]
    assert log[1][2] == log[0][2] + 3  # interrupted at the second signal, no grace


async def test_without_main_grace_the_first_signal_still_cancels_main_and_stops_claiming(
    autojump_clock: trio.testing.MockClock,
) -> None:
    app = _app([])
    seen: list[tuple[bool, bool]] = []

    async def main(rt: nj.Runtime) -> None:
        _signal()
        try:
            await trio.sleep(3600)
        finally:
            seen.append((rt.shutdown_requested.is_set(), rt.closing))

    await _serve(main, app, "memory://", None, None, None, None)
    assert seen == [(True, True)]


async def test_begin_shutdown_sets_shutdown_requested(autojump_clock: trio.testing.MockClock) -> None:
    app = _app([])
    async with nj.open_runtime(app) as rt:
        assert not rt.shutdown_requested.is_set()
        rt.begin_shutdown()
        assert rt.shutdown_requested.is_set()
        with pytest.raises(nj.RuntimeClosed):
            await rt.enqueue("work", {"seconds": 0})


async def test_leaving_open_runtime_sets_shutdown_requested(autojump_clock: trio.testing.MockClock) -> None:
    async with nj.open_runtime(nj.App()) as rt:
        pass
    assert rt.shutdown_requested.is_set()


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), True, "5"])
def test_main_grace_must_be_a_finite_number_of_seconds(bad: object) -> None:
    async def main(rt: nj.Runtime) -> None:
        raise AssertionError("not reached")

    with pytest.raises(nj.ConfigError, match="main_grace must be None or a finite number of seconds >= 0"):
        nj.run(main, app=nj.App(), main_grace=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("main_grace", [None, 5])
async def test_a_signal_while_the_runtime_starts_is_not_lost(
    main_grace: float | None, autojump_clock: trio.testing.MockClock
) -> None:
    app = _app([])
    seen: list[tuple[bool, bool, bool]] = []

    @app.resource
    async def signalling() -> AsyncIterator[None]:
        _signal()  # arrives while the runtime opens its resources, before main exists
        await trio.sleep(1)
        yield

    async def main(rt: nj.Runtime) -> None:
        cancelled = True
        try:
            await trio.sleep(0)
            cancelled = False
        finally:
            seen.append((rt.shutdown_requested.is_set(), rt.closing, cancelled))

    await _serve(main, app, "memory://", None, None, None, main_grace)
    # Without main_grace, main is cancelled at its first checkpoint and the runtime is closing;
    # with it, main runs, told by shutdown_requested, and enqueues are still accepted.
    assert seen == [(True, True, True)] if main_grace is None else [(True, False, False)]
