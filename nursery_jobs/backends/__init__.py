"""The one interface between the runtime and storage, and `open_backend(url)`.

The runtime never touches storage but through this protocol, so a behaviour written once in
`tests/conformance/` holds on every backend. The calls are shaped for durable stores from the
start: everything that can be a batch is a batch (claim k jobs, finish k outcomes, insert k
jobs), every state change a worker writes carries the attempt number it was claimed with (a
fencing token: a late worker can never overwrite a job that moved on), and wake-ups flow from
the backend to the runtime as events rather than being polled for.

Vocabulary:
- `claim(queue, limit)` moves up to `limit` due jobs of `queue` to running, highest priority
  first, then oldest `run_at`, then lowest id, and counts an attempt on each.
- `finish_many(outcomes)` ends attempts. An outcome whose job is no longer running under the
  same attempt is ignored (stale). A non-final outcome (retry, snooze, interrupted) of a job
  whose cancellation was requested while it ran ends it as cancelled instead.
- Events (`JobsAvailable`, `CancelRequested`, `JobFinalized`) are delivered to every listener,
  in order, without blocking the backend. An event that comes from outside the process (a
  PostgreSQL notification) is only a hint: a `JobsAvailable` causes a claim, a `JobFinalized` a
  re-read of the job, a `CancelRequested(verified=False)` a re-read of its row; none of them
  changes a job by itself.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Protocol, Sequence, Union, runtime_checkable

import attrs
import trio

from ..infra.redact import redact
from ..errors import ConfigError
from .transitions import OutcomeKind
from ..jobs import Job, JobError, JobState

__all__ = [
    "Backend",
    "BackendEvent",
    "CancelRequested",
    "ClaimResult",
    "ClaimedJob",
    "HeartbeatResult",
    "InsertResult",
    "JobFinalized",
    "JobsAvailable",
    "NewJob",
    "Outcome",
    "OutcomeKind",
    "QueueCounts",
    "open_backend",
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


BackendEvent = Union[JobsAvailable, CancelRequested, JobFinalized]
Listener = Callable[[BackendEvent], None]


@runtime_checkable
class Backend(Protocol):
    """What every backend implements; see the module docstring for the semantics."""

    url: str
    poll_interval: float | None
    """Fallback fetch period when the backend cannot push every wake-up (None: it can)."""
    atomic: bool
    """True if no call ever yields to other tasks (memory): a call cannot be cut in half by a
    cancellation, so callers need not shield it."""

    def now(self) -> float: ...

    def add_listener(self, listener: Listener) -> None: ...

    def remove_listener(self, listener: Listener) -> None: ...

    async def open(self) -> None: ...

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The backend's own background work (PostgreSQL: the LISTEN connection), run by the
        runtime as a service until cancelled. Reports started when wake-ups flow."""
        ...

    def check_budget(self, workers: int) -> None:
        """ConfigError if `workers` pool-using workers (plus the runtime's own needs) would
        exceed this backend's connection budget."""
        ...

    async def close(self) -> None: ...

    async def insert_many(self, jobs: Sequence[NewJob]) -> list[InsertResult]: ...

    async def claim(self, queue: str, limit: int) -> ClaimResult: ...

    async def finish_many(self, outcomes: Sequence[Outcome]) -> None: ...

    async def cancel(self, job_id: int) -> JobState:
        """Cancel a pending job now, or request cancellation of a running one.

        Returns the state after the call (RUNNING when a request was sent). Raises JobNotFound.
        """
        ...

    async def heartbeat(self, running: Sequence[tuple[int, int]]) -> HeartbeatResult:
        """Renew the claim on these (job id, attempt) pairs; report lost and cancel-requested ones."""
        ...

    async def rescue(self, stale_before: float) -> list[int]:
        """Make running jobs whose heartbeat is older than `stale_before` runnable again.

        The interrupted attempt counts (its worker may have done part of the work); a job with
        no attempt left is discarded. Returns the rescued ids.
        """
        ...

    async def delete_finished(self, before: Mapping[JobState, float], limit: int) -> int:
        """Retention: delete at most `limit` final jobs of the states in `before`, each finalized
        before its state's cutoff; returns how many (the runtime calls again while it is
        `limit`, so no single call is a long sweep)."""
        ...

    async def get_job(self, job_id: int) -> Job: ...

    async def stats(self) -> Mapping[str, QueueCounts]: ...


def open_backend(url: str) -> Backend:
    """A backend for `url`: ``memory://``, ``sqlite:///path/jobs.db[?synchronous=full|normal&wake=on|off]``
    or ``postgresql://user@host/db[?schema=...]``.

    Raises ConfigError for an unsupported or malformed URL (its password redacted).
    """
    if not isinstance(url, str):
        raise ConfigError(f"backend must be a URL string or a Backend, not {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigError(f"backend URL {redact(url, url)!r} has no scheme; use 'memory://'")
    if scheme == "memory":
        if rest:
            raise ConfigError(f"the memory backend takes no location: use 'memory://', not {url!r}")
        from .memory import MemoryBackend

        return MemoryBackend()
    if scheme == "sqlite":
        from .sqlite import SqliteBackend, parse_sqlite_url

        path, synchronous, wake = parse_sqlite_url(url)
        return SqliteBackend(path, synchronous=synchronous, wake=wake)
    if scheme in ("postgresql", "postgres"):
        from .postgres import PostgresBackend, parse_postgres_url

        conninfo, opts = parse_postgres_url(url)
        return PostgresBackend(conninfo, **opts)
    raise ConfigError(
        f"unsupported backend URL scheme {redact(scheme, url)!r} in {redact(url, url)!r}; supported: 'memory://', "
        "'sqlite:///path/jobs.db', 'postgresql://user@host/db'"
    )
