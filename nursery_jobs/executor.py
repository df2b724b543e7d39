"""One queue's worker pool: a fetcher, `max_workers` workers, and the attempt wrapper.

The problem: run the jobs of one queue with at most `max_workers` at a time, start a job as soon
as it is due and a worker is free, end every attempt with exactly one outcome, and never let a
slow queue delay another.

The naive shape -- a loop that claims one job and spawns a task for it under a shared limiter --
pays for a task spawn, a limiter and a claim round trip per job, and a shared limiter lets one
hung queue starve the others. Instead each queue owns:

- `max_workers` long-lived worker tasks. The pool size *is* the bound, so no limiter is needed;
  an idle worker parks in the queue's idle list with its own `trio.Event`.
- one fetcher, which claims as many due jobs as there are idle workers in a single backend call
  and hands each claimed job straight to an idle worker. A "wake-up" flag is raised by every
  insert notification and cleared *before* each claim, so a wake-up that lands while a claim is in
  flight triggers another claim: there is no cooldown that can drop an insert. When nothing is
  due the fetcher sleeps until the earliest scheduled `run_at` the backend reported, a wake-up, or
  a free worker.

An attempt runs inside exactly one `trio.CancelScope` whose deadline is the job's timeout.
Shutdown and remote cancel cancel the same scope after writing their *reason* on the attempt, so
the outcome is decided by which cause fired, not by the exception type: a reason of "cancel"
gives cancelled, "shutdown" gives interrupted (the attempt is given back), no reason with the
scope cancelled means the deadline passed (retryable, "timed out after N s"). One scope per
attempt keeps the per-job cost low (field notes: a cancel scope is the largest per-item cost).

Outcomes are not written here: they go to the completer, which writes them in batches.
"""

from __future__ import annotations

import inspect
import logging
import math
import random
from typing import TYPE_CHECKING, Any

import trio

from ._context import current_job_id, current_worker_box
from .backends import ClaimedJob, ClaimResult, Outcome, OutcomeKind
from .backends.transitions import on_failure
from .config import QueueConfig
from .errors import ArgsError
from .infra.owner import TaskOwner, open_children
from .infra.sync import Mailbox, Wakeup
from .jobs import Discard, JobContext, JobError, Snooze, clean_text, decode_args, describe_exception, format_traceback

if TYPE_CHECKING:
    from .runtime import Runtime

log = logging.getLogger("nursery_jobs")

__all__ = ["QueueExecutor"]

_tuple_new = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)
_COMPLETED = OutcomeKind.COMPLETED
_CANCEL_TAKES_REASON = "reason" in inspect.signature(trio.CancelScope.cancel).parameters
_REASON_TEXT = {
    "shutdown": "nursery_jobs: the runtime is shutting down and the grace period is over",
    "cancel": "nursery_jobs: the job was cancelled",
    "lost": "nursery_jobs: this worker lost the job (its claim expired or it was rescued elsewhere)",
}


def _process_exit(exc: BaseException) -> BaseException | None:
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


OUTCOME_SLACK = 32
"""Outcomes a queue may have waiting for the completer before it stops claiming: at least its
`max_workers`, and at least this many, so that a queue of a few workers still claims its next
job while the last outcomes are written (they are then written together, one commit for
several). Running rows in the backend stay below `max_workers` + this slack."""


class Attempt:
    """A running attempt: its scope and, once someone cancels it, why."""

    __slots__ = ("job", "scope", "reason", "queue")

    def __init__(self, job: ClaimedJob, scope: trio.CancelScope, queue: QueueExecutor) -> None:
        self.job = job
        self.scope = scope
        self.queue = queue
        self.reason: str | None = None

    def open_children(self) -> Any:
        return self.queue.open_children(self.job)

    def cancel(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        # The reason also reaches the handler: Cancelled's text and ctx.cancel_reason name it.
        if _CANCEL_TAKES_REASON:
            self.scope.cancel(reason=_REASON_TEXT.get(self.reason, self.reason))
        else:  # pragma: no cover - trio < 0.31 has no cancel reasons
            self.scope.cancel()


class QueueExecutor:
    def __init__(self, rt: Runtime, cfg: QueueConfig) -> None:
        self.rt = rt
        self.cfg = cfg
        self.name = cfg.name
        self.max_workers = cfg.max_workers
        self._idle: list[Mailbox[ClaimedJob]] = []
        self._kick = Wakeup()
        self._wake = True  # claim once at start-up: jobs may be waiting from before
        self._next_due = math.inf
        self._claiming = True
        self._claim_scope: trio.CancelScope | None = None
        self._workers_alive = 0
        self._all_exited = trio.Event()
        self._fetcher_exited = trio.Event()
        self._owner: TaskOwner | None = None
        self._cancel_reason: str | None = None
        self._kinds: dict[str, tuple[Any, float | None]] = {}
        self.started = 0
        self.unwritten = 0
        """Outcomes of this queue pushed to the completer and not written yet: jobs that are
        still `running` in the backend. Past `outcome_slack` of them, claims stop (`_room`)."""
        self.outcome_slack = max(self.max_workers, OUTCOME_SLACK)

    # -- notifications (synchronous, called from backend events and workers) --

    def wake(self, due: float | None) -> None:
        if due is None:
            self._wake = True
            self._kick.set()
        elif due < self._next_due:
            self._next_due = due
            self._kick.set()

    def outcomes_written(self, n: int) -> None:
        """The completer wrote `n` of this queue's outcomes: room to claim again."""
        self.unwritten -= n
        self._kick.set()

    def _room(self) -> int:
        """How many jobs a claim may take now: one per idle worker, less what the completer
        owes past `outcome_slack` (a slow write must never let running rows pile up)."""
        room = len(self._idle)
        over = self.unwritten - self.outcome_slack
        return room - over if over > 0 else room

    def stop_claiming(self) -> None:
        self._claiming = False
        self._kick.set()
        if self._claim_scope is not None:
            # A claim in flight is shielded from the shutdown, but not for longer than this.
            self._claim_scope.deadline = min(
                self._claim_scope.deadline, trio.current_time() + self.rt.settings.flush_bound
            )
        idle, self._idle = self._idle, []
        for box in idle:
            box.put(None)  # no job: the worker exits

    async def wait_workers_exited(self) -> None:
        await self._all_exited.wait()

    # -- tasks --

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        from .infra.owner import open_owner

        workers = self.max_workers + (1 if self.rt.faults.pool_off_by_one else 0)
        async with open_owner(f"queue:{self.name}") as owner:
            self._owner = owner
            self._workers_alive = workers
            for i in range(workers):
                owner.spawn(self._worker, name=f"worker-{i}")
            owner.spawn(self._fetcher_task, name="fetcher")
            task_status.started()

    async def _fetcher(self) -> None:
        backend = self.rt.backend
        faults = self.rt.faults
        poll = self.cfg.poll_interval if self.cfg.poll_interval is not None else backend.poll_interval
        while self._claiming:
            now = backend.now()
            room = self._room()
            if room <= 0 or not (self._wake or now >= self._next_due):
                wait_until = poll_at = math.inf
                if room > 0:
                    if self._next_due < math.inf:
                        wait_until = trio.current_time() + (self._next_due - now)
                    if poll is not None:
                        poll_at = trio.current_time() + poll
                until = min(wait_until, poll_at)
                if until == math.inf:
                    await self._kick.wait()  # no deadline: spare a cancel scope per batch
                else:
                    with trio.move_on_at(until):
                        await self._kick.wait()
                if trio.current_time() >= poll_at:
                    self._wake = True  # no wake-up came in time: look anyway
                continue
            if not faults.drop_wakeup_during_fetch:
                self._wake = False
            # Due times reported during the claim must survive it: the claim's own answer was
            # read before they were written. Start from inf and merge both.
            self._next_due = math.inf
            limit = room
            # A claim commits before it answers: if it were cancelled mid-way, the jobs it
            # took would stay running with nobody to run them. So it runs shielded, and
            # whatever it returns is either handed to a worker or given back. The backend
            # bounds the call itself (statement and outage timeouts); once shutdown begins,
            # `stop_claiming` bounds it by `flush_bound` too.
            if backend.atomic:
                result = await backend.claim(self.name, limit)  # never yields: cannot be cut
            else:
                answer: ClaimResult | None = None
                with trio.CancelScope(shield=True) as scope:
                    self._claim_scope = scope
                    if not self._claiming:
                        scope.deadline = trio.current_time() + self.rt.settings.flush_bound
                    answer = await backend.claim(self.name, limit)
                self._claim_scope = None
                if answer is None:
                    log.warning(
                        "shutdown: a claim on queue %r did not answer within flush_bound (%g s); any job it "
                        "took stays running in the backend and is rescued after rescue_after",
                        self.name,
                        self.rt.settings.flush_bound,
                    )
                    break
                result = answer
            if faults.drop_wakeup_during_fetch:
                self._wake = False
            if result.next_due is not None and result.next_due < self._next_due:
                self._next_due = result.next_due
            torn_down = trio.current_effective_deadline() == -math.inf
            for job in result.jobs:
                if torn_down or not self._idle:
                    # The runtime is being torn down, or shutdown emptied the idle list while
                    # the claim was in flight: give the job back, attempt and all.
                    self._finish(job, OutcomeKind.INTERRUPTED)
                    continue
                self._idle.pop().put(job)
            await trio.lowlevel.checkpoint_if_cancelled()
            if len(result.jobs) == limit:
                self._wake = True  # the queue may hold more than we had room for
            if not self._claiming:
                break
        # Claimed jobs handed out above still run: they are part of the grace period.

    async def _fetcher_task(self) -> None:
        try:
            await self._fetcher()
        finally:
            self._fetcher_exited.set()

    async def wait_fetcher_exited(self) -> None:
        await self._fetcher_exited.wait()

    async def _worker(self) -> None:
        """Take a job, run one attempt of it, repeat. The attempt's code is inline here rather
        than in its own coroutine: this loop runs once per job and a coroutine call per job is
        a measurable share of a no-op job's cost."""
        rt = self.rt
        attempts = rt.attempts
        box: Mailbox[ClaimedJob] = Mailbox()
        current_worker_box.set(box)  # names this worker's job to the blocked-loop watchdog
        try:
            while self._claiming:
                self._idle.append(box)
                self._kick.set()
                try:
                    job = await box.get()
                except trio.Cancelled:
                    # Torn down from outside: a job put in the box but not taken goes back.
                    leftover = box.take_nowait()
                    if leftover is not None:
                        self._finish(leftover, OutcomeKind.INTERRUPTED)
                    raise
                if job is None:
                    return
                self.started += 1
                if self._cancel_reason is not None or not self._claiming:
                    # Handed to this worker before shutdown began (a signal can land between the
                    # fetcher's hand-off and this task's wake-up), but not started yet: nothing
                    # starts once shutdown has begun, so the attempt is given back.
                    self._finish(job, OutcomeKind.INTERRUPTED)
                    continue
                cached = self._kinds.get(job.kind) or self._lookup_kind(job)
                if cached is None:
                    continue
                kind, timeout = cached
                try:
                    args = decode_args(job.args_json)
                    kind.check_args(args)  # stored args that no call could bind fail every attempt alike
                except ValueError as exc:  # ArgsError too
                    what = "do not fit the handler" if isinstance(exc, ArgsError) else "could not be decoded"
                    self._finish(job, OutcomeKind.DISCARD, error=clean_text(f"job args {what}: {exc}"))
                    continue
                deadline = trio.current_time() + timeout if timeout is not None else math.inf
                scope = trio.CancelScope(deadline=deadline)
                attempt = Attempt(job, scope, self)
                ctx = JobContext(args, deadline, attempt)
                stale = attempts.get(job.id)
                if stale is not None:
                    # The backend gave this job out again, so the older attempt lost it (rescued
                    # while it still ran here): it must stop now, not run beside the new one.
                    stale.cancel("lost")
                attempts[job.id] = attempt
                token = current_job_id.set(job.id)
                error: BaseException | None = None
                try:
                    with scope:
                        try:
                            if kind.asyncio:
                                from .infra.aio import call_asyncio

                                await call_asyncio(kind.fn, ctx, **args)
                            else:
                                await kind.fn(ctx, **args)
                        except Exception as exc:
                            error = exc
                        except BaseException as exc:
                            if _process_exit(exc) is None:
                                raise  # Cancelled (ours is caught by the scope), GeneratorExit
                            error = exc  # sys.exit() or KeyboardInterrupt in the handler
                except trio.Cancelled:
                    # Not our scope: the whole runtime is being torn down from outside. The
                    # attempt is given back, as in a shutdown, and the cancellation goes on.
                    self._finish(job, OutcomeKind.INTERRUPTED)
                    raise
                finally:
                    current_job_id.reset(token)
                    if attempts.get(job.id) is attempt:
                        del attempts[job.id]
                if error is None and not scope.cancel_called:
                    self.unwritten += 1
                    rt.completer.push(_tuple_new(Outcome, (job.id, job.attempt, _COMPLETED, None, None)), self)  # common
                else:
                    self._decide(job, kind, attempt, scope, error, timeout)
        finally:
            self._workers_alive -= 1
            if self._workers_alive == 0:
                self._all_exited.set()

    def _lookup_kind(self, job: ClaimedJob) -> tuple[Any, float | None] | None:
        """The kind and timeout of `job`, cached; None (and the job discarded) if unknown."""
        found = self.rt.app._kinds.get(job.kind)
        if found is None:
            self._finish(
                job, OutcomeKind.DISCARD, error=f"unknown job kind {job.kind!r}: no @app.job registers it in this process"
            )
            return None
        cached = self._kinds[job.kind] = (found, self.rt.app.timeout_for(found))
        return cached

    def open_children(self, job: ClaimedJob) -> Any:
        faults = self.rt.faults
        if faults.system_task_children:
            from .infra.owner import system_children

            return system_children()
        escape = self._owner if faults.children_in_queue_scope else None
        return open_children(f"job-{job.id}", escape)

    def _decide(
        self,
        job: ClaimedJob,
        kind: Any,
        attempt: Attempt,
        scope: trio.CancelScope,
        error: BaseException | None,
        timeout: float | None,
    ) -> None:
        faults = self.rt.faults
        if error is not None and not isinstance(error, Exception):
            # The handler asked the process to exit: the attempt counts as failed (a job that
            # always exits is bounded by max_attempts like any failure), and the runtime shuts
            # down without a grace, writing every other outcome, then raises it.
            leaf = _process_exit(error)
            assert leaf is not None
            message = f"{describe_exception(leaf)} (the handler made the process exit; the attempt counts as failed)"
            self._fail(job, kind, clean_text(message), format_traceback(error))
            self.rt.request_exit(leaf, job)
            return
        if scope.cancel_called:
            # Which scope fired decides, even if the handler swallowed the Cancelled and
            # returned: a timed-out attempt is a timeout, a shutdown-cut one is given back.
            reason = None if faults.outcome_from_exception_type else attempt.reason
            if reason == "cancel":
                self._finish(job, OutcomeKind.CANCELLED)
            elif reason == "shutdown" or reason == "lost":
                self._finish(job, OutcomeKind.INTERRUPTED)
            else:
                self._fail(job, kind, f"timed out after {timeout:g} s", None)
            return
        if error is None:
            self._finish(job, OutcomeKind.COMPLETED)
        elif isinstance(error, Snooze):
            if faults.snooze_counts_attempt:
                self._fail(job, kind, f"snoozed for {error.seconds:g} s", None, delay=error.seconds)
            else:
                self._finish(job, OutcomeKind.SNOOZE, run_at=self.rt.backend.now() + error.seconds)
        elif isinstance(error, Discard):
            self._finish(job, OutcomeKind.DISCARD, error=clean_text(error.reason))
        else:
            self._fail(job, kind, clean_text(describe_exception(error)), format_traceback(error))

    def _fail(self, job: ClaimedJob, kind: Any, message: str, tb: str | None, delay: float | None = None) -> None:
        if on_failure(attempt=job.attempt, max_attempts=job.max_attempts) is OutcomeKind.DISCARD:
            self._finish(job, OutcomeKind.DISCARD, error=message, tb=tb)
            return
        if delay is None:
            policy = kind.retry or self.rt.app.retry
            rng = random.SystemRandom() if self.rt.faults.unseeded_jitter else self.rt.rng
            delay = policy.delay(job.attempt, rng)
        self._finish(job, OutcomeKind.RETRY, run_at=self.rt.backend.now() + delay, error=message, tb=tb)

    def _finish(
        self,
        job: ClaimedJob,
        kind: OutcomeKind,
        *,
        run_at: float | None = None,
        error: str | None = None,
        tb: str | None = None,
    ) -> None:
        err = None
        if error is not None:
            err = JobError(job.attempt, self.rt.backend.now(), error, tb)
        self.unwritten += 1
        self.rt.completer.push(Outcome(job.id, job.attempt, kind, run_at, err), self)

    def cancel_running(self, reason: str) -> None:
        self._cancel_reason = reason
        for attempt in list(self.rt.attempts.values()):
            if attempt.queue is self:
                attempt.cancel(reason)
