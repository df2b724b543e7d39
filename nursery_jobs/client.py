"""`Client`: enqueue, read, wait for and cancel jobs; the part of a runtime a request handler uses.

A client needs an app (to know the kinds), a backend and the receipt waiters; it runs no queue
and owns no task, so it is usable as it is in a process that only enqueues. `Runtime` is a client
with a lifecycle: `open_runtime` builds one, and also runs the queues and services.

Every method is a Trio checkpoint, every wait in it is bounded, and the ones that change
something are cancel-atomic: if the caller is cancelled, the job was not enqueued (or not
cancelled); if the call returns, it happened exactly once.
"""

from __future__ import annotations

import datetime
import math
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Iterable, Mapping, Sequence

import attrs
import trio

from .app import App, EnqueueOptions, JobKind
from .backends import Backend, NewJob, Outbox, QueueCounts, TransactionalEnqueue
from .config import PUSH_POLL, check_name
from .coordination.receipts import Receipts
from .config import DEFAULT_QUEUE
from .errors import ConfigError, QueueFull, RuntimeClosed
from .infra.sync import Wakeup
from .infra.threads import ThreadBudget
from .jobs import Job, JobId, JobState, Receipt, check_job_id, encode_payload
from .middleware import enqueue_through, hooks_of
from .rules import check_batch

__all__ = ["Client", "QueueStats"]

REFUSED_OUTSIDE = (
    "the runtime is shutting down and accepts no new jobs from outside its running jobs: enqueue before "
    "shutdown begins, or from the next run of the service (a server in main whose requests enqueue runs "
    "under nj.run(..., main_grace=...), which keeps the runtime open for them until main returns)"
)
"""`RuntimeClosed`'s text for a call from code that is not a running job (a request handler,
main), once shutdown began."""


@attrs.frozen
class QueueStats:
    """One queue, as `Runtime.stats` reports it. Each counter says what it counts and whose it
    is: *jobs* in the backend (every process sharing it: the fleet), *attempts* over the jobs the
    backend still keeps (final jobs leave with retention), or this process's own workers (*here*).
    """

    name: str
    max_workers_here: int
    """This process's worker limit for the queue (0 when this process runs no worker for it,
    e.g. a client that only enqueues, or `open_runtime(queues=[...])` without it)."""
    running_here: int
    """Attempts of this queue in progress in this process (at most `max_workers_here`)."""
    running: int
    """Jobs in the `running` state, fleet-wide: every process's attempts (and claims not yet
    rescued from a process that died), so it may exceed `max_workers_here`."""
    queued: int
    """Jobs waiting to run, fleet-wide: `available` + `scheduled` + `retryable`."""
    available: int
    """Jobs due now, waiting for a worker."""
    scheduled: int
    """Jobs waiting for their `run_at` (a delay, a `run_at`, a snooze)."""
    retryable: int
    """Jobs whose last attempt failed, waiting for their backoff to pass."""
    completed: int
    """Jobs completed, of those the backend still keeps (retention deletes old final jobs)."""
    discarded: int
    """Jobs failed for good (`Discard`, attempts spent, or not runnable), of those kept."""
    cancelled: int
    """Jobs cancelled, of those kept."""
    failed_attempts: int
    """Attempts that ended in an error or a timeout, over the jobs kept: a job retried twice
    and then completed counts 2 here and 1 in `completed`; a failed attempt is not a failed
    job (those are `discarded`)."""
    interrupted_attempts: int
    """Attempts a shutdown cut and gave back (they did not count against `max_attempts`)."""


class Client:
    """Enqueue, get, wait for and cancel jobs, and read per-queue counts."""

    def __init__(self, app: App, backend: Backend, receipts: Receipts, threads: ThreadBudget) -> None:
        self.app = app
        self.backend = backend
        self.receipts = receipts
        self.threads = threads
        """`run_blocking`'s threads in this runtime (its limiter and the calls in flight)."""
        self._closing = False
        self.bounds: dict[str, int] = {
            name: cfg.max_length for name, cfg in app.queues.items() if cfg.max_length is not None
        }
        """The app's bounded queues and their `max_length` (empty: none, and enqueue pays nothing)."""
        self._room_waiters: set[Wakeup] = set()
        """Enqueues waiting for room in a full bounded queue (woken at once by shutdown, and when
        an enqueue of this process found room)."""
        self._enqueue_hooks = hooks_of(app.middlewares).around_enqueue
        """The middleware's `around_enqueue` hooks, outermost first (none: an enqueue pays nothing)."""
        self._full_at: dict[str, float] = {}
        """Per bounded queue, when an enqueue of this process last found it full: a waiting
        enqueue does not try again sooner than its own poll delay after that, so a crowd of
        waiters costs the store about one attempt per poll, not one per waiter."""

    @property
    def closing(self) -> bool:
        """True once shutdown began: no new job is accepted, except from the code whose time is
        not up (`_refusal`)."""
        return self._closing

    @closing.setter
    def closing(self, value: bool) -> None:
        self._closing = value
        if value:
            for waiter in tuple(self._room_waiters):
                waiter.set()

    # -- enqueue --

    def now(self) -> float:
        return self.backend.now()

    def wall_offset(self) -> float:
        return self.backend.wall_offset()

    def wall_now(self) -> datetime.datetime:
        """Now, as the backend's wall clock has it (an aware UTC datetime): the present in
        production; under `MockClock` on the memory backend, the virtual present (wall time at
        start plus the virtual time elapsed), which is what to add a `timedelta` to for a
        `run_at` in a test that moves virtual time."""
        return self.wall_time(self.backend.now())

    def wall_time(self, t: float) -> datetime.datetime:
        """A time on the backend's clock (a `Job`'s `run_at`, `created_at`, `attempted_at`,
        `finalized_at`, a `JobError`'s `at`) as an aware UTC datetime: the inverse of the mapping
        that `run_at=` goes through, so ``rt.wall_time(job.run_at)`` is the datetime enqueued."""
        return datetime.datetime.fromtimestamp(t - self.backend.wall_offset(), datetime.timezone.utc)

    def _check_open(self) -> None:
        if self.closing:
            refused = self._refusal()
            if refused is not None:
                raise RuntimeClosed(refused)

    def _refusal(self) -> str | None:
        """Once shutdown began: why the calling code may not add work (enqueue, publish, open a
        transaction), or None when it may, because its time is not up. A client runs no job, so
        every caller is outside one; `Runtime` lets its running attempts through."""
        return REFUSED_OUTSIDE

    def _kind(self, kind: str | JobKind[Any, Any]) -> JobKind[Any, Any]:
        return kind if isinstance(kind, JobKind) else self.app.kind(kind)

    async def insert(self, jobs: Sequence[NewJob]) -> list[JobId]:
        """Store jobs built by `JobKind.new_job` in one backend call (cancel-atomic), through the
        middleware's `around_enqueue` hooks."""
        if self._enqueue_hooks:
            return await enqueue_through(self._enqueue_hooks, jobs, self._insert)
        return await self._insert(jobs)

    async def _insert(self, jobs: Sequence[NewJob]) -> list[JobId]:
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        if not jobs:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return []
        bounds = self._bounds_for(jobs) if self.bounds else None
        if bounds:
            results = await self._insert_bounded(jobs, bounds)
        else:
            results = await self.backend.insert_many(jobs)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return JobId.of_many(results)

    def _bounds_for(self, jobs: Sequence[NewJob]) -> dict[str, int]:
        """The bounded queues among `jobs`' and their `max_length`; `QueueFull` at once for a
        batch that could never fit one (its jobs, one per distinct unique key, over the bound)."""
        bounds = self.bounds
        if len(jobs) == 1:
            queue = jobs[0].queue
            return {queue: bounds[queue]} if queue in bounds else {}
        out: dict[str, int] = {}
        plain: dict[str, int] = {}
        keys: dict[str, set[str]] = {}
        for job in jobs:
            if job.queue in bounds:
                out[job.queue] = bounds[job.queue]
                if job.unique_key is None:
                    plain[job.queue] = plain.get(job.queue, 0) + 1
                else:
                    keys.setdefault(job.queue, set()).add(job.unique_key)
        for queue, limit in out.items():
            check_batch(queue, plain.get(queue, 0) + len(keys.get(queue, ())), limit)
        return out

    async def _insert_bounded(self, jobs: Sequence[NewJob], bounds: Mapping[str, int]) -> list[Any]:
        """`insert_many` into bounded queues: while the backend answers `QueueFull`, look again
        after a short poll (`PUSH_POLL`: 10 ms doubling to 250 ms), until the queue's
        `push_timeout` has passed (the longest of the batch's queues), then raise `QueueFull`
        saying what to do. A poll is skipped when another enqueue of this process found the queue
        full within this one's poll delay (`_full_at`); an enqueue that finds room wakes the
        others. Shutdown ends the wait at once (`RuntimeClosed`), unless the caller is a running
        job: it may still enqueue, so it waits on (bounded by push_timeout, and cut with its
        attempt). Nothing is enqueued unless the call returns."""
        timeout = max(self.app.queues[queue].push_timeout for queue in bounds)
        deadline = trio.current_time() + timeout
        delay, longest = PUSH_POLL
        waker = Wakeup()
        full: QueueFull | None = None
        while True:
            last_full = max((self._full_at.get(queue, -math.inf) for queue in bounds), default=-math.inf)
            if full is None or trio.current_time() - last_full >= delay:
                try:
                    results = await self.backend.insert_many(jobs, bounds)
                except QueueFull as exc:
                    full = exc
                    self._full_at[exc.queue] = trio.current_time()
                else:
                    for queue in bounds:
                        self._full_at.pop(queue, None)
                    for other in tuple(self._room_waiters):  # there was room: the others look again now
                        other.set()
                    return results
            left = deadline - trio.current_time()
            if left <= 0:
                raise QueueFull(
                    f"{full}; it stayed full for the queue's push_timeout of {timeout:g} s and nothing was "
                    "enqueued. Add workers (or processes) for the queue, raise its max_length, or treat this "
                    "as backpressure: retry later, or answer the request with \"busy\"",
                    queue=full.queue,
                    max_length=full.max_length,
                    pending=full.pending,
                ) from None
            self._room_waiters.add(waker)
            try:
                with trio.move_on_after(min(delay, left)):
                    await waker.wait()
            finally:
                self._room_waiters.discard(waker)
            if self.closing and self._refusal() is not None:
                raise RuntimeClosed(
                    f"the runtime began shutting down while this enqueue waited for room in queue "
                    f"{full.queue!r} (max_length {full.max_length}); nothing was enqueued. Only a running job "
                    "may still enqueue (docs/shutdown.md): enqueue from the next run of the service"
                ) from None
            delay = min(delay * 2, longest)

    async def enqueue(
        self,
        kind: str | JobKind[Any, Any],
        args: Mapping[str, Any] | None = None,
        *,
        delay: float | None = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
        unique_key: str | None = None,
    ) -> JobId:
        """Enqueue one job of `kind` (a name or the kind itself) with keyword arguments `args`;
        returns its id (a `JobId`, an int whose `.existing` is True when `unique_key` matched a
        pending job).

        `delay` (seconds from now) or `run_at` (an aware datetime: wall-clock time on every
        backend; naive is a `ConfigError`) schedule it for later; higher `priority`
        runs first (default: the kind's); with `unique_key`, while a job with that key is not
        final, the existing job's id is returned and no job is added. Raises UnknownJob,
        ArgsError, ConfigError, or RuntimeClosed once shutdown began (except in a running
        job's code: docs/shutdown.md). Cancel-atomic: if the caller is cancelled, the job was
        not enqueued.
        """
        job_kind = self._kind(kind)
        opts = EnqueueOptions(delay=delay, run_at=run_at, priority=priority, unique_key=unique_key)
        return (await self.insert([job_kind.new_job(args or {}, opts, self.now(), self.wall_offset())]))[0]

    async def enqueue_many(
        self,
        kind: str | JobKind[Any, Any],
        many: Iterable[Mapping[str, Any]],
        *,
        delay: float | None = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
    ) -> list[JobId]:
        """Enqueue one job of `kind` per mapping in `many`, in one backend call; returns the ids
        in order. Every job is validated first: one bad mapping rejects the whole batch. A kind
        with a `unique` function gives each job its own key."""
        job_kind = self._kind(kind)
        opts = EnqueueOptions(delay=delay, run_at=run_at, priority=priority)
        return await self.insert(job_kind.new_jobs(many, opts, self.now(), self.wall_offset()))

    def _transactional(self, what: str) -> TransactionalEnqueue:
        backend = self.backend
        if not isinstance(backend, TransactionalEnqueue):
            raise ConfigError(
                f"{what} needs a backend with transactions (memory, SQLite, PostgreSQL); {backend.url} has none"
            )
        return backend

    async def insert_tx(self, conn: Any, jobs: Sequence[NewJob]) -> list[JobId]:
        """Store jobs built by `JobKind.new_job` inside the transaction open on `conn` (see
        `enqueue_tx`), through the middleware's `around_enqueue` hooks."""
        if self._enqueue_hooks:
            return await enqueue_through(self._enqueue_hooks, jobs, lambda stored: self._insert_tx(conn, stored))
        return await self._insert_tx(conn, jobs)

    async def _insert_tx(self, conn: Any, jobs: Sequence[NewJob]) -> list[JobId]:
        backend = self._transactional("enqueue_tx")
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        bounds = self._bounds_for(jobs) if self.bounds else None
        if not bounds:
            results = await backend.insert_tx(conn, jobs)
        else:
            try:
                results = await backend.insert_tx(conn, jobs, bounds)
            except QueueFull as full:
                raise QueueFull(
                    f"{full}; enqueue_tx does not wait for room (it would hold your transaction open), and "
                    "nothing was enqueued: roll back, or commit without the job and enqueue it later; add "
                    "workers for the queue or raise its max_length if this is not a burst",
                    queue=full.queue,
                    max_length=full.max_length,
                    pending=full.pending,
                ) from None
        return JobId.of_many(results)

    async def enqueue_tx(
        self,
        conn: Any,
        kind: str | JobKind[Any, Any],
        args: Mapping[str, Any] | None = None,
        *,
        delay: float | None = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
        unique_key: str | None = None,
    ) -> JobId:
        """Enqueue inside the transaction open on `conn`; otherwise as `enqueue` (the same
        checks, unique keys, priorities and scheduling, by the same code).

        `conn` is the connection `transaction()` lends, or one of the caller's own: on
        PostgreSQL a psycopg `Connection` (run on a thread) or `AsyncConnection` (run through
        trio-asyncio), on SQLite a `sqlite3.Connection` to the backend's own file. The job
        exists only if that transaction commits: a rolled-back request leaves no job behind,
        a committed one always runs. The runtime never commits or rolls back a caller's own
        transaction. Raises ConfigError for a connection the backend cannot use (another
        database or file, another kind of object), and what `enqueue` raises.
        """
        job_kind = self._kind(kind)
        opts = EnqueueOptions(delay=delay, run_at=run_at, priority=priority, unique_key=unique_key)
        return (await self.insert_tx(conn, [job_kind.new_job(args or {}, opts, self.now(), self.wall_offset())]))[0]

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Any]:
        """``async with rt.transaction() as conn:`` a connection of the runtime's own in a
        transaction: the service writes its rows on it and enqueues with
        ``kind.enqueue_tx(conn, ...)``; the block's end commits, an exception (or a
        cancellation) rolls back and propagates. The jobs exist, and this process's workers
        are woken for them, only once the commit is done.

        PostgreSQL: a pooled `psycopg.AsyncConnection` on Trio's own I/O (``await
        conn.execute(...)``); at most `pool_size - (workers + 2)` are lent at once. SQLite: the
        file's transaction connection, whose calls run on a thread (``await conn.execute(...)``),
        one transaction at a time (SQLite has one writer). Memory: a transaction whose enqueues
        appear at commit and vanish on rollback (it runs no SQL). Waiting for the connection is
        bounded (`BackendUnavailable` says how long); RuntimeClosed once shutdown began
        (except in a running job's code: docs/shutdown.md).
        """
        backend = self._transactional("rt.transaction()")
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        async with backend.transaction() as conn:
            yield conn

    # -- the outbox --

    def _outbox(self, what: str) -> Outbox:
        backend = self.backend
        if not isinstance(backend, Outbox):
            raise ConfigError(f"{what} needs a backend with an outbox (memory, SQLite, PostgreSQL); {backend.url} has none")
        return backend

    async def publish(self, topic: str, payload: Any) -> None:
        """Publish an event on `topic` now, in a transaction of the backend's own: every job
        kind subscribed to `topic` (`@app.subscribe`) gets one job of it, made by the relay of
        whichever process claims it. For an event that must commit with your own rows, use
        ``nj.publish(conn, topic, payload)`` inside the transaction instead.

        `payload`: a JSON value, held to the rules of job args (`ArgsError`); it becomes the
        subscribers' keyword arguments (or goes through their `args=` mapping). `topic`: a name
        like a queue's (`ConfigError`). Raises RuntimeClosed once shutdown began (except in a
        running job's code)."""
        backend = self._outbox("rt.publish")
        event = (check_name("topic", topic), encode_payload(payload))
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        await backend.publish([event])

    async def publish_tx(self, conn: Any, topic: str, payload: Any) -> None:
        """`publish` inside the transaction open on `conn` (the connections `enqueue_tx`
        takes): the event exists only if that transaction commits. See `nj.publish`."""
        backend = self._outbox("nj.publish")
        event = (check_name("topic", topic), encode_payload(payload))
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        await backend.publish_tx(conn, [event])

    # -- read, wait, cancel --

    async def get_job(self, job_id: int) -> Job:
        """A snapshot of the job. Raises JobNotFound."""
        await trio.lowlevel.checkpoint()
        return await self.backend.get_job(check_job_id(job_id))

    async def wait(self, job_id: int, *, timeout: float) -> Receipt:
        """Wait at most `timeout` seconds for the job to reach a final state.

        Returns a Receipt: `done` tells whether it did. Never raises for a slow job; when
        `max_waiters` receipts are already awaited in its queue, answers at once. Raises
        JobNotFound for an unknown id.
        """
        return await self.receipts.wait(check_job_id(job_id), timeout)

    async def cancel(self, job_id: int) -> JobState:
        """Cancel a job: a pending one is cancelled at once; a running one has its attempt's
        scope cancelled (wherever it runs) and ends as cancelled when its handler unwinds; a
        final one is left alone. Idempotent. Returns the job's state right after the request."""
        await trio.lowlevel.checkpoint_if_cancelled()
        state = await self.backend.cancel(check_job_id(job_id))
        await trio.lowlevel.cancel_shielded_checkpoint()
        return state

    def workers_here(self) -> Mapping[str, tuple[int, int]]:
        """Per queue this process runs workers for: (worker limit, attempts in progress). A
        client runs none; `Runtime` reports its executors."""
        return {}

    async def stats(self) -> dict[str, QueueStats]:
        """Per queue of the app, by name: its jobs by state (fleet-wide), its attempt counters
        and this process's workers (`QueueStats`). The "default" queue, which always exists, is
        listed only when it is used: declared with `app.queue`, used by a job kind, or holding
        jobs in the backend."""
        await trio.lowlevel.checkpoint()
        counts = await self.backend.stats()
        here = self.workers_here()
        out: dict[str, QueueStats] = {}
        for name in sorted(self.app.queues):
            if name == DEFAULT_QUEUE and not (name in counts or self.app.uses_queue(name)):
                continue
            c = counts.get(name, QueueCounts())
            limit, busy = here.get(name, (0, 0))
            out[name] = QueueStats(
                name=name,
                max_workers_here=limit,
                running_here=busy,
                running=c.running,
                queued=c.available + c.scheduled + c.retryable,
                available=c.available,
                scheduled=c.scheduled,
                retryable=c.retryable,
                completed=c.completed,
                discarded=c.discarded,
                cancelled=c.cancelled,
                failed_attempts=c.failed,
                interrupted_attempts=c.interrupted,
            )
        return out

