"""Scheduled jobs, priorities (higher first, FIFO within a priority) and unique jobs."""

from __future__ import annotations

import trio

import nursery_jobs as nj


async def test_delayed_and_run_at_jobs_start_on_time(make_backend, autojump_clock):
    app = nj.App()
    starts = {}

    @app.job()
    async def tick(ctx: nj.JobContext, name: str) -> None:
        starts[name] = trio.current_time()

    backend = make_backend()
    async with nj.open_runtime(app, backend=backend) as rt:
        t0 = trio.current_time()
        a = await tick.options(delay=30).enqueue(name="delay30")
        b = await rt.enqueue("tick", {"name": "run_at10"}, run_at=backend.now() + 10)
        c = await rt.enqueue("tick", {"name": "now"})
        assert (await rt.get_job(a)).state is nj.JobState.SCHEDULED
        for job_id in (a, b, c):
            await rt.wait(job_id, timeout=60)
    assert {k: round(v - t0, 6) for k, v in starts.items()} == {"now": 0.0, "run_at10": 10.0, "delay30": 30.0}


async def test_higher_priority_first_then_fifo(make_backend, autojump_clock):
    app = nj.App()
    app.queue("serial", max_workers=1, timeout=None)
    order = []

    @app.job(queue="serial")
    async def step(ctx: nj.JobContext, name: str) -> None:
        order.append(name)
        await trio.sleep(1)

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        first = await step.enqueue(name="first")  # claimed at once, before the others exist
        await trio.sleep(0.5)
        await step.enqueue(name="low-a")
        await step.options(priority=5).enqueue(name="high-a")
        await step.enqueue(name="low-b")
        await step.options(priority=5).enqueue(name="high-b")
        last = await step.options(priority=-1).enqueue(name="lowest")
        await rt.wait(first, timeout=10)
        await rt.wait(last, timeout=10)
    assert order == ["first", "high-a", "high-b", "low-a", "low-b", "lowest"]


async def test_kind_default_priority(make_backend, autojump_clock):
    app = nj.App()
    app.queue("serial", max_workers=1, timeout=None)
    order = []

    @app.job(queue="serial")
    async def blocker(ctx: nj.JobContext) -> None:
        await trio.sleep(1)

    @app.job(queue="serial", priority=10)
    async def urgent(ctx: nj.JobContext) -> None:
        order.append("urgent")

    @app.job(queue="serial")
    async def normal(ctx: nj.JobContext) -> None:
        order.append("normal")

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        await blocker.enqueue()
        await trio.sleep(0.1)
        n = await normal.enqueue()
        u = await urgent.enqueue()
        await rt.wait(n, timeout=10)
        await rt.wait(u, timeout=10)
    assert order == ["urgent", "normal"]


async def test_unique_key_returns_the_existing_job_until_it_is_final(make_backend, autojump_clock):
    app = nj.App()
    runs = []

    @app.job()
    async def sync_account(ctx: nj.JobContext, account: int) -> None:
        runs.append(account)

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        a = await rt.enqueue("sync_account", {"account": 1}, unique_key="acct:1", delay=5)
        b = await rt.enqueue("sync_account", {"account": 1}, unique_key="acct:1")
        other = await sync_account.options(unique_key="acct:2").enqueue(account=2)
        assert a == b and other != a
        assert (a.existing, b.existing, other.existing) == (False, True, False)
        await rt.wait(a, timeout=10)
        c = await rt.enqueue("sync_account", {"account": 1}, unique_key="acct:1")
        assert c != a
        await rt.wait(c, timeout=10)
        await rt.wait(other, timeout=10)
    assert sorted(runs) == [1, 1, 2]


async def test_enqueue_many_is_one_batch_in_order(make_backend, autojump_clock):
    app = nj.App()
    seen = []

    @app.job()
    async def item(ctx: nj.JobContext, n: int) -> None:
        seen.append(n)

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        ids = await item.enqueue_many([{"n": n} for n in range(50)])
        assert ids == sorted(ids) and len(set(ids)) == 50
        assert await item.enqueue_many([]) == []
        for i in ids:
            await rt.wait(i, timeout=10)
    assert sorted(seen) == list(range(50))
