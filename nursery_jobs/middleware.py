"""Middleware: code of the service's (or an extra's) run around every attempt and every enqueue.

`app.middleware(mw)` registers one, in order, outermost first. A middleware is an
``async def mw(ctx, call_next)`` function (around each attempt only), or an instance of a
`Middleware` subclass that overrides any of its hooks:

- `around_attempt(ctx, call_next)`: in the attempt's own task, inside its cancel scope, around
  the handler (``await call_next(ctx)`` runs it; what it raises goes on out);
- `attempt_ended(end)`: once the attempt's outcome is decided (`AttemptEnd`: the outcome, the
  error, the wait and the run time), in the same task, whatever happened to the attempt;
- `around_enqueue(jobs, call_next)`: around each enqueue call (`kind.enqueue`, `enqueue_many`,
  `enqueue_tx`, `rt.enqueue...`): sees the jobs (`EnqueuedJob`) and may add `meta` strings to
  each, stored with the job and read back by every attempt of it (`ctx.meta`);
- `loop_blocked(blocked)`: a step that held the Trio loop past `blocked_loop_warning`, with the job
  it belonged to (the blocked-loop watchdog's finding, `LoopBlocked`);
- `jobs_rescued(job_ids)`: this process's rescuer made stale running jobs runnable again.

The runtime calls only the hooks a middleware overrides, so an app with none pays nothing, and
one whose middleware only counts outcomes pays no coroutine per attempt. A hook that raises never
stops the runtime: an `around_*` hook's error is the attempt's or the enqueue's (as the handler's
or the backend's would be), the others' are logged (event ``middleware_failed``) and dropped.

The jobs that the periodic scheduler and the outbox relay make are the runtime's own, not a
caller's: no `around_enqueue` runs for them.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Literal, NamedTuple, Sequence

from .backends.protocol import NewJob
from .errors import ConfigError
from .jobs import BatchContext, JobContext, args_with_meta, decode_args, encode_meta

if TYPE_CHECKING:
    from .jobs import JobId

__all__ = [
    "AttemptEnd",
    "CallNext",
    "EnqueuedJob",
    "Hooks",
    "LoopBlocked",
    "Middleware",
    "AttemptOutcome",
    "hooks_of",
]

log = logging.getLogger("nursery_jobs")

CallNext = Callable[[Any], Awaitable[Any]]
"""``await call_next(ctx)``: the rest of the chain and the handler, for `ctx` (the attempt's
context, or one made from it)."""

AttemptOutcome = Literal["completed", "retry", "snooze", "discard", "cancelled", "interrupted"]
"""How an attempt ended: its job completed; failed and will be retried (a timeout is a failure:
`AttemptEnd.timed_out`); snoozed; discarded (failed with no attempt left, the handler's
`Discard`, or args no call could take); cancelled; interrupted (cut by a shutdown or a lost claim,
and given back: the attempt does not count)."""


class AttemptEnd(NamedTuple):
    """How one attempt of one job ended, as `Middleware.attempt_ended` is told: once per attempt
    that started (a batch: once per job of it, with the batch's context), and once for a job
    discarded before its handler could run (its args do not fit, or its kind is not declared
    here: `context` None, `duration` 0)."""

    job_id: int
    kind: str
    queue: str
    attempt: int
    max_attempts: int
    outcome: AttemptOutcome
    timed_out: bool
    """The attempt passed its timeout (its outcome is then "retry" or "discard")."""
    error: BaseException | None
    """What the handler raised (its `Snooze` and `Discard` too), None when it returned or was cut
    without raising anything of its own (a timeout, a cancel, a shutdown)."""
    message: str | None
    """The error recorded with the job for this attempt (``job.errors``), e.g. "ValueError: bad
    row" or "timed out after 30 s"; None when none is recorded."""
    wait: float
    """Seconds the job waited for a worker: from when it became due (its enqueue, its `run_at`,
    its retry's backoff, its snooze) to the attempt's start."""
    duration: float
    """Seconds the attempt ran (0 for a job that could not run)."""
    context: JobContext | BatchContext | None
    """The context the runtime made for the attempt, as the outermost `around_attempt` saw it (the
    same object, so per-attempt state can be keyed by it); None for a job that could not run."""


class LoopBlocked(NamedTuple):
    """A step that held the Trio loop longer than `RuntimeSettings.blocked_loop_warning`."""

    seconds: float
    job_id: int | None
    """The job whose code ran in the step; None when it was no job's (a resource opening, a
    runtime service, the service's own task)."""
    kind: str | None
    queue: str | None
    task: str
    """The Trio task's name."""


class EnqueuedJob:
    """One job of an enqueue call, as `Middleware.around_enqueue` sees it before it is stored:
    its `kind`, `queue`, `priority`, `unique_key` and `args` (read-only: a copy), and `meta`, a
    dict of str to str that the middleware may fill (at most `jobs.MAX_META_SIZE` characters of
    JSON in all): it is stored with the job and read back, by every attempt of it in any process,
    as ``ctx.meta``. The handler never sees it in its args."""

    __slots__ = ("_new", "meta")

    def __init__(self, new: NewJob) -> None:
        self._new = new
        self.meta: dict[str, str] = {}

    @property
    def kind(self) -> str:
        return self._new.kind

    @property
    def queue(self) -> str:
        return self._new.queue

    @property
    def priority(self) -> int:
        return self._new.priority

    @property
    def unique_key(self) -> str | None:
        return self._new.unique_key

    @property
    def args(self) -> dict[str, Any]:
        return decode_args(self._new.args_json)

    def __repr__(self) -> str:
        return f"EnqueuedJob(kind={self.kind!r}, queue={self.queue!r}, meta={self.meta!r})"

    def stored(self) -> NewJob:
        """The job as the backend stores it: its args with the meta, if any (`ConfigError` for
        meta that is not str to str, or too large)."""
        if not self.meta:
            return self._new
        return self._new._replace(args_json=args_with_meta(self._new.args_json, encode_meta(self.meta)))


class Middleware:
    """Hooks around every attempt and every enqueue; subclass it and override what you need
    (module docstring; docs/middleware.md). Register an instance with `app.middleware(...)`
    before the runtime opens. The runtime calls only the hooks a subclass overrides."""

    async def around_attempt(self, ctx: JobContext | BatchContext, call_next: CallNext) -> Any:
        """Around the handler, in the attempt's task and inside its cancel scope: ``return await
        call_next(ctx)`` runs it (or the next middleware). What the handler raises (its
        `Snooze`, a `Cancelled`) passes through: let it out. Code here that raises fails the
        attempt as the handler would. A batch kind's attempt passes its `BatchContext`."""
        return await call_next(ctx)

    def attempt_ended(self, end: AttemptEnd) -> None:
        """After the attempt's outcome is decided, in the attempt's task (`AttemptEnd`). Keep it
        quick and non-blocking: it runs once per attempt, on the worker's path to its next job."""

    async def around_enqueue(self, jobs: Sequence[EnqueuedJob], call_next: Callable[[], Awaitable[list[JobId]]]) -> list[JobId]:
        """Around one enqueue call of `jobs` (one or many, one kind): fill ``job.meta`` before
        ``await call_next()``, which stores them and returns their ids. Await nothing after it:
        the enqueue is cancel-atomic only while nothing can be cancelled once the jobs exist."""
        return await call_next()

    def loop_blocked(self, blocked: LoopBlocked) -> None:
        """A step held the Trio loop (`LoopBlocked`); called for every such step, where the log
        groups repeats."""

    def jobs_rescued(self, job_ids: Sequence[int]) -> None:
        """This process's rescuer made these stale running jobs runnable again (their worker
        stopped heartbeating)."""


class _Around(Middleware):
    """An ``async def mw(ctx, call_next)`` function registered as a middleware."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any, CallNext], Awaitable[Any]]) -> None:
        self.fn = fn

    def __repr__(self) -> str:
        return f"<middleware {getattr(self.fn, '__qualname__', self.fn)!r}>"


def as_middleware(value: Any) -> Middleware:
    """`value` as `app.middleware` registers it, or `ConfigError` naming what it should be."""
    import inspect

    if isinstance(value, Middleware):
        return value
    if isinstance(value, type) and issubclass(value, Middleware):
        raise ConfigError(f"app.middleware takes an instance: app.middleware({value.__name__}()), not the class")
    if inspect.iscoroutinefunction(value):
        return _Around(value)
    raise ConfigError(
        f"app.middleware takes an `async def mw(ctx, call_next)` or an nj.Middleware instance, not {value!r}"
    )


def _overrides(mw: Middleware, name: str) -> bool:
    return getattr(type(mw), name) is not getattr(Middleware, name)


def _around_of(mw: Middleware) -> Callable[[Any, CallNext], Awaitable[Any]]:
    return mw.fn if isinstance(mw, _Around) else mw.around_attempt


def _guarded(name: str, hooks: list[tuple[Middleware, Callable[[Any], None]]]) -> Callable[[Any], None] | None:
    """One callable that calls each hook in turn; one that raises is logged and the others still
    run. None when there is none (the runtime then skips the call)."""
    if not hooks:
        return None

    def failed(mw: Middleware) -> None:
        log.exception(
            "middleware %r raised in %s; the runtime goes on (fix the middleware: its hook was skipped)",
            mw,
            name,
            extra={"event": "middleware_failed", "middleware": repr(mw), "hook": name},
        )

    if len(hooks) == 1:
        ((only, hook),) = hooks

        def one(value: Any) -> None:
            try:
                hook(value)
            except Exception:
                failed(only)

        return one

    def each(value: Any) -> None:
        for mw, hook in hooks:
            try:
                hook(value)
            except Exception:
                failed(mw)

    return each


class Hooks(NamedTuple):
    """What the runtime calls, built once from the app's middleware (`hooks_of`)."""

    around_attempt: tuple[Callable[[Any, CallNext], Awaitable[Any]], ...]
    """Outermost first."""
    attempt_ended: Callable[[AttemptEnd], None] | None
    around_enqueue: tuple[Callable[[Sequence[EnqueuedJob], Callable[[], Awaitable[list[JobId]]]], Awaitable[list[JobId]]], ...]
    """Outermost first."""
    loop_blocked: Callable[[LoopBlocked], None] | None
    jobs_rescued: Callable[[Sequence[int]], None] | None


NO_HOOKS = Hooks((), None, (), None, None)


def hooks_of(middlewares: Iterable[Middleware]) -> Hooks:
    mws = list(middlewares)
    if not mws:
        return NO_HOOKS

    def observers(name: str) -> Any:
        return _guarded(name, [(mw, getattr(mw, name)) for mw in mws if _overrides(mw, name)])

    return Hooks(
        tuple(_around_of(mw) for mw in mws if isinstance(mw, _Around) or _overrides(mw, "around_attempt")),
        observers("attempt_ended"),
        tuple(mw.around_enqueue for mw in mws if _overrides(mw, "around_enqueue")),
        observers("loop_blocked"),
        observers("jobs_rescued"),
    )


async def enqueue_through(
    hooks: Sequence[Callable[[Sequence[EnqueuedJob], Callable[[], Awaitable[list[JobId]]]], Awaitable[list[JobId]]]],
    jobs: Sequence[NewJob],
    store: Callable[[Sequence[NewJob]], Awaitable[list[JobId]]],
) -> list[JobId]:
    """Store `jobs` through the enqueue hooks, outermost first: the innermost stores each job with
    the meta the hooks gave it."""
    views = [EnqueuedJob(job) for job in jobs]

    async def innermost() -> list[JobId]:
        return await store([view.stored() for view in views])

    call: Callable[[], Awaitable[list[JobId]]] = innermost
    for hook in reversed(hooks):
        call = _bind(hook, views, call)
    return await call()


def _bind(
    hook: Callable[[Sequence[EnqueuedJob], Callable[[], Awaitable[list[JobId]]]], Awaitable[list[JobId]]],
    views: Sequence[EnqueuedJob],
    inner: Callable[[], Awaitable[list[JobId]]],
) -> Callable[[], Awaitable[list[JobId]]]:
    def call() -> Awaitable[list[JobId]]:
        return hook(views, inner)

    return call
