"""The backend protocol: what the runtime asks of storage, split by capability.

The runtime never touches storage but through these protocols, so a behaviour written once in
`tests/conformance/` and `tests/contract/` holds on every backend. The calls are shaped for
durable stores from the start: everything that can be a batch is a batch (claim k jobs, finish k
outcomes, insert k jobs), every state change a worker writes carries the attempt number it was
claimed with (a fencing token: a late worker can never overwrite a job that moved on), and
wake-ups flow from the backend to the runtime as events rather than being polled for.

Capabilities:

- `JobStore`: the jobs themselves (insert, claim, finish, heartbeat, rescue, cancel, retention,
  reads). What a job's row becomes at each call is decided by the job rules (`nursery_jobs.rules`): a store
  applies those rules, it does not make its own.
- `Notifier`: events to the runtime (`JobsAvailable`, `JobFinalized`, `CancelRequested`), and
  the backend's own background service.
- `Backend` = both: what `open_runtime` needs.
- `TransactionalEnqueue`: enqueue inside a database transaction, the backend's own
  (`transaction`) or the caller's, on the caller's own connection (SQLite, PostgreSQL; memory
  has a transaction of its own).
- `Outbox`: events published in a transaction (or outside one) and relayed into jobs by
  claiming rows (`publish_tx`, `publish`, `relay`): memory, SQLite, PostgreSQL.
- `LockStore`: named locks with an owner token, an expiry and a fencing token per acquisition
  (`rt.lock`, `rt.try_lock`).
- `ScheduleStore`: periodic schedules' last ticks, and a tick's job enqueued exactly once
  across processes (a conditional update of the schedule's row, in the insert's transaction).
- `Caching`: a backend that has a cache (`cache_store()`, one `CacheStore` per backend
  instance): entries of JSON text with a freshness and an expiry, on the backend's clock;
  `CacheFlights` where one computation per key can be had across processes (PostgreSQL). The
  cache's rules (keys, single-flight, stale-while-revalidate, cached errors) are `nursery_jobs.cache`'s;
  a store only keeps entries.
- Per-key and per-queue concurrency limits are part of `claim` (a job carries its key and
  limit from `insert_many`; `claim` takes the queue's `max_running`): every backend enforces
  them, since a backend that ignored them would break the guarantee silently.
- Coming capabilities (admin queries for the CLI and the dashboard) are protocols of their own
  beside these, so a backend without them still works and says so by not implementing them.

Events are delivered to every listener, in order, synchronously, without blocking the backend.
An event that comes from outside the process (a PostgreSQL notification, an SQLite wake-up
datagram) is only a hint: a `JobsAvailable` causes a claim, a `JobFinalized` a re-read of the
job, a `CancelRequested(verified=False)` a re-read of its row; none of them changes a job by
itself.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Callable, Mapping, NamedTuple, Protocol, Sequence, Union, runtime_checkable

import attrs
import trio

from ..jobs import Job, JobError, JobState
from ..rules import OutcomeKind

__all__ = [
    "Backend",
    "BackendEvent",
    "Bounds",
    "CacheEntry",
    "CacheFlights",
    "CacheStore",
    "Caching",
    "CancelRequested",
    "ClaimResult",
    "ClaimedJob",
    "HeartbeatResult",
    "InsertResult",
    "JobFinalized",
    "JobStore",
    "JobsAvailable",
    "KeyWatch",
    "Listener",
    "NewJob",
    "Notifier",
    "Outbox",
    "OutboxEvent",
    "OutboxPublished",
    "Outcome",
    "OutcomeKind",
    "QueueCounts",
    "Route",
    "LockStore",
    "ScheduleState",
    "ScheduleStore",
    "TransactionalEnqueue",
]


class NewJob(NamedTuple):  # a tuple: built once per job on the hot path, 3x cheaper than attrs
    kind: str
    queue: str
    args_json: str
    priority: int
    run_at: float | None
    """None: available now (the backend's clock decides `now`)."""
    max_attempts: int
    unique_key: str | None = None
    concurrency_key: str | None = None
    """Jobs with one key run at most `max_concurrent` at a time, across every process."""
    max_concurrent: int | None = None
    """With a `concurrency_key`: how many jobs of that key may run at once (this job starts only
    while fewer than this many are `running`). None without a key."""
    rate_key: str | None = None
    """Jobs with one rate key start at most `rate_limit` times in any `rate_per` seconds, across
    every process (every attempt's start counts)."""
    rate_limit: int | None = None
    """With a `rate_key`: starts allowed per window. None without a key."""
    rate_per: float | None = None
    """With a `rate_key`: the window, in seconds. None without a key."""


Bounds = Mapping[str, int]
"""Queue name -> its `max_length`, for the bounded queues an insert touches."""


class InsertResult(NamedTuple):  # a tuple: built once per job on the hot path, 3x cheaper than attrs
    id: int
    existing: bool
    """True when `unique_key` matched a job that is not final yet: no new job was made."""


class ClaimedJob(NamedTuple):  # a tuple: built once per job on the hot path, 3x cheaper than attrs
    id: int
    kind: str
    queue: str
    args_json: str
    attempt: int
    max_attempts: int
    priority: int
    run_at: float
    """When the job last became due, on the backend's clock: its enqueue for a job due at once, its
    `run_at` (a delay, a retry's backoff, a snooze) otherwise. Its start minus this is the time it
    waited for a worker (`AttemptEnd.wait`); NaN when the stored value cannot be read."""


@attrs.frozen
class ClaimResult:
    jobs: list[ClaimedJob]
    next_due: float | None
    """The earliest `run_at` of a job of this queue that is not due yet, if the backend knows it."""


class Outcome(NamedTuple):  # a tuple: built once per job on the hot path, 3x cheaper than attrs
    job_id: int
    attempt: int
    kind: OutcomeKind
    run_at: float | None = None
    """For RETRY and SNOOZE: when to run again, on the backend's clock."""
    error: JobError | None = None


@attrs.define
class HeartbeatResult:
    lost: list[tuple[int, int]]
    """(job id, attempt) pairs this worker no longer owns: rescued, or finished elsewhere."""
    cancel: list[int]
    """Jobs whose cancellation was requested (from any process)."""


@attrs.frozen
class QueueCounts:
    available: int = 0
    scheduled: int = 0
    running: int = 0
    retryable: int = 0
    completed: int = 0
    discarded: int = 0
    cancelled: int = 0
    failed: int = 0
    """Attempts that ended in an error or a timeout, over the jobs the backend still keeps."""
    interrupted: int = 0
    """Attempts given back because a shutdown cut them."""


class JobsAvailable(NamedTuple):
    queue: str | None
    """None: any queue may have work (e.g. after a lost connection to the wake-up source)."""
    due: float | None = None
    """None: due now. Otherwise the earliest `run_at` among the jobs this event is about."""


class CancelRequested(NamedTuple):
    job_id: int
    verified: bool = True
    """False when it only says "someone asked" (a PostgreSQL notification, which any session
    that can connect may send, with no privilege check): the runtime then reads the job's row
    (`heartbeat`) and cancels only if the table says so. A notification is a hint to re-read,
    never an authority."""


class JobFinalized(NamedTuple):
    job_id: int
    state: JobState | None
    """None when the event came from another process and only says "final now"."""
    error: str | None = None


class OutboxPublished(NamedTuple):
    """Outbox events may be waiting to be relayed (a hint: the relay claims rows, it never
    trusts a count)."""


BackendEvent = Union[JobsAvailable, CancelRequested, JobFinalized, OutboxPublished]
Listener = Callable[[BackendEvent], None]



@runtime_checkable
class JobStore(Protocol):
    """The jobs. Every method is a Trio checkpoint unless `never_yields`, and bounded by the
    backend's own timeouts (statement and outage timeouts on durable backends).

    Every method that changes jobs is cancel-atomic on its own: it raises `Cancelled` only if it
    changed nothing (a cancellation is honoured before the change starts, never once it is
    made). `Client.enqueue` and `Client.cancel` call `insert_many` and `cancel` unshielded and
    promise their callers exactly that; the runtime shields `claim` (a claim cut after it
    committed would leave its jobs running with no worker) and writes outcomes from its own
    task."""

    url: str
    """Where the jobs are, with any password redacted: safe for logs."""
    poll_interval: float | None
    """Fallback fetch period when the backend cannot push every wake-up to other processes
    (None: it can, or there are none)."""
    never_yields: bool
    """True if no call ever yields to other tasks (memory): no call can be cut by a
    cancellation at all, so the runtime need not shield a claim."""

    def now(self) -> float:
        """The backend's clock, in seconds: every `run_at`, heartbeat and cutoff is on it."""
        ...

    def wall_offset(self) -> float:
        """Seconds to add to a Unix time to get the same instant on `now()`'s clock: 0.0 for a
        clock that is Unix time (the durable backends' default). A clock that is not (Trio's,
        on the memory backend or a test's durable one) is mapped by a pair of readings taken
        once, at the first call, and kept for the backend's life: wall time on this backend
        advances with its clock, so under `MockClock` a job scheduled an hour of wall time
        ahead runs after an hour of virtual time. Never raises; constant for the backend."""
        ...

    async def open(self) -> None:
        """Make the backend usable (connect, check the schema). Idempotent."""
        ...

    async def close(self) -> None:
        """Release connections and files. Idempotent; a closed backend may be opened again."""
        ...

    def check_budget(self, workers: int) -> None:
        """`ConfigError` (saying what to change) if `workers` pool-using workers (plus the
        runtime's own needs) would exceed this backend's connection budget; any backend takes
        one. Called before `open`; raises nothing else."""
        ...

    async def insert_many(self, jobs: Sequence[NewJob], bounds: Bounds | None = None) -> list[InsertResult]:
        """Add `jobs`, in order, in one transaction: all or none.

        A job whose `unique_key` is held by a job that is not final adds nothing and gets the
        holder's id with `existing=True` (a key twice in one batch: the first job's id twice);
        a final job holds its key no more. A job with no `run_at`, or one not after `now()`, is
        `available` with `run_at = now()`; otherwise `scheduled`. Every new job has attempt 0 and
        `created_at = now()`; new ids ascend in the batch's order. Returns one result per job, in
        order (an empty batch: nothing, and no event). Emits `JobsAvailable(queue)` per queue with a job
        due now and `JobsAvailable(queue, due)` with the earliest `run_at` per queue with later
        ones, after the transaction committed. Not retried on a lost connection (the outcome is
        unknown): `BackendUnavailable` says so.

        `bounds` (queue -> `max_length`, for the batch's bounded queues; None or empty: none):
        inside the same transaction, with the enqueues of each bounded queue serialized (any
        process), the queue's `rules.PENDING` jobs are counted with the batch's new ones
        in and `rules.check_room` decides; on `QueueFull` nothing of the batch is stored
        and nothing emitted. A job deduplicated by its unique key needs no room. Never waits
        for room: the caller does (`Client`)."""
        ...

    async def claim(self, queue: str, limit: int, *, max_running: int | None = None) -> ClaimResult:
        """Move up to `limit` due jobs of `queue` to `running`, highest priority first, then
        oldest `run_at`, then lowest id (a scheduled or retryable job whose `run_at` has come is
        due), count an attempt on each, set `attempted_at` and start its heartbeat at `now()`,
        and return them in that order, with the earliest `run_at` of the queue's pending jobs
        not due yet (None: there is none). Running and final rows, and other queues' rows, are
        never taken; `limit` 0 takes nothing. Atomic: concurrent claims (any process) never
        return the same job. Emits nothing.

        Limits (`rules.admit` decides, in claim order): a job with a `concurrency_key` is
        taken only while fewer than its `max_concurrent` jobs of that key are `running` (counted
        with the ones this claim takes), and with `max_running` no job is taken once that many
        jobs of `queue` are `running`. A job held back stays as it is (no attempt counted, no
        write) and the claim goes on with the next due job, so a key at its limit never holds
        back other keys. Exact under concurrent claims from any process.

        Rate limits (`rules.admit_rated`): a job with a `rate_key` is taken at `now()` only
        if fewer than its `rate_limit` starts of that key were made in the `rate_per` seconds
        before (counted with the ones this claim takes; every claim of a job is a start, a
        retry's too), and each start is recorded with the key. A job over its rate is held back
        like one over its concurrency limit, and the earliest time such a job gets a slot is
        reported in `next_due` when it is earlier than the queue's next `run_at`."""
        ...

    async def finish_many(self, outcomes: Sequence[Outcome]) -> None:
        """End attempts: each outcome changes its job's row as `rules.after_outcome`
        decides, and only if the job is still `running` under the outcome's attempt (a stale
        outcome, or one for a row that is not running or does not exist, is ignored: the row is
        left as it is and nothing is emitted for it). A final state sets `finalized_at` and
        frees the job's unique key. The error, if any, is appended (the latest `MAX_ERRORS_KEPT`
        kept). One transaction for the batch. Emits `JobFinalized(id, state, last error)` per job
        made final and `JobsAvailable` per job that may run again (with its `run_at` if later),
        and, for keyed jobs leaving `running`, `JobsAvailable` of the queues their freed slots
        may let a job start in (as in `rescue`). A batch holds at most one outcome per attempt (an attempt ends once); with two, which
        one is stored is not specified.
        Any exception but `BackendUnavailable` means the backend refused this batch's content:
        the completer isolates the outcome it cannot store and writes the others."""
        ...

    async def cancel(self, job_id: int) -> JobState:
        """`rules.on_cancel`: a pending job is cancelled now (emits `JobFinalized`), a
        running one has its request recorded (emits `CancelRequested` the first time only), a
        final one is left alone. Returns the job's state after the call (RUNNING when a request
        was recorded). Raises `JobNotFound`."""
        ...

    async def heartbeat(self, running: Sequence[tuple[int, int]]) -> HeartbeatResult:
        """Renew the heartbeat of each (job id, attempt) still `running` under that attempt.
        Reports the pairs that are not (lost: rescued, finished elsewhere, deleted, never
        existed) and the ids whose cancellation was requested among those
        still owned. Emits nothing. Safe to repeat."""
        ...

    async def rescue(self, stale_before: float) -> list[int]:
        """Every `running` job whose heartbeat is older than `stale_before`, or missing, ends
        its attempt as `rules.after_rescue` decides (the attempt counts as failed; a job
        with no attempt left is discarded, one whose cancellation was requested is cancelled),
        with an error saying so (`rows.rescue_message`). Rows that are not `running` are left
        alone. Returns the rescued ids, ascending. Emits `JobsAvailable(queue)` /
        `JobFinalized` for them (and, for a keyed job made final, `JobsAvailable` of the queue
        its freed slot may let a job start in: a backend that knows which parked job came back
        may name only that job's queue, and none when none did). Concurrent rescues (any
        process) never rescue a job twice."""
        ...

    async def delete_finished(self, before: Mapping[JobState, float], limit: int) -> int:
        """Retention: delete at most `limit` final jobs of the states in `before`, each finalized
        before its state's cutoff, oldest (first finalized) first within each state; returns
        how many (the caller calls again while it is `limit`, so no single call is a long
        sweep). Pending and running rows are never deleted, whatever `before` names. A deleted
        job's failed and interrupted attempts leave `stats` with it. Also forgets (at most
        `limit` of) the rate keys whose latest start is older than their window: they limit
        nothing any more (`rules.rate_idle`). Emits nothing."""
        ...

    async def get_job(self, job_id: int) -> Job:
        """A snapshot of one job (later changes do not show in it). A row the backend cannot read
        is set aside or repaired (`backends.rows`), never raised. Raises `JobNotFound`."""
        ...

    async def stats(self) -> Mapping[str, QueueCounts]:
        """Per queue that holds jobs (a queue with none is absent, even if it was claimed
        from): jobs by state, failed and interrupted attempts, over the jobs kept. Emits
        nothing."""
        ...


@runtime_checkable
class Notifier(Protocol):
    """Events from the backend to the runtime, and the backend's own background service."""

    def add_listener(self, listener: Listener) -> None:
        """Deliver every later event to `listener`: synchronously (before the call that emits
        it returns), in order, to every listener alike."""
        ...

    def remove_listener(self, listener: Listener) -> None:
        """Deliver nothing more to `listener` (added before); the other listeners go on."""
        ...

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The backend's own background work (PostgreSQL: the LISTEN connection; SQLite: its
        wake-up socket), run by the runtime as a service until cancelled. Reports started when
        wake-ups from other processes flow (or when it gave up for now: polling covers it);
        from then on an insert by another instance on the same store reaches the listeners as
        a `JobsAvailable` hint. The backend stays usable while it runs, and it may be served
        again after it ended."""
        ...


@runtime_checkable
class Backend(JobStore, Notifier, Protocol):
    """What `open_runtime` needs: a job store that notifies."""


@runtime_checkable
class TransactionalEnqueue(Protocol):
    """Enqueue inside a database transaction: one the backend lends (`transaction`), or the
    caller's own, on the caller's own connection. Either way the jobs are stored by the same
    code as `insert_many` (the same statements, the same unique-key and scheduling rules), so
    a job enqueued in a transaction is the job `insert_many` would have made."""

    def transaction(self) -> AbstractAsyncContextManager[Any]:
        """Borrow a connection of the backend's own (its pool's, or its file's), begin a
        transaction on it and yield it for the block; commit when the block ends, roll back when
        it raises or is cancelled; the connection goes back in every case. Waiting for a
        connection is bounded: `BackendUnavailable` names the bound. The events of the jobs
        inserted in it (`insert_tx` with the yielded connection) are emitted after the commit,
        never for a transaction that rolled back."""
        ...

    async def insert_tx(self, conn: Any, jobs: Sequence[NewJob], bounds: Bounds | None = None) -> list[InsertResult]:
        """Add `jobs` as `insert_many` would, inside the transaction open on `conn`: one that
        `transaction()` yielded, or a connection of the caller's own of a kind the backend
        takes (`ConfigError` for any other, and for one that reaches another database). The
        jobs exist only if that transaction commits; the backend never commits or rolls back a
        caller's own transaction (an autocommit connection commits each statement: the jobs are
        then committed at once). A unique key held by a job that is not final gives the holder's
        id with `existing=True`, as in `insert_many`. Events: for `transaction()`'s connection,
        emitted after its commit; for a caller's own, none in-process -- other processes, and
        this one, hear of the jobs at the commit where the database can say so (PostgreSQL's
        NOTIFY), and at their next poll otherwise.

        `bounds` as in `insert_many`, checked inside the caller's transaction: on `QueueFull`
        none of these jobs is in it (the rest of the caller's transaction is untouched). How
        exact the bound is against concurrent transactions depends on the backend's isolation
        (docs/queues.md): memory and SQLite serialize them; PostgreSQL counts what has committed
        and does not hold a lock for the rest of the caller's transaction."""
        ...


class OutboxEvent(NamedTuple):
    """One outbox row, as a relay pass claimed it."""

    id: int
    topic: str
    payload_json: str


Route = Callable[[Sequence[OutboxEvent]], list[list[NewJob]]]
"""The jobs a relay pass makes of the events it claimed, one list per event in order (no I/O;
it never raises for an event's content: `services.relay.Router` logs and leaves out what it
cannot make)."""


@runtime_checkable
class Outbox(Protocol):
    """The transactional outbox: events stored with the caller's rows, relayed into jobs.

    An event is a row (topic, payload as JSON text). `relay` claims rows -- never "rows after
    the last id seen", which would skip a row whose transaction committed after a later one's
    -- turns them into jobs with `route`, inserts the jobs and deletes the rows in one short
    transaction: each event becomes its jobs exactly once however many relays run, and a pass
    cut anywhere (a crash, a cancellation, `route` raising) changes nothing."""

    async def publish(self, events: Sequence[tuple[str, str]]) -> None:
        """Store `events` ((topic, payload JSON) pairs, validated by the caller) in one
        transaction of the backend's own; emits `OutboxPublished` after the commit (and tells
        the other processes where the backend can)."""
        ...

    async def publish_tx(self, conn: Any, events: Sequence[tuple[str, str]]) -> None:
        """Store `events` inside the transaction open on `conn`, with the connections
        `TransactionalEnqueue.insert_tx` takes (the same checks, the same `ConfigError`s). They
        exist only if that transaction commits; `OutboxPublished` comes after the commit of a
        `transaction()` connection, and for a caller's own only where the database tells
        (PostgreSQL's NOTIFY), otherwise at the relays' next poll."""
        ...

    async def relay(self, topics: Sequence[str], route: Route, limit: int, bounds: Bounds | None = None) -> int:
        """One pass: claim at most `limit` rows of `topics` (rows of other topics are never
        touched: another app may subscribe to them), oldest first among those no concurrent
        pass holds, make their jobs with ``route(events)``, insert them as `insert_many` would
        (unique keys included) and delete the rows, all in one transaction. Returns how many
        rows the pass claimed (the caller passes again while it is `limit`). Emits the inserted
        jobs' `JobsAvailable` after the commit. If `route` raises, or the pass is cancelled or
        its connection lost, nothing is inserted and no row deleted. `bounds` as in
        `insert_many`: a pass whose jobs do not fit a bounded queue raises `QueueFull` (naming
        the queue) and changes nothing, so its events stay for a later pass."""
        ...


class ScheduleState(NamedTuple):
    last_tick: float | None
    """The latest tick enqueued, as Unix time (None: never)."""
    last_job_id: int | None
    """The job that tick enqueued (None: never, or the tick's insert found its unique key held)."""


@runtime_checkable
class ScheduleStore(Protocol):
    """Periodic schedules (`App.periodic`): one row per schedule name, holding its last tick as
    Unix time (``now() - wall_offset()`` when it was due). No leader: every process's scheduler
    calls `enqueue_tick`, and the row decides."""

    async def schedule_states(self, names: Sequence[str]) -> Mapping[str, ScheduleState]:
        """The stored state of each of `names` that has one (a schedule never ticked is absent).
        Emits nothing."""
        ...

    async def enqueue_tick(
        self, name: str, tick: float, job: NewJob, bounds: Bounds | None = None
    ) -> InsertResult | None:
        """If `tick` is later than the schedule's last tick, or it has none: in one
        transaction, make `tick` its last tick, insert `job` as `insert_many` would (events
        included, after the commit) and record the job's id; return the insert's result.
        Otherwise change nothing and return None. So of any number of calls for one tick, from
        any process, exactly one returns a result, and a schedule's ticks only move forward.
        Cancel-atomic like `insert_many`; not retried on a lost connection. `bounds` as in
        `insert_many`: on `QueueFull` the tick is not advanced either."""
        ...


@runtime_checkable
class LockStore(Protocol):
    """Named locks: a row per held lock with its owner's token and an expiry on the backend's
    clock (`now()`), so a crashed holder's lock frees itself after its ttl, whatever happened to
    its connections. Every method is one short statement; none waits for a lock to be free."""

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> int | None:
        """Hold `name` for `owner` until ``now() + ttl`` if it is free, expired, or `owner`'s
        already (then extended). Returns this acquisition's fencing token, or None when another
        holds the lock. A token is an int >= 1, larger than the token of every acquisition of
        `name` that took the lock before this one, whatever happened between them (releases,
        expiries, restarts of any process; one counter for every name will do). Of concurrent
        calls (any process) for a free lock, exactly one returns a token."""
        ...

    async def renew_lock(self, name: str, owner: str, ttl: float) -> bool:
        """Extend `owner`'s hold on `name` to ``now() + ttl`` if `owner` holds it and it has not
        expired; False otherwise (the hold is lost: it expired, and may be another's)."""
        ...

    async def release_lock(self, name: str, owner: str) -> None:
        """Free `name` if `owner` holds it (expired or not); nothing otherwise. Idempotent."""
        ...


class CacheEntry(NamedTuple):
    """One cache entry as a store keeps it. Times are on the store's clock (`CacheStore.now`)."""

    value: str
    """JSON text: the value, or (`is_error`) the cached error's class and message."""
    is_error: bool
    fresh_until: float
    """Until then the entry is fresh."""
    expires_at: float
    """At least `fresh_until`; from `fresh_until` to here the entry is stale (served while one
    caller refreshes it), and from here on it is gone: no read returns it."""


@runtime_checkable
class CacheStore(Protocol):
    """Cache entries by key. Keys reach a store already made safe by `nursery_jobs.cache`
    (printable ASCII, no space, at most 400 characters), so a store keeps them as they are.
    Every method is one short statement, bounded by the backend's own timeouts; none waits for
    another caller's computation (`CacheFlights` does that)."""

    url: str
    """The backend's URL, password redacted."""
    shared: bool
    """True when other processes on the same database see the same entries (SQLite,
    PostgreSQL); False for a store in this process only (memory)."""
    never_yields: bool
    """True if no call ever yields to other tasks (memory)."""

    def now(self) -> float:
        """The backend's clock, which entries' times are on."""
        ...

    async def get(self, key: str) -> CacheEntry | None:
        """The entry of `key` if it has not expired (``expires_at > now()``); None otherwise.
        An expired entry is never returned, however long it stays before `purge`."""
        ...

    async def set(self, key: str, entry: CacheEntry) -> None:
        """Store `entry` as `key`'s, replacing any (one write, under the store's write lock)."""
        ...

    async def delete(self, key: str) -> None:
        """Remove `key`'s entry, if any. Idempotent."""
        ...

    async def purge(self, limit: int) -> int:
        """Delete at most `limit` expired entries (oldest expiry first); returns how many (the
        caller calls again while it is `limit`, so no call is a long sweep). Reads never wait
        for it: they ignore expired entries anyway."""
        ...


class KeyWatch(Protocol):
    async def wait(self) -> None:
        """Return once the watched key was filled or freed (`CacheFlights.fill`, in any
        process) since the watch began or since the last `wait` returned; otherwise wait. The
        caller bounds the wait (a notification is a hint, and may be lost: then read again)."""
        ...


@runtime_checkable
class CacheFlights(Protocol):
    """One computation per key across every process on the store: the process that computes
    holds the key's flight (a row with an owner and an expiry, as a lock is), the others watch
    the key and are told when it is filled."""

    def watch(self, key: str) -> AbstractContextManager[KeyWatch]:
        """Watch `key` for the block: fills and frees notified from then on wake `wait`."""
        ...

    async def lead(self, key: str, owner: str, until: float) -> tuple[bool, CacheEntry | None]:
        """Take `key`'s flight for `owner` until `until` (on `now()`'s clock) if no other owner
        holds it unexpired (an owner that holds it takes it again), and return (taken, the
        key's entry as read after the attempt). If the entry read is fresh the flight is not
        kept (taken is False then): the key was filled, by this call's time, by the flight
        that ended before it. Of concurrent calls (any process) for a free flight, one takes
        it."""
        ...

    async def fill(self, key: str, owner: str, entry: CacheEntry | None) -> None:
        """End a computation of `key`: store `entry` (None: nothing to store, the computation
        failed), free the flight if `owner` holds it, and wake every watcher of `key` (in
        every process), all in one transaction."""
        ...


@runtime_checkable
class Caching(Protocol):
    """A backend with a cache."""

    def cache_store(self) -> CacheStore:
        """This backend instance's cache store (the same object at every call). It is usable
        while the backend is open and closed with it."""
        ...
