"""The vocabulary of a job: its states, its public snapshot, its context, its outcomes.

- A **job** is one request to run a registered handler (its *kind*) with JSON arguments.
- An **attempt** is one execution of a job. Failures and timeouts cost an attempt; a snooze
  does not; a shutdown that interrupts a job gives the attempt back.
- An **outcome** ends an attempt: the handler returns (completed), raises `Snooze` (scheduled
  again), raises `Discard` (discarded), raises anything else or times out (retryable, or
  discarded once `max_attempts` is spent), or the job is cancelled from outside (cancelled).

Arguments cross every backend as JSON text, the memory backend included: what cannot survive
`json.loads(json.dumps(args)) == args` is refused at enqueue with `ArgsError`.
"""

from __future__ import annotations

import enum
import json
import math
from typing import Any

import attrs

from .errors import ArgsError

__all__ = [
    "Discard",
    "Job",
    "JobContext",
    "JobError",
    "JobId",
    "JobState",
    "Receipt",
    "Snooze",
    "decode_args",
    "encode_args",
]


class JobId(int):
    """A job's id, as `enqueue` returns it: an int that also says whether the enqueue made a new
    job (`existing` False) or found a not-yet-final job with the same `unique_key` (`existing`
    True, no job was added). Build one with ``JobId.of(id, existing)``."""

    __slots__ = ()
    existing = False

    @staticmethod
    def of(value: int, existing: bool = False) -> JobId:
        # Two classes instead of an instance attribute: an int subclass with a __dict__ costs a
        # tracked dict per job, and enqueue_many returns one per job.
        return _ExistingJobId(value) if existing else JobId(value)

    def __repr__(self) -> str:
        return f"JobId({int(self)}{', existing=True' if self.existing else ''})"

    def __str__(self) -> str:  # f"{job_id}" in a log line or URL is the plain number
        return int.__repr__(self)


class _ExistingJobId(JobId):
    __slots__ = ()
    existing = True


class JobState(str, enum.Enum):
    """Where a job is in its life. The last three are final."""

    AVAILABLE = "available"
    """Ready to be claimed now."""
    SCHEDULED = "scheduled"
    """Waiting for its `run_at` (delayed or snoozed)."""
    RUNNING = "running"
    """Claimed by a worker; an attempt is in progress."""
    RETRYABLE = "retryable"
    """The last attempt failed; waiting for its backoff to pass."""
    COMPLETED = "completed"
    DISCARDED = "discarded"
    """Failed for good: `Discard` raised, attempts spent, or the job could not be run."""
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset({JobState.COMPLETED, JobState.DISCARDED, JobState.CANCELLED})


@attrs.frozen
class JobError:
    """One failed attempt, kept on the job."""

    attempt: int
    at: float
    message: str
    traceback: str | None = None


@attrs.frozen
class Job:
    """A snapshot of a job row, as `Runtime.get_job` returns it.

    Times are seconds on the backend's clock: `trio.current_time()` on the memory backend (so
    `MockClock` drives it in tests), Unix time on durable backends.
    """

    id: int
    kind: str
    queue: str
    args: dict[str, Any]
    state: JobState
    attempt: int
    max_attempts: int
    priority: int
    run_at: float
    created_at: float
    attempted_at: float | None
    finalized_at: float | None
    errors: tuple[JobError, ...]
    unique_key: str | None = None


@attrs.frozen
class Receipt:
    """What `Runtime.wait` learnt about a job within its bound.

    `done` is True only when the job reached a final state; `state` is the state last seen;
    `error` is the last recorded error message, if any.
    """

    job_id: int
    done: bool
    state: JobState
    error: str | None = None


@attrs.define(repr=False)  # not frozen: a frozen attrs class costs 3x to build on the per-attempt path
class JobContext:
    """What a handler knows about the attempt it is running.

    `deadline` is the Trio-clock instant at which the attempt's timeout fires (`inf` when the
    job has no timeout). Treat it as read-only. Handlers that need concurrent children open `ctx.children()`: the
    children belong to this attempt and are cancelled with it.
    """

    args: dict[str, Any]
    deadline: float
    _attempt: Any = attrs.field(repr=False, alias="attempt_handle")

    # The job's identity is read through the attempt rather than copied into five fields: the
    # context is built once per attempt, on the runtime's hottest path.
    @property
    def id(self) -> int:
        job_id: int = self._attempt.job.id
        return job_id

    @property
    def kind(self) -> str:
        kind: str = self._attempt.job.kind
        return kind

    @property
    def queue(self) -> str:
        queue: str = self._attempt.job.queue
        return queue

    @property
    def attempt(self) -> int:
        number: int = self._attempt.job.attempt
        return number

    @property
    def max_attempts(self) -> int:
        most: int = self._attempt.job.max_attempts
        return most

    def __repr__(self) -> str:
        return (
            f"JobContext(id={self.id!r}, kind={self.kind!r}, queue={self.queue!r}, attempt={self.attempt!r}, "
            f"max_attempts={self.max_attempts!r}, args={self.args!r}, deadline={self.deadline!r})"
        )

    def children(self) -> Any:
        """An async context manager owning this attempt's child tasks.

        ``async with ctx.children() as tasks: tasks.spawn(fetch, url)`` -- the block waits for
        the children; a timeout, cancel or shutdown of the job cancels them too.
        """
        return self._attempt.open_children()

    @property
    def cancel_reason(self) -> str | None:
        """Why this attempt is being cancelled, once it is: "shutdown", "cancel" (rt.cancel),
        "lost" (this worker lost the job) or "timeout"; None while it is not.

        Lets cleanup code tell a redeploy from a timeout without reading clocks.
        """
        reason: str | None = self._attempt.reason
        if reason is None and self._attempt.scope.cancel_called:
            return "timeout"
        return reason


class Snooze(Exception):
    """Raise from a handler to run the job again after `seconds`, without spending an attempt."""

    def __init__(self, seconds: float) -> None:
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
            raise TypeError(f"Snooze seconds must be a number, not {seconds!r}")
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"Snooze seconds must be finite and >= 0, not {seconds!r}")
        super().__init__(seconds)
        self.seconds = float(seconds)


class Discard(Exception):
    """Raise from a handler to end the job as discarded now, with `reason` recorded."""

    def __init__(self, reason: str = "discarded by handler") -> None:
        super().__init__(reason)
        self.reason = str(reason)


_SCALARS = frozenset({str, int, float, bool, type(None)})
# One encoder for the process: json.dumps with options builds a new JSONEncoder per call.
_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def encode_args(args: Any) -> str:
    """JSON text for `args`, or `ArgsError` if it would not come back equal."""
    if not isinstance(args, dict):
        raise ArgsError(f"job args must be a dict of keyword arguments, not {type(args).__name__}")
    if not args:
        return "{}"
    try:
        text = _encode(args)
    except (TypeError, ValueError) as exc:
        raise ArgsError(
            f"job args are not JSON-serialisable ({exc}); pass ids and plain data "
            "(str, int, float, bool, None, list, dict with str keys), not objects"
        ) from None
    # Flat args of exact scalar types always come back equal; only containers (tuples, non-str
    # keys) and subclasses need the round trip to be checked.
    if all(type(v) in _SCALARS for v in args.values()) and all(type(k) is str for k in args):
        return text
    if json.loads(text) != args:
        raise ArgsError(
            f"job args {args!r} do not survive a JSON round trip (tuples become lists, "
            "non-str keys become str); pass lists and dicts with str keys"
        )
    return text


def decode_args(text: str) -> dict[str, Any]:
    if text == "{}":
        return {}
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"stored job args are not a JSON object: {text[:80]!r}")
    return value
