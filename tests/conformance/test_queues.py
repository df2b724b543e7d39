"""Queues are isolated pools: limits hold, and a hung queue never delays another."""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj


async def test_blocked_webhook_queue_does_not_delay_index_jobs(make_backend, autojump_clock):
    # Each queue has its own pool, so a slow endpoint must not slow anything else: fill the
    # webhook queue with jobs that never finish and check that index jobs still finish on time.
    app = nj.App()
    app.queue("index", max_workers=4, timeout=30)
    app.queue("webhook", max_workers=8, timeout=None)
    finished = {}

    @app.job(queue="webhook")
    async def deliver(ctx: nj.JobContext, n: int) -> None:
        await trio.sleep_forever()

    @app.job(queue="index")
    async def index(ctx: nj.JobContext, doc: int) -> None:
        await trio.sleep(1)
        finished[doc] = trio.current_time()

    async with nj.open_runtime(app, backend=make_backend(), grace=0) as rt:
        await deliver.enqueue_many([{"n": n} for n in range(50)])
        await trio.sleep(0.5)
        t0 = trio.current_time()
        ids = await index.enqueue_many([{"doc": d} for d in range(8)])
        for job_id in ids:
            assert (await rt.wait(job_id, timeout=10)).state is nj.JobState.COMPLETED
        stats = await rt.stats()
    assert sorted(round(t - t0, 6) for t in finished.values()) == [1.0] * 4 + [2.0] * 4
    assert stats["webhook"].running == 8 and stats["webhook"].available == 42


async def test_running_jobs_never_exceed_max_workers(make_backend, autojump_clock):
    app = nj.App()
    app.queue("narrow", max_workers=3, timeout=None)
    now_running = 0
    peak = 0

    @app.job(queue="narrow")
    async def unit(ctx: nj.JobContext, d: int) -> None:
        nonlocal now_running, peak
        now_running += 1
        peak = max(peak, now_running)
        try:
            await trio.sleep(d)
        finally:
            now_running -= 1

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        ids = await unit.enqueue_many([{"d": 1 + n % 3} for n in range(30)])
        await trio.sleep(0.5)
        assert (await rt.stats())["narrow"].running == 3
        for job_id in ids:
            await rt.wait(job_id, timeout=100)
    assert peak == 3


async def test_enqueue_only_runtime_claims_nothing(make_backend, autojump_clock):
    app = nj.App()

    @app.job()
    async def noop(ctx: nj.JobContext) -> None:
        pass

    backend = make_backend()
    async with nj.open_runtime(app, backend=backend, queues=[]) as web:
        job_id = await noop.enqueue()
        receipt = await web.wait(job_id, timeout=1)
        assert not receipt.done and receipt.state is nj.JobState.AVAILABLE
        # a worker runtime on the same backend does the work; the web runtime sees the receipt
        async with nj.open_runtime(app, backend=backend, queues=["default"]):
            assert (await web.wait(job_id, timeout=5)).state is nj.JobState.COMPLETED


async def test_unknown_queue_in_runtime_is_a_config_error(make_backend):
    app = nj.App()
    with pytest.raises(nj.ConfigError, match="not declared"):
        async with nj.open_runtime(app, backend=make_backend(), queues=["nope"]):
            pass


async def test_stats_say_whose_each_counter_is_and_count_jobs_apart_from_attempts(make_backend, autojump_clock):
    app = nj.App()
    app.queue("work", max_workers=2, timeout=None)
    release = trio.Event()

    @app.job(queue="work")
    async def hold(ctx: nj.JobContext) -> None:
        await release.wait()

    @app.job(queue="work", max_attempts=2, retry=nj.RetryPolicy(base=1.0, jitter=0.0))
    async def broken(ctx: nj.JobContext) -> None:
        raise RuntimeError("always")

    backend = make_backend()
    async with nj.open_runtime(app, backend=backend) as rt:
        held = [await hold.enqueue() for _ in range(3)]
        while (await rt.stats())["work"].running < 2:
            await trio.sleep(0.01)
        # A second runtime on the same backend that runs no worker: another process's view.
        async with nj.open_runtime(app, backend=backend, queues=[]) as other:
            here, there = (await rt.stats())["work"], (await other.stats())["work"]
        assert (here.max_workers_here, here.running_here, here.running, here.queued) == (2, 2, 2, 1)
        assert (there.max_workers_here, there.running_here, there.running) == (0, 0, 2)  # fleet-wide
        release.set()
        for job_id in held:
            await rt.wait(job_id, timeout=10)
        gone = await broken.enqueue()
        assert (await rt.wait(gone, timeout=10)).state is nj.JobState.DISCARDED
        work = (await rt.stats())["work"]
    # Two failed attempts, one failed job.
    assert (work.failed_attempts, work.discarded, work.completed, work.interrupted_attempts) == (2, 1, 3, 0)
    assert (work.running, work.running_here) == (0, 0)


async def test_the_default_queue_is_listed_only_when_used(make_backend, autojump_clock):
    app = nj.App()
    app.queue("work", max_workers=1)

    @app.job(queue="work")
    async def task(ctx: nj.JobContext) -> None:
        pass

    backend = make_backend()
    async with nj.open_runtime(app, backend=backend) as rt:
        assert list(await rt.stats()) == ["work"]
    used = nj.App()

    @used.job()
    async def other(ctx: nj.JobContext) -> None:
        pass

    async with nj.open_runtime(used, backend=backend) as rt:
        assert list(await rt.stats()) == ["default"]
