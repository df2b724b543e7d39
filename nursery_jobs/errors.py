"""Every error nursery_jobs raises on purpose, in one place.

Each message says what was wrong and what to do about it. All of them derive from
`NurseryJobsError`, so a service can catch the library's errors without catching its own.
"""

from __future__ import annotations

__all__ = [
    "ArgsError",
    "BackendError",
    "BackendUnavailable",
    "CacheWaitTimeout",
    "CachedError",
    "ConfigError",
    "DrainIncomplete",
    "JobNotFound",
    "LockLost",
    "LockTimeout",
    "NotIdempotent",
    "NurseryJobsError",
    "QueueFull",
    "ResourceError",
    "RuntimeClosed",
    "UnknownJob",
]


class NurseryJobsError(Exception):
    """Base class of every error raised by nursery_jobs."""


class ConfigError(NurseryJobsError, ValueError):
    """The declared app or the runtime settings are invalid.

    Raised at declaration or start-up time (unknown queue, max_workers < 1, duplicate job
    name, bad timeout...), never later while jobs run.
    """


class ArgsError(NurseryJobsError, ValueError):
    """Job arguments were rejected at enqueue time.

    Arguments must be a dict of keyword arguments that survives a JSON round trip unchanged
    (the durable backends store JSON; the memory backend round-trips too, so a test on memory
    fails where production would) and that matches the handler's signature.
    """


class UnknownJob(NurseryJobsError, LookupError):
    """A job kind name that no `@app.job` registered."""


class JobNotFound(NurseryJobsError, LookupError):
    """No job with this id exists in the backend (it may have been deleted by retention)."""


class BackendUnavailable(NurseryJobsError, ConnectionError):
    """The backend cannot be reached (at start-up: check the URL and that the server runs)."""


class BackendError(NurseryJobsError, RuntimeError):
    """The backend is reachable but refused one statement (PostgreSQL returned an error for it:
    the message names the SQLSTATE and the server's text). Not retried: the same statement would
    be refused again. The completer takes it for content it cannot store and writes the other
    outcomes of the batch."""


class RuntimeClosed(NurseryJobsError, RuntimeError):
    """The runtime is shutting down or closed, or there is no runtime in this context."""


class QueueFull(NurseryJobsError, RuntimeError):
    """An enqueue into a queue declared with `max_length` found it full: `pending` jobs of the
    queue were waiting to start (available, scheduled or retryable), and the new ones would
    take it past `max_length`. `enqueue` and `enqueue_many` raise it once the queue stayed full
    for the queue's `push_timeout`; `enqueue_tx`, the outbox relay and the periodic scheduler
    at once (docs/queues.md). Nothing of the call was enqueued. Raise `max_length`, add
    workers, or treat it as backpressure: retry later, or answer the request with "busy"."""

    def __init__(self, message: str, *, queue: str, max_length: int, pending: int) -> None:
        super().__init__(message)
        self.queue = queue
        self.max_length = max_length
        self.pending = pending
        """The queue's pending jobs as the last check counted them (with the call's own new
        jobs in, for a check made after inserting them)."""


class LockTimeout(NurseryJobsError, TimeoutError):
    """`rt.lock(name, timeout=...)` did not get the lock within `timeout`: another holder kept it."""


class LockLost(NurseryJobsError, RuntimeError):
    """A lock held by `rt.lock` could not be renewed before its hold ended (the store was
    unreachable or slow, the process was frozen past its ttl, or the lock expired and another
    holder took it): the block was cancelled at that point, and this is raised where the block
    ends. What the block had already sent is fenced by its token (`HeldLock.token`)."""


class ResourceError(NurseryJobsError, RuntimeError):
    """A resource declared with `@app.resource` failed to open, or to close.

    At start-up the message names the resource that did not open (an error from its code, or no
    value within `resource_bound`); the runtime claims no job, closes the resources it had opened
    and raises it from `open_runtime`. At shutdown, a resource whose close raised or did not end
    within `resource_bound` is logged when it happens and raised after every other resource has
    closed. The resource's own error is the `__cause__`.
    """


class DrainIncomplete(NurseryJobsError, AssertionError):
    """A test's `rt.drain()` (or `nursery_jobs.testing.run_job`) hit its bound with jobs due
    within the horizon still not final: a job that snoozes or retries forever, or a handler that
    never returns. The message lists each such job; an AssertionError, so a test fails on it."""


class NotIdempotent(NurseryJobsError, AssertionError):
    """`nursery_jobs.testing.check_at_least_once` found a checkpoint of the handler where an
    interruption and a second run leave other effects than one clean run; the message names the
    checkpoint's file and line and shows both observations."""


class CachedError(NurseryJobsError):
    """`rt.cache.get_or_compute` (or `get`, or an `nj.cached` function) found a failure cached
    for its key: the computation raised, and `error_ttl` kept that outcome (docs/cache.md).

    The cache holds JSON only, so the original exception object is gone; what is kept is its
    class and its message, never its traceback, arguments or chained causes. `type_name` is
    the class's qualified name (``"myapp.errors.NotFound"``), `message` its text (cut to 4,096
    characters), `key` the key it was cached under. `matches(cls)` says whether the original was
    an instance of `cls` (its class or a base class of it, compared by qualified name)."""

    def __init__(self, key: str, type_name: str, message: str, bases: tuple[str, ...] = ()) -> None:
        short = type_name.rpartition(".")[2]
        super().__init__(f"{short}: {message} (a cached error of key {key!r})" if message else f"{short} (a cached error of key {key!r})")
        self.key = key
        self.type_name = type_name
        self.message = message
        self.bases = bases
        """The qualified names of the original class's bases, nearest first, up to `Exception`."""

    def matches(self, cls: type[BaseException]) -> bool:
        """True when the original exception was an instance of `cls`."""
        name = f"{cls.__module__}.{cls.__qualname__}"
        return name == self.type_name or name in self.bases


class CacheWaitTimeout(NurseryJobsError, TimeoutError):
    """`rt.cache.get_or_compute(..., wait_timeout=...)` waited that long for another caller's
    computation of the same key (in this process or, on PostgreSQL, in another) and it had not
    ended; with ``on_wait_timeout="compute"`` the caller computes the value itself instead of
    raising this. Raise `wait_timeout`, or make the computation faster."""
