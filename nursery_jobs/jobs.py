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
import inspect
import json
import math
import traceback
import types
import typing
from typing import Any, AsyncIterator, Callable, Generic, Iterable, Iterator, Mapping, TypeVar, overload

import attrs
import msgspec

from .errors import ArgsError, ConfigError, JobNotFound

__all__ = [
    "ArgsChecker",
    "BatchContext",
    "BatchJob",
    "Discard",
    "Job",
    "JobContext",
    "JobError",
    "JobId",
    "JobState",
    "MAX_ERRORS_KEPT",
    "MAX_MESSAGE",
    "MAX_META_SIZE",
    "MAX_TRACEBACK",
    "META_KEY",
    "Receipt",
    "Resource",
    "Resources",
    "Snooze",
    "check_context_param",
    "check_job_id",
    "clean_text",
    "args_with_meta",
    "decode_args",
    "describe_exception",
    "encode_args",
    "encode_meta",
    "encode_payload",
    "format_traceback",
    "stored_meta",
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

    @staticmethod
    def of_many(results: Iterable[tuple[int, bool]]) -> list[JobId]:
        """The ids of a batch's (id, existing) pairs, in order: `of` for each, without a call
        per job (`enqueue_many` returns one per job)."""
        return [_ExistingJobId(value) if existing else JobId(value) for value, existing in results]

    def __repr__(self) -> str:
        return f"JobId({int(self)}{', existing=True' if self.existing else ''})"

    def __str__(self) -> str:  # f"{job_id}" in a log line or URL is the plain number
        return int.__repr__(self)


MAX_JOB_ID = 2**63 - 1
"""Ids are positive 64-bit ints on every backend."""


def check_job_id(value: object) -> int:
    """`value` as a job id: an int (a `JobId` is one); `ConfigError` for anything else (``"1"``
    is not an id on any backend), `JobNotFound` for an int no backend can hold."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"a job id is an int (as enqueue returns it), not {value!r}")
    if not 0 < value <= MAX_JOB_ID:
        raise JobNotFound(f"no job with id {value}: ids are between 1 and {MAX_JOB_ID}")
    return int(value)


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


MAX_MESSAGE = 4_096
"""Characters of an error message or `Discard` reason a job keeps: enough for any message a
person reads; a 20 MB message (a response body formatted into an exception) is cut, not stored
on every attempt."""
MAX_TRACEBACK = 16_384
"""Characters of a traceback a job keeps: its start (the outermost frames) and its end (the
innermost frames and the message), with a note of what was cut between them."""
MAX_ERRORS_KEPT = 10
"""Errors a job keeps, the most recent ones: with the limits above, a job's error history stays
under ~200 KB however many attempts it makes."""


@attrs.frozen
class JobError:
    """One failed attempt, kept on the job (at most `MAX_ERRORS_KEPT` per job, the latest).

    `message` and `traceback` are always storable text on every backend: `clean_text` has
    escaped what a database cannot hold (NUL, lone surrogates) and cut what is too long, and
    says so at the end of the text."""

    attempt: int
    at: float
    message: str
    traceback: str | None = None


def clean_text(text: str, limit: int = MAX_MESSAGE) -> str:
    """`text` as every backend stores it unchanged: NUL written as ``\\x00`` and lone
    surrogates (an undecodable file name from `os.listdir`) as ``\\udcff``; over `limit`
    characters, its head and tail with the middle cut. A note at the end says what was replaced
    or cut, so nobody mistakes the stored text for the original."""
    if not isinstance(text, str):
        text = _safe_str(text)
    notes: list[str] = []
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            escaped = text.encode("utf-8", "backslashreplace").decode("utf-8")
            notes.append(f"{sum(0xD800 <= ord(c) <= 0xDFFF for c in text)} lone surrogate(s) escaped")
            text = escaped
    if "\x00" in text:
        notes.append(f"{text.count(chr(0))} NUL(s) escaped")
        text = text.replace("\x00", "\\x00")
    if len(text) > limit:
        head = limit // 4
        tail = limit - head
        notes.append(f"cut to {limit:,} of {len(text):,} characters")
        text = f"{text[:head]} [...] {text[-tail:]}"
    if notes:
        text = f"{text} [nursery_jobs: {'; '.join(notes)}]"
    return text


def _safe_str(value: object) -> str:
    """``str(value)``, or a description of why it has none: an exception whose `__str__`
    raises must still leave a readable outcome."""
    try:
        text = str(value)
        if isinstance(text, str):
            return text
        raise TypeError(f"__str__ returned {type(text).__name__}")
    except Exception as exc:  # the object's own code: anything may happen
        try:
            why = f"{type(exc).__name__}"
        except Exception:  # pragma: no cover - a type whose name cannot be read
            why = "an error"
        return f"<unprintable {type(value).__name__}: str() raised {why}>"


def describe_exception(error: BaseException) -> str:
    """``Type: text`` for a failed attempt; for an exception group (a failed child of
    `ctx.children()`), its leaves. Never raises, whatever the exception's own methods do;
    the result is not cleaned yet (`clean_text`)."""
    if isinstance(error, BaseExceptionGroup):
        leaves: list[BaseException] = []

        def walk(group: BaseExceptionGroup[BaseException]) -> None:
            for exc in group.exceptions:
                walk(exc) if isinstance(exc, BaseExceptionGroup) else leaves.append(exc)

        try:
            walk(error)
        except Exception:  # a group subclass whose `exceptions` misbehaves
            leaves = []
        if leaves:
            parts = [f"{type(e).__name__}: {_safe_str(e)}" for e in leaves[:20]]
            more = f" (and {len(leaves) - 20} more)" if len(leaves) > 20 else ""
            return parts[0] if len(parts) == 1 else f"{len(leaves)} errors: " + "; ".join(parts) + more
    return f"{type(error).__name__}: {_safe_str(error)}"


def format_traceback(error: BaseException) -> str:
    """The traceback of `error`, cleaned and cut to `MAX_TRACEBACK`; never raises."""
    try:
        text = "".join(traceback.format_exception(error))
    except Exception as exc:  # pragma: no cover - the traceback module met an object it cannot render
        text = f"<no traceback: formatting it raised {type(exc).__name__}>"
    return clean_text(text, MAX_TRACEBACK)


@attrs.frozen
class Job:
    """A snapshot of a job row, as `Runtime.get_job` returns it.

    Times (`run_at`, `created_at`, `attempted_at`, `finalized_at`, each error's `at`) are
    seconds on the backend's clock, for arithmetic with `rt.now()`: Unix time on the durable
    backends, `trio.current_time()` on the memory backend (so `MockClock` drives it in tests).
    ``rt.wall_time(job.run_at)`` gives any of them as an aware UTC datetime on every backend,
    the same datetime that `run_at=` was given.
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


# Not frozen: a frozen attrs class costs 3x to build on the per-attempt path. Compared by
# identity (hashable): middleware keys an attempt's own state by its context.
@attrs.define(repr=False, eq=False)
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

    @property
    def meta(self) -> dict[str, str]:
        """What middleware stored with the job when it was enqueued (`EnqueuedJob.meta`: a trace
        context, say), the same for every attempt of it; empty when nothing was."""
        return stored_meta(self._attempt.job.args_json)

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
    def resources(self) -> Resources:
        """The app's resources (`@app.resource`), open for as long as any attempt runs:
        ``ctx.resources.http``, ``ctx.resources["http"]``, or typed, ``ctx.resources[http]``
        with the handle `@app.resource` returned."""
        resources: Resources = self._attempt.resources
        return resources

    @property
    def client(self) -> Any:
        """The client of the runtime running this job (an `nj.Client`: enqueue, enqueue_tx,
        transaction, get_job, wait, cancel, stats), for a job that enqueues or reads other jobs. Annotate it for typed use:
        ``client: nj.Client = ctx.client``."""
        return self._attempt.client

    @property
    def cancel_reason(self) -> str | None:
        """Why this attempt is being cancelled, once it is: "shutdown", "cancel" (rt.cancel),
        "lost" (this worker lost the job) or "timeout"; None while it is not.

        Lets cleanup code tell a redeploy from a timeout without reading clocks.
        """
        reason: str | None = self._attempt.reason
        if reason is None and self._attempt.cancel_called:
            return "timeout"
        return reason


A = TypeVar("A")


class BatchJob(Generic[A]):
    """One job of a batch, as a batch handler (`@app.batch_job`) sees it: its `id`, its `args`
    (the mapping it was enqueued with; typed `A` when the handler annotates ``jobs:
    list[nj.BatchJob[SomeTypedDict]]``), its `attempt` (counted per job, from 1) and
    `max_attempts`, and `cancel_requested` (True once `rt.cancel` reached it while the batch
    runs: whatever the handler does with it, it ends cancelled)."""

    __slots__ = ("args", "_member")

    def __init__(self, member: Any, args: A) -> None:
        self.args = args
        self._member = member

    @property
    def id(self) -> int:
        job_id: int = self._member.job.id
        return job_id

    @property
    def attempt(self) -> int:
        number: int = self._member.job.attempt
        return number

    @property
    def max_attempts(self) -> int:
        most: int = self._member.job.max_attempts
        return most

    @property
    def cancel_requested(self) -> bool:
        return bool(self._member.reason == "cancel")

    @property
    def meta(self) -> dict[str, str]:
        """What middleware stored with the job at enqueue (see `JobContext.meta`)."""
        return stored_meta(self._member.job.args_json)

    def __repr__(self) -> str:
        return f"BatchJob(id={self.id!r}, attempt={self.attempt!r}, args={self.args!r})"


@attrs.define(repr=False, eq=False)  # compared by identity, as `JobContext`
class BatchContext:
    """What a batch handler knows about the batch it is running: `jobs` (the `BatchJob`s, in
    claim order), `deadline` (the Trio-clock instant at which the batch's timeout fires, `inf`
    for none: one deadline for the whole batch), `kind`, `queue`, `children()`, `resources`,
    `client` and `cancel_reason`, as on `JobContext`. Each job's own attempt number is
    ``job.attempt``. `args` is empty: a batch has no arguments of its own (it is there for
    middleware, which sees this context around a batch)."""

    jobs: list[BatchJob[Any]]
    deadline: float
    _batch: Any = attrs.field(repr=False, alias="batch_handle")
    args: dict[str, Any] = attrs.field(factory=dict)

    @property
    def kind(self) -> str:
        kind: str = self._batch.kind
        return kind

    @property
    def queue(self) -> str:
        queue: str = self._batch.queue
        return queue

    def __repr__(self) -> str:
        ids = [job.id for job in self.jobs]
        return f"BatchContext(kind={self.kind!r}, queue={self.queue!r}, jobs={ids!r}, deadline={self.deadline!r})"

    def children(self) -> Any:
        """An async context manager owning the batch's child tasks (see `JobContext.children`):
        a timeout or shutdown of the batch cancels them too."""
        return self._batch.open_children()

    @property
    def resources(self) -> Resources:
        """The app's resources, as on `JobContext.resources`."""
        resources: Resources = self._batch.resources
        return resources

    @property
    def client(self) -> Any:
        """The runtime's client, as on `JobContext.client`."""
        return self._batch.client

    @property
    def cancel_reason(self) -> str | None:
        """Why the whole batch is being cancelled, once it is: "shutdown", "timeout", or
        "cancel" / "lost" when every job of the batch was cancelled or lost; None while it is
        not. A cancel of some of the jobs does not cancel the batch (`BatchJob.cancel_requested`)."""
        reason: str | None = self._batch.reason
        if reason is None and self._batch.cancel_called:
            return "timeout"
        return reason


class Snooze(Exception):
    """Raise from a handler to run the job again after `seconds`, without spending an attempt."""

    def __init__(self, seconds: float) -> None:
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
            raise TypeError(f"Snooze seconds must be a number, not {seconds!r}")
        if not math.isfinite(seconds) or seconds < 0:
            raise ConfigError(f"Snooze seconds must be finite and >= 0, not {seconds!r}")
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

MAX_ARGS_DEPTH = 64
"""How deeply job args may nest (lists and dicts inside each other). Past a few hundred levels
Python's json module raises RecursionError; every backend refuses the same args the same way,
at enqueue, long before that."""
MAX_ARGS_SIZE = 16 * 1024 * 1024
"""The largest JSON text of a job's args (16 MiB): a job carries ids and small data; a large
payload belongs in the service's own storage, passed by reference. PostgreSQL refuses text over
1 GB, and every attempt reads the args again."""


def encode_args(args: Any) -> str:
    """The JSON text every backend stores for `args`, or `ArgsError` if it would not come back
    exactly equal on every backend.

    Stored exactly: str (any code point, NUL and lone surrogates included: the text escapes
    them), int (up to Python's 4,300-digit conversion limit), float (finite; `-0.0`, `1e16` and
    `1.2345678901234567e+19` come back as they went in), bool, None, and lists and dicts with
    str keys of those, nested at most `MAX_ARGS_DEPTH` levels, at most `MAX_ARGS_SIZE` of text.
    Refused: everything else (NaN and infinities, tuples, sets, non-str keys, objects)."""
    if not isinstance(args, dict):
        raise ArgsError(f"job args must be a dict of keyword arguments, not {type(args).__name__}")
    if not args:
        return "{}"
    if META_KEY in args:
        raise ArgsError(
            f"job args may not use the key {META_KEY!r}: it holds what middleware stores with a job "
            "(ctx.meta) and is taken out of the args before the handler sees them; rename the argument"
        )
    # Flat args of exact scalar types always come back equal; only containers (tuples, non-str
    # keys, depth) and subclasses need the round trip to be checked.
    flat = all(type(v) in _SCALARS for v in args.values()) and all(type(k) is str for k in args)
    if not flat:
        _check_depth(args)
    try:
        text = _encode(args)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ArgsError(
            f"job args are not JSON-serialisable ({exc}); pass ids and plain data "
            "(str, int, float, bool, None, list, dict with str keys), not objects"
        ) from None
    if len(text) > MAX_ARGS_SIZE:
        raise ArgsError(
            f"job args are {len(text):,} characters of JSON, over the limit of {MAX_ARGS_SIZE:,}; store large "
            "payloads in your own storage and pass their id"
        )
    if not flat and json.loads(text) != args:
        raise ArgsError(
            f"job args {_short_repr(args)} do not survive a JSON round trip (tuples become lists, "
            "non-str keys become str); pass lists and dicts with str keys"
        )
    return text


def encode_payload(payload: Any) -> str:
    """The JSON text of an outbox event's `payload` (any JSON value: an object, a list, a
    scalar), refused by the rules of `encode_args` (`ArgsError`): what a payload may hold is
    what a job's args may hold, since the payload becomes a job's args."""
    try:
        text = encode_args({"payload": payload})
    except ArgsError as exc:
        raise ArgsError(str(exc).replace("job args", "the event payload", 1)) from None
    return text[len('{"payload":') : -1]


def _check_depth(args: dict[str, Any]) -> None:
    stack: list[tuple[Any, int]] = [(args, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_ARGS_DEPTH:
            raise ArgsError(
                f"job args nest deeper than {MAX_ARGS_DEPTH} levels of lists and dicts (or contain "
                "themselves); flatten them"
            )
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values() if isinstance(v, (dict, list, tuple)))
        elif isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1) for v in value if isinstance(v, (dict, list, tuple)))


def _short_repr(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def decode_args(text: str) -> dict[str, Any]:
    """The args stored as `text`. Raises ValueError (never anything else) when the stored value
    is not a JSON object: a row written by hand, or damaged, must not crash a worker."""
    if text == "{}":
        return {}
    try:
        value = json.loads(text)
    except (ValueError, TypeError, RecursionError) as exc:
        raise ValueError(f"stored job args are not valid JSON ({type(exc).__name__}: {exc}): {_short_repr(text, 80)}") from None
    if not isinstance(value, dict):
        raise ValueError(f"stored job args are not a JSON object: {_short_repr(text, 80)}")
    if META_KEY in value:
        del value[META_KEY]  # middleware's, never the handler's (`stored_meta`)
    return value


META_KEY = "nursery_jobs.meta"
"""The key under which a job's args text carries what middleware stored with it (`EnqueuedJob.meta`,
read back as `JobContext.meta`). Reserved: an enqueue whose args use it is refused, and
`decode_args` takes it out, so no handler, `Job.args` or args check ever sees it. In the args
rather than a column of its own so that every backend stores it as it is, with no schema change,
and a process that runs no middleware still runs the job. Not an identifier, so no handler
parameter can be named so."""

MAX_META_SIZE = 4096
"""The largest JSON text of one job's meta: a trace context is ~100 characters."""

_META_MARK = json.dumps(META_KEY)


def encode_meta(meta: Mapping[str, str]) -> str:
    """The JSON text of a job's meta; `ConfigError` (the middleware's mistake) unless it is a
    mapping of str to str of at most `MAX_META_SIZE` characters of JSON."""
    if not isinstance(meta, Mapping) or not all(type(k) is str and type(v) is str for k, v in meta.items()):
        raise ConfigError(
            f"a job's meta must map str to str (a middleware set {_short_repr(meta)}); store ids and short text"
        )
    text = _encode(dict(meta))
    if len(text) > MAX_META_SIZE:
        raise ConfigError(
            f"a job's meta is {len(text):,} characters of JSON, over the limit of {MAX_META_SIZE:,}: a middleware "
            "stored too much with the job; keep it to a trace context and a few ids"
        )
    return text


def args_with_meta(args_json: str, meta_json: str) -> str:
    """`args_json` (a JSON object's text) with `meta_json` under `META_KEY`."""
    body = args_json.rstrip()[:-1].rstrip()
    return f"{body}{',' if body != '{' else ''}{_META_MARK}:{meta_json}}}"


def stored_meta(text: str) -> dict[str, str]:
    """The meta stored in a job's args `text`; empty when there is none, and when what is there
    is not str to str (a row written by hand: it must not stop the job)."""
    if _META_MARK not in text:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return {}
    meta = value.get(META_KEY) if isinstance(value, dict) else None
    if not isinstance(meta, dict):
        return {}
    return {k: v for k, v in meta.items() if isinstance(v, str)}


T = TypeVar("T")


@attrs.frozen(repr=False)
class Resource(Generic[T]):
    """A resource declared with `@app.resource`: the handle the decorator returns.

    `name` is the function's name; `ctx.resources[handle]` gives the open value, typed `T` (what
    the async generator yields), where `ctx.resources.name` is untyped.
    """

    name: str
    fn: Callable[[], AsyncIterator[T]]

    def __repr__(self) -> str:
        return f"<Resource {self.name!r}>"


class Resources(Mapping[str, Any]):
    """The open resources, by name: ``resources.http``, ``resources["http"]``, or, typed,
    ``resources[http]`` with the `Resource` handle. Read-only."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_values", dict(values))

    @overload
    def __getitem__(self, key: Resource[T]) -> T: ...
    @overload
    def __getitem__(self, key: str) -> Any: ...
    def __getitem__(self, key: Resource[Any] | str) -> Any:
        name = key.name if isinstance(key, Resource) else key
        try:
            return self._values[name]
        except (KeyError, TypeError):
            raise KeyError(self._unknown(name)) from None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(self._unknown(name)) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("resources are read-only; declare them with @app.resource")

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"<Resources {sorted(self._values)}>"

    def _unknown(self, name: object) -> str:
        return (
            f"no resource named {name!r} is open; declare it with @app.resource on an async generator "
            f"function (open: {sorted(self._values)})"
        )


# -- the handler's parameters: what a job's args must be -------------------------------------

_CONTEXT_NAMES = frozenset({"ctx", "context", "job_ctx", "_ctx", "_context", "_"})
_ALLOWED_TYPES = (
    "int, float, str, bool, None, Any, list[...], dict[str, ...], Literal[...] of str/int/bool/None, "
    "X | Y (Optional, Union) and TypedDicts of these"
)


def _label(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", fn))


def _type_hints(fn: Callable[..., Any], params: list[inspect.Parameter]) -> dict[str, Any]:
    """The handler's annotations, evaluated (``from __future__ import annotations`` makes them
    strings). A name only imported under TYPE_CHECKING cannot be evaluated: tolerated on the
    context parameter, a `ConfigError` on an argument (whose type must be known to check it)."""
    try:
        return typing.get_type_hints(fn)
    except Exception:  # NameError most often; evaluate one annotation at a time to say which
        pass
    hints: dict[str, Any] = {}
    globalns = getattr(inspect.unwrap(fn), "__globals__", {})
    for i, p in enumerate(params):
        if p.annotation is p.empty:
            continue
        try:
            hints[p.name] = typing.get_type_hints(_Holder(p.name, p.annotation), globalns)[p.name]
        except Exception as exc:
            if i == 0:
                hints[p.name] = p.annotation  # the context's annotation is not needed to run
                continue
            raise ConfigError(
                f"job handler {_label(fn)!r}: the annotation {p.annotation!r} of argument {p.name!r} cannot be "
                f"evaluated ({type(exc).__name__}: {exc}); import the names it uses at module level, "
                "not under TYPE_CHECKING, so the arguments can be checked at enqueue"
            ) from None
    return hints


class _Holder:
    """An object whose `__annotations__` is one annotation, for `typing.get_type_hints`."""

    def __init__(self, name: str, annotation: Any) -> None:
        self.__annotations__ = {name: annotation}


def check_context_param(fn: Callable[..., Any], kind_name: str, context: type = JobContext) -> dict[str, Any]:
    """`ConfigError` unless the handler's first parameter can take the `JobContext` (`context`:
    the `BatchContext` of a batch handler); returns the handler's evaluated annotations.

    It must be positional, and annotated with `JobContext` (or Any, object) or, unannotated, be
    named `ctx` (or `context`, `_ctx`, `_`): ``async def f(doc_id)`` would otherwise be handed the
    context as `doc_id`, and every enqueue would fail with a confusing `ArgsError`."""
    params = list(inspect.signature(fn).parameters.values())
    cname = context.__name__
    write = f"write `async def {getattr(fn, '__name__', 'handler')}(ctx: nj.{cname}, ...)`"
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        raise ConfigError(
            f"job handler {kind_name!r} ({_label(fn)}) must take the {cname} as its first, positional "
            f"parameter; {write}"
        )
    hints = _type_hints(fn, params)
    first = params[0]
    ann = hints.get(first.name, inspect.Parameter.empty)
    if ann is inspect.Parameter.empty:
        ok = first.name in _CONTEXT_NAMES
    elif isinstance(ann, str):  # unresolvable (TYPE_CHECKING import): trust a name that says context
        ok = "Context" in ann
    else:
        ok = ann is Any or ann is object or (isinstance(ann, type) and issubclass(context, ann))
    if not ok:
        shown = "unannotated" if ann is inspect.Parameter.empty else f"annotated {ann!r}"
        raise ConfigError(
            f"job handler {kind_name!r} ({_label(fn)}): its first parameter {first.name!r} ({shown}) is where "
            f"the {cname} goes; {write} (name it ctx or annotate it nj.{cname}; "
            f"{'job args' if context is JobContext else 'the jobs'} follow it)"
        )
    return hints


def _check_json_type(tp: Any, where: str) -> None:
    """`ConfigError` unless `tp` describes JSON values only (the allowed annotations)."""
    if tp is Any or tp is object or tp in _SCALARS or tp is None or tp is list or tp is dict:
        return
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return _check_json_type(args[0], where)
    if origin is list:
        return _check_json_type(args[0], where) if args else None
    if origin is dict:
        if args and args[0] is not str:
            raise ConfigError(f"{where}: {tp!r} has keys that are not str; JSON object keys are str: use dict[str, ...]")
        return _check_json_type(args[1], where) if args else None
    if origin is typing.Literal:
        bad = [a for a in args if type(a) not in _SCALARS or type(a) is float]
        if bad:
            raise ConfigError(f"{where}: Literal values must be str, int, bool or None, not {bad!r}")
        return None
    if origin is typing.Union or origin is types.UnionType:
        for a in args:
            _check_json_type(a, where)
        return None
    if typing.is_typeddict(tp):
        for name, field in typing.get_type_hints(tp).items():
            _check_json_type(field, f"{where}, field {name!r} of {tp.__name__}")
        return None
    raise ConfigError(
        f"{where}: the annotation {tp!r} is not a JSON type; job args cross every backend as JSON, so "
        f"annotate them with {_ALLOWED_TYPES} (pass an id and load the object in the handler)"
    )


class ArgsChecker:
    """The types of a kind's arguments, checked at enqueue with msgspec (``convert(args, Struct,
    strict=True)``: no coercion, so ``"1"`` is not an int and True is not an int; an int is a
    valid float, as in JSON and in Python's typing). Built once per kind, at `@app.job`.

    Only annotated parameters are checked (unannotated: any JSON value); defaults are not
    checked (they are not sent); which arguments are missing or unknown is `JobKind.check_args`'s
    concern, so this sees the type errors only. The values are never converted: the handler
    receives exactly what was enqueued."""

    __slots__ = ("kind", "_struct", "_types", "_extras")

    def __init__(self, kind: str, struct: Any, types: Mapping[str, Any], extras: Any) -> None:
        self.kind = kind
        self._struct = struct
        self._types = types
        self._extras = extras

    @classmethod
    def build(cls, fn: Callable[..., Any], kind_name: str, hints: Mapping[str, Any]) -> ArgsChecker | None:
        """The checker for `fn`'s annotated arguments (None: none is annotated, nothing to
        check); `ConfigError` for an annotation that is not a JSON type."""
        params = list(inspect.signature(fn).parameters.values())[1:]
        fields: list[tuple[str, Any, Any] | tuple[str, Any]] = []
        types: dict[str, Any] = {}
        extras: Any = None
        for p in params:
            tp = hints.get(p.name, Any)
            if p.kind is p.VAR_KEYWORD:
                if tp is not Any:
                    _check_json_type(tp, f"job {kind_name!r}, **{p.name}")
                    extras = tp
                continue
            if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                continue
            if tp is not Any:
                _check_json_type(tp, f"job {kind_name!r}, argument {p.name!r}")
                types[p.name] = tp
            # Optional fields get a placeholder default: a default is not sent, so never checked.
            fields.append((p.name, tp) if p.default is p.empty else (p.name, tp, None))
        if not types and extras is None:
            return None
        fields.sort(key=lambda f: len(f) == 3)  # msgspec wants required fields first
        struct = msgspec.defstruct(f"{kind_name}_args", fields, forbid_unknown_fields=False)
        return cls(kind_name, struct, types, extras)

    @classmethod
    def for_typeddict(cls, kind_name: str, td: Any) -> ArgsChecker:
        """The checker of a batch kind whose jobs' args are typed by the TypedDict `td`
        (``jobs: list[nj.BatchJob[td]]``): its required keys must be there, every field of the
        type it says; other keys pass, unchecked. `ConfigError` for a field that is not a JSON type."""
        _check_json_type(td, f"job {kind_name!r}, the args type")
        return cls(kind_name, td, typing.get_type_hints(td), None)

    def check(self, args: Mapping[str, Any]) -> None:
        """`ArgsError` naming the kind, the argument, what was expected and what was given."""
        try:
            _convert(args, self._struct, strict=True)
        except msgspec.ValidationError as exc:
            detail, _, path = str(exc).partition(" - at `")
            path = path.rstrip("`")
            name = path[2:].split(".")[0].split("[")[0] if path.startswith("$.") else ""
            rel = path[2 + len(name) :]
            if not name:  # the mapping as a whole (a batch kind's TypedDict: a required key missing)
                raise ArgsError(
                    f"job {self.kind!r}: args {_short_repr(dict(args), 200)} do not fit its args type: "
                    f"{detail[0].lower()}{detail[1:]}"
                ) from None
            raise ArgsError(self._describe(name, self._types.get(name), args.get(name), detail, rel)) from None
        if self._extras is not None:
            known = self._struct.__struct_fields__
            for name, value in args.items():
                if name not in known:
                    try:
                        _convert(value, self._extras, strict=True)
                    except msgspec.ValidationError as exc:
                        detail, _, path = str(exc).partition(" - at `")
                        raise ArgsError(self._describe(name, self._extras, value, detail, path.rstrip("`")[1:])) from None

    def _describe(self, name: str, expected: Any, given: Any, detail: str, path: str) -> str:
        inner = f" at {name}{path}" if path else ""
        return (
            f"job {self.kind!r}: argument {name!r} must be {_type_name(expected)}, not {_short_repr(given, 80)} "
            f"({detail[0].lower()}{detail[1:]}{inner}); pass a value of that type (none is converted: "
            '"1" is not an int)'
        )


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return "None" if tp is type(None) else tp.__name__
    return repr(tp).replace("typing.", "")


_convert = msgspec.convert
