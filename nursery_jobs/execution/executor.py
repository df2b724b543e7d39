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
- claim ahead: a claim answers after a round trip, and a worker that waits for it idles. So
  the fetcher also claims for workers that are still running: up to `prefetch` jobs
  (`PREFETCH_PER_WORKER` per worker, at most `PREFETCH_MAX`) wait in the queue's `_held` list,
  and a worker that ends an attempt takes its next job from there with no round trip and no
  hand-off. How many it holds follows the attempts' mean duration (`_ahead`): the whole
  prefetch while they are short, fewer as they lengthen, so that the workers are expected to
  have started every held job within half of `HOLD_BOUND`, and none once they average more
  than that. The fetcher claims again once the list is down to half of that (`_low_water`),
  while the workers run what is left, so the claim overlaps the running instead of following
  it. Large claims matter as much as early ones: each claim and each outcome batch is a
  statement (and each outcome batch's NOTIFY wakes every listening session of the database),
  so at 32 workers of short jobs a claim of ~90 jobs costs the server per job about half what
  a claim of ~40 does (RESULTS.md, issue 8). It claims ahead only when it is worth it: on a
  backend whose claim is a round trip (not `never_yields`), for a queue of more than one
  worker (a queue of one worker starts its jobs in the strict order the docs promise), for a
  queue with no rate-limited kind (a rate counts a start at the claim, and must hold at the
  handler's first line: `_rated`), and while the attempts are short, so a queue of long jobs
  holds nothing. A held job is `running`
  in the backend: it is in the attempt registry from
  the moment it is claimed (so the heartbeats renew it, and a cancel request or a lost claim
  reaches it before it starts, which then starts nothing), its timeout starts when a worker
  starts it, and one that no worker took within `HOLD_BOUND` is given back (interrupted:
  available at once, attempt and all). Shutdown gives every held job back the same way, at once.
  The price is order: a job that becomes due after a claim ahead starts after the held ones
  (docs/guarantees.md, "Ordering"); `app.queue(..., claim_ahead=False)` turns it off.
- backpressure: an outcome not written yet is a job still `running` in the backend, so the
  fetcher stops claiming while more than `outcome_slack` of the queue's outcomes wait for the
  completer (`_room`); a slow write can never let running rows pile up. Running rows in the
  backend stay below `max_workers + prefetch + outcome_slack`.

- batches (`@app.batch_job`): a claimed job of a batch kind joins the batch of its kind that is
  collecting (`_open`), or opens one for an idle worker, which collects until the batch holds
  `max_size` jobs or `max_wait` has passed since its first, then runs the handler once under one
  scope (`_run_batch`; each job's outcome from `attempt.decide_batch`). Each job of a batch is a
  `BatchMember` in the attempt registry from its claim. A queue whose kinds are all batch kinds
  claims `max_size` per idle worker; any queue claims for the room of the batches collecting,
  less what it already holds (claims are by queue, so they may bring other kinds). A batch that
  has not started when shutdown begins is given back whole (`_give_back_batch`).

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
from collections import deque
from typing import Any, Awaitable, Callable, Mapping

import trio

from .._context import current_attempt, current_worker_box
from ..backends import Backend, ClaimedJob, ClaimResult, Outcome, OutcomeKind
from ..config import QueueConfig
from ..infra.owner import open_children, open_owner
from ..infra.sync import Mailbox, Wakeup
from ..app import BatchKind
from ..jobs import BatchContext, BatchJob, Discard, JobContext, JobError, clean_text
from ..middleware import AttemptEnd
from .attempt import (
    Attempt,
    AttemptRegistry,
    Batch,
    KindRunner,
    decide,
    decide_batch,
    only_cancelled,
    process_exit,
    report_failure,
    split_cut,
    stored_args,
)
from .completer import Completer

log = logging.getLogger("nursery_jobs")

__all__ = ["HOLD_BOUND", "OUTCOME_SLACK", "PREFETCH_MAX", "PREFETCH_PER_WORKER", "QueueExecutor"]

_tuple_new = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)
_COMPLETED = OutcomeKind.COMPLETED
_FAILED = (OutcomeKind.RETRY, OutcomeKind.DISCARD)

OUTCOME_SLACK = 32
"""Outcomes a queue may have waiting for the completer before it stops claiming: at least its
`max_workers`, and at least this many, so that a queue of a few workers still claims its next
job while the last outcomes are written (they are then written together, one commit for
several). Running rows in the backend stay below `max_workers` + the prefetch + this slack."""

PREFETCH_PER_WORKER = 4
"""Jobs a queue claims ahead per worker, at most (and no more than `PREFETCH_MAX` in all)."""

PREFETCH_MAX = 128
"""Jobs a queue claims ahead, for workers still running, at most. Each is a `running` row nobody
works on yet, held at most `HOLD_BOUND`, so the number stays bounded; but each claim is a
statement, so it is large enough that a drain of short jobs claims ~100 at a time, not one per
worker."""

HOLD_BOUND = 1.0
"""Seconds a job claimed ahead may wait for a worker. Past it the job is given back (available
again at once, the attempt not counted), so a job claimed for a worker that turned out to be
busy for long waits at most this long, rather than as long as the job in front of it."""


def _children(job: ClaimedJob) -> Any:
    return open_children(f"job-{job.id}")


def _batch_children(job: ClaimedJob) -> Any:
    return open_children(f"batch-{job.id}")


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
        observe: Callable[[AttemptEnd], None] | None = None,
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
        self._observe = observe
        """The middleware's `attempt_ended` hooks (one call for them all), or None: nothing is
        built for them per attempt."""
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
        self.unwritten = 0
        """Outcomes of this queue pushed to the completer and not written yet: jobs that are
        still `running` in the backend. Past `outcome_slack` of them, claims stop (`_room`)."""
        self.outcome_slack = max(self.max_workers, OUTCOME_SLACK)
        here = [r for r in runners.values() if r.job_kind.queue == self.name]
        self._batch_kinds = {r.job_kind.name: r for r in here if isinstance(r.job_kind, BatchKind)}
        """This queue's batch kinds (`@app.batch_job`): their jobs are collected into batches."""
        sizes = [r.job_kind.max_size for r in self._batch_kinds.values() if isinstance(r.job_kind, BatchKind)]
        self._per_idle = max(sizes) if sizes and len(sizes) == len(here) else 1
        """Jobs a claim takes per idle worker: a batch's worth when every kind of the queue is a
        batch kind, else one (a batch then fills by the claims its room makes)."""
        if sizes:
            self.outcome_slack = max(self.outcome_slack, self.max_workers * max(sizes))  # a batch's outcomes come at once
        self._open: dict[str, Batch] = {}
        """Batches collecting, by kind: a claimed job of the kind joins it until it is full."""
        self._handed: dict[int, Batch] = {}
        """Batches the fetcher opened, by first job id, handed to a worker that has not taken them yet."""
        self._max_running = cfg.global_max_workers
        self._rated = any(r.job_kind.rate is not None for r in here)
        """A kind of this queue has a rate limit: the queue claims for idle workers only. A
        rate counts a job's start when the claim takes it, so a job held for a busy worker
        would reach its handler later than counted, and the next window's starts, handed
        straight to idle workers, would crowd it there: the rate must hold where the
        handler's request goes out (docs/rate_limits.md)."""
        ahead = cfg.claim_ahead and not backend.never_yields and self.max_workers > 1 and not self._rated
        self.prefetch = min(self.max_workers * PREFETCH_PER_WORKER, PREFETCH_MAX) if ahead else 0
        self._low_water = self.prefetch // 2
        """Held jobs at which the fetcher claims ahead again (the workers still have these): half
        of what `_ahead` said at the last look."""
        self._held: deque[Attempt] = deque()
        """Jobs claimed ahead, in claim order, each already an `Attempt` in the registry."""
        self._held_until: deque[float] = deque()
        """Parallel to `_held`: when each is given back if no worker took it."""
        self._ended = 0
        """Attempts ended by this queue's workers, ever (counted only where it claims ahead)."""
        self._busy = 0.0
        """Their summed durations: the mean decides whether to claim ahead."""
        self._mark = (0, 0.0)
        """`_ended` and `_busy` at the last claim."""
        self._mean = math.inf
        """Mean duration of the attempts that ended between the last two claims that saw any."""

    def __repr__(self) -> str:
        return (
            f"<QueueExecutor {self.name!r} workers={self.max_workers} held={len(self._held)} "
            f"unwritten={self.unwritten}>"
        )

    @property
    def held(self) -> int:
        """Jobs claimed ahead and not started yet (`running` in the backend)."""
        return len(self._held)

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
        """The completer wrote `n` of this queue's outcomes: room to claim again (and, under
        `global_max_workers`, a slot of the queue's that another claim may have been refused)."""
        self.unwritten -= n
        if self._max_running is not None:
            self._claim_now = True
        self._fetcher_wakeup.set()

    def _room(self) -> int:
        """How many jobs a claim may take now: one per idle worker, plus what the held list
        lacks of `_ahead()` once it is down to half of that (`_low_water`), less what the
        completer owes past `outcome_slack` (a slow write must never let running rows pile
        up)."""
        room = len(self._idle) * self._per_idle
        if self._open and not self._rated:
            # Claims are by queue: what a claim for a batch's room brings of other kinds waits
            # in `_held`, and counts against that room, so plain jobs never pile up there (a
            # queue with a rate-limited kind holds none: its batches fill from the claims
            # for its idle workers).
            batch_room = sum(batch.room for batch in self._open.values()) - len(self._held)
            if batch_room > 0:
                room += batch_room
        if self.prefetch:
            held = len(self._held)
            ahead = self._ahead()
            self._low_water = ahead // 2
            if held <= self._low_water:
                room += ahead - held
        over = self.unwritten - self.outcome_slack
        return room - over if over > 0 else room

    def _ahead(self) -> int:
        """How many jobs to hold for workers still running: as many as the workers are expected
        to start within half of `HOLD_BOUND` (held x mean attempt / workers), at most
        `prefetch`; none while attempts average more than that (a queue of long jobs holds
        nothing). At a mean of half of `HOLD_BOUND` that is one per worker."""
        mean = self._mean_attempt()
        if mean > HOLD_BOUND / 2:
            return 0
        if mean <= 0.0:
            return self.prefetch
        return min(self.prefetch, int(self.max_workers * (HOLD_BOUND / 2) / mean))

    def _mean_attempt(self) -> float:
        ended, busy = self._mark
        n = self._ended - ended
        return (self._busy - busy) / n if n else self._mean

    def _hold(self, job: ClaimedJob, until: float) -> None:
        """Keep a job claimed ahead for the next worker that ends an attempt."""
        attempt = Attempt(job, None, _children)  # no scope until it starts: a cancel meanwhile leaves its reason
        self._attempts.begin(attempt)  # heartbeated, cancellable, from now on
        self._held.append(attempt)
        self._held_until.append(until)

    def _give_back_held(self, expired_by: float | None = None) -> None:
        """Give back every held job (shutdown, teardown) or those held past `expired_by`."""
        held, until = self._held, self._held_until
        given: list[int] = []
        while held and (expired_by is None or until[0] <= expired_by):
            attempt = held.popleft()
            until.popleft()
            self._attempts.end(attempt)
            job = attempt.job
            self._push(Outcome(job.id, job.attempt, OutcomeKind.INTERRUPTED))
            given.append(job.id)
        if given and expired_by is not None:
            # The attempts in front of them outlasted the bound: no claiming ahead until
            # attempts that end again say they are short.
            self._mean = math.inf
            self._mark = (self._ended, self._busy)
            log.info(
                "queue %r: %d jobs claimed ahead waited %g s for a worker and were given back",
                self.name,
                len(given),
                HOLD_BOUND,
                extra={"event": "claimed_ahead_given_back", "queue": self.name, "job_ids": given},
            )

    def stop_claiming(self) -> None:
        self._claiming = False
        self._fetcher_wakeup.set()
        if self._claim_scope is not None:
            # A claim in flight is shielded from the shutdown, but not for longer than this.
            self._claim_scope.deadline = min(self._claim_scope.deadline, trio.current_time() + self._flush_bound)
        idle, self._idle = self._idle, []
        for box in idle:
            box.put(None)  # no job: the worker exits
        self._give_back_held()  # nothing starts once shutdown has begun
        for batch in self._open.values():
            batch.wakeup.set()  # its worker gives it back: a batch still collecting does not start

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
            self._give_back_held()  # torn down from outside: what nobody started goes back
            self._fetcher_exited.set()

    async def _fetcher(self) -> None:
        backend = self._backend
        poll = self.cfg.poll_interval if self.cfg.poll_interval is not None else backend.poll_interval
        held_until = self._held_until
        while self._claiming:
            if held_until and held_until[0] <= trio.current_time():
                self._give_back_held(trio.current_time())
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
                if held_until and held_until[0] < until:
                    until = held_until[0]  # a held job's time is up then: give it back
                if until == math.inf:
                    await self._fetcher_wakeup.wait()  # no deadline: spare a cancel scope per batch
                else:
                    with trio.move_on_at(until):
                        await self._fetcher_wakeup.wait()
                if trio.current_time() >= poll_at:
                    self._claim_now = True  # no wake-up came in time: look anyway
                continue
            self._claim_now = False
            if self.prefetch:
                self._mean = self._mean_attempt()
                self._mark = (self._ended, self._busy)
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
                result = await self._claim(limit)  # never yields: cannot be cut
            else:
                answer: ClaimResult | None = None
                with trio.CancelScope(shield=True) as scope:
                    self._claim_scope = scope
                    if not self._claiming:
                        scope.deadline = trio.current_time() + self._flush_bound
                    answer = await self._claim(limit)
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
            idle = self._idle
            hold_until = 0.0
            for job in result.jobs:
                if torn_down or not self._claiming:
                    # The runtime is being torn down, or shutdown began while the claim was in
                    # flight: give the job back, attempt and all.
                    self._push(Outcome(job.id, job.attempt, OutcomeKind.INTERRUPTED))
                elif job.kind in self._batch_kinds and self._to_batch(job):
                    pass  # joined the batch collecting, or opened one for an idle worker
                elif idle:
                    idle.pop().put(job)
                else:
                    if not hold_until:
                        hold_until = trio.current_time() + HOLD_BOUND
                    self._hold(job, hold_until)  # claimed ahead: the next worker that is free takes it
            await trio.lowlevel.checkpoint_if_cancelled()
            if len(result.jobs) == limit:
                self._claim_now = True  # the queue may hold more than we had room for
            if not self._claiming:
                break
        # Claimed jobs handed out above and already started still run: they are part of the
        # grace period (a worker that had not started its job gives it back).

    def _claim(self, limit: int) -> Awaitable[ClaimResult]:
        if self._max_running is None:
            return self._backend.claim(self.name, limit)
        return self._backend.claim(self.name, limit, max_running=self._max_running)

    async def _worker(self) -> None:
        """Take a job, run one attempt of it, repeat.

        A worker keeps one cancel scope for as long as its attempts simply complete: each
        attempt holds it while it runs, with the scope's deadline moved to the attempt's own as
        it starts (its timeout runs from its start), and between attempts the deadline is back at
        inf and no attempt holds it. That is safe because a deadline fires, and a cancel reaches
        the scope, only through the attempt that holds it: an attempt that ended is out of the
        registry and left with no scope (`Attempt.cancel` then only records the reason), and
        nothing can fire while the worker waits. It matters because entering and leaving a scope
        with a deadline costs several microseconds, a large share of what the runtime spends on
        a short job; a deadline write costs a third of that. An attempt that did not simply
        complete (cut by its reason or its deadline, or raising) leaves the scope, and its
        outcome is decided once the scope has exited, as if it had had a scope of its own; the
        worker goes on in a new one. Inside, it reads the attempt's reason and the clock rather
        than `cancel_called`, which would cost a clock read and would call an attempt that
        overran its deadline without yielding timed out, where its exited scope says it
        completed."""
        attempts = self._attempts
        completer = self._completer
        batch_kinds = self._batch_kinds
        box: Mailbox[ClaimedJob] = Mailbox()
        current_worker_box.set(box)  # names this worker's job to the blocked-loop watchdog
        held = self._held
        held_until = self._held_until
        prefetch = self.prefetch
        observe = self._observe
        clock = trio.lowlevel.current_clock().current_time  # the run's clock (MockClock in tests), one call per read
        try:
            while self._claiming:
                scope = trio.CancelScope()  # the worker's, until an attempt is cut (or the worker ends)
                running = False  # an attempt of this scope's was started and not yet simply completed
                try:
                    with scope:
                        while self._claiming:
                            job: ClaimedJob | None
                            if held:
                                # A job claimed ahead: no round trip, no hand-off. It is in the registry
                                # already; a cancel request or a lost claim may have reached it there.
                                attempt = held.popleft()
                                held_until.popleft()
                                job = attempt.job
                                box.last = job
                                if len(held) == self._low_water:
                                    # Down to the low water: let the fetcher send its claim now, so that it
                                    # travels while this worker and the others run what is left.
                                    self._fetcher_wakeup.set()
                                    try:
                                        await trio.lowlevel.checkpoint()
                                    except trio.Cancelled:
                                        attempts.end(attempt)  # torn down from outside: not started, given back
                                        self._push(Outcome(job.id, job.attempt, OutcomeKind.INTERRUPTED))
                                        raise
                                    if not self._claiming:
                                        attempts.end(attempt)  # shutdown began meanwhile: nothing starts now
                                        self._push(Outcome(job.id, job.attempt, OutcomeKind.INTERRUPTED))
                                        continue
                                if attempt.reason is not None:
                                    self._not_started(attempt)  # a cancel request or a lost claim reached it
                                    continue
                            else:
                                self._idle.append(box)
                                self._fetcher_wakeup.set()
                                try:
                                    job = await box.get()
                                except trio.Cancelled:
                                    # Torn down from outside: a job put in the box but not taken goes back.
                                    leftover = box.take_nowait()
                                    if leftover is not None:
                                        self._give_back_job(leftover)
                                    raise
                                if job is None:
                                    return
                                attempt = None
                                if self._cancel_reason is not None or not self._claiming:
                                    # Handed to this worker before shutdown began (a signal can land between
                                    # the fetcher's hand-off and this task's wake-up), but not started yet:
                                    # nothing starts once shutdown has begun, so the attempt is given back.
                                    self._give_back_job(job)
                                    continue
                            if job.kind in batch_kinds:
                                box.last = job
                                await self._batch(job, attempt)
                                continue
                            ready = self._ready(job, attempt)
                            if ready is None:
                                continue
                            runner, args = ready
                            timeout = runner.timeout
                            started = clock()
                            deadline = started + timeout if timeout is not None else math.inf
                            if deadline != math.inf:
                                scope.deadline = deadline  # the timeout runs from the start, not the claim
                            if attempt is None:
                                attempt = Attempt(job, scope, _children)
                                attempts.begin(attempt)
                            else:
                                attempt.scope = scope
                            error: BaseException | None = None
                            running = True
                            while True:
                                ctx = JobContext(args, deadline, attempt)
                                token = current_attempt.set(attempt)
                                try:
                                    await runner.call(ctx, args)
                                except Exception as exc:
                                    error = exc
                                except BaseException as exc:
                                    if process_exit(exc) is None:
                                        cut = split_cut(exc)
                                        if cut is None:
                                            raise  # Cancelled (ours is caught by the scope), GeneratorExit
                                        error = cut[1]  # children failed in their cleanup: this job's error
                                        raise cut[0] from None  # and the cancellation goes on
                                    error = exc  # sys.exit() or KeyboardInterrupt in the handler
                                finally:
                                    current_attempt.reset(token)
                                    attempts.end(attempt)
                                    ended = clock()
                                    if prefetch:  # every attempt counts, a cut one too (`_ahead`)
                                        self._ended += 1
                                        self._busy += ended - started
                                if error is not None or attempt.reason is not None or ended >= deadline:
                                    break  # cut by its reason or its deadline, or raised: decided below
                                attempt.scope = None  # ended: a late cancel of it cuts nothing
                                self.unwritten += 1
                                completer.push(_tuple_new(Outcome, (job.id, job.attempt, _COMPLETED, None, None)), self)  # common
                                if observe is not None:
                                    self._tell_end(job, ctx, _COMPLETED, None, None, ended - started, False)
                                # The next held job starts at once if taking it needs no yield.
                                if not (held and self._claiming and len(held) - 1 != self._low_water):
                                    running = False
                                    break
                                following = held[0]
                                if following.reason is not None or following.job.kind in batch_kinds:
                                    running = False  # cancelled before it started, or a batch's: taken above
                                    break
                                held.popleft()
                                held_until.popleft()
                                attempt = following
                                job = attempt.job
                                box.last = job
                                ready = self._ready(job, attempt)
                                if ready is None:
                                    running = False
                                    break
                                runner, args = ready
                                timeout = runner.timeout
                                started = clock()
                                deadline = started + timeout if timeout is not None else math.inf
                                scope.deadline = deadline
                                attempt.scope = scope
                            if running:
                                break  # leave the scope: the attempt is decided once it has exited
                            if deadline != math.inf:
                                scope.deadline = math.inf  # no attempt's deadline may fire while the worker waits
                except BaseException as exc:
                    if running and only_cancelled(exc):
                        assert job is not None
                        # Not our scope: the whole runtime is being torn down from outside. The
                        # attempt is given back, as in a shutdown, and the cancellation goes on.
                        self._push(Outcome(job.id, job.attempt, OutcomeKind.INTERRUPTED))
                        if observe is not None:
                            self._tell_end(job, ctx, OutcomeKind.INTERRUPTED, None, None, clock() - started, False)
                    raise
                if not running:
                    continue  # the worker stopped taking jobs
                assert job is not None and attempt is not None  # the attempt that left the scope
                if error is None and not scope.cancel_called:
                    self.unwritten += 1
                    completer.push(_tuple_new(Outcome, (job.id, job.attempt, _COMPLETED, None, None)), self)
                    if observe is not None:
                        self._tell_end(job, ctx, _COMPLETED, None, None, ended - started, False)
                    continue
                now = self._backend.now()
                outcome = decide(job, runner, attempt, error, now, self._rng)
                self._push(outcome)
                if outcome.error is not None:
                    report_failure(job, outcome, trio.current_time() - started, now, "handler" if isinstance(error, Discard) else None)
                if observe is not None:
                    timed_out = outcome.kind in _FAILED and attempt.cancel_called and attempt.reason is None
                    self._tell_end(job, ctx, outcome.kind, error, outcome.error, ended - started, timed_out)
                if error is not None and not isinstance(error, Exception):
                    exit_exc = process_exit(error)
                    assert exit_exc is not None
                    self._on_exit(exit_exc, job)
        finally:
            self._workers_alive -= 1
            if self._workers_alive == 0:
                self._all_exited.set()

    def _ready(self, job: ClaimedJob, attempt: Attempt | None) -> tuple[KindRunner, dict[str, Any]] | None:
        """The runner and args of a job about to start; None when it cannot run at all (an
        unknown kind, args that do not decode or fit the handler): it is discarded, and its
        attempt, if it has one yet, ended."""
        runner = self._runners.get(job.kind)
        if runner is None:
            if attempt is not None:
                self._attempts.end(attempt)
            self._discard(job, f"unknown job kind {job.kind!r}: no @app.job registers it in this process")
            return None
        try:
            args = stored_args(runner.job_kind, job.args_json)
        except ValueError as exc:
            if attempt is not None:
                self._attempts.end(attempt)
            self._discard(job, clean_text(str(exc)))
            return None
        return runner, args

    # -- batches (@app.batch_job) --

    def _to_batch(self, job: ClaimedJob) -> bool:
        """Route a claimed job of a batch kind: into the batch collecting, or into a new batch
        for an idle worker. False when neither is there (the job is held, and the worker that
        takes it opens a batch with it)."""
        batch = self._open.get(job.kind)
        if batch is not None:
            self._join(batch, job)
            return True
        if not self._idle:
            return False
        batch = self._new_batch(job)
        self._handed[job.id] = batch
        self._idle.pop().put(job)
        return True

    def _new_batch(self, job: ClaimedJob) -> Batch:
        kind = self._batch_kinds[job.kind].job_kind
        assert isinstance(kind, BatchKind)
        batch = Batch(job, kind.max_size, trio.current_time() + kind.max_wait, _batch_children)
        self._join(batch, job)
        if batch.room:
            self._open[job.kind] = batch
            self._claim_now = True  # more of the kind may be due: claim for the room it has
            self._fetcher_wakeup.set()
        return batch

    def _join(self, batch: Batch, job: ClaimedJob) -> None:
        self._attempts.begin(batch.add(job))  # heartbeated, cancellable, from now on
        if not batch.room and self._open.get(batch.kind) is batch:
            del self._open[batch.kind]  # full: the next job of the kind opens another

    def _give_back_job(self, job: ClaimedJob) -> None:
        """A job handed to a worker that will not start it: given back, with the batch it opened."""
        batch = self._handed.pop(job.id, None)
        if batch is None:
            self._push(Outcome(job.id, job.attempt, OutcomeKind.INTERRUPTED))
        else:
            self._give_back_batch(batch)

    def _give_back_batch(self, batch: Batch) -> None:
        """Every job of a batch that will not start goes back (interrupted: available at once,
        the attempt not counted), or ends cancelled if a cancel reached it meanwhile."""
        if self._open.get(batch.kind) is batch:
            del self._open[batch.kind]
        batch.started = True  # nothing joins it any more
        for member in batch.members:
            self._not_started(member)

    def _not_started(self, attempt: Attempt) -> None:
        """An attempt that will not start ends: cancelled if a cancel request reached it before
        its start, else interrupted (available again at once, the attempt not counted)."""
        self._attempts.end(attempt)
        job = attempt.job
        kind = OutcomeKind.CANCELLED if attempt.reason == "cancel" else OutcomeKind.INTERRUPTED
        self._push(Outcome(job.id, job.attempt, kind))

    async def _batch(self, job: ClaimedJob, held: Attempt | None) -> None:
        """Collect a batch from `job` on (at most `max_size` jobs, at most `max_wait` after its
        first), then run it: one worker, one scope, one handler call, one outcome per job."""
        batch = self._handed.pop(job.id, None)
        if batch is None:
            # Claimed ahead and held: it joins the batch collecting, or opens one with the
            # other held jobs of its kind.
            if held is not None:
                self._attempts.end(held)
            collecting = self._open.get(job.kind)
            if collecting is not None:
                self._join(collecting, job)
                return  # another worker runs that batch
            batch = self._new_batch(job)
            self._take_held(batch)
        try:
            while batch.room and self._claiming and trio.current_time() < batch.until:
                with trio.move_on_at(batch.until):
                    await batch.wakeup.wait()
        except trio.Cancelled:
            self._give_back_batch(batch)  # torn down from outside: given back, and the cancellation goes on
            raise
        if not self._claiming:
            self._give_back_batch(batch)  # shutdown began while it collected: nothing starts now
            return
        if self._open.get(batch.kind) is batch:
            del self._open[batch.kind]
        await self._run_batch(batch)

    def _take_held(self, batch: Batch) -> None:
        """Held jobs of the batch's kind join it, up to its room (claim order kept for the rest)."""
        held, until = self._held, self._held_until
        if not held:
            return
        keep = [(a, u) for a, u in zip(held, until)]
        held.clear()
        until.clear()
        for attempt, at in keep:
            if attempt.job.kind == batch.kind and batch.room and attempt.reason is None:
                self._attempts.end(attempt)
                self._join(batch, attempt.job)
            else:
                held.append(attempt)
                until.append(at)

    async def _run_batch(self, batch: Batch) -> None:
        runner = self._runners[batch.kind]  # looked up per run, as a plain job's is: the testing kit wraps one
        attempts = self._attempts
        batch.started = True
        jobs: list[BatchJob[Any]] = []
        running = []
        for member in batch.members:
            job = member.job
            if member.reason is not None:
                self._not_started(member)  # cancelled or lost while it was collected
                continue
            try:
                args = stored_args(runner.job_kind, job.args_json)
            except ValueError as exc:
                attempts.end(member)
                self._discard(job, clean_text(str(exc)))
                continue
            running.append(member)
            jobs.append(BatchJob(member, args))
        batch.members = running
        if not running:
            return
        clock = trio.lowlevel.current_clock().current_time
        timeout = runner.timeout
        started = clock()
        deadline = started + timeout if timeout is not None else math.inf
        scope = batch.scope
        assert scope is not None  # a batch has its scope from the start
        scope.deadline = deadline
        ctx = BatchContext(jobs, deadline, batch)
        token = current_attempt.set(batch)
        error: BaseException | None = None
        returned: Any = None
        try:
            with scope:
                try:
                    returned = await runner.call(ctx, ctx.args)  # type: ignore[arg-type]  # the batch's context
                except Exception as exc:
                    error = exc
                except BaseException as exc:
                    if process_exit(exc) is None:
                        cut = split_cut(exc)
                        if cut is None:
                            raise
                        error = cut[1]  # children failed in their cleanup: the batch's error
                        raise cut[0] from None  # and the cancellation goes on
                    error = exc
        except BaseException as exc:
            if only_cancelled(exc):
                for member in running:  # not our scope: torn down from outside, every attempt given back
                    self._push(Outcome(member.job.id, member.job.attempt, OutcomeKind.INTERRUPTED))
                    if self._observe is not None:
                        self._tell_end(member.job, ctx, OutcomeKind.INTERRUPTED, None, None, clock() - started, False)
            raise
        finally:
            current_attempt.reset(token)
            for member in running:
                attempts.end(member)
        duration = clock() - started
        if self.prefetch:
            self._ended += 1
            self._busy += duration
        now = self._backend.now()
        observe = self._observe
        for member, outcome in decide_batch(batch, runner, error, returned, now, self._rng):
            self._push(outcome)
            if outcome.error is not None:
                report_failure(member.job, outcome, duration, now, "handler" if isinstance(error, Discard) else None)
            if observe is not None:
                timed_out = outcome.kind in _FAILED and batch.cancel_called and member.reason is None and batch.reason is None
                self._tell_end(member.job, ctx, outcome.kind, error, outcome.error, duration, timed_out)
        if error is not None and not isinstance(error, Exception):
            exit_exc = process_exit(error)
            assert exit_exc is not None
            self._on_exit(exit_exc, batch.job)

    def _discard(self, job: ClaimedJob, message: str) -> None:
        outcome = Outcome(job.id, job.attempt, OutcomeKind.DISCARD, None, JobError(job.attempt, self._backend.now(), message))
        self._push(outcome)
        report_failure(job, outcome, 0.0, self._backend.now(), "unrunnable")
        if self._observe is not None:
            self._tell_end(job, None, OutcomeKind.DISCARD, None, outcome.error, 0.0, False)

    def _tell_end(
        self,
        job: ClaimedJob,
        ctx: JobContext | BatchContext | None,
        kind: OutcomeKind,
        error: BaseException | None,
        recorded: JobError | None,
        duration: float,
        timed_out: bool,
    ) -> None:
        """Tell the middleware how an attempt ended (`AttemptEnd`). Its wait is timed on the
        backend's clock, which the job's `run_at` is on: from then to the attempt's start."""
        assert self._observe is not None
        wait = self._backend.now() - duration - job.run_at
        self._observe(
            AttemptEnd(
                job.id, job.kind, job.queue, job.attempt, job.max_attempts, kind.value, timed_out, error,
                None if recorded is None else recorded.message, wait if wait > 0.0 else 0.0, duration, ctx,
            )  # fmt: skip
        )

    def _push(self, outcome: Outcome) -> None:
        self.unwritten += 1
        self._completer.push(outcome, self)
