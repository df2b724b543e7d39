"""The backend protocol: what the runtime asks of storage, split by capability.

The runtime never touches storage but through these protocols, so a behaviour written once in
`tests/conformance/` and `tests/contract/` holds on every backend. The calls are shaped for
durable stores from the start: everything that can be a batch is a batch (claim k jobs, finish k
outcomes, insert k jobs), every state change a worker writes carries the attempt number it was
claimed with (a fencing token: a late worker can never overwrite a job that moved on), and
wake-ups flow from the backend to the runtime as events rather than being polled for.

Capabilities:

- `JobStore`: the jobs themselves (insert, claim, finish, heartbeat, rescue, cancel, retention,
  reads). What a job's row becomes at each call is decided by `backends.transitions`: a store
  applies those rules, it does not make its own.
- `Notifier`: events to the runtime (`JobsAvailable`, `JobFinalized`, `CancelRequested`), and
  the backend's own background service.
- `Backend` = both: what `open_runtime` needs.
- `TransactionalEnqueue`: enqueue inside a database transaction, the backend's own
  (`transaction`) or the caller's, on the caller's own connection (SQLite, PostgreSQL; memory
  has a transaction of its own).
- `Outbox`: events published in a transaction (or outside one) and relayed into jobs by
  claiming rows (`publish_tx`, `publish`, `relay`): memory, SQLite, PostgreSQL.
- Coming capabilities (per-key leases, locks, admin queries for the CLI and the
  dashboard) are protocols of their own beside these, so a backend without them still works
  and says so by not implementing them.

Events are delivered to every listener, in order, synchronously, without blocking the backend.
An event that comes from outside the process (a PostgreSQL notification, an SQLite wake-up
datagram) is only a hint: a `JobsAvailable` causes a claim, a `JobFinalized` a re-read of the
job, a `CancelRequested(verified=False)` a re-read of its row; none of them changes a job by
itself.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Callable, Mapping, NamedTuple, Protocol, Sequence, Union, runtime_checkable

import attrs
import trio

from ..jobs import Job, JobError, JobState
from .transitions import OutcomeKind

__all__ = [
    "Backend",
    "BackendEvent",
    "CancelRequested",
    "ClaimResult",
    "ClaimedJob",
    "HeartbeatResult",
    "InsertResult",
    "JobFinalized",
    "JobStore",
    "JobsAvailable",
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

    async def insert_many(self, jobs: Sequence[NewJob]) -> list[InsertResult]:
        """Add `jobs`, in order, in one transaction: all or none.

        A job whose `unique_key` is held by a job that is not final adds nothing and gets the
        holder's id with `existing=True` (a key twice in one batch: the first job's id twice);
        a final job holds its key no more. A job with no `run_at`, or one not after `now()`, is
        `available` with `run_at = now()`; otherwise `scheduled`. Every new job has attempt 0 and
        `created_at = now()`; new ids ascend in the batch's order. Returns one result per job, in
        order (an empty batch: nothing, and no event). Emits `JobsAvailable(queue)` per queue with a job
        due now and `JobsAvailable(queue, due)` with the earliest `run_at` per queue with later
        ones, after the transaction committed. Not retried on a lost connection (the outcome is
        unknown): `BackendUnavailable` says so."""
        ...

    async def claim(self, queue: str, limit: int) -> ClaimResult:
        """Move up to `limit` due jobs of `queue` to `running`, highest priority first, then
        oldest `run_at`, then lowest id (a scheduled or retryable job whose `run_at` has come is
        due), count an attempt on each, set `attempted_at` and start its heartbeat at `now()`,
        and return them in that order, with the earliest `run_at` of the queue's pending jobs
        not due yet (None: there is none). Running and final rows, and other queues' rows, are
        never taken; `limit` 0 takes nothing. Atomic: concurrent claims (any process) never
        return the same job. Emits nothing."""
        ...

    async def finish_many(self, outcomes: Sequence[Outcome]) -> None:
        """End attempts: each outcome changes its job's row as `transitions.after_outcome`
        decides, and only if the job is still `running` under the outcome's attempt (a stale
        outcome, or one for a row that is not running or does not exist, is ignored: the row is
        left as it is and nothing is emitted for it). A final state sets `finalized_at` and
        frees the job's unique key. The error, if any, is appended (the latest `MAX_ERRORS_KEPT`
        kept). One transaction for the batch. Emits `JobFinalized(id, state, last error)` per job
        made final and `JobsAvailable` per job that may run again (with its `run_at` if later).
        A batch holds at most one outcome per attempt (an attempt ends once); with two, which
        one is stored is not specified.
        Any exception but `BackendUnavailable` means the backend refused this batch's content:
        the completer isolates the outcome it cannot store and writes the others."""
        ...

    async def cancel(self, job_id: int) -> JobState:
        """`transitions.on_cancel`: a pending job is cancelled now (emits `JobFinalized`), a
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
        its attempt as `transitions.after_rescue` decides (the attempt counts as failed; a job
        with no attempt left is discarded, one whose cancellation was requested is cancelled),
        with an error saying so (`rows.rescue_message`). Rows that are not `running` are left
        alone. Returns the rescued ids, ascending. Emits `JobsAvailable(queue)` /
        `JobFinalized` for them. Concurrent rescues (any process) never rescue a job twice."""
        ...

    async def delete_finished(self, before: Mapping[JobState, float], limit: int) -> int:
        """Retention: delete at most `limit` final jobs of the states in `before`, each finalized
        before its state's cutoff, oldest (first finalized) first within each state; returns
        how many (the caller calls again while it is `limit`, so no single call is a long
        sweep). Pending and running rows are never deleted, whatever `before` names. A deleted
        job's failed and interrupted attempts leave `stats` with it. Emits nothing."""
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

    async def insert_tx(self, conn: Any, jobs: Sequence[NewJob]) -> list[InsertResult]:
        """Add `jobs` as `insert_many` would, inside the transaction open on `conn`: one that
        `transaction()` yielded, or a connection of the caller's own of a kind the backend
        takes (`ConfigError` for any other, and for one that reaches another database). The
        jobs exist only if that transaction commits; the backend never commits or rolls back a
        caller's own transaction (an autocommit connection commits each statement: the jobs are
        then committed at once). A unique key held by a job that is not final gives the holder's
        id with `existing=True`, as in `insert_many`. Events: for `transaction()`'s connection,
        emitted after its commit; for a caller's own, none in-process -- other processes, and
        this one, hear of the jobs at the commit where the database can say so (PostgreSQL's
        NOTIFY), and at their next poll otherwise."""
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

    async def relay(self, topics: Sequence[str], route: Route, limit: int) -> int:
        """One pass: claim at most `limit` rows of `topics` (rows of other topics are never
        touched: another app may subscribe to them), oldest first among those no concurrent
        pass holds, make their jobs with ``route(events)``, insert them as `insert_many` would
        (unique keys included) and delete the rows, all in one transaction. Returns how many
        rows the pass claimed (the caller passes again while it is `limit`). Emits the inserted
        jobs' `JobsAvailable` after the commit. If `route` raises, or the pass is cancelled or
        its connection lost, nothing is inserted and no row deleted."""
        ...
