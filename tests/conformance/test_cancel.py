"""Cancellation: pending jobs never start, running jobs end as cancelled, final jobs stay final."""

from __future__ import annotations

import trio

import nursery_jobs as nj


async def test_cancel_pending_job_never_starts(make_backend, autojump_clock):
    app = nj.App()
    ran = []

    @app.job()
    async def later(ctx: nj.JobContext) -> None:
        ran.append(ctx.id)

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        job_id = await later.options(delay=10).enqueue()
        assert await rt.cancel(job_id) is nj.JobState.CANCELLED
        assert await rt.cancel(job_id) is nj.JobState.CANCELLED  # idempotent
        await trio.sleep(20)
        job = await rt.get_job(job_id)
    assert ran == [] and job.state is nj.JobState.CANCELLED and job.attempt == 0


async def test_cancel_running_job_cancels_its_scope_and_runs_cleanup(make_backend, autojump_clock):
    app = nj.App()
    events = []
    started = trio.Event()

    @app.job()
    async def long(ctx: nj.JobContext) -> None:
        started.set()
        try:
            await trio.sleep(3600)
        finally:
            events.append(("cleanup", trio.current_time()))

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        job_id = await long.enqueue()
        await started.wait()
        t_cancel = trio.current_time()
        assert await rt.cancel(job_id) is nj.JobState.RUNNING
        receipt = await rt.wait(job_id, timeout=5)
        job = await rt.get_job(job_id)
    assert receipt.state is nj.JobState.CANCELLED
    assert events == [("cleanup", t_cancel)]  # no virtual time elapsed
    assert job.attempt == 1 and job.errors == ()


async def test_cancel_after_completion_is_a_no_op(make_backend, autojump_clock):
    app = nj.App()

    @app.job()
    async def quick(ctx: nj.JobContext) -> None:
        pass

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        job_id = await quick.enqueue()
        await rt.wait(job_id, timeout=5)
        assert await rt.cancel(job_id) is nj.JobState.COMPLETED
        assert (await rt.get_job(job_id)).state is nj.JobState.COMPLETED


async def test_cancel_of_a_retrying_job_stops_its_retries(make_backend, autojump_clock):
    app = nj.App()
    attempts = []

    @app.job(retry=nj.RetryPolicy(base=5, factor=1, cap=5, jitter=0))
    async def failing(ctx: nj.JobContext) -> None:
        attempts.append(ctx.attempt)
        raise OSError("down")

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        job_id = await failing.enqueue()
        await trio.sleep(1)
        assert (await rt.get_job(job_id)).state is nj.JobState.RETRYABLE
        await rt.cancel(job_id)
        await trio.sleep(100)
        job = await rt.get_job(job_id)
    assert attempts == [1] and job.state is nj.JobState.CANCELLED


async def test_cancel_does_not_touch_other_jobs(make_backend, autojump_clock):
    app = nj.App()
    done = []

    @app.job()
    async def work(ctx: nj.JobContext, n: int) -> None:
        await trio.sleep(5)
        done.append(n)

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        ids = await work.enqueue_many([{"n": n} for n in range(4)])
        await trio.sleep(1)
        await rt.cancel(ids[1])
        receipts = [await rt.wait(i, timeout=20) for i in ids]
    assert [r.state for r in receipts] == [
        nj.JobState.COMPLETED,
        nj.JobState.CANCELLED,
        nj.JobState.COMPLETED,
        nj.JobState.COMPLETED,
    ]
    assert sorted(done) == [0, 2, 3]


async def test_cancel_unknown_job_raises(make_backend, autojump_clock):
    import pytest

    app = nj.App()
    async with nj.open_runtime(app, backend=make_backend()) as rt:
        with pytest.raises(nj.JobNotFound, match="no job with id 999"):
            await rt.cancel(999)
        with pytest.raises(nj.JobNotFound):
            await rt.get_job(999)
        with pytest.raises(nj.JobNotFound):
            await rt.wait(999, timeout=1)


async def test_the_handler_can_tell_why_it_is_cancelled(make_backend, autojump_clock):
    app = nj.App()
    reasons = {}

    @app.job(timeout=None)
    async def watch(ctx: nj.JobContext, name: str, limit: float | None = None) -> None:
        assert ctx.cancel_reason is None
        try:
            with trio.fail_after(limit) if limit else trio.CancelScope():
                await trio.sleep(3600)
        finally:
            reasons[name] = ctx.cancel_reason

    @app.job(timeout=2, max_attempts=1)
    async def short(ctx: nj.JobContext) -> None:
        try:
            await trio.sleep(3600)
        except trio.Cancelled as exc:
            reasons["timeout"] = (ctx.cancel_reason, exc)
            raise

    async with nj.open_runtime(app, backend=make_backend(), grace=1) as rt:
        cancelled = await watch.enqueue(name="cancel")
        await rt.wait(await short.enqueue(), timeout=5)
        await rt.cancel(cancelled)
        await rt.wait(cancelled, timeout=5)
        await watch.enqueue(name="shutdown")
        await trio.sleep(0.5)
    assert reasons["cancel"] == "cancel" and reasons["shutdown"] == "shutdown"
    assert reasons["timeout"][0] == "timeout"
