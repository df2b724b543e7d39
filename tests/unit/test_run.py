"""`nj.run`: hands the runtime the service's whole life; signals start the graceful shutdown."""

from __future__ import annotations

import os
import signal

import pytest
import trio
import trio.testing

import nursery_jobs as nj


def _app(log: list) -> nj.App:
    app = nj.App()

    @app.job()
    async def work(ctx: nj.JobContext, seconds: float) -> None:
        log.append(("start", ctx.id))
        try:
            await trio.sleep(seconds)
            log.append(("done", ctx.id))
        except trio.Cancelled:
            log.append(("cancelled", ctx.id))
            raise

    return app


def test_run_returns_mains_value():
    log: list = []
    app = _app(log)

    async def main(rt: nj.Runtime) -> str:
        job_id = await rt.enqueue("work", {"seconds": 0})
        return (await rt.wait(job_id, timeout=5)).state.value

    assert nj.run(main, app=app) == "completed"


def test_first_signal_is_a_graceful_shutdown_that_lets_jobs_finish():
    log: list = []
    app = _app(log)
    backend = nj.MemoryBackend()

    async def main(rt: nj.Runtime) -> str:
        await rt.enqueue("work", {"seconds": 0.2})
        await trio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
        await trio.sleep(30)
        return "not reached"

    assert nj.run(main, app=app, backend=backend, grace=10) is None
    assert log == [("start", 1), ("done", 1)]


def test_second_signal_skips_the_grace():
    log: list = []
    app = _app(log)
    backend = nj.MemoryBackend()

    @app.job()
    async def resender(ctx: nj.JobContext) -> None:
        # Runs during the grace period: plays the operator who presses Ctrl-C again.
        await trio.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)

    async def main(rt: nj.Runtime) -> None:
        ids = [await rt.enqueue("work", {"seconds": 60}), await rt.enqueue("resender", {})]
        with trio.fail_after(10):  # both must be running: the first signal stops claiming
            while (await rt.stats())["default"].running < 2:
                await trio.sleep(0.01)
        assert ids
        os.kill(os.getpid(), signal.SIGINT)
        await trio.sleep(30)

    import time

    start = time.monotonic()
    assert nj.run(main, app=app, backend=backend, grace=30) is None
    assert time.monotonic() - start < 10
    assert ("cancelled", 1) in log

    async def check() -> nj.Job:
        return await backend.get_job(1)

    job = trio.run(check)
    assert job.state is nj.JobState.AVAILABLE and job.attempt == 0


def test_main_exception_propagates_after_shutdown():
    app = _app([])

    async def main(rt: nj.Runtime) -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):  # one error: run() shows it without the groups
        nj.run(main, app=app)


def test_first_signal_stops_claiming_while_main_still_unwinds():
    app = nj.App()
    app.queue("q", max_workers=2, timeout=30)
    started = []
    signalled = []

    @app.job(queue="q")
    async def work(ctx: nj.JobContext) -> None:
        started.append(trio.current_time())
        await trio.sleep(0.05)

    async def main(rt: nj.Runtime) -> None:
        await work.enqueue_many({} for _ in range(200))
        await trio.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)
        try:
            await trio.sleep(10)
        except trio.Cancelled:
            signalled.append(trio.current_time())
            with trio.CancelScope(shield=True):
                await trio.sleep(0.5)  # main's own shielded cleanup
            raise

    assert nj.run(main, app=app, grace=5) is None
    assert signalled and started
    assert not [t for t in started if t > signalled[0]]


def test_grace_from_settings_is_used_when_no_grace_argument_is_given():
    app = nj.App()

    @app.job(timeout=None)
    async def long(ctx: nj.JobContext) -> None:
        await trio.sleep(3600)

    async def main() -> float:
        async with nj.open_runtime(app, settings=nj.RuntimeSettings(grace=7)) as rt:
            await long.enqueue()
            await trio.sleep(0.1)
            t0 = trio.current_time()
        return trio.current_time() - t0

    elapsed = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert elapsed == pytest.approx(7)


def test_a_single_error_leaves_run_unwrapped():
    app = nj.App()

    @app.job()
    async def exits(ctx: nj.JobContext) -> None:
        raise SystemExit(3)

    async def main(rt: nj.Runtime) -> None:
        await exits.enqueue()
        await trio.sleep(10)

    with pytest.raises(SystemExit) as info:
        nj.run(main, app=app, grace=0)
    assert info.value.code == 3
