"""`finish_many`, `rescue`, `cancel` and `heartbeat`, for every outcome and starting state,
against the job rules: whatever a backend stores must be what `transitions` decides.

The expectations are computed by `after_outcome`, `after_rescue` and `on_cancel`, never written
by hand here: changing a rule (a snooze that ignores a pending cancel request, say) changes the
expectation for every backend at once, and a backend that stores something else fails.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import CancelRequested, JobFinalized, JobsAvailable, NewJob, Outcome, OutcomeKind
from nursery_jobs.backends.transitions import CancelAction, after_outcome, after_rescue, on_cancel

Q = "q"


def _new(max_attempts: int = 5, delay: float | None = None, now: float = 0.0) -> NewJob:
    return NewJob("work", Q, "{}", 0, None if delay is None else now + delay, max_attempts)


@contextlib.asynccontextmanager
async def opened(make_backend: Callable[[], nj.Backend]) -> AsyncIterator[nj.Backend]:
    backend = make_backend()
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


async def _running(backend: nj.Backend, *, cancel_requested: bool = False, max_attempts: int = 5) -> tuple[int, int]:
    """A job running its first attempt (optionally with a cancel request); (id, attempt)."""
    (res,) = await backend.insert_many([_new(max_attempts)])
    (job,) = (await backend.claim(Q, 1)).jobs
    assert job.id == res.id and job.attempt == 1
    if cancel_requested:
        assert await backend.cancel(job.id) is nj.JobState.RUNNING
    return job.id, job.attempt


async def _counts(backend: nj.Backend) -> tuple[int, int]:
    c = (await backend.stats()).get(Q)
    return (0, 0) if c is None else (c.failed, c.interrupted)


COMBOS = list(itertools.product(OutcomeKind, [False, True], [False, True], [0.0, 30.0]))


@pytest.mark.parametrize(
    "kind, cancel_requested, has_error, later",
    COMBOS,
    ids=[f"{k.value}-{'cancel' if c else 'plain'}-{'error' if e else 'quiet'}-{'later' if lt else 'now'}" for k, c, e, lt in COMBOS],
)
async def test_finish_stores_what_the_rules_decide(
    make_backend, autojump_clock, kind: OutcomeKind, cancel_requested: bool, has_error: bool, later: float
) -> None:
    async with opened(make_backend) as backend:
        job_id, attempt = await _running(backend, cancel_requested=cancel_requested)
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
    assert job.state is expected.state
    assert job.attempt == attempt + expected.attempt_delta
    assert job.run_at == (before.run_at if expected.run_at is None else expected.run_at)
    assert (job.finalized_at is not None) == expected.state.final
    assert (failed - failed0, interrupted - interrupted0) == (expected.failed, expected.interrupted)
    assert [e.message for e in job.errors] == (["OSError: down"] if has_error else [])
    if expected.state.final:
        assert JobFinalized(job_id, expected.state, "OSError: down" if has_error else None) in events
    elif expected.state is nj.JobState.AVAILABLE:
        assert JobsAvailable(Q) in events
    else:
        assert JobsAvailable(Q, expected.run_at) in events


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
    if expected.state.final:
        assert [e for e in events if isinstance(e, JobFinalized)] == [JobFinalized(job_id, expected.state, job.errors[-1].message)]
    else:
        assert JobsAvailable(Q) in events


STARTS = ["available", "scheduled", "running", "running-requested", "retryable", "completed", "discarded", "cancelled"]


async def _in_state(backend: nj.Backend, start: str) -> int:
    now = backend.now()
    if start == "available":
        return (await backend.insert_many([_new()]))[0].id
    if start == "scheduled":
        return (await backend.insert_many([_new(delay=100, now=now)]))[0].id
    job_id, attempt = await _running(backend, cancel_requested=start == "running-requested")
    finish = {
        "retryable": Outcome(job_id, attempt, OutcomeKind.RETRY, now + 100, nj.JobError(1, now, "x")),
        "completed": Outcome(job_id, attempt, OutcomeKind.COMPLETED),
        "discarded": Outcome(job_id, attempt, OutcomeKind.DISCARD, None, nj.JobError(1, now, "x")),
        "cancelled": Outcome(job_id, attempt, OutcomeKind.CANCELLED),
    }.get(start)
    if finish is not None:
        await backend.finish_many([finish])
    return job_id


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
        assert [e for e in events if isinstance(e, JobFinalized)] == [JobFinalized(job_id, nj.JobState.CANCELLED, last_error)]


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
