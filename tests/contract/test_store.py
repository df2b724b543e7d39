"""The rest of `JobStore`, called directly: heartbeat, rescue, cancel, retention
(`delete_finished`), reads (`get_job`, `stats`), the clock and the life cycle (`open`, `close`,
`check_budget`), each as its docstring in `nursery_jobs/backends/protocol.py` promises."""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import HeartbeatResult, JobFinalized, JobsAvailable, Outcome, OutcomeKind, QueueCounts

from .common import FINAL, NOT_RUNNING, STARTS, STATE_OF, Q, in_state, listen, new, opened, running

# -- heartbeat --


async def test_an_empty_heartbeat_reports_nothing(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        events = listen(backend)
        assert await backend.heartbeat([]) == HeartbeatResult([], [])
        assert events == []


async def test_a_heartbeat_for_a_job_that_does_not_exist_reports_it_lost(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        job_id, attempt = await running(backend)
        result = await backend.heartbeat([(job_id, attempt), (10**9, 1)])
    assert result.lost == [(10**9, 1)] and result.cancel == []


async def test_a_repeated_heartbeat_renews_each_time_and_emits_nothing(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        job_id, attempt = await running(backend, cancel_requested=True)
        events = listen(backend)
        for _ in range(3):
            await trio.sleep(10)
            assert await backend.heartbeat([(job_id, attempt)]) == HeartbeatResult([], [job_id])
            assert await backend.rescue(stale_before=backend.now() - 5) == []
        assert events == []


# -- rescue --


@pytest.mark.parametrize("start", NOT_RUNNING)
async def test_rescue_leaves_every_row_that_is_not_running_alone(make_backend, autojump_clock, start: str) -> None:
    async with opened(make_backend) as backend:
        job_id = await in_state(backend, start)
        before = await backend.get_job(job_id)
        await trio.sleep(10)
        events = listen(backend)
        assert await backend.rescue(stale_before=backend.now()) == []
        assert await backend.get_job(job_id) == before and events == []


async def test_rescue_returns_the_rescued_ids_ascending_and_rescues_each_once(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        ids = [r.id for r in await backend.insert_many([new() for _ in range(4)])]
        claimed = (await backend.claim(Q, 4)).jobs
        await trio.sleep(10)
        await backend.heartbeat([(ids[2], 1)])  # this one's worker is alive
        first = await backend.rescue(stale_before=backend.now() - 1)
        second = await backend.rescue(stale_before=backend.now() - 1)
    assert len(claimed) == 4
    assert first == [ids[0], ids[1], ids[3]] and second == []


async def test_concurrent_rescues_never_rescue_a_job_twice(store, autojump_clock) -> None:
    """Several instances on one store, as several processes' rescuers."""
    backends = [store.open() for _ in range(3)]
    for backend in backends:
        await backend.open()
    try:
        ids = [r.id for r in await backends[0].insert_many([new() for _ in range(10)])]
        assert len((await backends[0].claim(Q, 10)).jobs) == 10
        await trio.sleep(10)
        found: list[list[int]] = []

        async def rescuer(backend: nj.Backend) -> None:
            found.append(await backend.rescue(stale_before=backend.now() - 1))

        async with trio.open_nursery() as nursery:
            for backend in backends:
                nursery.start_soon(rescuer, backend)
        attempts = {(await backends[1].get_job(i)).attempt for i in ids}
        failed = (await backends[2].stats())[Q].failed
    finally:
        for backend in backends:
            await backend.close()
    every = [i for ids_ in found for i in ids_]
    assert sorted(every) == ids and all(f == sorted(f) for f in found)
    assert attempts == {1} and failed == 10  # each rescued once: one failed attempt each


# -- cancel --


async def test_cancel_of_a_job_that_does_not_exist_raises_job_not_found(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        events = listen(backend)
        with pytest.raises(nj.JobNotFound):
            await backend.cancel(10**9)
        assert events == []


async def test_a_cancelled_pending_job_is_never_claimed_and_frees_its_unique_key(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        job_id = await in_state(backend, "available", unique_key="k")
        assert await backend.cancel(job_id) is nj.JobState.CANCELLED
        assert (await backend.claim(Q, 10)).jobs == []
        (again,) = await backend.insert_many([new(unique_key="k")])
    assert again.existing is False and again.id != job_id


# -- delete_finished (retention) --


async def _finished_at(backend: nj.Backend, *times: float, state: str = "completed") -> list[int]:
    """Jobs made final at each of `times` (absolute, on the backend's clock), in that order."""
    ids = []
    for t in times:
        await trio.sleep_until(t)
        ids.append(await in_state(backend, state))
    return ids


@pytest.mark.parametrize("start", STARTS)
async def test_retention_deletes_only_final_rows_of_the_named_states_before_their_cutoff(
    make_backend, autojump_clock, start: str
) -> None:
    async with opened(make_backend) as backend:
        job_id = await in_state(backend, start)
        await trio.sleep(10)
        now = backend.now()
        events = listen(backend)
        every_state = {s: now for s in nj.JobState}
        other_states = {s: now for s in nj.JobState if s is not STATE_OF[start]}
        assert await backend.delete_finished(other_states, 10) == 0
        assert await backend.delete_finished({STATE_OF[start]: now - 20}, 10) == 0  # finalized after the cutoff
        deleted = await backend.delete_finished(every_state, 10)
        if start in FINAL:
            with pytest.raises(nj.JobNotFound):
                await backend.get_job(job_id)
            assert await backend.stats() == {}  # a queue is in the stats while it holds jobs
        else:
            assert (await backend.get_job(job_id)).state is STATE_OF[start]
    assert deleted == (1 if start in FINAL else 0) and events == []


async def test_retention_deletes_at_most_limit_oldest_first_within_a_state(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        # the job with the lower id is finalized last: oldest means finalized first, not lowest id
        late, early = (r.id for r in await backend.insert_many([new(), new()]))
        claimed = {j.id: j.attempt for j in (await backend.claim(Q, 2)).jobs}
        await backend.finish_many([Outcome(early, claimed[early], OutcomeKind.COMPLETED)])
        await trio.sleep(5)
        await backend.finish_many([Outcome(late, claimed[late], OutcomeKind.COMPLETED)])
        more = await _finished_at(backend, backend.now() + 5, backend.now() + 6)
        cutoff = {nj.JobState.COMPLETED: backend.now() + 1}
        await trio.sleep(2)
        assert await backend.delete_finished(cutoff, 1) == 1
        assert (await backend.stats())[Q].completed == 3
        with pytest.raises(nj.JobNotFound):
            await backend.get_job(early)
        assert await backend.delete_finished(cutoff, 2) == 2
        assert await backend.delete_finished(cutoff, 2) == 1
        assert await backend.delete_finished(cutoff, 2) == 0
    assert len(more) == 2


async def test_retention_applies_each_states_own_cutoff(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        done = await _finished_at(backend, 1.0, state="completed")
        gone = await _finished_at(backend, 2.0, state="discarded")
        stopped = await _finished_at(backend, 3.0, state="cancelled")
        await trio.sleep_until(10)
        exactly = {nj.JobState.COMPLETED: 1.0, nj.JobState.DISCARDED: 2.0, nj.JobState.CANCELLED: 3.0}
        assert await backend.delete_finished(exactly, 10) == 0  # finalized *before* the cutoff only
        cutoffs = {nj.JobState.COMPLETED: 5.0, nj.JobState.DISCARDED: 1.5, nj.JobState.CANCELLED: 5.0}
        assert await backend.delete_finished(cutoffs, 10) == 2
        assert (await backend.get_job(gone[0])).state is nj.JobState.DISCARDED
        for job_id in done + stopped:
            with pytest.raises(nj.JobNotFound):
                await backend.get_job(job_id)


async def test_retention_also_forgets_the_deleted_jobs_failed_attempts(make_backend, autojump_clock) -> None:
    """`stats` counts failed and interrupted attempts over the jobs kept."""
    async with opened(make_backend) as backend:
        await in_state(backend, "discarded")  # one failed attempt
        kept = await in_state(backend, "retryable")  # one failed attempt
        await trio.sleep(10)
        before = (await backend.stats())[Q]
        assert await backend.delete_finished({nj.JobState.DISCARDED: backend.now()}, 10) == 1
        after = (await backend.stats())[Q]
        assert (await backend.get_job(kept)).state is nj.JobState.RETRYABLE
    assert (before.failed, after.failed) == (2, 1)


# -- get_job, stats --


async def test_get_job_of_a_job_that_does_not_exist_raises_job_not_found(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        with pytest.raises(nj.JobNotFound):
            await backend.get_job(10**9)


async def test_get_job_is_a_snapshot(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        job_id, attempt = await running(backend)
        before = await backend.get_job(job_id)
        await backend.finish_many([Outcome(job_id, attempt, OutcomeKind.COMPLETED)])
        after = await backend.get_job(job_id)
    assert before.state is nj.JobState.RUNNING and after.state is nj.JobState.COMPLETED


async def test_stats_counts_every_state_per_queue(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        # "available" last: every other start claims the queue's due job
        for i, start in sorted(enumerate(STARTS), key=lambda p: p[1] == "available"):
            await in_state(backend, start, queue=f"q{i % 2}")
        # an interrupted attempt and a retry without an error: not failures
        job_id, attempt = await running(backend, queue="q1")
        await backend.finish_many([Outcome(job_id, attempt, OutcomeKind.RETRY, backend.now() + 100)])
        job_id, attempt = await running(backend, queue="q1")
        await backend.finish_many([Outcome(job_id, attempt, OutcomeKind.INTERRUPTED)])
        events = listen(backend)
        stats = await backend.stats()
    expected: dict[str, dict[str, int]] = {"q0": {}, "q1": {}}
    for i, start in enumerate(STARTS):
        by_state = expected[f"q{i % 2}"]
        by_state[STATE_OF[start].value] = by_state.get(STATE_OF[start].value, 0) + 1
    expected["q1"]["available"] = expected["q1"].get("available", 0) + 1
    expected["q1"]["retryable"] = expected["q1"].get("retryable", 0) + 1
    failed = {"q0": 0, "q1": 0}
    for i, start in enumerate(STARTS):
        failed[f"q{i % 2}"] += start in ("retryable", "discarded")
    assert stats == {
        q: QueueCounts(**{**by_state, "failed": failed[q], "interrupted": int(q == "q1")}) for q, by_state in expected.items()
    }
    assert events == []


async def test_stats_of_an_empty_store_is_empty(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        assert await backend.stats() == {}
        await backend.claim("nothing-here", 10)  # asking about a queue does not make it exist
        assert await backend.stats() == {}


# -- the clock and the life cycle --


async def test_now_is_the_clock_every_time_is_on(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        t0 = backend.now()
        await trio.sleep(7)
        t1 = backend.now()
        (res,) = await backend.insert_many([new()])
        job = await backend.get_job(res.id)
    assert t1 >= t0 + 7 and job.created_at == job.run_at == t1


async def test_open_and_close_are_idempotent_and_a_closed_backend_opens_again(make_backend, autojump_clock) -> None:
    backend = make_backend()
    backend.check_budget(1)  # before open
    await backend.open()
    await backend.open()
    (res,) = await backend.insert_many([new()])
    await backend.close()
    await backend.close()
    await backend.open()
    try:
        job = await backend.get_job(res.id)  # the same store: its jobs are still there
        (claimed,) = (await backend.claim(Q, 1)).jobs
    finally:
        await backend.close()
    assert job.state is nj.JobState.AVAILABLE and claimed.id == res.id


def test_check_budget_accepts_one_worker_and_refuses_only_with_a_config_error(make_backend) -> None:
    backend = make_backend()
    backend.check_budget(1)
    try:
        backend.check_budget(10**6)
    except nj.ConfigError as exc:
        assert "10" in str(exc) or "worker" in str(exc), exc  # it says what is wrong


# -- the clock --


async def test_wall_offset_maps_unix_time_onto_the_clock_and_never_changes(make_backend, autojump_clock) -> None:
    import time

    async with opened(make_backend) as backend:
        offset = backend.wall_offset()
        assert abs(backend.now() - offset - time.time()) < 5  # the same present, read both ways
        await trio.sleep(60)  # virtual time moves the clock; the mapping stays
        assert backend.wall_offset() == offset
