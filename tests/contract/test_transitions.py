"""`finish_many`, `rescue`, `cancel` and `heartbeat`, for every outcome and starting state,
against the job rules: whatever a backend stores must be what `transitions` decides.

The expectations are computed by `after_outcome`, `after_rescue` and `on_cancel`, never written
by hand here: changing a rule (a snooze that ignores a pending cancel request, say) changes the
expectation for every backend at once, and a backend that stores something else fails.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import CancelRequested, JobFinalized, JobsAvailable, NewJob, Outcome, OutcomeKind
from nursery_jobs.rules import CancelAction, after_outcome, after_rescue, on_cancel
from nursery_jobs.jobs import MAX_ERRORS_KEPT

from .common import NOT_RUNNING, STARTS, Q, counts as _counts, in_state as _in_state, new as _new, opened, running as _running

COMBOS = list(itertools.product(OutcomeKind, [False, True], [False, True], [0.0, 30.0, -30.0]))
WHEN = {0.0: "now", 30.0: "later", -30.0: "past"}


@pytest.mark.parametrize(
    "kind, cancel_requested, has_error, later",
    COMBOS,
    ids=[f"{k.value}-{'cancel' if c else 'plain'}-{'error' if e else 'quiet'}-{WHEN[lt]}" for k, c, e, lt in COMBOS],
)
async def test_finish_stores_what_the_rules_decide(
    make_backend, autojump_clock, kind: OutcomeKind, cancel_requested: bool, has_error: bool, later: float
) -> None:
    async with opened(make_backend) as backend:
        await trio.sleep(100)  # a run_at in the past is still a time the clock has seen
        job_id, attempt = await _running(backend, cancel_requested=cancel_requested, unique_key="k")
        before = await backend.get_job(job_id)
        failed0, interrupted0 = await _counts(backend)
        events: list[Any] = []
        backend.add_listener(events.append)
        now = backend.now()
        error = nj.JobError(attempt, now, "OSError: down", "Traceback ...") if has_error else None
        run_at = now + later if kind in (OutcomeKind.RETRY, OutcomeKind.SNOOZE) else None
        await backend.finish_many([Outcome(job_id, attempt, kind, run_at, error)])
        expected = after_outcome(kind, cancel_requested=cancel_requested, has_error=has_error, run_at=run_at, now=now)
        job = await backend.get_job(job_id)
        failed, interrupted = await _counts(backend)
        emitted = list(events)
        (again,) = await backend.insert_many([_new(unique_key="k")])  # a final job frees its key
        await trio.sleep(60)  # past any run_at: a job that may run again is claimed, a final one never
        claimed = [(j.id, j.attempt) for j in (await backend.claim(Q, 10)).jobs]
    if expected.state.final:
        assert claimed == [(again.id, 1)]
    else:
        assert claimed == [(job_id, attempt + expected.attempt_delta + 1)]
    assert again.existing is not expected.state.final and (again.id == job_id) is not expected.state.final
    assert job.state is expected.state
    assert job.attempt == attempt + expected.attempt_delta
    assert job.run_at == (before.run_at if expected.run_at is None else expected.run_at)
    assert (job.finalized_at is not None) == expected.state.final
    assert (failed - failed0, interrupted - interrupted0) == (expected.failed, expected.interrupted)
    assert [e.message for e in job.errors] == (["OSError: down"] if has_error else [])
    if expected.state.final:
        assert emitted == [JobFinalized(job_id, expected.state, "OSError: down" if has_error else None)]
    elif expected.state is nj.JobState.AVAILABLE:
        assert emitted == [JobsAvailable(Q)]
    else:
        assert emitted == [JobsAvailable(Q, expected.run_at)]


@pytest.mark.parametrize("kind", list(OutcomeKind), ids=lambda k: k.value)
async def test_finish_ignores_a_stale_attempt_and_a_row_that_is_not_running(make_backend, autojump_clock, kind) -> None:
    async with opened(make_backend) as backend:
        job_id, attempt = await _running(backend)
        (waiting,) = await backend.insert_many([_new(delay=100, now=backend.now())])
        events: list[Any] = []
        backend.add_listener(events.append)
        run_at = backend.now() + 5
        await backend.finish_many(
            [Outcome(job_id, attempt + 1, kind, run_at), Outcome(waiting.id, 0, kind, run_at), Outcome(10**9, 1, kind)]
        )
        assert (await backend.get_job(job_id)).state is nj.JobState.RUNNING
        assert (await backend.get_job(waiting.id)).state is nj.JobState.SCHEDULED
        assert events == []


@pytest.mark.parametrize(
    "cancel_requested, last_attempt", list(itertools.product([False, True], [False, True])), ids=str
)
async def test_rescue_stores_what_the_rules_decide(make_backend, autojump_clock, cancel_requested, last_attempt) -> None:
    async with opened(make_backend) as backend:
        job_id, attempt = await _running(backend, cancel_requested=cancel_requested, max_attempts=1 if last_attempt else 5)
        (fresh,) = await backend.insert_many([_new()])
        before = await backend.get_job(job_id)
        await trio.sleep(10)
        (beating,) = (await backend.claim(Q, 1)).jobs  # claimed after the cutoff: not stale
        failed0, _ = await _counts(backend)
        events: list[Any] = []
        backend.add_listener(events.append)
        now = backend.now()
        assert await backend.rescue(stale_before=now - 5) == [job_id]
        expected = after_rescue(attempt=attempt, max_attempts=before.max_attempts, cancel_requested=cancel_requested, now=now)
        job = await backend.get_job(job_id)
        failed, _ = await _counts(backend)
        assert (await backend.get_job(beating.id)).state is nj.JobState.RUNNING
    assert beating.id == fresh.id
    assert job.state is expected.state and job.attempt == attempt + expected.attempt_delta
    assert job.run_at == (before.run_at if expected.run_at is None else expected.run_at)
    assert (job.finalized_at is not None) == expected.state.final
    assert failed - failed0 == expected.failed
    assert job.errors[-1].message.startswith("rescued: its worker stopped heartbeating at")
    assert job.errors[-1].attempt == attempt
    if expected.state.final:
        assert events == [JobFinalized(job_id, expected.state, job.errors[-1].message)]
    else:
        assert events == [JobsAvailable(Q)]


@pytest.mark.parametrize("start", STARTS)
async def test_cancel_does_what_the_rules_say_in_every_state(make_backend, autojump_clock, start: str) -> None:
    async with opened(make_backend) as backend:
        job_id = await _in_state(backend, start)
        before = await backend.get_job(job_id)
        events: list[Any] = []
        backend.add_listener(events.append)
        returned = await backend.cancel(job_id)
        again = await backend.cancel(job_id)  # idempotent
        job = await backend.get_job(job_id)
    action = on_cancel(before.state)
    if action is CancelAction.NONE:
        assert returned is again is before.state and job == before and events == []
    elif action is CancelAction.REQUEST:
        assert returned is again is nj.JobState.RUNNING and job.state is nj.JobState.RUNNING
        # one request per running job, however often it is asked
        assert events == ([] if start == "running-requested" else [CancelRequested(job_id)])
    else:
        assert returned is nj.JobState.CANCELLED and again is nj.JobState.CANCELLED
        assert job.state is nj.JobState.CANCELLED and job.finalized_at is not None
        last_error = before.errors[-1].message if before.errors else None
        assert events == [JobFinalized(job_id, nj.JobState.CANCELLED, last_error)]  # once, however often asked


@pytest.mark.parametrize("start", STARTS)
async def test_heartbeat_renews_only_running_attempts_and_reports_the_rest(make_backend, autojump_clock, start: str) -> None:
    async with opened(make_backend) as backend:
        job_id = await _in_state(backend, start)
        job = await backend.get_job(job_id)
        attempt = max(job.attempt, 1)
        await trio.sleep(10)  # the claim's own heartbeat is stale by now
        result = await backend.heartbeat([(job_id, attempt), (job_id, attempt + 1)])
        rescued = await backend.rescue(stale_before=backend.now() - 5)
    if job.state is nj.JobState.RUNNING:
        assert result.lost == [(job_id, attempt + 1)]
        assert result.cancel == ([job_id] if start == "running-requested" else [])
        assert rescued == []  # renewed at the heartbeat, within the cutoff
    else:
        assert sorted(result.lost) == [(job_id, attempt), (job_id, attempt + 1)] and result.cancel == []


@pytest.mark.parametrize(
    "kind, start", list(itertools.product(OutcomeKind, NOT_RUNNING)), ids=lambda v: getattr(v, "value", v)
)
async def test_finish_leaves_a_row_that_is_not_running_as_it_is(make_backend, autojump_clock, kind, start: str) -> None:
    """The fence: an outcome for a row that moved on (rescued and finished elsewhere, cancelled,
    snoozed) changes nothing, whatever its attempt number, and emits nothing."""
    async with opened(make_backend) as backend:
        job_id = await _in_state(backend, start)
        before = await backend.get_job(job_id)
        stats_before = await backend.stats()
        events: list[Any] = []
        backend.add_listener(events.append)
        now = backend.now()
        error = nj.JobError(1, now, "late")
        await backend.finish_many([Outcome(job_id, a, kind, now + 5, error) for a in {before.attempt, 1}])
        assert await backend.get_job(job_id) == before
        assert await backend.stats() == stats_before
        assert events == []


async def test_finish_writes_a_batch_per_job_and_keeps_the_latest_errors(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        a, b, c = (r.id for r in await backend.insert_many([_new(50), _new(50), _new(50)]))
        claimed = (await backend.claim(Q, 3)).jobs
        assert [j.id for j in claimed] == [a, b, c]
        now = backend.now()
        await backend.finish_many(
            [
                Outcome(a, 1, OutcomeKind.COMPLETED),
                Outcome(b, 1, OutcomeKind.RETRY, now, nj.JobError(1, now, "b failed")),
                Outcome(c, 1, OutcomeKind.DISCARD, None, nj.JobError(1, now, "c discarded")),
            ]
        )
        states = [(await backend.get_job(i)).state for i in (a, b, c)]
        assert states == [nj.JobState.COMPLETED, nj.JobState.AVAILABLE, nj.JobState.DISCARDED]
        # b fails again and again: only the latest MAX_ERRORS_KEPT errors are kept, in order
        for attempt in range(2, MAX_ERRORS_KEPT + 4):
            (job,) = (await backend.claim(Q, 1)).jobs
            assert (job.id, job.attempt) == (b, attempt)
            await backend.finish_many([Outcome(b, attempt, OutcomeKind.RETRY, None, nj.JobError(attempt, now, f"b{attempt}"))])
        kept = (await backend.get_job(b)).errors
    assert [e.message for e in kept] == [f"b{n}" for n in range(4, MAX_ERRORS_KEPT + 4)]


@pytest.mark.parametrize("kind", list(OutcomeKind), ids=lambda k: k.value)
async def test_the_outcome_of_a_rescued_attempt_cannot_touch_the_next_one(make_backend, autojump_clock, kind) -> None:
    """The fencing token at work: attempt 1's worker was lost and rescued, attempt 2 runs
    elsewhere; attempt 1's late outcome, whatever it is, changes nothing."""
    async with opened(make_backend) as backend:
        job_id, first = await _running(backend)
        await trio.sleep(10)
        assert await backend.rescue(stale_before=backend.now() - 1) == [job_id]
        (again,) = (await backend.claim(Q, 1)).jobs
        before = await backend.get_job(job_id)
        events: list[Any] = []
        backend.add_listener(events.append)
        now = backend.now()
        await backend.finish_many([Outcome(job_id, first, kind, now + 5, nj.JobError(first, now, "late"))])
        after = await backend.get_job(job_id)
        beat = await backend.heartbeat([(job_id, first), (job_id, again.attempt)])
    assert (again.id, again.attempt) == (job_id, first + 1)
    assert after == before and after.state is nj.JobState.RUNNING and events == []
    assert beat.lost == [(job_id, first)]


@pytest.mark.parametrize("late_first", [True, False], ids=["late-first", "late-last"])
async def test_one_batch_with_two_attempts_of_a_job_applies_the_running_attempts_outcome(
    make_backend, autojump_clock, late_first: bool
) -> None:
    """A completer batch can hold the late outcome of a rescued attempt beside the outcome of
    the attempt now running, for the same job: only the running attempt's applies, in either
    order (a backend that looked outcomes up by job id alone would keep one of the two)."""
    async with opened(make_backend) as backend:
        job_id, first = await _running(backend)
        await trio.sleep(10)
        assert await backend.rescue(stale_before=backend.now() - 1) == [job_id]
        (again,) = (await backend.claim(Q, 1)).jobs
        now = backend.now()
        late = Outcome(job_id, first, OutcomeKind.RETRY, now + 5, nj.JobError(first, now, "late"))
        current = Outcome(job_id, again.attempt, OutcomeKind.COMPLETED)
        await backend.finish_many([late, current] if late_first else [current, late])
        job = await backend.get_job(job_id)
    assert (job.state, job.attempt) == (nj.JobState.COMPLETED, first + 1)
    assert len(job.errors) == 1 and "late" not in job.errors[0].message  # the rescue's entry only
