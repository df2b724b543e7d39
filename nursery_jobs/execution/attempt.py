"""One attempt of one job: its scope, its handler chain, and the outcome it ends with.

An attempt runs inside one `trio.CancelScope` whose deadline is the job's timeout (the
worker's scope, which each attempt holds while it runs: `executor.QueueExecutor._worker`).
Shutdown, a remote cancel and a lost claim cancel the same scope after writing their *reason* on
the attempt, so the outcome is decided by which cause fired, not by the exception type the
handler let out: a reason of "cancel" gives cancelled, "shutdown" and "lost" give interrupted
(the attempt is given back), no reason with the scope cancelled means the deadline passed (a
failure, "timed out after N s"). One scope per attempt, and no fresh scope per attempt,
keeps the per-job cost low.

The call itself is a `KindRunner`, built once per job kind at start-up: the handler, or the
handler wrapped by the asyncio bridge, wrapped by the app's middleware chain (`async def
mw(ctx, call_next)`, outermost first). With no middleware it is the same single direct call
as a bare ``await fn(ctx, **args)``: the chain costs nothing until someone plugs into it. What an
attempt's end means for the job (retry or discard, the backoff) is decided by `decide`, with the
job rules (`nursery_jobs.rules`).

Nothing here writes: the executor hands `decide`'s outcome to the completer, and reports an
attempt that did not complete with `report_failure`: one log line per failed or discarded
attempt, with its facts as structured fields; a completed, snoozed, cancelled or interrupted
attempt logs nothing (a shutdown names what it interrupted once, for all of them).
"""

from __future__ import annotations

import inspect
import logging
import math
import random
from collections import abc
from typing import Any, Awaitable, Callable, Iterator, NamedTuple, Sequence

import trio

from .._context import current_resources, get_enqueuer
from ..app import BatchKind, JobKind
from ..backends import ClaimedJob, Outcome, OutcomeKind
from ..rules import on_failure
from ..config import RetryPolicy
from ..errors import ArgsError
from ..infra.sync import Wakeup
from ..middleware import CallNext
from ..jobs import (
    BatchJob,
    Discard,
    JobContext,
    JobError,
    Resources,
    Snooze,
    clean_text,
    decode_args,
    describe_exception,
    format_traceback,
)

__all__ = [
    "Attempt",
    "AttemptRegistry",
    "Batch",
    "BatchMember",
    "KindRunner",
    "decide",
    "decide_batch",
    "process_exit",
    "report_failure",
    "stored_args",
]

log = logging.getLogger("nursery_jobs")

_CANCEL_TAKES_REASON = "reason" in inspect.signature(trio.CancelScope.cancel).parameters
_REASON_TEXT = {
    "shutdown": "nursery_jobs: the runtime is shutting down and the grace period is over",
    "cancel": "nursery_jobs: the job was cancelled",
    "lost": "nursery_jobs: this worker lost the job (its claim expired or it was rescued elsewhere)",
}


class Attempt:
    """A running attempt: its job, its scope and, once someone cancels it, why.

    `scope` is None while the job is held (claimed ahead, not started) and once its attempt
    ended in a worker's run that went on (`executor.QueueExecutor._worker`): a cancel then only
    records its reason, which is all a job that is not running needs, and which the worker reads
    before it starts a held job."""

    __slots__ = ("job", "scope", "reason", "queue", "_children")

    def __init__(self, job: ClaimedJob, scope: trio.CancelScope | None, children: Callable[[ClaimedJob], Any]) -> None:
        self.job = job
        self.scope = scope
        self.queue = job.queue
        self.reason: str | None = None
        self._children = children

    def open_children(self) -> Any:
        return self._children(self.job)

    @property
    def resources(self) -> Resources:
        # Read when a handler asks, not per attempt: most handlers never do.
        return current_resources.get()

    @property
    def client(self) -> Any:
        return get_enqueuer("ctx.client")

    @property
    def cancel_called(self) -> bool:
        """Whether the attempt's scope was cancelled: by a reason, or by its deadline."""
        return self.scope is not None and self.scope.cancel_called

    def cancel(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        scope = self.scope
        if scope is None:
            return  # not running: the reason is all it takes
        # The reason also reaches the handler: Cancelled's text and ctx.cancel_reason name it.
        if _CANCEL_TAKES_REASON:
            scope.cancel(reason=_REASON_TEXT.get(self.reason, self.reason))
        else:  # pragma: no cover - trio < 0.31 has no cancel reasons
            scope.cancel()


class Batch(Attempt):
    """A batch of a batch kind (`@app.batch_job`): collected, then run under one scope.

    It is an `Attempt` of its first job for what the handler's context reads (its scope, the
    batch's reason, children, resources, client); it is never in the registry itself: each of
    its jobs is, as a `BatchMember`, so heartbeats renew every job and a cancel or a lost claim
    reaches the job it names. `until` is when collection ends at the latest (`max_wait` after
    the first job); `members` are the jobs collected, then those the batch runs with."""

    __slots__ = ("kind", "max_size", "until", "members", "wakeup", "started")

    def __init__(self, first: ClaimedJob, max_size: int, until: float, children: Callable[[ClaimedJob], Any]) -> None:
        super().__init__(first, trio.CancelScope(), children)
        self.kind = first.kind
        self.max_size = max_size
        self.until = until
        self.members: list[BatchMember] = []
        self.wakeup = Wakeup()
        """Set when the batch is full, and when the queue stops claiming: its worker looks again."""
        self.started = False

    @property
    def room(self) -> int:
        return self.max_size - len(self.members) if not self.started else 0

    def add(self, job: ClaimedJob) -> BatchMember:
        member = BatchMember(job, self)
        self.members.append(member)
        if len(self.members) >= self.max_size:
            self.wakeup.set()
        return member

    def member_cancelled(self, reason: str) -> None:
        """A job of the running batch was cancelled (`BatchMember.cancel`): a shutdown cuts the
        whole batch; otherwise the batch goes on for the others, and is cut only once every job
        of it is cancelled or lost (nothing left to do for anyone)."""
        if not self.started:
            return  # collecting: the job is left out when the batch starts
        if reason == "shutdown" or all(m.reason is not None for m in self.members):
            self.cancel(reason)


class BatchMember(Attempt):
    """One job of a `Batch`, in the attempt registry. Its own scope is never entered: cancelling
    it marks the job (its outcome is then decided by its reason, whatever the handler did with
    it) and tells the batch (`Batch.member_cancelled`)."""

    __slots__ = ("batch",)

    def __init__(self, job: ClaimedJob, batch: Batch) -> None:
        super().__init__(job, trio.CancelScope(), _no_children)
        self.batch = batch

    def cancel(self, reason: str) -> None:
        super().cancel(reason)
        self.batch.member_cancelled(reason)


def _no_children(job: ClaimedJob) -> Any:
    raise RuntimeError(f"job {job.id} runs in a batch: open child tasks with the batch's ctx.children()")


class AttemptRegistry:
    """The attempts running in this runtime, by job id: what heartbeats renew, what a cancel
    request or a lost claim cancels, what shutdown interrupts."""

    __slots__ = ("_by_id",)

    def __init__(self) -> None:
        self._by_id: dict[int, Attempt] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._by_id

    def get(self, job_id: int) -> Attempt | None:
        return self._by_id.get(job_id)

    def values(self) -> list[Attempt]:
        return list(self._by_id.values())

    def pairs(self) -> list[tuple[int, int]]:
        """(job id, attempt) of every running attempt."""
        return [(a.job.id, a.job.attempt) for a in self._by_id.values()]

    def begin(self, attempt: Attempt) -> None:
        stale = self._by_id.get(attempt.job.id)
        if stale is not None:
            # The backend gave this job out again, so the older attempt lost it (rescued
            # while it still ran here): it must stop now, not run beside the new one.
            stale.cancel("lost")
        self._by_id[attempt.job.id] = attempt

    def end(self, attempt: Attempt) -> None:
        if self._by_id.get(attempt.job.id) is attempt:
            del self._by_id[attempt.job.id]

    def holds(self, attempt: object) -> bool:
        """Whether `attempt` (an `Attempt` or a `Batch`, as `current_attempt` has it) runs in
        this registry now: from its start until its handler has returned or unwound. By
        identity, so an attempt that ended, lost its job to a later claim, or runs under another
        runtime is not held, whatever its job's id."""
        if isinstance(attempt, Batch):
            return any(self._by_id.get(m.job.id) is m for m in attempt.members)
        return isinstance(attempt, Attempt) and self._by_id.get(attempt.job.id) is attempt

    def cancel(self, reason: str, queue: str | None = None) -> None:
        for attempt in list(self._by_id.values()):
            if queue is None or attempt.queue == queue:
                attempt.cancel(reason)


class KindRunner(NamedTuple):
    """What an attempt of one kind needs, built once at start-up."""

    job_kind: JobKind[Any, Any]
    timeout: float | None
    retry: RetryPolicy
    call: Callable[[JobContext, dict[str, Any]], Awaitable[Any]]
    """The handler chain: ``await call(ctx, args)`` runs one attempt's code."""

    @staticmethod
    def build(
        kind: JobKind[Any, Any],
        timeout: float | None,
        retry: RetryPolicy,
        around: Sequence[Callable[[Any, CallNext], Awaitable[Any]]] = (),
    ) -> KindRunner:
        """`around`: the middleware's `around_attempt` hooks, outermost first (`middleware.Hooks`)."""
        fn = kind.fn
        call: Callable[[JobContext, dict[str, Any]], Awaitable[Any]]
        if isinstance(kind, BatchKind):

            def batched(ctx: Any, _args: dict[str, Any]) -> Awaitable[Any]:
                return fn(ctx, ctx.jobs)  # a BatchContext: the handler takes the jobs

            call = batched
        elif kind.asyncio:

            async def bridged(ctx: JobContext, args: dict[str, Any]) -> Any:
                from ..infra.aio import call_asyncio  # only a runtime with an asyncio kind loads it

                return await call_asyncio(fn, ctx, **args)

            call = bridged
        else:

            def direct(ctx: JobContext, args: dict[str, Any]) -> Awaitable[Any]:
                return fn(ctx, **args)  # the coroutine itself: no frame of our own per attempt

            call = direct
        for mw in reversed(around):
            call = _wrap(mw, call)
        return KindRunner(kind, timeout, retry, call)


def _wrap(
    mw: Callable[[Any, CallNext], Awaitable[Any]], inner: Callable[[JobContext, dict[str, Any]], Awaitable[Any]]
) -> Callable[[JobContext, dict[str, Any]], Awaitable[Any]]:
    # Plain functions returning the awaitable: the middleware's own coroutine is the only frame a
    # layer adds to an attempt, and `call_next` is made once per kind, not once per attempt.
    def call_next(next_ctx: JobContext) -> Awaitable[Any]:
        return inner(next_ctx, next_ctx.args)

    def call(ctx: JobContext, _args: dict[str, Any]) -> Awaitable[Any]:
        return mw(ctx, call_next)

    return call


def process_exit(exc: BaseException) -> BaseException | None:
    """The `SystemExit` or `KeyboardInterrupt` in `exc` (itself, or in an exception group from
    `ctx.children()`), or None."""
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        group, _ = exc.split((SystemExit, KeyboardInterrupt))
        found: BaseException | None = group
        while isinstance(found, BaseExceptionGroup):
            found = found.exceptions[0]
        return found
    return None


def decide(
    job: ClaimedJob,
    runner: KindRunner,
    attempt: Attempt,
    error: BaseException | None,
    now: float,
    rng: random.Random,
) -> Outcome:
    """The outcome of an attempt that did not simply complete: which scope fired, what the
    handler raised, and the failure rule (`on_failure`, with the kind's backoff)."""
    if error is not None and not isinstance(error, Exception):
        # The handler asked the process to exit: the attempt counts as failed (a job that
        # always exits is bounded by max_attempts like any failure); the executor then asks
        # the runtime to shut down and raise it.
        leaf = process_exit(error)
        assert leaf is not None
        message = f"{describe_exception(leaf)} (the handler made the process exit; the attempt counts as failed)"
        return _failure(job, runner, clean_text(message), format_traceback(error), now, rng)
    if attempt.cancel_called:
        # Which scope fired decides, even if the handler swallowed the Cancelled and returned:
        # a timed-out attempt is a timeout, a shutdown-cut one is given back.
        reason = attempt.reason
        if reason in ("cancel", "shutdown", "lost"):
            if error is not None:  # a child failed in its cleanup (`split_cut`): logged, as the outcome is no failure
                log.warning(
                    "job %d (%s, queue %s) attempt %d was cut (%s); in its cleanup: %s",
                    job.id, job.kind, job.queue, job.attempt, reason, clean_text(describe_exception(error)),
                    extra={"event": "cleanup_failed", "job_id": job.id, "attempt": job.attempt},
                )  # fmt: skip
            kind = OutcomeKind.CANCELLED if reason == "cancel" else OutcomeKind.INTERRUPTED
            return Outcome(job.id, job.attempt, kind)
        timeout = runner.timeout if runner.timeout is not None else math.inf
        message = f"timed out after {timeout:g} s"
        if error is None:
            return _failure(job, runner, message, None, now, rng)
        # A child failed in its cleanup while the timeout cancelled it (`split_cut`): the
        # failure is this attempt's too, and shown with the timeout.
        message += f"; then, in the cleanup: {describe_exception(error)}"
        return _failure(job, runner, clean_text(message), format_traceback(error), now, rng)
    if error is None:
        return Outcome(job.id, job.attempt, OutcomeKind.COMPLETED)
    if isinstance(error, Snooze):
        return Outcome(job.id, job.attempt, OutcomeKind.SNOOZE, now + error.seconds)
    if isinstance(error, Discard):
        return Outcome(job.id, job.attempt, OutcomeKind.DISCARD, None, JobError(job.attempt, now, clean_text(error.reason)))
    return _failure(job, runner, clean_text(describe_exception(error)), format_traceback(error), now, rng)


def split_cut(exc: BaseException) -> tuple[BaseException, Exception] | None:
    """What a handler lets out when children fail in their cleanup while its attempt is being
    cancelled (a timeout, a cancel, a shutdown): one group of the children's cancellations and
    those errors. Split in two: the cancellations, which go on (the attempt's scope takes its
    own), and the errors, which are the job's and no one else's; left whole, the group's errors
    would pass through the scope and end the worker and the runtime. None for anything else."""
    if isinstance(exc, BaseExceptionGroup):
        cancelled, failed = exc.split(trio.Cancelled)
        if cancelled is not None and isinstance(failed, Exception):
            return cancelled, failed
    return None


def only_cancelled(exc: BaseException) -> bool:
    """`exc` is a cancellation, alone or as a group of them (a handler's children cancelled)."""
    if isinstance(exc, trio.Cancelled):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.split(trio.Cancelled)[1] is None


NOT_HANDLED = "the batch handler returned this job as not handled"


def decide_batch(
    batch: Batch, runner: KindRunner, error: BaseException | None, returned: Any, now: float, rng: random.Random
) -> list[tuple[BatchMember, Outcome]]:
    """The outcome of each job of a batch that ran, by the same rules as `decide`: a job whose
    own attempt was cancelled ("cancel", "lost", "shutdown") by its reason, whatever the
    handler did with it; a batch cut by its deadline fails every other job ("timed out"), one
    cut by a shutdown gives every attempt back; a handler that raised applies its error to
    every job (a failure each, or its `Snooze` / `Discard`); a handler that returned fails the
    jobs it returned (`NOT_HANDLED`) and completes the others. A return value that is not None
    or an iterable of this batch's jobs is an error of the handler's (every job fails)."""
    unhandled: set[int] = set()
    if error is None and not batch.cancel_called and returned is not None:
        try:
            unhandled = _unhandled(batch, returned)
        except Exception as exc:
            error = exc
    outcomes = []
    cut = batch.cancel_called
    for member in batch.members:
        job = member.job
        if error is None and not cut and member.reason is None and job.id not in unhandled:
            outcomes.append((member, Outcome(job.id, job.attempt, OutcomeKind.COMPLETED)))  # the common case
            continue
        view: Attempt = member
        if member.reason is None and cut:
            view = batch  # the batch's deadline or shutdown decides for this job
        if error is None and job.id in unhandled and not view.cancel_called:
            outcome = _failure(job, runner, NOT_HANDLED, None, now, rng)
        else:
            outcome = decide(job, runner, view, error, now, rng)
        outcomes.append((member, outcome))
    return outcomes


def _unhandled(batch: Batch, returned: Any) -> set[int]:
    """The ids of the jobs a batch handler returned as not handled; `TypeError` for a return
    value that is not an iterable of this batch's `BatchJob`s."""
    fix = "return the jobs it could not handle (some of `jobs`), or None when it handled all"
    if isinstance(returned, (str, bytes, abc.Mapping, BatchJob)) or not isinstance(returned, abc.Iterable):
        raise TypeError(f"the batch handler returned {clean_text(repr(returned), 200)}; {fix}")
    ids: set[int] = set()
    for item in returned:
        member = getattr(item, "_member", None) if isinstance(item, BatchJob) else None
        if not isinstance(member, BatchMember) or member.batch is not batch:
            raise TypeError(f"the batch handler returned {clean_text(repr(item), 200)}, which is not a job of this batch; {fix}")
        ids.add(item.id)
    return ids


def _failure(job: ClaimedJob, runner: KindRunner, message: str, tb: str | None, now: float, rng: random.Random) -> Outcome:
    error = JobError(job.attempt, now, message, tb)
    if on_failure(attempt=job.attempt, max_attempts=job.max_attempts) is OutcomeKind.DISCARD:
        return Outcome(job.id, job.attempt, OutcomeKind.DISCARD, None, error)
    return Outcome(job.id, job.attempt, OutcomeKind.RETRY, now + runner.retry.delay(job.attempt, rng), error)


def report_failure(job: ClaimedJob, outcome: Outcome, duration: float, now: float, discard: str | None = None) -> None:
    """Log the attempt `outcome` ended with an error, on one line: a failure that will be retried
    (warning), a failure with no attempt left (error), the handler's `Discard` (`discard`
    "handler": warning), or a job that could not run at all (`discard` "unrunnable": error).
    `duration`: seconds the attempt ran."""
    error = outcome.error
    if error is None:
        return
    retry_in = None
    if outcome.kind is OutcomeKind.RETRY:
        retry_in = round(max(0.0, outcome.run_at - now), 3) if outcome.run_at is not None else 0.0
        level, event, verb, then = logging.WARNING, "attempt_failed", "failed", f"; retrying in {retry_in:.3g} s"
    elif discard == "handler":
        level, event, verb, then = logging.WARNING, "job_discarded", "was discarded by its handler", ""
    elif discard is not None:
        level, event, verb, then = logging.ERROR, "job_discarded", "could not run", ""
    else:
        level, event, verb, then = logging.ERROR, "attempt_failed", "failed", "; no attempt left: discarded"
    if log.isEnabledFor(level):
        log.log(
            level,
            "job %d (%s, queue %s) attempt %d of %d %s after %.3g s: %s%s",
            job.id,
            job.kind,
            job.queue,
            job.attempt,
            job.max_attempts,
            verb,
            duration,
            _one_line(error.message),
            then,
            extra={
                "event": event,
                "job_id": job.id,
                "kind": job.kind,
                "queue": job.queue,
                "attempt": job.attempt,
                "max_attempts": job.max_attempts,
                "duration": round(duration, 6),
                "error": error.message,
                "outcome": outcome.kind.value,
                "retry_in": retry_in,
            },
        )


def stored_args(kind: JobKind[Any, Any], text: str) -> dict[str, Any]:
    """The args of a claimed job of `kind`, held to its handler as an enqueue through the app
    holds them (`JobKind.check_stored_args`): the job may have been stored without that check
    (`nursery-jobs enqueue` without `--app`, a process running another version of the app,
    SQL), and args that no call can take would fail every attempt alike. ValueError, with the
    message the job's discard records, when the text is not a JSON object or does not fit."""
    try:
        args = decode_args(text)
        kind.check_stored_args(args)
    except ArgsError as exc:
        raise ValueError(
            f"job args do not fit the handler: {exc}; no attempt could succeed, so the job was not run. "
            "Enqueue it again with args that fit (`nursery-jobs enqueue --app MODULE:APP` checks them)"
        ) from None
    except ValueError as exc:
        raise ValueError(f"job args could not be decoded: {exc}") from None
    return args


def _one_line(text: str, limit: int = 500) -> str:
    """`text` on one line (a log line per attempt stays one line) and at most `limit` long; the
    `error` field keeps the whole message."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
