"""What the contract tests share: a backend opened for one test, and a job put in any starting
state through the protocol itself (insert, claim, finish, cancel), as the runtime would."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import nursery_jobs as nj
from nursery_jobs.backends import NewJob, Outcome, OutcomeKind

Q = "q"

STARTS = [
    "available",
    "scheduled",
    "running",
    "running-requested",
    "retryable",
    "snoozed",
    "completed",
    "discarded",
    "cancelled",
]
"""Every state a row can be in (a running one with or without a cancel request; a scheduled one
fresh or snoozed, which gave its attempt back)."""

PENDING = ["available", "scheduled", "retryable", "snoozed"]
FINAL = ["completed", "discarded", "cancelled"]
NOT_RUNNING = PENDING + FINAL


def new(
    max_attempts: int = 5,
    delay: float | None = None,
    now: float = 0.0,
    *,
    queue: str = Q,
    priority: int = 0,
    unique_key: str | None = None,
    args: str = "{}",
) -> NewJob:
    return NewJob("work", queue, args, priority, None if delay is None else now + delay, max_attempts, unique_key)


@contextlib.asynccontextmanager
async def opened(make_backend: Callable[[], nj.Backend]) -> AsyncIterator[nj.Backend]:
    backend = make_backend()
    await backend.open()
    try:
        yield backend
    finally:
        await backend.close()


class Events(list[Any]):
    """Every event a backend emits while listened to."""

    def of(self, kind: type) -> list[Any]:
        return [e for e in self if isinstance(e, kind)]


def listen(backend: nj.Backend) -> Events:
    events = Events()
    backend.add_listener(events.append)
    return events


async def running(
    backend: nj.Backend, *, cancel_requested: bool = False, max_attempts: int = 5, queue: str = Q, unique_key: str | None = None
) -> tuple[int, int]:
    """A job running its first attempt (optionally with a cancel request); (id, attempt)."""
    (res,) = await backend.insert_many([new(max_attempts, queue=queue, unique_key=unique_key)])
    (job,) = (await backend.claim(queue, 1)).jobs
    assert job.id == res.id and job.attempt == 1
    if cancel_requested:
        assert await backend.cancel(job.id) is nj.JobState.RUNNING
    return job.id, job.attempt


async def in_state(backend: nj.Backend, start: str, *, queue: str = Q, unique_key: str | None = None) -> int:
    """A job of `queue` in the starting state `start` (one of `STARTS`), made through the
    protocol. Pending states wait 100 s into the future, so a claim now leaves them alone."""
    now = backend.now()
    if start == "available":
        return (await backend.insert_many([new(queue=queue, unique_key=unique_key)]))[0].id
    if start == "scheduled":
        return (await backend.insert_many([new(delay=100, now=now, queue=queue, unique_key=unique_key)]))[0].id
    job_id, attempt = await running(backend, cancel_requested=start == "running-requested", queue=queue, unique_key=unique_key)
    finish = {
        "retryable": Outcome(job_id, attempt, OutcomeKind.RETRY, now + 100, nj.JobError(1, now, "x")),
        "snoozed": Outcome(job_id, attempt, OutcomeKind.SNOOZE, now + 100),
        "completed": Outcome(job_id, attempt, OutcomeKind.COMPLETED),
        "discarded": Outcome(job_id, attempt, OutcomeKind.DISCARD, None, nj.JobError(1, now, "x")),
        "cancelled": Outcome(job_id, attempt, OutcomeKind.CANCELLED),
    }.get(start)
    if finish is not None:
        await backend.finish_many([finish])
    return job_id


STATE_OF = {
    "available": nj.JobState.AVAILABLE,
    "scheduled": nj.JobState.SCHEDULED,
    "running": nj.JobState.RUNNING,
    "running-requested": nj.JobState.RUNNING,
    "retryable": nj.JobState.RETRYABLE,
    "snoozed": nj.JobState.SCHEDULED,
    "completed": nj.JobState.COMPLETED,
    "discarded": nj.JobState.DISCARDED,
    "cancelled": nj.JobState.CANCELLED,
}


async def counts(backend: nj.Backend, queue: str = Q) -> tuple[int, int]:
    """(failed, interrupted) attempts of `queue`."""
    c = (await backend.stats()).get(queue)
    return (0, 0) if c is None else (c.failed, c.interrupted)
