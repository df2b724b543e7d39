"""The memory backend: the embedded default, and the reference the durable backends must match.

It keeps rows in a dict and, per queue, two heaps: jobs that are due (ordered as a claim takes
them: priority descending, then `run_at`, then id) and jobs that wait for their `run_at`
(ordered by `run_at`). Heap entries are invalidated lazily: every state change bumps the row's
`version`, and an entry whose version no longer matches is dropped when it reaches the top.
That keeps every operation O(log n) without searching heaps for a row to remove.

Per-key limits (`rules.admit`): a claim that meets a due job whose key is at its limit
parks its heap entry under (key, limit) instead of putting it back, so later claims do not step
over it again; whenever a job of that key leaves `running` (or a pending one is cancelled), the
best parked entry of each (key, limit) goes back to the due heap, where the next claim weighs
it against the key's other due jobs in claim order. One freed slot lets one more job of the key
start, so one entry per freed slot is all that ever needs to come back. The write that brought
entries back wakes their queues, once each (`_woken`): only a queue a job came back to has
anything new to claim, and a key may span queues, so it is that job's queue, not the freeing
job's. A slot freed with nothing parked behind it wakes nothing, and no job is lost by that:
a claim that comes back short has emptied the due heap (each job claimed or parked), one that
comes back full makes the fetcher claim again, and every other way into the heap wakes the
queue (an insert, a retry or rescue to available, an unpark through `_woken`). The completer's
`outcomes_written` is not what covers it: without `global_max_workers` it only lets a fetcher
that stopped for backpressure claim again. With one key per job, a wake-up per job was a
measurable share of a keyed drain (issue 11). A claim asks
`rules.key_admits` per keyed job, which is `admit`'s per-key rule without building its
candidates.

Rate limits (`rules.admit_rated`): each rate key keeps the times of its latest starts
(`_RateLog`, at most the largest limit its jobs carry). A due job over its key's rate is parked
under the key in its queue, and the queue remembers when the key's next slot comes
(`rate_wake`); a claim at or after that time brings back as many of the key's parked jobs as
slots are open, best first, and the claim reports the earliest such time as its `next_due`, so
the fetcher sleeps exactly until a slot frees.

Its clock is `trio.current_time()`, so `MockClock` drives delays, retries and snoozes in tests.
Arguments are kept as the JSON text the runtime encoded, and decoded again for every attempt,
exactly as a durable backend would do.

All methods are `async` to match the protocol but never yield: each one is atomic with respect
to other Trio tasks, which is what lets the runtime make `enqueue` cancel-atomic on this
backend.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Iterator, Mapping, Sequence

import trio

from ..errors import ConfigError, JobNotFound
from ..jobs import MAX_ERRORS_KEPT, Job, JobError, JobState, decode_args
from ..rules import (
    PENDING, CancelAction, admit_rated, after_outcome, after_rescue, check_room, key_admits, on_cancel, rate_idle,
    rate_log, rate_release, rate_time, unparks,
)  # fmt: skip
from .cache_memory import MemoryCacheStore
from .rows import rescue_message
from .protocol import (
    BackendEvent,
    Bounds,
    CancelRequested,
    ClaimedJob,
    ClaimResult,
    HeartbeatResult,
    InsertResult,
    JobFinalized,
    JobsAvailable,
    Listener,
    NewJob,
    OutboxEvent,
    OutboxPublished,
    Outcome,
    OutcomeKind,
    QueueCounts,
    Route,
    ScheduleState,
)

_tuple_new = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)
_COMPLETED = OutcomeKind.COMPLETED
_A, _S, _R, _RT = JobState.AVAILABLE, JobState.SCHEDULED, JobState.RUNNING, JobState.RETRYABLE
_COUNTED = (_A, _S, _R, _RT, JobState.COMPLETED, JobState.DISCARDED, JobState.CANCELLED)


class _Row:
    __slots__ = (
        "id", "kind", "queue", "args_json", "state", "attempt", "max_attempts", "priority",
        "run_at", "created_at", "attempted_at", "finalized_at", "errors", "unique_key",
        "cancel_requested", "version", "heartbeat_at", "failed", "interrupted", "ckey", "climit",
        "rkey", "rlimit", "rper",
    )  # fmt: skip

    def __init__(self, id: int, new: NewJob, now: float) -> None:
        self.id = id
        self.kind = new.kind
        self.queue = new.queue
        self.args_json = new.args_json
        self.run_at = now if new.run_at is None or new.run_at < now else new.run_at
        self.state = _A if self.run_at <= now else _S
        self.attempt = 0
        self.max_attempts = new.max_attempts
        self.priority = new.priority
        self.created_at = now
        self.attempted_at: float | None = None
        self.finalized_at: float | None = None
        self.errors: list[JobError] | None = None
        self.unique_key = new.unique_key
        self.cancel_requested = False
        self.version = 0
        self.heartbeat_at = 0.0
        self.failed = 0
        self.interrupted = 0
        self.ckey = new.concurrency_key
        self.climit = new.max_concurrent or 1
        self.rkey = new.rate_key
        self.rlimit = new.rate_limit or 1
        self.rper = new.rate_per or 0.0


class _RateLog:
    """A rate key's latest starts, ascending (at most `cap` between claims: a claim appends its
    starts and trims the log once, at its end), and the largest limit and window of the jobs a
    claim weighed against it (`Admission.rate_sized`)."""

    __slots__ = ("cap", "per", "starts")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.cap = 1
        self.per = 0.0


class _QueueState:
    __slots__ = ("due", "waiting", "counts", "failed", "interrupted", "rate_parked", "rate_wake", "rate_armed")

    def __init__(self) -> None:
        self.due: list[tuple[int, float, int, int]] = []  # (-priority, run_at, id, version)
        self.waiting: list[tuple[float, int, int]] = []  # (run_at, id, version)
        self.rate_parked: dict[str, list[tuple[int, float, int, int]]] = {}
        """rate key -> due-heap entries held back because the key was over its rate."""
        self.rate_wake: list[tuple[float, str]] = []
        """(next slot, rate key) of the keys with parked entries, earliest first."""
        self.rate_armed: dict[str, float] = {}
        """rate key -> the slot its `rate_wake` entry waits for (one entry per key)."""
        self.counts = dict.fromkeys(_COUNTED, 0)
        self.failed = 0
        self.interrupted = 0


class MemoryTransaction:
    """What `rt.transaction()` yields on the memory backend: the jobs enqueued in it, shown
    at its commit. It runs no SQL (a service's own rows need a database)."""

    __slots__ = ("backend", "events", "jobs", "open", "reserved", "results")

    def __init__(self, backend: MemoryBackend) -> None:
        self.backend = backend
        self.events: list[tuple[str, str]] = []
        """Outbox events published in it, stored at its commit."""
        self.jobs: list[NewJob] = []
        self.results: list[InsertResult] = []
        self.reserved: dict[str, int] = {}
        """New jobs of bounded queues in it: counted toward their queues' length until it ends."""
        self.open = True

    def __repr__(self) -> str:
        return f"<MemoryTransaction jobs={len(self.jobs)} open={self.open}>"


class MemoryBackend:
    """Jobs in this process's memory. Lost when the process exits; shared by every runtime
    given the same instance (which is how tests restart a runtime on the same jobs)."""

    url = "memory://"
    poll_interval: float | None = None  # every wake-up is pushed: nothing to poll for
    never_yields = True

    def __init__(self, *, max_final_jobs: int = 100_000) -> None:
        """`max_final_jobs`: final jobs kept at most (oldest dropped first), besides the
        runtime's age-based retention, so an embedded service's memory stays bounded at any
        throughput (100,000 x ~420 B = ~42 MB)."""
        if isinstance(max_final_jobs, bool) or not isinstance(max_final_jobs, int) or max_final_jobs < 0:
            raise ConfigError(f"max_final_jobs must be an int >= 0, not {max_final_jobs!r}")
        self.max_final_jobs = max_final_jobs
        self._final_order: collections.deque[int] = collections.deque()
        self._rows: dict[int, _Row] = {}
        self._queues: dict[str, _QueueState] = {}
        self._unique: dict[str, int] = {}
        self._listeners: list[Listener] = []
        self._running: set[int] = set()
        self._key_running: dict[str, int] = {}
        """Running jobs per concurrency key (keys with none are absent)."""
        self._parked: dict[str, dict[int, list[tuple[int, float, int, int]]]] = {}
        """key -> limit -> due-heap entries held back because the key was at that limit."""
        self._woken: dict[str, None] = {}
        """Queues a parked entry went back to since their last wake-up (`_unpark`), in order:
        the write that freed the slot tells each one once (`_wake_woken`)."""
        self._parked_dead: dict[str, int] = {}
        """key -> its jobs cancelled since its parked entries were last compacted (at most)."""
        self._rates: dict[str, _RateLog] = {}
        """Rate key -> its latest starts (keys idle longer than their window are dropped)."""
        self._rate_trim: dict[str, _RateLog] = {}
        """The logs the claim in progress appended starts to: each trimmed once, at its end."""
        self._next_id = 1
        self._outbox: dict[int, tuple[str, str]] = {}
        """Outbox events not relayed yet, by id (in publish order)."""
        self._next_event = 1
        self._reserved: dict[str, int] = {}
        """Per bounded queue, the new jobs of transactions still open (`MemoryTransaction.reserved`):
        they count toward its length already, as a durable backend's would under its lock."""
        self._schedules: dict[str, ScheduleState] = {}
        self._locks: dict[str, tuple[str, float]] = {}
        self._lock_fence = 0
        """The last fencing token handed out, for every lock name (`acquire_lock`)."""
        self._wall_offset: float | None = None
        """Trio time minus Unix time, read once (`wall_offset`): the one mapping of wall-clock
        `run_at`s onto this backend's clock, shared by every runtime on this instance."""
        self._cache: MemoryCacheStore | None = None

    def __repr__(self) -> str:
        return f"<MemoryBackend jobs={len(self._rows)}>"

    def now(self) -> float:
        return trio.current_time()

    def wall_offset(self) -> float:
        if self._wall_offset is None:
            self._wall_offset = trio.current_time() - time.time()
        return self._wall_offset

    def cache_store(self) -> MemoryCacheStore:
        if self._cache is None:
            self._cache = MemoryCacheStore(self.now)
        return self._cache

    # -- ScheduleStore --

    async def schedule_states(self, names: Sequence[str]) -> Mapping[str, ScheduleState]:
        return {name: self._schedules[name] for name in names if name in self._schedules}

    # -- LockStore --

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> int | None:
        now = self.now()
        held = self._locks.get(name)
        if held is not None and held[0] != owner and held[1] > now:
            return None
        self._locks[name] = (owner, now + ttl)
        self._lock_fence += 1
        return self._lock_fence

    async def renew_lock(self, name: str, owner: str, ttl: float) -> bool:
        now = self.now()
        held = self._locks.get(name)
        if held is None or held[0] != owner or held[1] <= now:
            return False
        self._locks[name] = (owner, now + ttl)
        return True

    async def release_lock(self, name: str, owner: str) -> None:
        held = self._locks.get(name)
        if held is not None and held[0] == owner:
            del self._locks[name]

    async def enqueue_tick(self, name: str, tick: float, job: NewJob, bounds: Bounds | None = None) -> InsertResult | None:
        state = self._schedules.get(name)
        if state is not None and state.last_tick is not None and tick <= state.last_tick:
            return None
        (result,) = await self.insert_many([job], bounds)  # never yields: the two changes are one
        self._schedules[name] = ScheduleState(tick, result.id)
        return result

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def _emit(self, event: BackendEvent) -> None:
        for listener in tuple(self._listeners):
            listener(event)

    def _emit_all(self, events: list[BackendEvent]) -> None:
        listeners = tuple(self._listeners)  # once per batch: a listener may remove itself
        for event in events:
            for listener in listeners:
                listener(event)

    async def open(self) -> None:
        return None

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()  # every wake-up is delivered in-process; nothing to run
        await trio.sleep_forever()

    def check_budget(self, workers: int) -> None:
        return None

    async def close(self) -> None:
        return None

    def _q(self, name: str) -> _QueueState:
        q = self._queues.get(name)
        if q is None:
            q = self._queues[name] = _QueueState()
        return q

    def _move(self, row: _Row, q: _QueueState, state: JobState) -> None:
        if row.state is _R:
            self._running.discard(row.id)
            if row.ckey is not None:
                self._slot_freed(row.ckey, unparks(_R, state))
        elif state is _R:
            self._running.add(row.id)
        q.counts[row.state] -= 1
        q.counts[state] += 1
        row.state = state
        row.version += 1

    def _slot_freed(self, key: str, back: int) -> None:
        """A job of `key` left `running`: its slot is free, so the best parked job of each of
        the key's limits may start now; it goes back to the due heap (`back` times: `unparks`)."""
        n = self._key_running[key] - 1
        if n:
            self._key_running[key] = n
        else:
            del self._key_running[key]
        if key in self._parked:
            for _ in range(back):
                self._unpark(key)

    def _unpark(self, key: str) -> bool:
        """The best parked entry of each of the key's limits goes back to its due heap, and its
        queue is noted for a wake-up (`_woken`; it may be another queue than the freeing job's:
        keys are not scoped to a queue); True if one did."""
        groups = self._parked.get(key)
        if groups is None:
            return False
        rows = self._rows
        back = False
        for limit, heap in list(groups.items()):
            while heap:
                entry = heapq.heappop(heap)
                row = rows.get(entry[2])
                if row is not None and row.version == entry[3]:
                    heapq.heappush(self._q(row.queue).due, entry)
                    self._woken[row.queue] = None
                    back = True
                    break
            if not heap:
                del groups[limit]
        if not groups:
            del self._parked[key]
            self._parked_dead.pop(key, None)
        return back

    def _wake_woken(self, events: list[BackendEvent], but: str | None = None) -> None:
        """A wake-up per queue a parked entry went back to (`_woken`), except `but`."""
        for queue in self._woken:
            if queue != but:
                events.append(JobsAvailable(queue))  # a freed slot let its key's next job back in line
        self._woken.clear()

    def _parked_cancelled(self, key: str) -> None:
        """A pending job of `key` was cancelled: its parked entry, if it has one, is dead. Once
        about half of the key's entries may be, they are dropped, so a key that stays full while
        jobs are enqueued and cancelled holds no more entries than twice its live ones."""
        groups = self._parked.get(key)
        if groups is None:
            return
        dead = self._parked_dead[key] = self._parked_dead.get(key, 0) + 1
        if 2 * dead <= sum(len(heap) for heap in groups.values()):
            return
        rows = self._rows
        for limit, heap in list(groups.items()):
            live = [e for e in heap if (row := rows.get(e[2])) is not None and row.version == e[3]]
            if live:
                heapq.heapify(live)
                groups[limit] = live
            else:
                del groups[limit]
        del self._parked_dead[key]
        if not groups:
            del self._parked[key]

    def _push(self, row: _Row, q: _QueueState) -> None:
        if row.state is _A:
            heapq.heappush(q.due, (-row.priority, row.run_at, row.id, row.version))
        else:
            heapq.heappush(q.waiting, (row.run_at, row.id, row.version))

    def _finalize(self, row: _Row, q: _QueueState, state: JobState, now: float) -> JobFinalized:
        self._move(row, q, state)
        row.finalized_at = now
        final = self._final_order
        final.append(row.id)
        if len(final) > self.max_final_jobs:
            self._drop(final.popleft())
        if row.unique_key is not None and self._unique.get(row.unique_key) == row.id:
            del self._unique[row.unique_key]
        errors = row.errors
        return _tuple_new(JobFinalized, (row.id, state, errors[-1].message if errors else None))

    async def insert_many(self, jobs: Sequence[NewJob], bounds: Bounds | None = None) -> list[InsertResult]:
        if bounds:
            self._check_room(jobs, bounds)
        results = self._admit(jobs)
        self._store(jobs, results, self.now())
        return results

    def _check_room(self, jobs: Sequence[NewJob], bounds: Bounds) -> dict[str, int]:
        """`rules.check_room` for each bounded queue of `jobs`, counting the jobs that
        would be new (a unique key held, or met before in the batch, makes none); returns the
        new jobs per bounded queue. Changes nothing."""
        new: dict[str, int] = {}
        keys: set[str] = set()
        for job in jobs:
            if job.queue not in bounds:
                continue
            key = job.unique_key
            if key is not None:
                if key in self._unique or key in keys:
                    continue
                keys.add(key)
            new[job.queue] = new.get(job.queue, 0) + 1
        for queue, n in new.items():
            q = self._queues.get(queue)
            pending = sum(q.counts[state] for state in PENDING) if q is not None else 0
            check_room(queue, pending + self._reserved.get(queue, 0) + n, bounds[queue])
        return new

    def _release(self, tx: MemoryTransaction) -> None:
        for queue, n in tx.reserved.items():
            left = self._reserved[queue] - n
            if left:
                self._reserved[queue] = left
            else:
                del self._reserved[queue]
        tx.reserved.clear()

    def _admit(self, jobs: Sequence[NewJob]) -> list[InsertResult]:
        """Each job's id: a unique key held by a job that is not final gives the holder's id
        (`existing`); any other job takes the next id, ascending, and holds its key from now
        on. (`insert_many` stores the rows at once; a transaction at its commit.)"""
        results: list[InsertResult] = []
        unique = self._unique
        for new in jobs:
            key = new.unique_key
            if key is not None:
                existing = unique.get(key)
                if existing is not None:
                    results.append(InsertResult(existing, True))
                    continue
                unique[key] = self._next_id
            job_id = self._next_id
            self._next_id = job_id + 1
            results.append(_tuple_new(InsertResult, (job_id, False)))
        return results

    def _store(self, jobs: Sequence[NewJob], results: Sequence[InsertResult], now: float) -> None:
        """The rows of the jobs `_admit` gave new ids, due now or later as `now` says, and
        their wake-ups."""
        due_now: set[str] = set()
        due_later: dict[str, float] = {}
        rows, queues, heappush = self._rows, self._queues, heapq.heappush
        for new, (job_id, existing) in zip(jobs, results):
            if existing:
                continue
            row = rows[job_id] = _Row(job_id, new, now)
            q = queues.get(new.queue) or self._q(new.queue)
            q.counts[row.state] += 1
            if row.state is _A:
                heappush(q.due, (-row.priority, row.run_at, job_id, 0))
                due_now.add(new.queue)
            else:
                heappush(q.waiting, (row.run_at, job_id, 0))
                due_later[new.queue] = min(row.run_at, due_later.get(new.queue, row.run_at))
        for queue in sorted(due_now):
            self._emit(JobsAvailable(queue))
        for queue, due in sorted(due_later.items()):
            self._emit(JobsAvailable(queue, due))

    # -- transactions --

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[MemoryTransaction]:
        """A transaction with no SQL: the jobs `insert_tx` adds in it take their ids (and
        their unique keys) at once, and appear -- with their wake-ups -- at the commit, when the
        block ends; an exception or a cancellation drops them and frees their keys."""
        await trio.lowlevel.checkpoint()
        tx = MemoryTransaction(self)
        try:
            yield tx
        except BaseException:
            tx.open = False
            self._release(tx)
            for new, (job_id, existing) in zip(tx.jobs, tx.results):
                if not existing and new.unique_key is not None and self._unique.get(new.unique_key) == job_id:
                    del self._unique[new.unique_key]
            raise
        tx.open = False
        self._release(tx)
        self._store(tx.jobs, tx.results, self.now())
        if tx.events:
            self._add_events(tx.events)

    async def insert_tx(self, conn: Any, jobs: Sequence[NewJob], bounds: Bounds | None = None) -> list[InsertResult]:
        if not isinstance(conn, MemoryTransaction) or conn.backend is not self:
            raise ConfigError(
                "enqueue_tx on the memory backend takes the transaction of "
                f"`async with rt.transaction() as tx:`, not {type(conn).__name__}"
            )
        if not conn.open:
            raise ConfigError("enqueue_tx: this transaction has ended; enqueue inside its `async with` block")
        if bounds:
            for queue, n in self._check_room(jobs, bounds).items():
                conn.reserved[queue] = conn.reserved.get(queue, 0) + n
                self._reserved[queue] = self._reserved.get(queue, 0) + n
        results = self._admit(jobs)
        conn.jobs.extend(jobs)
        conn.results.extend(results)
        return results

    # -- the outbox --

    def _add_events(self, events: Sequence[tuple[str, str]]) -> None:
        for event in events:
            self._outbox[self._next_event] = event
            self._next_event += 1
        self._emit(OutboxPublished())

    async def publish(self, events: Sequence[tuple[str, str]]) -> None:
        if events:
            self._add_events(events)

    async def publish_tx(self, conn: Any, events: Sequence[tuple[str, str]]) -> None:
        if not isinstance(conn, MemoryTransaction) or conn.backend is not self:
            raise ConfigError(
                "publish on the memory backend takes the transaction of "
                f"`async with rt.transaction() as tx:`, not {type(conn).__name__}; outside one, use rt.publish"
            )
        if not conn.open:
            raise ConfigError("publish: this transaction has ended; publish inside its `async with` block")
        conn.events.extend(events)

    async def relay(self, topics: Sequence[str], route: Route, limit: int, bounds: Bounds | None = None) -> int:
        # Never yields: the pass is atomic, as a durable backend's transaction is.
        wanted = set(topics)
        claimed = list(
            itertools.islice(
                (OutboxEvent(i, t, p) for i, (t, p) in self._outbox.items() if t in wanted), max(limit, 0)
            )
        )
        if not claimed:
            return 0
        jobs = [job for made in route(claimed) for job in made]
        if bounds:
            self._check_room(jobs, bounds)  # QueueFull: the events stay
        for event in claimed:
            del self._outbox[event.id]
        if jobs:
            self._store(jobs, self._admit(jobs), self.now())
        return len(claimed)

    async def claim(self, queue: str, limit: int, *, max_running: int | None = None) -> ClaimResult:
        now = self.now()
        q = self._q(queue)
        rows = self._rows
        waiting, due = q.waiting, q.due
        while waiting and waiting[0][0] <= now:
            _, job_id, version = heapq.heappop(waiting)
            row = rows[job_id]
            if row.version == version:
                self._move(row, q, _A)
                heapq.heappush(due, (-row.priority, row.run_at, row.id, row.version))
        if q.rate_wake and q.rate_wake[0][0] <= now:
            self._rate_unpark(q, now)
        claimed: list[ClaimedJob] = []
        counts, running = q.counts, self._running
        if max_running is not None:
            limit = min(limit, max_running - counts[_R])
        trim = self._rate_trim
        key_running = self._key_running
        while due and len(claimed) < limit:
            entry = heapq.heappop(due)
            job_id, version = entry[2], entry[3]
            row = rows[job_id]
            if row.version != version:
                continue
            key, rkey = row.ckey, row.rkey
            if rkey is not None:
                if not self._rate_admits(q, row, entry, now):
                    continue
            elif key is not None and not key_admits(key_running.get(key, 0), row.climit):
                # At its key's limit: parked until a job of the key leaves `running`.
                heapq.heappush(self._parked.setdefault(key, {}).setdefault(row.climit, []), entry)
                continue
            if key is not None:
                key_running[key] = key_running.get(key, 0) + 1
            counts[_A] -= 1  # _move, inlined: this loop runs once per job
            counts[_R] += 1
            row.state = _R
            row.version = version + 1
            running.add(job_id)
            row.attempt += 1
            row.attempted_at = row.heartbeat_at = now
            claimed.append(
                _tuple_new(
                    ClaimedJob,
                    (job_id, row.kind, row.queue, row.args_json, row.attempt, row.max_attempts, row.priority, row.run_at),
                )
            )
        next_due = None
        while waiting:
            run_at, job_id, version = waiting[0]
            if rows[job_id].version == version:
                next_due = run_at
                break
            heapq.heappop(waiting)
        if trim:
            for log in trim.values():  # once per claim, as the durable backends write a record once
                log.starts = rate_log(log.starts, 0, now, log.cap, log.per)
            trim.clear()
        wake = q.rate_wake
        while wake and q.rate_armed.get(wake[0][1]) != wake[0][0]:
            heapq.heappop(wake)  # superseded by the key's later wake
        if wake:
            slot = wake[0][0]
            if next_due is None or slot < next_due:
                next_due = slot  # a rate key's next slot: its parked jobs may start then
        if self._woken:  # a job parked for its rate handed its key's slot on (`_rate_admits`)
            events: list[BackendEvent] = []
            self._wake_woken(events, but=queue)  # this claim weighed the ones of its own queue
            self._emit_all(events)
        return ClaimResult(claimed, next_due)

    def _rate_admits(self, q: _QueueState, row: _Row, entry: tuple[int, float, int, int], now: float) -> bool:
        """Whether the due job of `entry` (with a rate key) may start now under both its limits;
        if it may, its start is recorded. One refused for its rate is parked under the key until
        the slot `admit_rated` reports; one refused for its concurrency key, under that key."""
        rkey = row.rkey
        assert rkey is not None
        log = self._rates.get(rkey)
        verdict = admit_rated(
            ((row.ckey, row.climit, rkey, row.rlimit, row.rper),),
            self._key_running,
            {rkey: log.starts} if log is not None else {},
            want=1,
            now=now,
        )
        if log is not None and verdict.rate_sized:  # weighed against its rate: the log is kept for it
            log.cap = max(log.cap, row.rlimit)
            log.per = max(log.per, row.rper)
        if not verdict.started:
            slot = verdict.rate_next
            if slot is None:  # its concurrency key is full
                assert row.ckey is not None
                heapq.heappush(self._parked.setdefault(row.ckey, {}).setdefault(row.climit, []), entry)
                if rkey in q.rate_parked:
                    self._rate_release(q, rkey, now)  # the rate's slot it may have come back for
            else:
                heapq.heappush(q.rate_parked.setdefault(rkey, []), entry)
                armed = q.rate_armed.get(rkey)
                if armed is None or slot < armed:
                    q.rate_armed[rkey] = slot
                    heapq.heappush(q.rate_wake, (slot, rkey))
                if row.ckey is not None and row.ckey in self._parked:
                    for _ in range(unparks(_A, _A, parks=True)):
                        self._unpark(row.ckey)  # the key's slot it may have come back for is still free
            return False
        if log is None:
            log = self._rates[rkey] = _RateLog()
            log.cap, log.per = row.rlimit, row.rper
        log.starts.append(rate_time(log.starts, now))
        self._rate_trim[rkey] = log  # trimmed at the claim's end
        return True

    def _rate_unpark(self, q: _QueueState, now: float) -> None:
        """The keys whose next slot has come: their best parked jobs go back to the due heap,
        one per open slot (each judged by its own rate), so the claim weighs them in order."""
        while q.rate_wake and q.rate_wake[0][0] <= now:
            slot, rkey = heapq.heappop(q.rate_wake)
            if q.rate_armed.get(rkey) != slot:
                continue  # superseded by an earlier entry for the key
            del q.rate_armed[rkey]
            self._rate_release(q, rkey, now)

    def _rate_release(self, q: _QueueState, rkey: str, now: float) -> None:
        """The best parked jobs of `rkey` in `q` back to the due heap, one per slot open now;
        the key's wake re-armed for the next slot if jobs stay parked."""
        heap = q.rate_parked.get(rkey)
        log = self._rates.get(rkey)
        rows = self._rows
        due = q.due

        def parked() -> Iterator[tuple[int, float]]:
            """The live parked entries in claim order (`rules.rate_release`): each one
            goes back to the due heap when the next is asked for."""
            while heap:
                entry = heap[0]
                row = rows.get(entry[2])
                if row is None or row.version != entry[3]:
                    heapq.heappop(heap)  # claimed, cancelled or deleted since
                    continue
                yield row.rlimit, row.rper
                heapq.heappush(due, heapq.heappop(heap))

        if heap is None:
            return
        _, wait = rate_release(log.starts if log else (), parked(), now)
        if wait is not None:  # the open slots are taken: wait for the next one
            armed = q.rate_armed.get(rkey)
            if armed is None or wait < armed:
                q.rate_armed[rkey] = wait
                heapq.heappush(q.rate_wake, (wait, rkey))
        if not heap:
            q.rate_parked.pop(rkey, None)

    async def finish_many(self, outcomes: Sequence[Outcome]) -> None:
        now = self.now()
        events: list[BackendEvent] = []
        for out in outcomes:
            row = self._rows.get(out.job_id)
            if row is None or row.state is not _R or row.attempt != out.attempt:
                continue  # stale: the job moved on without this worker
            q = self._q(row.queue)
            if out.kind is _COMPLETED and out.error is None:  # the common case: nothing else to decide
                events.append(self._finalize(row, q, JobState.COMPLETED, now))
                continue
            nxt = after_outcome(
                out.kind, cancel_requested=row.cancel_requested, has_error=out.error is not None, run_at=out.run_at, now=now
            )
            if out.error is not None:
                row.errors = [*(row.errors or ()), out.error][-MAX_ERRORS_KEPT:]
            row.failed += nxt.failed
            q.failed += nxt.failed
            row.interrupted += nxt.interrupted
            q.interrupted += nxt.interrupted
            row.attempt += nxt.attempt_delta
            if nxt.state.final:
                events.append(self._finalize(row, q, nxt.state, now))
                continue
            assert nxt.run_at is not None
            row.run_at = nxt.run_at
            self._move(row, q, nxt.state)
            self._push(row, q)
            events.append(JobsAvailable(row.queue) if nxt.state is _A else JobsAvailable(row.queue, nxt.run_at))
        if self._woken:
            self._wake_woken(events)  # once per queue and batch, and only where a freed slot let a job back
        self._emit_all(events)

    async def cancel(self, job_id: int) -> JobState:
        row = self._row(job_id)
        action = on_cancel(row.state)
        if action is CancelAction.NONE:
            return row.state
        q = self._q(row.queue)
        if action is CancelAction.REQUEST:
            if not row.cancel_requested:
                row.cancel_requested = True
                self._emit(CancelRequested(job_id))
            return _R
        before = row.state
        self._emit(self._finalize(row, q, JobState.CANCELLED, self.now()))
        if row.ckey is not None:
            self._parked_cancelled(row.ckey)
        if row.ckey is not None and unparks(before, JobState.CANCELLED) and self._unpark(row.ckey):
            events: list[BackendEvent] = []
            self._wake_woken(events)  # it may have been the entry a freed slot brought back
            self._emit_all(events)
        return JobState.CANCELLED

    async def heartbeat(self, running: Sequence[tuple[int, int]]) -> HeartbeatResult:
        now = self.now()
        result = HeartbeatResult([], [])
        for job_id, attempt in running:
            row = self._rows.get(job_id)
            if row is None or row.state is not _R or row.attempt != attempt:
                result.lost.append((job_id, attempt))
                continue
            row.heartbeat_at = now
            if row.cancel_requested:
                result.cancel.append(job_id)
        return result

    async def rescue(self, stale_before: float) -> list[int]:
        now = self.now()
        rescued: list[int] = []
        events: list[BackendEvent] = []
        for job_id in sorted(self._running):
            row = self._rows[job_id]
            if row.heartbeat_at >= stale_before:
                continue
            q = self._q(row.queue)
            message = rescue_message(row.heartbeat_at)
            row.errors = [*(row.errors or ()), JobError(row.attempt, now, message)][-MAX_ERRORS_KEPT:]
            rescued.append(job_id)
            nxt = after_rescue(
                attempt=row.attempt, max_attempts=row.max_attempts, cancel_requested=row.cancel_requested, now=now
            )
            q.failed += nxt.failed
            row.failed += nxt.failed
            if nxt.state.final:
                events.append(self._finalize(row, q, nxt.state, now))
            else:
                assert nxt.run_at is not None
                row.run_at = nxt.run_at
                self._move(row, q, nxt.state)
                self._push(row, q)
                events.append(JobsAvailable(row.queue))
        self._wake_woken(events)  # the queues a freed slot let a parked job back into
        for event in events:
            self._emit(event)
        return rescued

    async def delete_finished(self, before: Mapping[JobState, float], limit: int) -> int:
        # `_final_order` is the order jobs were finalized in: oldest first (ids of jobs
        # already deleted are skipped).
        doomed = []
        rows = self._rows
        for job_id in self._final_order:
            r = rows.get(job_id)
            if r is not None and r.finalized_at is not None and r.finalized_at < before.get(r.state, -math.inf):
                doomed.append(job_id)
                if len(doomed) >= limit:
                    break
        for job_id in doomed:
            self._drop(job_id)
        self._drop_idle_rates(limit)
        return len(doomed)

    def _drop_idle_rates(self, limit: int) -> None:
        """Forget the rate keys whose latest start is older than their window: they limit
        nothing now (retention calls this; a key's record is at most its `cap` starts)."""
        now = self.now()
        idle = [k for k, log in self._rates.items() if not log.starts or rate_idle(log.starts[-1], log.per, now)]
        for key in idle[:limit]:
            del self._rates[key]

    def _drop(self, job_id: int) -> None:
        row = self._rows.pop(job_id, None)
        if row is None:
            return  # retention got there first
        q = self._q(row.queue)
        q.counts[row.state] -= 1
        q.failed -= row.failed
        q.interrupted -= row.interrupted

    def _row(self, job_id: int) -> _Row:
        row = self._rows.get(job_id)
        if row is None:
            raise JobNotFound(f"no job with id {job_id} in {self.url}")
        return row

    async def get_job(self, job_id: int) -> Job:
        row = self._row(job_id)
        try:
            args = decode_args(row.args_json)
        except ValueError:
            args = {}  # undecodable rows are discarded with the decode error recorded on them
        return Job(
            id=row.id,
            kind=row.kind,
            queue=row.queue,
            args=args,
            state=row.state,
            attempt=row.attempt,
            max_attempts=row.max_attempts,
            priority=row.priority,
            run_at=row.run_at,
            created_at=row.created_at,
            attempted_at=row.attempted_at,
            finalized_at=row.finalized_at,
            errors=tuple(row.errors or ()),
            unique_key=row.unique_key,
        )

    async def stats(self) -> Mapping[str, QueueCounts]:
        return {
            name: QueueCounts(
                available=q.counts[_A],
                scheduled=q.counts[_S],
                running=q.counts[_R],
                retryable=q.counts[_RT],
                completed=q.counts[JobState.COMPLETED],
                discarded=q.counts[JobState.DISCARDED],
                cancelled=q.counts[JobState.CANCELLED],
                failed=q.failed,
                interrupted=q.interrupted,
            )
            for name, q in sorted(self._queues.items())
            if any(q.counts.values())  # a queue is counted while it holds jobs, as in a table
        }
