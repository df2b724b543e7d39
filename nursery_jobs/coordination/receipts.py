"""Receipt waiters: bounded in-request waiting for a job's outcome.

A request handler that enqueued a job may wait a short, bounded time for it to finish ("write,
then wait up to 2 s for the index"). Waiting is fed by the backend's `JobFinalized` events --
one listener per runtime fans them out to the waiters -- never by each request polling the
database. The waiter registers *before* it reads the job's state, so a job finalized between the
read and the wait is never missed.

Backpressure: at most `max_waiters` receipts (64 by default) are awaited at once per queue.
Beyond that `wait` answers at once with `done=False` instead of queueing the request: a burst of
requests degrades to "not done yet", never to an unbounded pile of waiters that holds every
request open and grows without limit while the workers are behind.
"""

from __future__ import annotations

import math
from typing import Callable

import trio

from ..backends import Backend
from ..errors import ConfigError
from ..jobs import Job, JobState, Receipt

__all__ = ["Receipts"]


class Receipts:
    """`wait` for a job's receipt; `on_finalized` is fed the backend's finalization events.

    `poll_for(queue)`: how often a waiter on a job of `queue` reads the row again while it
    waits, or None for the backend's own `poll_interval` (the queue's setting, in an
    enqueue-only web process too)."""

    def __init__(self, backend: Backend, max_waiters: int, poll_for: Callable[[str], float | None]) -> None:
        self._backend = backend
        self._poll_for = poll_for
        self._max = max_waiters
        self._events: dict[int, trio.Event] = {}
        self._refs: dict[int, int] = {}
        self._per_queue: dict[str, int] = {}

    @property
    def waiting(self) -> int:
        return sum(self._per_queue.values())

    def on_finalized(self, job_id: int) -> None:
        event = self._events.pop(job_id, None)
        if event is not None:
            event.set()

    def _listen(self, job_id: int) -> trio.Event:
        """The event the next finalization of `job_id` sets (shared by its waiters)."""
        event = self._events.get(job_id)
        if event is None:
            event = self._events[job_id] = trio.Event()
        return event

    async def wait(self, job_id: int, timeout: float) -> Receipt:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout < 0:
            raise ConfigError(f"wait timeout must be a finite number of seconds >= 0, not {timeout!r}; every wait is bounded")
        await trio.lowlevel.checkpoint()
        backend = self._backend
        event = self._listen(job_id)
        self._refs[job_id] = self._refs.get(job_id, 0) + 1
        queue = None
        try:
            job = await backend.get_job(job_id)
            if job.state.final:
                return _receipt(job)
            if self._per_queue.get(job.queue, 0) >= self._max:
                return _receipt(job)
            queue = job.queue
            self._per_queue[queue] = self._per_queue.get(queue, 0) + 1
            deadline = trio.current_time() + timeout
            # A backend that polls cannot push every finish from other processes: look again
            # every poll interval while waiting (PostgreSQL pushes them, and is polled anyway in
            # case a NOTIFY was lost while its listener reconnected).
            # The job's queue's own poll_interval, when it has one, is how soon its waiters
            # want to know (an awaited queue polls every 0.1 s), in an enqueue-only web process too.
            poll = math.inf
            if backend.poll_interval is not None:
                own = self._poll_for(queue)
                poll = own if own is not None else backend.poll_interval
            while True:
                with trio.move_on_at(min(deadline, trio.current_time() + poll)):
                    await event.wait()
                job = await backend.get_job(job_id)
                if job.state.final or trio.current_time() >= deadline:
                    return _receipt(job)
                if event.is_set():
                    # Woken, but the row says not final: the wake-up was a hint that did not
                    # hold (a notification anyone connected may send). Listen again.
                    event = self._listen(job_id)
        finally:
            if queue is not None:
                self._per_queue[queue] -= 1
            left = self._refs[job_id] - 1
            if left:
                self._refs[job_id] = left
            else:
                del self._refs[job_id]
                if self._events.get(job_id) is event:
                    del self._events[job_id]


def _receipt(job: Job) -> Receipt:
    # A job that completed on a later attempt has no error to report.
    error = job.errors[-1].message if job.errors and job.state is not JobState.COMPLETED else None
    return Receipt(job.id, job.state.final, job.state, error)
