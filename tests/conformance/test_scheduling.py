"""Scheduled jobs, priorities (higher first, FIFO within a priority) and unique jobs."""

from __future__ import annotations

import datetime

import pytest
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
        b = await rt.enqueue("tick", {"name": "run_at10"}, run_at=rt.wall_now() + datetime.timedelta(seconds=10))
        c = await rt.enqueue("tick", {"name": "now"})
        assert (await rt.get_job(a)).state is nj.JobState.SCHEDULED
        for job_id in (a, b, c):
            await rt.wait(job_id, timeout=60)
    assert {k: round(v - t0, 3) for k, v in starts.items()} == {"now": 0.0, "run_at10": 10.0, "delay30": 30.0}


async def test_run_at_is_an_aware_wall_clock_datetime_on_every_backend(make_backend, autojump_clock):
    app = nj.App()

    @app.job()
    async def tick(ctx: nj.JobContext) -> None:
        pass

    async with nj.open_runtime(app, backend=make_backend(), queues=[]) as rt:
        utc = rt.wall_now()
        assert utc.tzinfo is datetime.timezone.utc
        at = (utc + datetime.timedelta(hours=2)).astimezone(datetime.timezone(datetime.timedelta(hours=5)))
        job = await rt.get_job(await tick.options(run_at=at).enqueue())
        # The same instant whatever the zone it is written in, read back as it went in.
        assert job.state is nj.JobState.SCHEDULED and abs(rt.wall_time(job.run_at) - at) < datetime.timedelta(microseconds=2)
        assert abs(job.run_at - rt.now() - 7200) < 1e-3  # two hours on the backend's clock
        past = await rt.get_job(await rt.enqueue(tick, run_at=utc - datetime.timedelta(days=1)))
        assert past.state is nj.JobState.AVAILABLE  # a time already past is due now
        for bad, message in [
            (datetime.datetime(2030, 1, 1), "naive datetime.*pass tzinfo"),
            (rt.now() + 10, "must be an aware datetime.*delay="),
            ("2030-01-01T00:00:00Z", "must be an aware datetime"),
        ]:
            with pytest.raises(nj.ConfigError, match=message):
                tick.options(run_at=bad)  # type: ignore[arg-type]
            with pytest.raises(nj.ConfigError, match=message):
                await rt.enqueue_many(tick, [{}], run_at=bad)  # type: ignore[arg-type]
        assert rt.wall_time(job.created_at) <= rt.wall_now()
        before = rt.wall_now()
        await trio.sleep(60)  # virtual time: the backend's wall clock moves with it
        assert abs(rt.wall_now() - before - datetime.timedelta(minutes=1)) < datetime.timedelta(milliseconds=1)


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


async def test_a_kind_unique_function_keys_every_enqueue_of_the_kind(make_backend, autojump_clock):
    app = nj.App()
    runs = []

    @app.job(unique=lambda args: f"user-{args['user']}" if args["user"] else None)
    async def sync_user(ctx: nj.JobContext, user: int) -> None:
        runs.append(("sync", user))

    @app.job(unique=lambda args: f"user-{args['user']}")
    async def mail_user(ctx: nj.JobContext, user: int) -> None:
        runs.append(("mail", user))

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        # far in the future: on a durable backend autojump may move virtual time during I/O,
        # and the key must stay held until the test frees it
        a = await sync_user.options(delay=10_000).enqueue(user=1)
        b = await sync_user.enqueue(user=1)
        assert b == a and b.existing and not a.existing
        assert (await rt.get_job(a)).unique_key == "sync_user:user-1"
        # scoped to the kind: the same key from another kind is another job
        m = await mail_user.enqueue(user=1)
        assert m != a and not m.existing
        # the function may say "not unique"; an explicit unique_key wins over the function
        free = [await sync_user.enqueue(user=0) for _ in range(2)]
        assert free[0] != free[1] and not any(f.existing for f in free)
        own = await sync_user.options(unique_key="mine").enqueue(user=1)
        assert own != a and (await rt.get_job(own)).unique_key == "mine"
        # enqueue_many: a key per job, and a key twice in one batch is one job
        many = await sync_user.enqueue_many([{"user": 2}, {"user": 1}, {"user": 2}, {"user": 3}])
        assert many[1] == a and many[0] == many[2] and len({many[0], many[1], many[3]}) == 3
        assert [i.existing for i in many] == [False, True, True, False]
        for job_id in (m, own, *free, many[0], many[3]):
            assert (await rt.wait(job_id, timeout=30)).done
        await rt.cancel(a)  # final now: the key is free again
        again = await sync_user.enqueue(user=1)
        assert again != a and not again.existing
        assert (await rt.wait(again, timeout=30)).done
    assert sorted(runs) == sorted(
        [("mail", 1), ("sync", 0), ("sync", 0), ("sync", 1), ("sync", 2), ("sync", 3), ("sync", 1)]
    )


async def test_a_unique_function_returning_a_non_string_is_a_clear_error(make_backend, autojump_clock):
    app = nj.App()

    @app.job(unique=lambda args: args["n"])
    async def numbered(ctx: nj.JobContext, n: int) -> None:
        pass

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        with pytest.raises(nj.ConfigError, match="must return a non-empty str or None, not 7"):
            await numbered.enqueue(n=7)
        assert all(q.queued == 0 for q in (await rt.stats()).values())


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


async def test_one_job_per_key_under_concurrent_enqueues_from_several_processes(store):
    """Several instances on one store (separate connections, as separate processes) enqueue
    the same keys at once: the store, not a check-then-insert, keeps one job per key. Real time:
    the race is between real connections."""
    import random

    keys, callers = 60, 3
    app = nj.App()

    @app.job()
    async def sync_account(ctx: nj.JobContext, account: int) -> None:
        pass

    backends = [store.open() for _ in range(callers)]
    got: dict[int, list[nj.JobId]] = {k: [] for k in range(keys)}

    async def caller(backend: nj.Backend, seed: int) -> None:
        order = list(range(keys))
        random.Random(seed).shuffle(order)
        # enqueue-only: nothing runs, so every key stays held for the whole race
        async with nj.open_runtime(app, backend=backend, queues=[]) as rt:
            for k in order:
                got[k].append(await rt.enqueue("sync_account", {"account": k}, unique_key=f"acct:{k}"))

    try:
        async with trio.open_nursery() as nursery:
            for i, backend in enumerate(backends):
                nursery.start_soon(caller, backend, i)
        await backends[0].open()
        counts = await backends[0].stats()
    finally:
        for backend in backends:
            await backend.close()
    for k, ids in got.items():
        assert len(ids) == callers
        assert len(set(ids)) == 1, f"key {k}: callers got different jobs {ids}"
        assert sum(not i.existing for i in ids) == 1, f"key {k}: {[i.existing for i in ids]}"
    assert sum(c.available for c in counts.values()) == keys
