"""Bounded in-request waiting for a job's receipt."""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj


async def test_wait_returns_not_done_at_exactly_its_bound(make_backend, autojump_clock):
    app = nj.App()

    @app.job()
    async def slow(ctx: nj.JobContext) -> None:
        await trio.sleep(10)

    async with nj.open_runtime(app, backend=make_backend(), grace=0) as rt:
        job_id = await slow.enqueue()
        t0 = trio.current_time()
        receipt = await rt.wait(job_id, timeout=2)
        assert trio.current_time() - t0 == pytest.approx(2)
        assert receipt == nj.Receipt(job_id, False, nj.JobState.RUNNING, None)
        receipt = await rt.wait(job_id, timeout=100)
        assert receipt.done and trio.current_time() - t0 == pytest.approx(10)


async def test_wait_on_a_finished_job_answers_at_once(make_backend, autojump_clock):
    app = nj.App()

    @app.job()
    async def quick(ctx: nj.JobContext) -> None:
        pass

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        job_id = await quick.enqueue()
        await trio.sleep(1)
        t0 = trio.current_time()
        receipt = await rt.wait(job_id, timeout=5)
        assert receipt.done and trio.current_time() == t0


async def test_waiters_beyond_the_limit_answer_not_done_at_once(make_backend, autojump_clock):
    app = nj.App()

    @app.job()
    async def slow(ctx: nj.JobContext) -> None:
        await trio.sleep(10)

    settings = nj.RuntimeSettings(max_waiters=2)
    results = []

    async def waiter(rt: nj.Runtime, job_id: int) -> None:
        results.append((await rt.wait(job_id, timeout=20), trio.current_time()))

    async with nj.open_runtime(app, backend=make_backend(), settings=settings) as rt:
        job_id = await slow.enqueue()
        t0 = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(waiter, rt, job_id)
    done = sorted((r.done, round(t - t0, 6)) for r, t in results)
    assert done == [(False, 0.0), (True, 10.0), (True, 10.0)]


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), "2"])
async def test_wait_needs_a_finite_bound(make_backend, autojump_clock, bad):
    app = nj.App()
    async with nj.open_runtime(app, backend=make_backend()) as rt:
        with pytest.raises(nj.ConfigError, match="every wait is bounded"):
            await rt.wait(1, timeout=bad)


async def test_a_receipt_awaited_in_another_process_polls_at_the_queues_interval(store, autojump_clock):
    """A receipt awaited in another process than the one running the job (an enqueue-only web
    process) learns of the outcome within the job's queue's `poll_interval`, not the backend's
    (60 s here): two instances on one store deliver nothing in-process to each other."""
    app = nj.App()
    app.queue("search", max_workers=2, timeout=30, poll_interval=0.1)
    finished_at: list[float] = []

    @app.job(queue="search")
    async def index(ctx: nj.JobContext) -> None:
        await trio.sleep(1.03)
        finished_at.append(trio.current_time())

    async with nj.open_runtime(app, backend=store.open(), queues=[]) as web:
        async with nj.open_runtime(app, backend=store.open(), queues=["search"]):
            job_id = await index.enqueue()
            receipt = await web.wait(job_id, timeout=10)
            assert receipt.state is nj.JobState.COMPLETED
            answered = trio.current_time()
    assert 0 <= answered - finished_at[0] <= 0.1 + 1e-6
