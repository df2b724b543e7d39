"""`claim` under the limits, called directly: a job whose concurrency key is at its
`max_concurrent` is not claimed and holds back nothing else; jobs of one key start in claim
order; the slot is the running row, freed by every way out of `running`; `max_running` bounds
the queue (protocol.py's `claim` docstring, `rules.admit`)."""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs import JobState
from nursery_jobs.backends import JobsAvailable, NewJob, Outcome, OutcomeKind

from .common import Q, listen, new, opened


def keyed(key: str | None, limit: int | None = 1, *, priority: int = 0, delay: float | None = None, now: float = 0.0) -> NewJob:
    return new(priority=priority, delay=delay, now=now)._replace(
        concurrency_key=key, max_concurrent=None if key is None else limit
    )


async def ids_of(backend: nj.Backend, limit: int, **kw: int) -> list[int]:
    return [j.id for j in (await backend.claim(Q, limit, **kw)).jobs]


async def test_a_key_at_its_limit_is_not_claimed_and_spends_no_attempt(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        a, b, c = [r.id for r in await backend.insert_many([keyed("k") for _ in range(3)])]
        first = await ids_of(backend, 10)
        again = await ids_of(backend, 10)
        held = [await backend.get_job(i) for i in (b, c)]
        stats = (await backend.stats())[Q]
    assert first == [a] and again == []
    assert all(j.state is nj.JobState.AVAILABLE and j.attempt == 0 and j.attempted_at is None for j in held)
    assert (stats.running, stats.available) == (1, 2)


async def test_max_concurrent_jobs_of_a_key_run_at_once(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        ids = [r.id for r in await backend.insert_many([keyed("k", 2) for _ in range(5)])]
        first = await ids_of(backend, 10)
        second = await ids_of(backend, 10)
    assert first == ids[:2] and second == []


async def test_a_busy_key_holds_back_no_other_key_and_no_unkeyed_job(make_backend, autojump_clock) -> None:
    """The busy key's jobs come first in claim order (older, and one of higher priority): each
    claim of one job passes over them to the next job it may start."""
    async with opened(make_backend) as backend:
        busy = [r.id for r in await backend.insert_many([keyed("busy", priority=5)] + [keyed("busy") for _ in range(20)])]
        other = [r.id for r in await backend.insert_many([keyed("other"), keyed(None), keyed("third")])]
        got = [await ids_of(backend, 1) for _ in range(5)]
    assert got == [[busy[0]], [other[0]], [other[1]], [other[2]], []]


async def test_a_free_key_with_a_backlog_does_not_fill_a_claim_with_jobs_it_cannot_start(make_backend, autojump_clock) -> None:
    """The key's first job starts, and the same claim goes on past the rest of its backlog."""
    async with opened(make_backend) as backend:
        backlog = [r.id for r in await backend.insert_many([keyed("k") for _ in range(10)])]
        (other,) = [r.id for r in await backend.insert_many([keyed("j")])]
        got = await ids_of(backend, 4)
    assert got == [backlog[0], other]


async def test_a_job_of_a_full_key_in_a_batch_is_passed_over_within_one_claim(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        ids = [r.id for r in await backend.insert_many([keyed("a"), keyed("a"), keyed("b"), keyed("a"), keyed("b")])]
        got = await ids_of(backend, 3)
    assert sorted(got) == [ids[0], ids[2]]


async def test_jobs_of_one_key_start_by_priority_then_enqueue_order(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        ids = [r.id for r in await backend.insert_many([keyed("k", priority=p) for p in (0, 5, 0, 5, 1)])]
        order = []
        for _ in ids:
            (job,) = (await backend.claim(Q, 10)).jobs
            order.append(job.id)
            await backend.finish_many([Outcome(job.id, job.attempt, OutcomeKind.COMPLETED)])
    assert order == [ids[1], ids[3], ids[4], ids[0], ids[2]]


async def test_a_scheduled_job_of_a_key_takes_no_slot_and_blocks_nothing(make_backend, autojump_clock) -> None:
    """No head-of-line blocking behind a job that is not due yet (Procrastinate #1599)."""
    async with opened(make_backend) as backend:
        await trio.sleep(1)
        now = backend.now()
        later, due = [r.id for r in await backend.insert_many([keyed("k", delay=50, now=now), keyed("k")])]
        first = await backend.claim(Q, 10)
    assert [j.id for j in first.jobs] == [due] and first.next_due == now + 50


OUTCOMES = [
    (OutcomeKind.COMPLETED, None),
    (OutcomeKind.RETRY, 0.0),
    (OutcomeKind.SNOOZE, 0.0),
    (OutcomeKind.DISCARD, None),
    (OutcomeKind.CANCELLED, None),
    (OutcomeKind.INTERRUPTED, None),
]


@pytest.mark.parametrize(("kind", "delay"), OUTCOMES, ids=[k.value for k, _ in OUTCOMES])
async def test_the_slot_is_freed_when_the_job_leaves_running(make_backend, autojump_clock, kind, delay) -> None:
    """Every outcome ends the attempt, and with it the slot: the key's next job may start (the
    one that left, back in line by its own order if it runs again)."""
    async with opened(make_backend) as backend:
        await trio.sleep(1)
        a, b = [r.id for r in await backend.insert_many([keyed("k"), keyed("k")])]
        (job,) = (await backend.claim(Q, 10)).jobs
        events = listen(backend)
        run_at = None if delay is None else backend.now() + 100
        error = nj.JobError(1, backend.now(), "x") if kind in (OutcomeKind.RETRY, OutcomeKind.DISCARD) else None
        await backend.finish_many([Outcome(job.id, job.attempt, kind, run_at, error)])
        after = await ids_of(backend, 10)
    assert job.id == a
    assert after == ([a] if kind is OutcomeKind.INTERRUPTED else [b])
    assert JobsAvailable(Q) in events  # a freed slot wakes the queue's fetchers


async def test_a_cancelled_running_job_frees_its_slot_when_its_attempt_ends(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        a, b = [r.id for r in await backend.insert_many([keyed("k"), keyed("k")])]
        (job,) = (await backend.claim(Q, 10)).jobs
        assert await backend.cancel(a) is nj.JobState.RUNNING
        still = await ids_of(backend, 10)  # requested, still running: the slot is still its
        await backend.finish_many([Outcome(a, job.attempt, OutcomeKind.INTERRUPTED)])  # ends cancelled
        after = await ids_of(backend, 10)
        state = (await backend.get_job(a)).state
    assert still == [] and after == [b] and state is nj.JobState.CANCELLED


async def test_cancelling_a_held_job_lets_the_next_one_of_its_key_start(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        a, b, c = [r.id for r in await backend.insert_many([keyed("k") for _ in range(3)])]
        (job,) = (await backend.claim(Q, 10)).jobs
        assert await ids_of(backend, 10) == []
        await backend.cancel(b)
        await backend.finish_many([Outcome(a, job.attempt, OutcomeKind.COMPLETED)])
        after = await ids_of(backend, 10)
    assert after == [c]


async def test_a_rescue_frees_the_slot_of_a_crashed_worker(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        a, b = [r.id for r in await backend.insert_many([keyed("k", max_attempts) for max_attempts in (1, 1)])]
        await ids_of(backend, 10)  # a worker that then dies without a word
        await trio.sleep(100)
        events = listen(backend)
        assert await backend.rescue(backend.now() - 10) == [a]  # out of attempts: discarded
        after = await ids_of(backend, 10)
    assert after == [b] and JobsAvailable(Q) in events


async def test_a_freed_slot_wakes_the_queue_of_the_job_it_lets_back(make_backend, autojump_clock) -> None:
    """Keys are not scoped to a queue: a slot freed by a job of one queue lets the key's parked
    job of another queue back in line, and the wake-up goes to that queue (its fetcher, whose
    claim came back short, sleeps until then: on memory, which never polls, for ever; on the
    durable backends until their poll, 1 s)."""
    async with opened(make_backend) as backend:
        await backend.insert_many([keyed("k")])
        (b,) = await backend.insert_many([keyed("k")._replace(queue="other")])
        (job,) = (await backend.claim(Q, 10)).jobs
        assert (await backend.claim("other", 10)).jobs == []  # the key is full: parked
        events = listen(backend)
        await backend.finish_many([Outcome(job.id, job.attempt, OutcomeKind.COMPLETED)])
        after = [j.id for j in (await backend.claim("other", 10)).jobs]
    assert after == [b.id] and JobsAvailable("other") in events


async def test_a_cancel_that_frees_a_brought_back_place_wakes_the_queue_of_the_next_job(make_backend, autojump_clock) -> None:
    """A job a freed slot let back (unparked, not yet claimed) that is cancelled gives its place
    to its key's next parked job, whose queue (here a third one) is the one woken."""
    async with opened(make_backend) as backend:
        await backend.insert_many([keyed("k")])
        (b,) = await backend.insert_many([keyed("k")._replace(queue="other")])
        (c,) = await backend.insert_many([keyed("k")._replace(queue="third")])
        (job,) = (await backend.claim(Q, 10)).jobs
        assert (await backend.claim("other", 10)).jobs == [] and (await backend.claim("third", 10)).jobs == []
        await backend.finish_many([Outcome(job.id, job.attempt, OutcomeKind.COMPLETED)])  # lets b back
        events = listen(backend)
        assert await backend.cancel(b.id) is JobState.CANCELLED
        after = [j.id for j in (await backend.claim("third", 10)).jobs]
    assert after == [c.id] and JobsAvailable("third") in events


async def test_a_rescue_that_frees_a_slot_wakes_the_queue_of_the_job_it_lets_back(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        await backend.insert_many([keyed("k")])
        (b,) = await backend.insert_many([keyed("k")._replace(queue="other")])
        assert len((await backend.claim(Q, 10)).jobs) == 1  # a worker that then dies without a word
        assert (await backend.claim("other", 10)).jobs == []
        await trio.sleep(100)
        events = listen(backend)
        await backend.rescue(backend.now() - 10)
        after = [j.id for j in (await backend.claim("other", 10)).jobs]
    assert after == [b.id] and JobsAvailable("other") in events


async def test_a_freed_slot_wakes_another_instance_serving_the_queue_of_the_job_it_lets_back(store, autojump_clock) -> None:
    """As two processes: the one that finishes a job of `Q` wakes the other, which serves only
    the queue the key's parked job is in, without waiting for its poll."""
    writer, reader = store.open(), store.open()
    await writer.open()
    await reader.open()
    try:
        await writer.insert_many([keyed("k")])
        (b,) = await writer.insert_many([keyed("k")._replace(queue="other")])
        (job,) = (await writer.claim(Q, 10)).jobs
        assert (await reader.claim("other", 10)).jobs == []  # the key is full: parked
        heard = trio.Event()

        def on_event(event: object) -> None:
            if event == JobsAvailable("other"):
                heard.set()

        reader.add_listener(on_event)
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.serve)
            await writer.finish_many([Outcome(job.id, job.attempt, OutcomeKind.COMPLETED)])
            with trio.fail_after(30):  # no fetcher polls here: only the writer's wake-up can come
                await heard.wait()
            nursery.cancel_scope.cancel()
        assert [j.id for j in (await reader.claim("other", 10)).jobs] == [b.id]
    finally:
        await writer.close()
        await reader.close()


async def test_a_job_parked_for_its_rate_hands_its_slot_on_and_wakes_the_next_jobs_queue(make_backend, autojump_clock) -> None:
    """C (key k, rate r) is the job a freed slot let back; the claim that finds r spent parks
    C for its rate, so k's place goes to its next parked job, B, of another queue: that queue
    is woken (on PostgreSQL from inside the claim, by a notification the process itself acts
    on, so the test serves the backend)."""
    async with opened(make_backend) as backend:
        rated = {"rate_key": "r", "rate_limit": 1, "rate_per": 100.0}
        await backend.insert_many([keyed(None)._replace(**rated)])
        assert len(await ids_of(backend, 10)) == 1  # r is spent for 100 s
        (a,) = await backend.insert_many([keyed("k")])
        assert await ids_of(backend, 10) == [a.id]
        (c,) = await backend.insert_many([keyed("k")._replace(**rated)])
        (b,) = await backend.insert_many([keyed("k")._replace(queue="other")])
        assert await ids_of(backend, 10) == [] and (await backend.claim("other", 10)).jobs == []  # both parked
        heard = trio.Event()

        def on_event(event: object) -> None:
            if event == JobsAvailable("other"):
                heard.set()

        async with trio.open_nursery() as nursery:
            await nursery.start(backend.serve)
            await backend.finish_many([Outcome(a.id, 1, OutcomeKind.COMPLETED)])  # lets c back
            backend.add_listener(on_event)
            assert await ids_of(backend, 10) == []  # c is over its rate: parked for it, b let back
            with trio.fail_after(30):  # no fetcher polls here
                await heard.wait()
            nursery.cancel_scope.cancel()
        assert [j.id for j in (await backend.claim("other", 10)).jobs] == [b.id]
        assert c.id not in [j.id for j in (await backend.claim(Q, 10)).jobs]


async def test_max_running_bounds_the_queue_whatever_the_limit_asked(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        ids = [r.id for r in await backend.insert_many([keyed(None) for _ in range(4)] + [keyed("k")])]
        first = await ids_of(backend, 10, max_running=2)
        full = await ids_of(backend, 10, max_running=2)
        await backend.finish_many([Outcome(first[0], 1, OutcomeKind.COMPLETED)])
        one = await ids_of(backend, 10, max_running=2)
        wider = await ids_of(backend, 10, max_running=4)
    assert first == ids[:2] and full == [] and one == [ids[2]] and wider == [ids[3], ids[4]]


async def test_concurrent_claims_never_run_more_than_the_limit_of_a_key(store, autojump_clock) -> None:
    """Three instances on one store, as three processes, claiming at once."""
    backends = [store.open() for _ in range(3)]
    for backend in backends:
        await backend.open()
    try:
        await backends[0].insert_many([keyed(f"k{n % 4}", 1 + n % 4 // 3) for n in range(40)])
        got: list[list[int]] = []

        async def claimer(backend: nj.Backend) -> None:
            got.append([j.id for j in (await backend.claim(Q, 4)).jobs])

        async with trio.open_nursery() as nursery:
            for backend in backends:
                nursery.start_soon(claimer, backend)
    finally:
        for backend in backends:
            await backend.close()
    per_key: dict[int, int] = {}  # job n (id n + 1) has key n % 4
    for batch in got:
        for job_id in batch:
            per_key[(job_id - 1) % 4] = per_key.get((job_id - 1) % 4, 0) + 1
    assert per_key == {0: 1, 1: 1, 2: 1, 3: 2}  # k3's limit is 2, the others' 1


# -- a full key's backlog, passed over (parked) and brought back as slots free --


async def finish(backend: nj.Backend, job_id: int, kind: OutcomeKind = OutcomeKind.COMPLETED) -> None:
    await backend.finish_many([Outcome(job_id, (await backend.get_job(job_id)).attempt, kind)])


async def test_a_passed_over_backlog_starts_by_priority_then_enqueue_order_as_slots_free(make_backend, autojump_clock) -> None:
    """Claims pass over the busy key's backlog (the durable backends park it); each freed slot
    brings back its best job, and a job enqueued meanwhile takes its place in that order."""
    async with opened(make_backend) as backend:
        ids = [r.id for r in await backend.insert_many([keyed("k", priority=p) for p in (9, 0, 3, 0, 1)])]
        (other,) = [r.id for r in await backend.insert_many([keyed("other")])]
        first = await ids_of(backend, 10)
        passed = await ids_of(backend, 10)
        order = []
        for n in range(5):
            await finish(backend, first[0] if n == 0 else order[-1])
            if n == 1:
                (late,) = [r.id for r in await backend.insert_many([keyed("k", priority=2)])]
            order += await ids_of(backend, 10)
    assert first == [ids[0], other] and passed == []
    assert order == [ids[2], late, ids[4], ids[1], ids[3]]


async def test_a_rescue_brings_back_a_crashed_workers_passed_over_backlog(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        ids = [r.id for r in await backend.insert_many([keyed("k") for _ in range(4)])]
        assert await ids_of(backend, 10) == [ids[0]]  # a worker that then dies without a word
        assert await ids_of(backend, 10) == []  # the rest passed over
        await trio.sleep(100)
        assert await backend.rescue(backend.now() - 10) == [ids[0]]
        after = []
        for _ in range(4):
            got = await ids_of(backend, 10)
            after += got
            await finish(backend, got[0])
    assert len(after) == 4 and sorted(after) == ids  # one at a time, none left behind
    assert after[0] == ids[1]  # the rescued job went back in line at the time of its rescue


async def test_a_given_back_job_and_the_passed_over_backlog_keep_their_order(make_backend, autojump_clock) -> None:
    """A shutdown gives the running job back (back in line as of now, its attempt returned):
    the key's next job starts, and the given-back one after the jobs that were due before it."""
    async with opened(make_backend) as backend:
        await trio.sleep(1)
        ids = [r.id for r in await backend.insert_many([keyed("k") for _ in range(3)])]
        assert await ids_of(backend, 10) == [ids[0]]
        assert await ids_of(backend, 10) == []
        await trio.sleep(1)
        await finish(backend, ids[0], OutcomeKind.INTERRUPTED)
        order = []
        for _ in range(3):
            (job,) = (await backend.claim(Q, 10)).jobs
            order.append((job.id, job.attempt))
            await finish(backend, job.id)
    assert order == [(ids[1], 1), (ids[2], 1), (ids[0], 1)]


async def test_cancelling_a_passed_over_job_leaves_the_rest_of_its_key_in_order(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        ids = [r.id for r in await backend.insert_many([keyed("k") for _ in range(4)])]
        assert await ids_of(backend, 10) == [ids[0]]
        assert await ids_of(backend, 10) == []
        assert await backend.cancel(ids[2]) is nj.JobState.CANCELLED
        await finish(backend, ids[0])
        second = await ids_of(backend, 10)
        await finish(backend, ids[1])
        third = await ids_of(backend, 10)
        stats = (await backend.stats())[Q]
    assert second == [ids[1]] and third == [ids[3]] and (stats.cancelled, stats.available) == (1, 0)


async def test_cancelling_the_job_a_freed_slot_brought_back_brings_back_the_next(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        ids = [r.id for r in await backend.insert_many([keyed("k") for _ in range(3)])]
        assert await ids_of(backend, 10) == [ids[0]]
        assert await ids_of(backend, 10) == []
        await finish(backend, ids[0])  # ids[1] may start now
        events = listen(backend)
        await backend.cancel(ids[1])
        after = await ids_of(backend, 10)
    assert after == [ids[2]] and JobsAvailable(Q) in events


async def test_a_backlog_longer_than_one_claim_reads_holds_back_no_other_key(make_backend, autojump_clock) -> None:
    """More of the busy key's jobs than a claim passes over at once: the claim that stops
    among them wakes the queue (so the fetcher claims again at once), and the other key's job
    starts within a few claims, each of them bounded."""
    async with opened(make_backend) as backend:
        busy = [r.id for r in await backend.insert_many([keyed("busy") for _ in range(2_500)])]
        (other,) = [r.id for r in await backend.insert_many([keyed("other")])]
        assert await ids_of(backend, 1) == [busy[0]]
        events = listen(backend)
        got: list[int] = []
        claims = 0
        while not got and claims < 10:
            got = await ids_of(backend, 1)
            claims += 1
            assert got or JobsAvailable(Q) in events  # an empty claim that passed jobs over asks for another
            events.clear()
        await finish(backend, busy[0])
        nxt = await ids_of(backend, 1)
    assert got == [other] and nxt == [busy[1]]
