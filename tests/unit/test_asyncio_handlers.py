"""asyncio job handlers (`@app.job(asyncio=True)`) on the memory backend: they run through the
trio-asyncio bridge under their attempt's cancel scope, so a cancel, a timeout and a shutdown
reach the asyncio task, and the attempt (and its receipt) ends only after the task's own
cleanup ran. Real time, kept short: the asyncio side sleeps on the asyncio loop."""

from __future__ import annotations


import asyncio

import trio

import nursery_jobs as nj


def _app(log: list[tuple[str, object]]) -> nj.App:
    app = nj.App()
    app.queue("aio", max_workers=2, timeout=None)

    @app.job(queue="aio", asyncio=True, max_attempts=2, retry=nj.RetryPolicy(base=0.05, jitter=0))
    async def aio_work(ctx: nj.JobContext, seconds: float) -> str:
        log.append(("start", ctx.attempt))
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # asyncio cleanup that itself awaits
            log.append(("cleanup", ctx.cancel_reason))
            raise
        log.append(("done", ctx.attempt))
        return "ok"

    @app.job(queue="aio", asyncio=True, timeout=0.2, max_attempts=1)
    async def aio_slow(ctx: nj.JobContext) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            log.append(("cleanup", ctx.cancel_reason))
            raise

    return app


async def test_an_asyncio_handler_completes() -> None:
    log: list[tuple[str, object]] = []
    async with nj.open_runtime(_app(log)) as rt:
        receipt = await rt.wait(await rt.enqueue("aio_work", {"seconds": 0.01}), timeout=10)
    assert receipt.state is nj.JobState.COMPLETED and log == [("start", 1), ("done", 1)]


async def test_cancel_reaches_the_asyncio_task_and_its_cleanup_ends_before_the_receipt() -> None:
    log: list[tuple[str, object]] = []
    async with nj.open_runtime(_app(log)) as rt:
        job_id = await rt.enqueue("aio_work", {"seconds": 30})
        with trio.fail_after(10):  # bounded: a handler that never starts fails, not hangs
            while not log:
                await trio.sleep(0.01)
        await rt.cancel(job_id)
        receipt = await rt.wait(job_id, timeout=10)
        # the receipt answered only after the asyncio cleanup had run
        assert receipt.state is nj.JobState.CANCELLED and log[-1] == ("cleanup", "cancel")


async def test_a_timeout_cancels_the_asyncio_task() -> None:
    log: list[tuple[str, object]] = []
    async with nj.open_runtime(_app(log)) as rt:
        receipt = await rt.wait(await rt.enqueue("aio_slow"), timeout=10)
    assert receipt.state is nj.JobState.DISCARDED and receipt.error == "timed out after 0.2 s"
    assert log == [("cleanup", "timeout")]


async def test_shutdown_interrupts_an_asyncio_handler_after_the_grace() -> None:
    log: list[tuple[str, object]] = []
    backend = nj.MemoryBackend()
    async with nj.open_runtime(_app(log), backend=backend, grace=0.1) as rt:
        job_id = await rt.enqueue("aio_work", {"seconds": 30})
        with trio.fail_after(10):  # bounded: a handler that never starts fails, not hangs
            while not log:
                await trio.sleep(0.01)
    assert log[-1] == ("cleanup", "shutdown") and rt.interrupted == [job_id]
    job = await backend.get_job(job_id)
    assert job.state is nj.JobState.AVAILABLE and job.attempt == 0  # the attempt was given back
