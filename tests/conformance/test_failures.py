"""Errors reach someone: a crash in a runtime service surfaces from open_runtime."""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj


class Boom(Exception):
    pass


async def test_backend_failure_in_the_completer_surfaces(make_backend, autojump_clock):
    app = nj.App()

    @app.job()
    async def noop(ctx: nj.JobContext) -> None:
        pass

    backend = make_backend()

    async def broken_finish_many(outcomes):
        raise Boom("disk full")

    backend.finish_many = broken_finish_many  # type: ignore[method-assign]
    with pytest.RaisesGroup(Boom, allow_unwrapped=False, flatten_subgroups=True):
        async with nj.open_runtime(app, backend=backend):
            await noop.enqueue()
            await trio.sleep_forever()  # cancelled by the crash, not left hanging


async def test_job_children_belong_to_the_attempt(make_backend, autojump_clock):
    app = nj.App()
    log = []

    async def child(n: int) -> None:
        try:
            await trio.sleep(n)
            log.append(("child done", n))
        finally:
            log.append(("child end", n, trio.current_time()))

    @app.job(timeout=3, max_attempts=1)
    async def fan_out(ctx: nj.JobContext) -> None:
        log.append(("start", trio.current_time()))
        async with ctx.children() as tasks:
            tasks.spawn(child, 1)
            tasks.spawn(child, 10)

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        receipt = await rt.wait(await fan_out.enqueue(), timeout=20)
    assert receipt.error == "timed out after 3 s"
    assert ("child done", 1) in log and ("child done", 10) not in log
    # measured from the attempt's own start: on a durable backend the claim's thread hop may
    # let the (real-time threshold) autojump move the clock before the job starts
    started = next(entry[1] for entry in log if entry[0] == "start")
    assert ("child end", 10, started + 3) in log


async def test_a_child_failing_in_its_cleanup_is_the_jobs_error_not_the_runtimes(make_backend, autojump_clock):
    # The attempt times out; one child's `finally` raises while it is cancelled. The handler
    # lets out a group of the cancellations and that error: the error is this job's (recorded
    # with the timeout), the next job runs, and the runtime goes on.
    app = nj.App()
    app.queue("q", max_workers=1, timeout=1.0)

    @app.job(queue="q", max_attempts=1)
    async def work(ctx: nj.JobContext) -> None:
        async def quiet() -> None:
            await trio.sleep_forever()

        async def loud() -> None:
            try:
                await trio.sleep_forever()
            finally:
                raise ValueError("cleanup failed")  # noqa: B012 - the case under test

        async with ctx.children() as kids:
            kids.spawn(quiet)
            kids.spawn(loud)

    @app.job(queue="q", max_attempts=1)
    async def after(ctx: nj.JobContext) -> None:
        pass

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        first = await rt.wait(await work.enqueue(), timeout=20)
        second = await rt.wait(await after.enqueue(), timeout=20)
    assert first.state is nj.JobState.DISCARDED
    assert first.error is not None and "timed out after 1 s" in first.error and "cleanup failed" in first.error
    assert second.state is nj.JobState.COMPLETED


async def test_a_child_failing_in_the_cleanup_of_a_cancelled_job_is_logged(make_backend, autojump_clock, caplog):
    app = nj.App()
    started = trio.Event()

    @app.job(max_attempts=1)
    async def work(ctx: nj.JobContext) -> None:
        async def loud() -> None:
            try:
                started.set()
                await trio.sleep_forever()
            finally:
                raise ValueError("cleanup failed")  # noqa: B012 - the case under test

        async with ctx.children() as kids:
            kids.spawn(loud)

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        job_id = await work.enqueue()
        with trio.fail_after(20):
            await started.wait()
        await rt.cancel(job_id)
        receipt = await rt.wait(job_id, timeout=20)
    assert receipt.state is nj.JobState.CANCELLED  # asked for: the outcome stays a cancel
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "cleanup_failed"]
    assert "was cut (cancel)" in record.getMessage() and "cleanup failed" in record.getMessage()


async def test_run_blocking_runs_on_a_bounded_thread():
    import threading
    import time

    app = nj.App()
    app.queue("io", max_workers=4, timeout=None)
    peak = 0
    current = 0
    lock = threading.Lock()

    def blocking(n: int) -> int:
        nonlocal peak, current
        with lock:
            current += 1
            peak = max(peak, current)
        time.sleep(0.05)
        with lock:
            current -= 1
        return n * 2

    results = []

    @app.job(queue="io")
    async def offload(ctx: nj.JobContext, n: int) -> None:
        results.append(await nj.run_blocking(blocking, n))

    settings = nj.RuntimeSettings(thread_limit=2)
    async with nj.open_runtime(app, settings=settings) as rt:
        ids = await offload.enqueue_many([{"n": n} for n in range(6)])
        for job_id in ids:
            assert (await rt.wait(job_id, timeout=10)).done
        assert rt.threads.in_flight == 0
    assert sorted(results) == [0, 2, 4, 6, 8, 10] and peak == 2


async def test_run_blocking_is_never_abandoned():
    import time

    app = nj.App()
    finished = []

    def blocking() -> None:
        time.sleep(0.3)
        finished.append(True)

    @app.job(timeout=0.05, max_attempts=1)
    async def offload(ctx: nj.JobContext) -> None:
        await nj.run_blocking(blocking)
        finished.append("handler saw the result")
        await trio.sleep(0)  # the first checkpoint after the thread delivers the timeout

    async with nj.open_runtime(app) as rt:
        receipt = await rt.wait(await offload.enqueue(), timeout=5)
    # the job's timeout fired during the thread, but the attempt only ended once it returned
    assert receipt.error == "timed out after 0.05 s"
    assert finished == [True, "handler saw the result"]


async def test_run_blocking_outside_a_runtime_is_an_error():
    with pytest.raises(nj.RuntimeClosed, match="run_blocking"):
        await nj.run_blocking(print)


async def test_run_blocking_in_the_shutdown_runs_and_after_the_runtime_is_refused():
    """Code still running in the shutdown (a job's grace, main) may offload its cleanup; a task
    that outlived the runtime may not start a thread: it would outlive the runtime too. (Real
    time, in tenths of a second: under the autojump clock virtual time would pass while a
    thread runs.)"""
    app = nj.App()
    seen: list[object] = []

    @app.job(timeout=None)
    async def offload(ctx: nj.JobContext) -> None:
        await trio.sleep(0.2)
        seen.append(await nj.run_blocking(lambda: "in the grace"))
        outside = nursery[0]

        async def outlived() -> None:
            await ended.wait()
            try:
                await nj.run_blocking(lambda: "after")
            except nj.RuntimeClosed as exc:
                seen.append(str(exc))

        outside.start_soon(outlived)

    nursery: list[trio.Nursery] = []
    ended = trio.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as outer:
            nursery.append(outer)
            async with nj.open_runtime(app, grace=5) as rt:
                job_id = await offload.enqueue()
                await trio.sleep(0.1)
                rt.begin_shutdown()
                seen.append(await nj.run_blocking(lambda: "main in the shutdown"))
            ended.set()
    assert seen[:2] == ["main in the shutdown", "in the grace"]
    assert len(seen) == 3 and "after the runtime this task ran under had ended" in str(seen[2])
    assert (await rt.get_job(job_id)).state is nj.JobState.COMPLETED
