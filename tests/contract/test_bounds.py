"""`bounds` on the insert calls, called directly (`insert_many`, `insert_tx`, `relay`,
`enqueue_tick`): the queue's pending jobs (available, scheduled, retryable; never running or
final ones) counted with the call's new ones, `rules.check_room` deciding, and on
`QueueFull` nothing stored, nothing emitted, and a caller's transaction left as it was."""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import JobsAvailable, NewJob, Outbox, OutboxEvent, ScheduleStore, TransactionalEnqueue
from nursery_jobs.rules import PENDING, check_room
from tests.registry import TestBackend

from .common import Q, STATE_OF, STARTS, in_state, listen, new, opened


def test_the_rule() -> None:
    check_room(Q, 3, 3)
    check_room(Q, 10**9, None)
    with pytest.raises(nj.QueueFull) as raised:
        check_room(Q, 4, 3)
    assert (raised.value.queue, raised.value.max_length, raised.value.pending) == (Q, 3, 4)
    assert set(PENDING) == {nj.JobState.AVAILABLE, nj.JobState.SCHEDULED, nj.JobState.RETRYABLE}


@pytest.mark.parametrize("start", STARTS)
async def test_what_counts_toward_the_length(make_backend, autojump_clock, start) -> None:
    async with opened(make_backend) as backend:
        await in_state(backend, start)
        counts = STATE_OF[start] in PENDING
        if counts:
            with pytest.raises(nj.QueueFull):
                await backend.insert_many([new()], {Q: 1})
        else:
            await backend.insert_many([new()], {Q: 1})
        c = (await backend.stats())[Q]
        assert c.available + c.scheduled + c.retryable == 1


async def test_a_full_queue_stores_nothing_and_emits_nothing(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        await backend.insert_many([new(), new(delay=100, now=backend.now())], {Q: 2})
        events = listen(backend)
        with pytest.raises(nj.QueueFull) as raised:
            await backend.insert_many([new(), new(queue="other")], {Q: 2})
        assert raised.value.queue == Q and raised.value.max_length == 2
        assert events == []
        stats = await backend.stats()
        assert stats[Q].available + stats[Q].scheduled == 2 and "other" not in stats
        (res,) = await backend.insert_many([new()], {Q: 3})
        assert events.of(JobsAvailable) == [JobsAvailable(Q)]
        assert (await backend.get_job(res.id)).state is nj.JobState.AVAILABLE


async def test_other_queues_and_unbounded_calls_are_not_limited(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        await backend.insert_many([new()], {Q: 1})
        await backend.insert_many([new(queue="other") for _ in range(5)], {Q: 1})
        await backend.insert_many([new()])  # no bounds: the caller did not ask
        assert (await backend.stats())["other"].available == 5


@pytest.mark.parametrize("size", [2, 60])  # 60: PostgreSQL's COPY path
async def test_a_batch_fits_whole_or_not_at_all(make_backend, autojump_clock, size) -> None:
    async with opened(make_backend) as backend:
        await backend.insert_many([new()], {Q: size})
        with pytest.raises(nj.QueueFull):
            await backend.insert_many([new() for _ in range(size)], {Q: size})
        assert (await backend.stats())[Q].available == 1
        await backend.insert_many([new() for _ in range(size - 1)], {Q: size})
        assert (await backend.stats())[Q].available == size


async def test_a_unique_job_that_dedupes_needs_no_room(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        (held,) = await backend.insert_many([new(unique_key="k")], {Q: 1})
        (again,) = await backend.insert_many([new(unique_key="k")], {Q: 1})
        assert again == (held.id, True)
        with pytest.raises(nj.QueueFull):
            await backend.insert_many([new(unique_key="k2")], {Q: 1})
        # A key twice in one batch is one job: it needs room for one.
        await backend.cancel(held.id)
        first, second = await backend.insert_many([new(unique_key="k3"), new(unique_key="k3")], {Q: 1})
        assert second == (first.id, True)


@pytest.fixture
def callers(test_backend: TestBackend, make_backend):
    if not isinstance(make_backend(), TransactionalEnqueue):
        pytest.skip(f"the {test_backend.name} backend has no transactions")
    return test_backend.transaction


async def test_insert_tx_refuses_in_the_backends_transaction_and_keeps_the_rest(make_backend, callers, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        async with backend.transaction() as conn:
            (kept,) = await backend.insert_tx(conn, [new()], {Q: 1})
            with pytest.raises(nj.QueueFull):
                await backend.insert_tx(conn, [new()], {Q: 1})
            (other,) = await backend.insert_tx(conn, [new(queue="other")], {Q: 1})
        assert (await backend.get_job(kept.id)).state is nj.JobState.AVAILABLE
        assert (await backend.get_job(other.id)).state is nj.JobState.AVAILABLE
        assert (await backend.stats())[Q].available == 1


async def test_insert_tx_refuses_in_the_callers_transaction_and_keeps_the_rest(make_backend, callers, autojump_clock) -> None:
    if callers is None:
        pytest.skip("no connection of the caller's own")
    async with opened(make_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        await backend.insert_many([new()], {Q: 2})
        with callers(backend) as conn:
            (kept,) = await backend.insert_tx(conn, [new()], {Q: 2})
            with pytest.raises(nj.QueueFull):
                await backend.insert_tx(conn, [new(), new()], {Q: 3})  # the second would be the fourth
            (other,) = await backend.insert_tx(conn, [new(queue="other")], {Q: 2})
        assert (await backend.get_job(kept.id)).state is nj.JobState.AVAILABLE
        assert (await backend.get_job(other.id)).state is nj.JobState.AVAILABLE
        assert (await backend.stats())[Q].available == 2


async def test_a_relay_pass_that_does_not_fit_changes_nothing(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        if not isinstance(backend, Outbox):
            pytest.skip("no outbox")
        await backend.publish([("t", "1"), ("t", "2")])
        await backend.insert_many([new()], {Q: 2})

        def route(events: list[OutboxEvent]) -> list[list[nj.backends.NewJob]]:
            return [[new()] for _ in events]

        with pytest.raises(nj.QueueFull):
            await backend.relay(["t"], route, 10, {Q: 2})
        assert (await backend.stats())[Q].available == 1
        assert await backend.relay(["t"], route, 1, {Q: 2}) == 1  # one event fits
        with pytest.raises(nj.QueueFull):
            await backend.relay(["t"], route, 10, {Q: 2})
        assert (await backend.stats())[Q].available == 2
        await backend.cancel((await backend.claim(Q, 1)).jobs[0].id)  # running, then cancelled: room
        assert await backend.relay(["t"], route, 10, {Q: 2}) == 1


async def test_a_tick_that_does_not_fit_is_not_advanced(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        if not isinstance(backend, ScheduleStore):
            pytest.skip("no schedules")
        (held,) = await backend.insert_many([new(delay=100, now=backend.now())], {Q: 1})
        with pytest.raises(nj.QueueFull):
            await backend.enqueue_tick("s", 1000.0, new(), {Q: 1})
        assert await backend.schedule_states(["s"]) == {}
        await backend.cancel(held.id)
        result = await backend.enqueue_tick("s", 1000.0, new(), {Q: 1})
        assert result is not None and not result.existing
        assert (await backend.schedule_states(["s"]))["s"].last_tick == 1000.0


async def test_concurrent_bounded_inserts_never_overshoot(store, autojump_clock) -> None:
    backends = [store.open() for _ in range(3)]
    for b in backends:
        await b.open()
    accepted = 0
    try:

        async def insert(b: nj.Backend) -> None:
            nonlocal accepted
            for _ in range(5):
                try:
                    await b.insert_many([new(), new()], {Q: 9})
                    accepted += 2
                except nj.QueueFull:
                    pass

        async with trio.open_nursery() as nursery:
            for b in backends:
                for _ in range(3):
                    nursery.start_soon(insert, b)
        assert accepted == 8
        assert (await backends[0].stats())[Q].available == 8
    finally:
        for b in backends:
            await b.close()


async def test_a_full_keys_passed_over_backlog_still_counts(make_backend, autojump_clock) -> None:
    """Jobs the claims passed over because their concurrency key was full (the durable backends
    park them, out of the claim's index) are still waiting to start: they count."""
    async with opened(make_backend) as backend:
        await backend.insert_many([NewJob("work", Q, "{}", 0, None, 5, None, "k", 1) for _ in range(3)])
        assert len((await backend.claim(Q, 10)).jobs) == 1
        assert (await backend.claim(Q, 10)).jobs == []  # the other two passed over
        with pytest.raises(nj.QueueFull) as raised:
            await backend.insert_many([new()], {Q: 2})
        assert raised.value.pending == 3
        await backend.insert_many([new()], {Q: 3})
