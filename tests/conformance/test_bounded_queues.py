"""Bounded queues (`app.queue(..., max_length=N, push_timeout=T)`), on every backend: an
enqueue into a full queue waits at most `push_timeout`, then raises `QueueFull`; a job starting
makes room; running jobs do not count; unique jobs deduplicated need no room; a batch is all or
nothing; `enqueue_tx` never waits; shutdown ends a waiting enqueue at once; concurrent enqueuers
never make the queue longer than its bound; the relay and the periodic scheduler leave what does
not fit for later without blocking anything else."""

from __future__ import annotations

import logging

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import Outbox, TransactionalEnqueue

LATER = 10_000.0  # a delay that keeps a job pending (scheduled) for the whole test


@pytest.fixture
def tx_backend(make_backend, backend_name):
    backend = make_backend()
    if not isinstance(backend, TransactionalEnqueue):
        pytest.skip(f"the {backend_name} backend has no transactions")
    return backend


def bounded_app(max_length: int = 3, push_timeout: float = 5.0, max_workers: int = 2) -> tuple[nj.App, nj.JobKind]:
    app = nj.App()
    app.queue("bounded", max_workers=max_workers, timeout=None, max_length=max_length, push_timeout=push_timeout)

    @app.job(queue="bounded")
    async def work(ctx: nj.JobContext, n: int) -> None:
        await trio.sleep_forever()

    return app, work


async def pending(rt: nj.Runtime, queue: str = "bounded") -> int:
    return (await rt.stats())[queue].queued


async def test_full_queue_raises_queue_full_after_push_timeout(make_backend, autojump_clock):
    app, work = bounded_app(max_length=3, push_timeout=5.0)
    async with nj.open_runtime(app, backend=make_backend(), queues=[]) as rt:
        for n in range(3):
            await work.enqueue(n=n)
        t0 = trio.current_time()
        with pytest.raises(nj.QueueFull) as raised:
            await work.enqueue(n=3)
        waited = trio.current_time() - t0
        assert 5.0 <= waited < 5.5
        err = raised.value
        assert (err.queue, err.max_length) == ("bounded", 3)
        text = str(err)
        assert "'bounded'" in text and "max_length is 3" in text and "push_timeout of 5 s" in text
        assert "nothing was enqueued" in text and "raise its max_length" in text
        assert await pending(rt) == 3


async def test_push_timeout_zero_fails_at_once(make_backend, autojump_clock):
    app, work = bounded_app(max_length=1, push_timeout=0)
    async with nj.open_runtime(app, backend=make_backend(), queues=[]) as rt:
        await work.enqueue(n=0)
        t0 = trio.current_time()
        with pytest.raises(nj.QueueFull):
            await rt.enqueue("work", {"n": 1})
        assert trio.current_time() == t0


async def test_waiting_enqueue_succeeds_when_a_job_starts(make_backend, autojump_clock):
    app, work = bounded_app(max_length=2, push_timeout=5.0, max_workers=1)
    backend = make_backend()
    async with nj.open_runtime(app, backend=backend, queues=[]) as web:
        await work.enqueue_many([{"n": 0}, {"n": 1}])
        done_at: list[float] = []

        async def third() -> None:
            await web.enqueue("work", {"n": 2})
            done_at.append(trio.current_time())

        t0 = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(third)
            await trio.sleep(2)
            assert not done_at and await pending(web) == 2
            # A worker starts one job: the waiting enqueue gets its room.
            async with nj.open_runtime(app, backend=backend, grace=0) as worker:
                with trio.fail_after(3):
                    while not done_at:
                        await trio.sleep(0.05)
                assert (await worker.stats())["bounded"].running == 1
                assert await pending(web) == 2
        assert 2.0 <= done_at[0] - t0 < 2.5


async def test_running_jobs_do_not_count(make_backend, autojump_clock):
    app, work = bounded_app(max_length=2, push_timeout=0, max_workers=2)
    async with nj.open_runtime(app, backend=make_backend(), grace=0) as rt:
        await work.enqueue_many([{"n": 0}, {"n": 1}])
        with trio.fail_after(5):
            while (await rt.stats())["bounded"].running < 2:
                await trio.sleep(0.05)
        await work.enqueue_many([{"n": 2}, {"n": 3}])  # two running, two pending: full
        with pytest.raises(nj.QueueFull):
            await work.enqueue(n=4)
        stats = (await rt.stats())["bounded"]
        assert (stats.running, stats.queued) == (2, 2)


async def test_scheduled_jobs_count_and_unique_dedupe_needs_no_room(make_backend, autojump_clock):
    app, work = bounded_app(max_length=2, push_timeout=0)
    async with nj.open_runtime(app, backend=make_backend(), queues=[]) as rt:
        first = await work.options(delay=LATER, unique_key="k").enqueue(n=0)
        await work.options(delay=LATER).enqueue(n=1)
        with pytest.raises(nj.QueueFull):
            await work.enqueue(n=2)
        again = await work.options(unique_key="k").enqueue(n=0)  # dedupes: no room needed
        assert again == first and again.existing
        assert await pending(rt) == 2


async def test_enqueue_many_all_or_nothing(make_backend, autojump_clock):
    app, work = bounded_app(max_length=3, push_timeout=2.0)
    async with nj.open_runtime(app, backend=make_backend(), queues=[]) as rt:
        t0 = trio.current_time()
        with pytest.raises(nj.QueueFull) as raised:
            await work.enqueue_many([{"n": n} for n in range(4)])  # can never fit
        assert trio.current_time() == t0
        assert "batches of at most 3" in str(raised.value)
        assert await pending(rt) == 0
        await work.enqueue(n=0)
        await work.enqueue(n=1)
        with pytest.raises(nj.QueueFull):
            await work.enqueue_many([{"n": 2}, {"n": 3}])  # room for one, not both: neither
        assert trio.current_time() - t0 >= 2.0
        assert await pending(rt) == 2
        assert len(await work.enqueue_many([{"n": 2}])) == 1
        assert await pending(rt) == 3


async def test_enqueue_many_waits_for_room_for_all(make_backend, autojump_clock):
    app, work = bounded_app(max_length=3, push_timeout=10.0)
    async with nj.open_runtime(app, backend=make_backend(), queues=[]) as rt:
        held = await work.options(delay=LATER).enqueue_many([{"n": n} for n in range(3)])
        done: list[float] = []

        async def batch() -> None:
            await work.enqueue_many([{"n": 10}, {"n": 11}])
            done.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(batch)
            await trio.sleep(1)
            await rt.cancel(held[0])  # room for one: the batch of two still waits
            await trio.sleep(1)
            assert not done and await pending(rt) == 2
            await rt.cancel(held[1])
        assert done and await pending(rt) == 3


async def test_enqueue_tx_into_full_queue_raises_at_once(tx_backend, autojump_clock):
    app, work = bounded_app(max_length=1, push_timeout=5.0)

    @app.job(queue="default")
    async def other(ctx: nj.JobContext) -> None:
        pass

    async with nj.open_runtime(app, backend=tx_backend, queues=[]) as rt:
        await work.enqueue(n=0)
        t0 = trio.current_time()
        async with rt.transaction() as tx:
            with pytest.raises(nj.QueueFull) as raised:
                await work.enqueue_tx(tx, n=1)
            assert trio.current_time() == t0
            assert "enqueue_tx does not wait" in str(raised.value)
            await other.enqueue_tx(tx)  # the transaction goes on, without the refused job
        stats = await rt.stats()
        assert stats["bounded"].queued == 1 and stats["default"].queued == 1


async def test_enqueue_tx_counts_toward_the_length(tx_backend, autojump_clock):
    app, work = bounded_app(max_length=2, push_timeout=0)
    async with nj.open_runtime(app, backend=tx_backend, queues=[]) as rt:
        async with rt.transaction() as tx:
            await work.enqueue_tx(tx, n=0)
            await work.enqueue_tx(tx, n=1)
            with pytest.raises(nj.QueueFull):
                await work.enqueue_tx(tx, n=2)
        assert await pending(rt) == 2
        with pytest.raises(nj.QueueFull):
            await work.enqueue(n=3)


async def test_shutdown_ends_a_waiting_enqueue_at_once(make_backend, autojump_clock):
    app, work = bounded_app(max_length=1, push_timeout=30.0)
    async with nj.open_runtime(app, backend=make_backend(), queues=[]) as rt:
        await work.enqueue(n=0)
        outcome: list[BaseException] = []

        async def waiting() -> None:
            try:
                await work.enqueue(n=1)
            except nj.RuntimeClosed as exc:
                outcome.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiting)
            await trio.sleep(1)
            t0 = trio.current_time()
            rt.begin_shutdown()
        assert trio.current_time() - t0 < 0.01
        assert outcome and "waited for room in queue 'bounded'" in str(outcome[0])
        assert "nothing was enqueued" in str(outcome[0])


async def test_a_running_job_waits_on_for_room_during_the_shutdown(make_backend, autojump_clock):
    """The shutdown refuses outside callers at once, but a job still running may enqueue: its
    wait for room goes on (bounded by push_timeout and by its attempt), and room made meanwhile
    (here a cancel; elsewhere another process's worker) lets its follow-up in."""
    app = nj.App()
    app.queue("bounded", max_workers=1, timeout=None, max_length=1, push_timeout=30.0)
    app.queue("work", max_workers=1, timeout=None)
    enqueued: list[int] = []

    @app.job(queue="bounded")
    async def work(ctx: nj.JobContext, n: int) -> None:
        pass

    @app.job(queue="work")
    async def producer(ctx: nj.JobContext) -> None:
        await trio.sleep(2)  # the shutdown begins meanwhile
        enqueued.append(await work.enqueue(n=1))

    backend = make_backend()
    async with nj.open_runtime(app, backend=backend, queues=["work"], grace=10) as rt:
        filler = await work.enqueue(n=0)
        job_id = await producer.enqueue()
        await trio.sleep(1)
        rt.begin_shutdown()
        await trio.sleep(3)
        assert not enqueued  # waiting for room, not refused
        await rt.cancel(filler)
        t0 = trio.current_time()
    assert trio.current_time() - t0 <= 0.5  # the next poll found room; the job then ended
    job = await backend.get_job(job_id)
    assert (job.state, job.attempt, job.errors) == (nj.JobState.COMPLETED, 1, ())
    assert len(enqueued) == 1 and (await backend.get_job(enqueued[0])).state is nj.JobState.AVAILABLE


async def test_concurrent_enqueuers_never_exceed_the_bound(make_backend, autojump_clock):
    await concurrent_enqueuers([make_backend()])


async def test_concurrent_enqueuers_of_several_instances_never_exceed_the_bound(store, autojump_clock):
    await concurrent_enqueuers([store.open() for _ in range(3)])


async def concurrent_enqueuers(instances: list[nj.Backend]) -> None:
    max_length = 7
    app, work = bounded_app(max_length=max_length, push_timeout=0)
    accepted = 0
    refused = 0
    async with contextlib_runtimes(app, instances) as runtimes:

        async def producer(rt: nj.Runtime, base: int) -> None:
            nonlocal accepted, refused
            for n in range(6):
                try:
                    await rt.enqueue("work", {"n": base + n})
                    accepted += 1
                except nj.QueueFull:
                    refused += 1

        async with trio.open_nursery() as nursery:
            for i in range(4):
                for rt in runtimes:
                    nursery.start_soon(producer, rt, 100 * i)
        assert accepted == max_length and refused == 6 * 4 * len(runtimes) - max_length
        assert await pending(runtimes[0]) == max_length


def contextlib_runtimes(app: nj.App, backends: list[nj.Backend]):
    from contextlib import AsyncExitStack, asynccontextmanager

    @asynccontextmanager
    async def opened():
        async with AsyncExitStack() as stack:
            yield [await stack.enter_async_context(nj.open_runtime(app, backend=b, queues=[])) for b in backends]

    return opened()


async def test_relay_leaves_events_of_a_full_queue_and_relays_other_topics(make_backend, autojump_clock, caplog):
    backend = make_backend()
    if not isinstance(backend, Outbox):
        pytest.skip("no outbox")
    app = nj.App()
    app.queue("bounded", max_workers=1, timeout=None, max_length=1)
    app.queue("free", max_workers=1, timeout=None)

    @app.subscribe("to.bounded")
    @app.job(queue="bounded")
    async def full_kind(ctx: nj.JobContext, n: int) -> None:
        pass

    @app.subscribe("to.free")
    @app.job(queue="free")
    async def free_kind(ctx: nj.JobContext, n: int) -> None:
        pass

    settings = nj.RuntimeSettings(relay_interval=1.0)
    caplog.set_level(logging.WARNING, logger="nursery_jobs")
    async with nj.open_runtime(app, backend=backend, queues=[], settings=settings) as rt:
        holder = await full_kind.options(delay=LATER).enqueue(n=0)
        await rt.publish("to.bounded", {"n": 1})
        await rt.publish("to.free", {"n": 2})
        with trio.fail_after(5):
            while (await rt.stats())["free"].queued < 1:
                await trio.sleep(0.1)
        await trio.sleep(3)  # the full queue's event is tried again each second, in vain
        assert (await rt.stats())["bounded"].queued == 1
        assert any(getattr(r, "event", None) == "relay_queue_full" for r in caplog.records)
        await rt.cancel(holder)  # room: the event's job is made at a later pass
        with trio.fail_after(5):
            while (await rt.stats())["bounded"].queued < 1:
                await trio.sleep(0.1)
        await rt.publish("to.free", {"n": 3})
        with trio.fail_after(5):
            while (await rt.stats())["free"].queued < 2:
                await trio.sleep(0.1)
        stats = await rt.stats()
        assert stats["bounded"].queued == 1 and stats["free"].queued == 2


async def test_periodic_tick_into_a_full_queue_is_retried_not_waited_for(make_backend, autojump_clock, caplog):
    app = nj.App()
    app.queue("bounded", max_workers=1, timeout=None, max_length=1)

    @app.job(queue="bounded")
    async def filler(ctx: nj.JobContext) -> None:
        pass

    @app.periodic("@every 10s")
    @app.job(queue="bounded")
    async def tick(ctx: nj.JobContext) -> None:
        pass

    caplog.set_level(logging.WARNING, logger="nursery_jobs")
    async with nj.open_runtime(app, backend=make_backend(), queues=[]) as rt:
        holder = await filler.options(delay=LATER).enqueue()
        await trio.sleep(25)  # two ticks, both refused and retried
        assert (await rt.stats())["bounded"].queued == 1
        full = [r for r in caplog.records if getattr(r, "event", None) == "periodic_queue_full"]
        assert full and all(r.levelno == logging.WARNING for r in full)
        await rt.cancel(holder)
        with trio.fail_after(130):  # the retry's delay doubles up to MAX_SLEEP (60 s)
            while {p.name: p for p in await rt.periodic()}["tick"].last_job_id is None:
                await trio.sleep(1)
        assert (await rt.stats())["bounded"].queued == 1  # one tick's job, never more


async def test_relay_makes_what_fits_when_a_pass_is_larger_than_the_room(make_backend, autojump_clock):
    backend = make_backend()
    if not isinstance(backend, Outbox):
        pytest.skip("no outbox")
    app = nj.App()
    app.queue("bounded", max_workers=1, timeout=None, max_length=5)

    @app.subscribe("to.bounded")
    @app.job(queue="bounded")
    async def full_kind(ctx: nj.JobContext, n: int) -> None:
        pass

    async with nj.open_runtime(app, backend=backend, queues=[], settings=nj.RuntimeSettings(relay_interval=1.0)) as rt:
        held = await full_kind.options(delay=LATER).enqueue(n=0)
        for n in range(8):
            await rt.publish("to.bounded", {"n": n})
        with trio.fail_after(5):
            while (await rt.stats())["bounded"].queued < 5:
                await trio.sleep(0.1)
        await trio.sleep(3)
        assert (await rt.stats())["bounded"].queued == 5  # four events relayed, four wait
        await rt.cancel(held)
        with trio.fail_after(5):
            while (await rt.stats())["bounded"].queued < 5 or (await rt.stats())["bounded"].cancelled < 1:
                await trio.sleep(0.1)
        await trio.sleep(2)
        stats = (await rt.stats())["bounded"]
        assert stats.queued == 5 and stats.cancelled == 1  # one more event relayed into the freed room
