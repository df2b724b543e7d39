"""Rules of the backend protocol (nursery_jobs/backends/__init__.py and docs/guarantees.md) that
one runtime on one backend never exercises, called directly as runtimes in other processes do.

A runtime decides by itself what one backend instance would otherwise have to: a cancel
requested while its attempt runs reaches its executor at once, which ends the attempt as
cancelled before the backend sees any outcome; and a job given out again comes back to the same
executor, which cancels the older attempt without asking. When the request or the rescue comes
from another process, the outcome the worker writes is a retry, a snooze or an interruption, and
only the backend can end the job as the rules say. So these tests play both processes' parts.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import CancelRequested, JobFinalized, NewJob, Outcome, OutcomeKind

NOT_CANCELLED = {
    OutcomeKind.RETRY: nj.JobState.RETRYABLE,
    OutcomeKind.SNOOZE: nj.JobState.SCHEDULED,
    OutcomeKind.INTERRUPTED: nj.JobState.AVAILABLE,
}


def _new(max_attempts: int = 25) -> NewJob:
    return NewJob("work", "default", "{}", 0, None, max_attempts)


@contextlib.asynccontextmanager
async def opened(make_backend: Callable[[], nj.Backend]) -> AsyncIterator[nj.Backend]:
    backend = make_backend()
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


@pytest.mark.parametrize("kind", list(NOT_CANCELLED), ids=lambda k: k.value)
async def test_a_non_final_outcome_of_a_job_whose_cancel_was_requested_ends_it_cancelled(
    kind, make_backend, autojump_clock
):
    async with opened(make_backend) as backend:
        requested, untouched = await backend.insert_many([_new(), _new()])
        claimed = {j.id: j for j in (await backend.claim("default", 2)).jobs}
        events: list[object] = []
        backend.add_listener(events.append)
        # another process asks; the worker has not heard yet, and its attempt ends otherwise
        assert await backend.cancel(requested.id) is nj.JobState.RUNNING
        now = backend.now()
        error = nj.JobError(1, now, "OSError: down") if kind is OutcomeKind.RETRY else None
        await backend.finish_many(
            [Outcome(job_id, claimed[job_id].attempt, kind, now + 10, error) for job_id in (requested.id, untouched.id)]
        )
        job = await backend.get_job(requested.id)
        assert job.state is nj.JobState.CANCELLED and job.finalized_at is not None
        assert (await backend.get_job(untouched.id)).state is NOT_CANCELLED[kind]  # the rule is per job
        assert CancelRequested(requested.id) in events
        assert [e.state for e in events if isinstance(e, JobFinalized) and e.job_id == requested.id] == [
            nj.JobState.CANCELLED
        ]
        await trio.sleep(20)  # past the retry's or the snooze's run_at: it never comes back
        assert [j.id for j in (await backend.claim("default", 10)).jobs] == [untouched.id]
        assert (await backend.get_job(requested.id)).state is nj.JobState.CANCELLED


async def test_a_rescue_spends_the_attempt_and_discards_a_job_that_had_none_left(make_backend, autojump_clock):
    async with opened(make_backend) as backend:
        last, more = await backend.insert_many([_new(max_attempts=1), _new(max_attempts=2)])
        assert len((await backend.claim("default", 2)).jobs) == 2  # a worker that then dies
        await trio.sleep(10)
        assert sorted(await backend.rescue(stale_before=backend.now())) == sorted([last.id, more.id])
        discarded, again = await backend.get_job(last.id), await backend.get_job(more.id)
        assert discarded.state is nj.JobState.DISCARDED and discarded.finalized_at is not None
        assert discarded.errors[-1].message.startswith("rescued: its worker stopped heartbeating")
        assert again.state is nj.JobState.AVAILABLE and again.attempt == 1  # the attempt counted
        assert (await backend.stats())["default"].failed == 2  # each rescued attempt is a failed one
        assert [j.id for j in (await backend.claim("default", 10)).jobs] == [more.id]


async def test_a_rescued_job_whose_cancel_was_requested_ends_cancelled(make_backend, autojump_clock):
    async with opened(make_backend) as backend:
        [res] = await backend.insert_many([_new()])
        assert len((await backend.claim("default", 1)).jobs) == 1
        assert await backend.cancel(res.id) is nj.JobState.RUNNING  # requested; its worker is dead
        await trio.sleep(10)
        assert await backend.rescue(stale_before=backend.now()) == [res.id]
        assert (await backend.get_job(res.id)).state is nj.JobState.CANCELLED
        assert (await backend.claim("default", 10)).jobs == []


async def test_a_heartbeat_reports_the_attempts_its_worker_no_longer_owns(make_backend, autojump_clock):
    async with opened(make_backend) as backend:
        rescued, finished, kept = (r.id for r in await backend.insert_many([_new(), _new(), _new()]))
        assert {j.attempt for j in (await backend.claim("default", 3)).jobs} == {1}
        await trio.sleep(10)
        beat = await backend.heartbeat([(finished, 1), (kept, 1)])  # this worker's: all still owned
        assert beat.lost == [] and beat.cancel == []
        assert await backend.rescue(stale_before=backend.now() - 1) == [rescued]  # no heartbeat for 10 s
        [again] = (await backend.claim("default", 1)).jobs  # another worker runs it now
        assert (again.id, again.attempt) == (rescued, 2)
        await backend.finish_many([Outcome(finished, 1, OutcomeKind.COMPLETED)])
        beat = await backend.heartbeat([(rescued, 1), (finished, 1), (kept, 1)])
        assert sorted(beat.lost) == sorted([(rescued, 1), (finished, 1)]) and beat.cancel == []
        assert (await backend.heartbeat([(rescued, 2)])).lost == []  # the new owner's attempt
