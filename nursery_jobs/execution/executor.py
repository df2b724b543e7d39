"""One queue's worker pool: a fetcher and `max_workers` workers.

The problem: run the jobs of one queue with at most `max_workers` at a time, start a job as soon
as it is due and a worker is free, end every attempt with exactly one outcome, and never let a
slow queue delay another.

The naive shape -- a loop that claims one job and spawns a task for it under a shared limiter --
pays for a task spawn, a limiter and a claim round trip per job, and a shared limiter lets one
hung queue starve the others. Instead each queue owns:

- `max_workers` long-lived worker tasks. The pool size *is* the bound, so no limiter is needed;
  an idle worker parks in the queue's idle list with its own mailbox.
- one fetcher, which claims as many due jobs as there are idle workers in a single backend call
  and hands each claimed job straight to an idle worker. Every insert notification reaches it as
  a wake-up (`wake_up`), which raises a claim-now flag that is cleared *before* each claim, so a
  wake-up that lands while a claim is in flight triggers another claim: there is no cooldown that
  can drop an insert. When nothing is due the fetcher sleeps until the earliest scheduled
  `run_at` the backend reported, a wake-up, or a free worker.
- backpressure: an outcome not written yet is a job still `running` in the backend, so the
  fetcher stops claiming while more than `outcome_slack` of the queue's outcomes wait for the
  completer (`_room`); a slow write can never let running rows pile up.

A worker runs each attempt through its kind's `KindRunner` (the handler chain) inside the
attempt's cancel scope (`execution.attempt`), and hands the outcome to the completer, which
writes outcomes in batches. The attempt's code stays inline in the worker's loop: this loop runs
once per job, and a coroutine call per job is a measurable share of a no-op job's cost.

What the executor needs is passed in, nothing more: the backend's job store, the completer, the
attempt registry, the runners by kind name, and a callback for a handler that makes the process
exit.
"""

from __future__ import annotations

import logging
import math
import random
from typing import Any, Callable, Mapping

import trio

from .._context import current_job_id, current_worker_box
from ..backends import Backend, ClaimedJob, ClaimResult, Outcome, OutcomeKind
from ..config import QueueConfig
from ..errors import ArgsError
from ..infra.owner import open_children, open_owner
from ..infra.sync import Mailbox, Wakeup
from ..jobs import Discard, JobContext, JobError, clean_text, decode_args
from .attempt import Attempt, AttemptRegistry, KindRunner, decide, process_exit, report_failure
from .completer import Completer

log = logging.getLogger("nursery_jobs")

__all__ = ["OUTCOME_SLACK", "QueueExecutor"]

_tuple_new = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)
_COMPLETED = OutcomeKind.COMPLETED

OUTCOME_SLACK = 32
"""Outcomes a queue may have waiting for the completer before it stops claiming: at least its
`max_workers`, and at least this many, so that a queue of a few workers still claims its next
job while the last outcomes are written (they are then written together, one commit for
several). Running rows in the backend stay below `max_workers` + this slack."""


def _children(job: ClaimedJob) -> Any:
    return open_children(f"job-{job.id}")


class QueueExecutor:
    def __init__(
        self,
        cfg: QueueConfig,
        *,
        backend: Backend,
        completer: Completer,
        attempts: AttemptRegistry,
        runners: Mapping[str, KindRunner],
        flush_bound: float,
        rng: random.Random,
        on_exit: Callable[[BaseException, ClaimedJob], None],
    ) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self.max_workers = cfg.max_workers
        self._backend = backend
        self._completer = completer
        self._attempts = attempts
        self._runners = runners
        self._flush_bound = flush_bound
        self._rng = rng
        self._on_exit = on_exit
        self._idle: list[Mailbox[ClaimedJob]] = []
        self._fetcher_wakeup = Wakeup()
        self._claim_now = True  # claim once at start-up: jobs may be waiting from before
        self._next_due = math.inf
        self._claiming = True
        self._claim_scope: trio.CancelScope | None = None
        self._workers_alive = 0
        self._all_exited = trio.Event()
        self._fetcher_exited = trio.Event()
        self._cancel_reason: str | None = None
        self.started = 0
        self.unwritten = 0
        """Outcomes of this queue pushed to the completer and not written yet: jobs that are
        still `running` in the backend. Past `outcome_slack` of them, claims stop (`_room`)."""
        self.outcome_slack = max(self.max_workers, OUTCOME_SLACK)

    def __repr__(self) -> str:
        return f"<QueueExecutor {self.name!r} workers={self.max_workers} unwritten={self.unwritten}>"

    # -- notifications (synchronous, called from backend events, workers and the completer) --

    def wake_up(self, due: float | None) -> None:
        """A wake-up from the backend: jobs are due now (`due` None), or at `due` at the earliest."""
        if due is None:
            self._claim_now = True
            self._fetcher_wakeup.set()
        elif due < self._next_due:
            self._next_due = due
            self._fetcher_wakeup.set()

    def outcomes_written(self, n: int) -> None:
        """The completer wrote `n` of this queue's outcomes: room to claim again."""
        self.unwritten -= n
        self._fetcher_wakeup.set()

    def _room(self) -> int:
        """How many jobs a claim may take now: one per idle worker, less what the completer
        owes past `outcome_slack` (a slow write must never let running rows pile up)."""
        room = len(self._idle)
        over = self.unwritten - self.outcome_slack
        return room - over if over > 0 else room

    def stop_claiming(self) -> None:
        self._claiming = False
        self._fetcher_wakeup.set()
        if self._claim_scope is not None:
            # A claim in flight is shielded from the shutdown, but not for longer than this.
            self._claim_scope.deadline = min(self._claim_scope.deadline, trio.current_time() + self._flush_bound)
        idle, self._idle = self._idle, []
        for box in idle:
            box.put(None)  # no job: the worker exits

    def cancel_running(self, reason: str) -> None:
        self._cancel_reason = reason
        self._attempts.cancel(reason, self.name)

    async def wait_workers_exited(self) -> None:
        await self._all_exited.wait()

    async def wait_fetcher_exited(self) -> None:
        await self._fetcher_exited.wait()

    # -- tasks --

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with open_owner(f"queue:{self.name}") as owner:
            self._workers_alive = self.max_workers
            for i in range(self.max_workers):
                owner.spawn(self._worker, name=f"worker-{i}")
            owner.spawn(self._fetcher_task, name="fetcher")
            task_status.started()

    async def _fetcher_task(self) -> None:
        try:
            await self._fetcher()
        finally:
            self._fetcher_exited.set()

    async def _fetcher(self) -> None:
        backend = self._backend
        poll = self.cfg.poll_interval if self.cfg.poll_interval is not None else backend.poll_interval
        while self._claiming:
            now = backend.now()
            room = self._room()
            if room <= 0 or not (self._claim_now or now >= self._next_due):
                wait_until = poll_at = math.inf
                if room > 0:
                    if self._next_due < math.inf:
                        wait_until = trio.current_time() + (self._next_due - now)
                    if poll is not None:
                        poll_at = trio.current_time() + poll
                until = min(wait_until, poll_at)
                if until == math.inf:
                    await self._fetcher_wakeup.wait()  # no deadline: spare a cancel scope per batch
                else:
                    with trio.move_on_at(until):
                        await self._fetcher_wakeup.wait()
                if trio.current_time() >= poll_at:
                    self._claim_now = True  # no wake-up came in time: look anyway
                continue
            self._claim_now = False
            # Due times reported during the claim must survive it: the claim's own answer was
            # read before they were written. Start from inf and merge both.
            self._next_due = math.inf
            limit = room
            # A claim commits before it answers: if it were cancelled mid-way, the jobs it
            # took would stay running with nobody to run them. So it runs shielded, and
            # whatever it returns is either handed to a worker or given back. The backend
            # bounds the call itself (statement and outage timeouts); once shutdown begins,
            # `stop_claiming` bounds it by `flush_bound` too.
            if backend.never_yields:
                result = await backend.claim(self.name, limit)  # never yields: cannot be cut
            else:
                answer: ClaimResult | None = None
                with trio.CancelScope(shield=True) as scope:
                    self._claim_scope = scope
                    if not self._claiming:
                        scope.deadline = trio.current_time() + self._flush_bound
                    answer = await backend.claim(self.name, limit)
                self._claim_scope = None
                if answer is None:
                    log.warning(
                        "shutdown: a claim on queue %r did not answer within flush_bound (%g s); any job it "
                        "took stays running in the backend and is rescued after rescue_after",
                        self.name,
                        self._flush_bound,
                        extra={"event": "claim_unanswered", "queue": self.name},
                    )
                    break
                result = answer
            if result.next_due is not None and result.next_due < self._next_due:
                self._next_due = result.next_due
            torn_down = trio.current_effective_deadline() == -math.inf
            for job in result.jobs:
                if torn_down or not self._idle:
                    # The runtime is being torn down, or shutdown emptied the idle list while
                    # the claim was in flight: give the job back, attempt and all.
                    self._push(Outcome(job.id, job.attempt, OutcomeKind.INTERRUPTED))
                    continue
                self._idle.pop().put(job)
            await trio.lowlevel.checkpoint_if_cancelled()
            if len(result.jobs) == limit:
                self._claim_now = True  # the queue may hold more than we had room for
            if not self._claiming:
                break
        # Claimed jobs handed out above and already started still run: they are part of the
        # grace period (a worker that had not started its job gives it back).

    async def _worker(self) -> None:
        """Take a job, run one attempt of it, repeat."""
        attempts = self._attempts
        runners = self._runners
        completer = self._completer
        box: Mailbox[ClaimedJob] = Mailbox()
        current_worker_box.set(box)  # names this worker's job to the blocked-loop watchdog
        try:
            while self._claiming:
                self._idle.append(box)
                self._fetcher_wakeup.set()
                try:
                    job = await box.get()
                except trio.Cancelled:
                    # Torn down from outside: a job put in the box but not taken goes back.
                    leftover = box.take_nowait()
                    if leftover is not None:
                        self._push(Outcome(leftover.id, leftover.attempt, OutcomeKind.INTERRUPTED))
                    raise
                if job is None:
                    return
                self.started += 1
                if self._cancel_reason is not None or not self._claiming:
                    # Handed to this worker before shutdown began (a signal can land between the
                    # fetcher's hand-off and this task's wake-up), but not started yet: nothing
                    # starts once shutdown has begun, so the attempt is given back.
                    self._push(Outcome(job.id, job.attempt, OutcomeKind.INTERRUPTED))
                    continue
                runner = runners.get(job.kind)
                if runner is None:
                    self._discard(job, f"unknown job kind {job.kind!r}: no @app.job registers it in this process")
                    continue
                try:
                    args = decode_args(job.args_json)
                    runner.job_kind.check_args(args)  # stored args that no call could bind fail every attempt alike
                except ValueError as exc:  # ArgsError too
                    what = "do not fit the handler" if isinstance(exc, ArgsError) else "could not be decoded"
                    self._discard(job, clean_text(f"job args {what}: {exc}"))
                    continue
                timeout = runner.timeout
                started = trio.current_time()
                deadline = started + timeout if timeout is not None else math.inf
                scope = trio.CancelScope(deadline=deadline)
                attempt = Attempt(job, scope, _children)
                ctx = JobContext(args, deadline, attempt)
                attempts.begin(attempt)
                token = current_job_id.set(job.id)
                error: BaseException | None = None
                try:
                    with scope:
                        try:
                            await runner.call(ctx, args)
                        except Exception as exc:
                            error = exc
                        except BaseException as exc:
                            if process_exit(exc) is None:
                                raise  # Cancelled (ours is caught by the scope), GeneratorExit
                            error = exc  # sys.exit() or KeyboardInterrupt in the handler
                except trio.Cancelled:
                    # Not our scope: the whole runtime is being torn down from outside. The
                    # attempt is given back, as in a shutdown, and the cancellation goes on.
                    self._push(Outcome(job.id, job.attempt, OutcomeKind.INTERRUPTED))
                    raise
                finally:
                    current_job_id.reset(token)
                    attempts.end(attempt)
                if error is None and not scope.cancel_called:
                    self.unwritten += 1
                    completer.push(_tuple_new(Outcome, (job.id, job.attempt, _COMPLETED, None, None)), self)  # common
                else:
                    now = self._backend.now()
                    outcome = decide(job, runner, attempt, error, now, self._rng)
                    self._push(outcome)
                    if outcome.error is not None:
                        report_failure(job, outcome, trio.current_time() - started, now, "handler" if isinstance(error, Discard) else None)
                    if error is not None and not isinstance(error, Exception):
                        exit_exc = process_exit(error)
                        assert exit_exc is not None
                        self._on_exit(exit_exc, job)
        finally:
            self._workers_alive -= 1
            if self._workers_alive == 0:
                self._all_exited.set()

    def _discard(self, job: ClaimedJob, message: str) -> None:
        outcome = Outcome(job.id, job.attempt, OutcomeKind.DISCARD, None, JobError(job.attempt, self._backend.now(), message))
        self._push(outcome)
        report_failure(job, outcome, 0.0, self._backend.now(), "unrunnable")

    def _push(self, outcome: Outcome) -> None:
        self.unwritten += 1
        self._completer.push(outcome, self)
