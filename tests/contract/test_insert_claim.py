"""`insert_many` and `claim`, called directly: what each docstring in
`nursery_jobs/backends/protocol.py` promises (order, return values, events, uniqueness,
due versus later), for each starting state of the rows around them."""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import ClaimedJob, InsertResult, JobsAvailable, Outcome, OutcomeKind

from .common import NOT_RUNNING, PENDING, STARTS, STATE_OF, Q, in_state, listen, new, opened

# -- insert_many --


async def test_an_empty_batch_inserts_nothing_and_emits_nothing(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        events = listen(backend)
        assert await backend.insert_many([]) == []
        assert events == [] and await backend.stats() == {}


async def test_insert_returns_one_new_id_per_job_in_order_and_stores_each_as_given(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        await trio.sleep(3)
        now = backend.now()
        jobs = [
            new(3, queue="a", priority=2, args='{"n": 1}'),
            new(4, delay=10, now=now, queue="b", priority=-1, unique_key="k1", args='{"n": 2}'),
            new(5, queue="a", args='{"s": "x"}'),
        ]
        results = await backend.insert_many(jobs)
        got = [await backend.get_job(r.id) for r in results]
    assert all(isinstance(r, InsertResult) and r.existing is False for r in results)
    ids = [r.id for r in results]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert [(j.kind, j.queue, j.priority, j.max_attempts, j.unique_key, j.args) for j in got] == [
        ("work", "a", 2, 3, None, {"n": 1}),
        ("work", "b", -1, 4, "k1", {"n": 2}),
        ("work", "a", 0, 5, None, {"s": "x"}),
    ]
    assert [j.state for j in got] == [nj.JobState.AVAILABLE, nj.JobState.SCHEDULED, nj.JobState.AVAILABLE]
    assert [j.run_at for j in got] == [now, now + 10, now]
    assert all(j.created_at == now and j.attempt == 0 and j.attempted_at is None for j in got)
    assert all(j.finalized_at is None and j.errors == () for j in got)


@pytest.mark.parametrize("delay", [-50.0, 0.0, 0.5], ids=["past", "now", "later"])
async def test_a_job_is_available_unless_its_run_at_is_after_now(make_backend, autojump_clock, delay: float) -> None:
    async with opened(make_backend) as backend:
        await trio.sleep(100)
        now = backend.now()
        events = listen(backend)
        (res,) = await backend.insert_many([new(delay=delay, now=now)])
        job = await backend.get_job(res.id)
    if delay > 0:
        assert job.state is nj.JobState.SCHEDULED and job.run_at == now + delay
        assert events == [JobsAvailable(Q, now + delay)]
    else:
        assert job.state is nj.JobState.AVAILABLE and job.run_at == now  # never before now
        assert events == [JobsAvailable(Q)]


async def test_insert_emits_one_wake_up_per_queue_after_the_batch(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        now = backend.now()
        events = listen(backend)
        await backend.insert_many(
            [
                new(queue="a"),
                new(queue="a"),
                new(delay=30, now=now, queue="a"),
                new(delay=20, now=now, queue="b"),
                new(delay=10, now=now, queue="b"),
                new(queue="c"),
            ]
        )
    assert sorted(events, key=repr) == sorted(
        [JobsAvailable("a"), JobsAvailable("a", now + 30), JobsAvailable("b", now + 10), JobsAvailable("c")], key=repr
    )


@pytest.mark.parametrize("start", STARTS)
async def test_a_unique_key_held_by_a_job_that_is_not_final_adds_nothing(make_backend, autojump_clock, start: str) -> None:
    async with opened(make_backend) as backend:
        holder = await in_state(backend, start, unique_key="acct:1")
        before = await backend.stats()
        events = listen(backend)
        (res,) = await backend.insert_many([new(unique_key="acct:1")])
        after = await backend.stats()
    if STATE_OF[start].final:
        assert res.existing is False and res.id != holder  # a final job holds its key no more
        assert JobsAvailable(Q) in events
    else:
        assert res == InsertResult(holder, True)
        assert after == before and events == []


async def test_a_key_twice_in_one_batch_gets_the_first_jobs_id_twice(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        results = await backend.insert_many([new(unique_key="k"), new(), new(unique_key="k"), new(unique_key="other")])
        stats = await backend.stats()
    first = results[0].id
    assert [r.existing for r in results] == [False, False, True, False]
    assert results[2].id == first and len({r.id for r in results}) == 3
    assert stats[Q].available == 3


# -- claim --


async def test_claim_takes_priority_then_run_at_then_id(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        now = backend.now()
        # scheduled jobs that are due by the time of the claim take their place by run_at
        specs = [(0, 5.0), (1, 9.0), (1, 2.0), (0, 0.0), (2, 7.0), (1, 2.0), (0, 5.0)]
        ids = [(await backend.insert_many([new(priority=p, delay=d or None, now=now)]))[0].id for p, d in specs]
        await trio.sleep(10)
        events = listen(backend)
        result = await backend.claim(Q, 100)
    expected = sorted(range(len(specs)), key=lambda i: (-specs[i][0], specs[i][1], ids[i]))
    assert [j.id for j in result.jobs] == [ids[i] for i in expected]
    assert result.next_due is None and events == []


async def test_claim_takes_at_most_limit_and_leaves_the_rest_in_order(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        ids = [r.id for r in await backend.insert_many([new() for _ in range(5)])]
        first = await backend.claim(Q, 2)
        none = await backend.claim(Q, 0)
        rest = await backend.claim(Q, 10)
        empty = await backend.claim(Q, 10)
    assert [j.id for j in first.jobs] == ids[:2] and none.jobs == []
    assert [j.id for j in rest.jobs] == ids[2:] and empty.jobs == []


async def test_claim_takes_only_its_own_queue(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        a = await in_state(backend, "available", queue="a")
        b = await in_state(backend, "available", queue="b")
        got_a = await backend.claim("a", 10)
        got_c = await backend.claim("c", 10)
        job_b = await backend.get_job(b)
    assert [j.id for j in got_a.jobs] == [a] and got_c.jobs == [] and job_b.state is nj.JobState.AVAILABLE


async def test_a_claimed_job_is_running_its_next_attempt_with_a_fresh_heartbeat(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        (res,) = await backend.insert_many([new(7, priority=3, args='{"n": 1}')])
        await trio.sleep(50)
        now = backend.now()
        (claimed,) = (await backend.claim(Q, 1)).jobs
        job = await backend.get_job(res.id)
        assert await backend.rescue(stale_before=now) == []  # its heartbeat started at the claim
        stats = await backend.stats()
    assert claimed == ClaimedJob(res.id, "work", Q, '{"n": 1}', 1, 7, 3, job.created_at)
    assert job.state is nj.JobState.RUNNING and job.attempt == 1 and job.attempted_at == now
    assert stats[Q].running == 1 and stats[Q].available == 0


async def test_a_claimed_job_says_when_it_became_due_its_insert_its_run_at_or_its_backoff(make_backend, autojump_clock) -> None:
    # What the wait for a worker is timed from (`AttemptEnd.wait`): the insert for a job due at
    # once, its run_at for a scheduled one, the backoff's end for a retry.
    async with opened(make_backend) as backend:
        inserted = backend.now()
        now_job, later_job = await backend.insert_many([new(), new(delay=20, now=inserted)])
        await trio.sleep(30)
        first = {j.id: j.run_at for j in (await backend.claim(Q, 10)).jobs}
        retry_at = backend.now() + 5
        await backend.finish_many([Outcome(now_job.id, 1, OutcomeKind.RETRY, retry_at, nj.JobError(1, backend.now(), "x"))])
        await trio.sleep(10)
        (again,) = (await backend.claim(Q, 10)).jobs
    assert first == {now_job.id: inserted, later_job.id: inserted + 20}
    assert (again.id, again.attempt, again.run_at) == (now_job.id, 2, retry_at)


@pytest.mark.parametrize("start", STARTS)
async def test_claim_takes_a_row_only_when_it_is_pending_and_due(make_backend, autojump_clock, start: str) -> None:
    async with opened(make_backend) as backend:
        job_id = await in_state(backend, start)
        before = await backend.get_job(job_id)
        now = backend.now()
        result = await backend.claim(Q, 10)
        if start == "available":
            assert [j.id for j in result.jobs] == [job_id] and result.next_due is None
            return
        assert result.jobs == []
        assert result.next_due == (before.run_at if start in PENDING else None)
        assert await backend.get_job(job_id) == before
        await trio.sleep_until(now + 100)  # every pending row is due now
        later = await backend.claim(Q, 10)
        after = await backend.get_job(job_id)
    if start in PENDING:
        assert [(j.id, j.attempt) for j in later.jobs] == [(job_id, before.attempt + 1)]
        assert after.state is nj.JobState.RUNNING
    else:
        assert later.jobs == [] and after == before


async def test_next_due_is_the_earliest_run_at_of_the_queues_later_jobs(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        now = backend.now()
        await backend.insert_many([new(delay=30, now=now), new(delay=10, now=now), new(delay=20, now=now, queue="other")])
        first = await backend.claim(Q, 10)
        await trio.sleep(15)
        second = await backend.claim(Q, 10)
        await trio.sleep(15)
        third = await backend.claim(Q, 10)
    assert first.jobs == [] and first.next_due == now + 10
    assert len(second.jobs) == 1 and second.next_due == now + 30
    assert len(third.jobs) == 1 and third.next_due is None


async def test_concurrent_claims_never_return_the_same_job(store, autojump_clock) -> None:
    """Several instances on one store, as several processes: each job goes to one claim."""
    backends = [store.open() for _ in range(3)]
    for backend in backends:
        await backend.open()
    try:
        ids = {r.id for r in await backends[0].insert_many([new() for _ in range(30)])}
        got: list[int] = []

        async def claimer(backend: nj.Backend) -> None:
            for _ in range(6):
                got.extend(j.id for j in (await backend.claim(Q, 2)).jobs)

        async with trio.open_nursery() as nursery:
            for backend in backends:
                nursery.start_soon(claimer, backend)
    finally:
        for backend in backends:
            await backend.close()
    assert len(got) == len(set(got)) == 30 and set(got) == ids


@pytest.mark.parametrize("start", NOT_RUNNING + ["running"])
async def test_a_pending_row_of_another_queue_or_state_does_not_change_next_due(make_backend, autojump_clock, start) -> None:
    async with opened(make_backend) as backend:
        await in_state(backend, start, queue="other")
        result = await backend.claim(Q, 10)
    assert result.jobs == [] and result.next_due is None

