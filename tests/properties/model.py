"""The reference model: what the runtime must do, as a pure-Python discrete-event simulation.

Written from the specification (the pages in docs/, the module docstrings of the public API,
and the statement at the top of each property module), not from the runtime's code: two
descriptions that must agree. No Trio,
no I/O; virtual time is a float that only `advance_to`, `enqueue`, `cancel`, `open` and
`shutdown` move or act at.

Semantics, in the words of the spec:
- Each queue runs at most `max_workers` attempts at a time; a queue never waits for another.
- A job starts as soon as it is due (`run_at <= now`), the runtime is open and not shutting
  down, and its queue has a free worker. Among due jobs of a queue, higher priority first, then
  older `run_at`, then older job (insertion order).
- An attempt ends when its handler ends, when its timeout fires (`start + T`), when it is
  cancelled (`cancel`) or when shutdown cuts it after the grace period. Which of these fired
  decides the outcome: handler return -> completed; `Discard` -> discarded; another exception or
  the timeout -> retryable after the retry policy's delay, discarded once the attempt number
  reached `max_attempts`; `Snooze(d)` -> again after d, the attempt given back; cancel ->
  cancelled; shutdown -> interrupted: the attempt is given back, the job is available again.
- Cancelling a pending job cancels it at once; a running one ends at once as cancelled; a final
  one is left alone.
- Shutdown at t0 with grace G: no starts from t0 on; attempts still running at t0 + G (or when
  the grace is skipped) are interrupted; the runtime is closed once nothing runs.

Scripts keep the simulation exact: durations are integers, timeouts are k + 0.5, grace ends at
k + 0.25 and skips at k + 0.125 past an integer command time, so no two causes that decide *one*
attempt's outcome ever fire at the same instant. Cleanup in the scripted handler takes no time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OK, RAISE, SNOOZE, DISCARD, HANG = "ok", "raise", "snooze", "discard", "hang"
HANG_S = 10_000.0
"""A hanging job sleeps this long: virtual time, so no test waits, and a runtime that waits for a
hang (an unbounded grace) finishes instead of deadlocking the example. Far beyond every other
time in a script, short enough that the runtime's 5 s heartbeat ticks through it quickly."""
RETRY_CAP = 100.0

PENDING = "pending"
RUNNING = "running"
FINAL = ("completed", "discarded", "cancelled")


@dataclass(frozen=True)
class Step:
    """What one execution of a scripted job does: sleep `duration` while `children` sleep their
    own durations inside the attempt's child scope, then end as `outcome`."""

    duration: int = 0
    outcome: str = OK
    snooze: int = 1
    children: tuple[int, ...] = ()

    def body_time(self) -> float:
        if self.outcome == HANG:
            return HANG_S
        return float(max((self.duration, *self.children)))


@dataclass(frozen=True)
class JobSpec:
    """A scripted job: execution k follows `steps[k]` (the last step repeats)."""

    queue: str
    steps: tuple[Step, ...]
    delay: int = 0
    priority: int = 0

    def step(self, k: int) -> Step:
        return self.steps[min(k, len(self.steps) - 1)]


@dataclass(frozen=True)
class QueueSpec:
    name: str
    max_workers: int
    timeout: float | None = None
    max_attempts: int = 3
    retry_base: int = 1
    retry_factor: int = 1

    @property
    def kind(self) -> str:
        return f"job_{self.name}"

    def retry_delay(self, attempt: int) -> float:
        return float(min(RETRY_CAP, self.retry_base * self.retry_factor ** (attempt - 1)))


def raise_message(n: int, k: int) -> str:
    return f"ScriptedError: job {n} execution {k}"


def discard_message(n: int, k: int) -> str:
    return f"job {n} execution {k} discarded"


def timeout_message(timeout: float) -> str:
    return f"timed out after {timeout:g} s"


@dataclass
class MJob:
    n: int
    seq: int
    spec: JobSpec
    queue: QueueSpec
    priority: int
    run_at: float
    state: str = PENDING
    attempt: int = 0
    execs: int = 0
    cancel_requested: bool = False
    finalized_at: float | None = None
    finalized_tick: int = 0
    """`Model.tick` when it was finalized: orders it against commands at the same instant."""
    errors: list[tuple[int, float, str]] = field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.state in FINAL


@dataclass
class MRun:
    job: MJob
    attempt: int
    exec: int
    start: float
    end: float
    timed_out: bool
    step: Step


class Model:
    def __init__(self, queues: list[QueueSpec]) -> None:
        self.queues = {q.name: q for q in queues}
        self.now = 0.0
        self.jobs: dict[int, MJob] = {}
        self.runs: dict[int, MRun] = {}
        self.open_ = False
        self.closing = False
        self.grace_end: float | None = None
        self.seq = 0
        self.starts: list[tuple[float, int, int, int]] = []
        """(time, n, attempt, execution) of every attempt started."""
        self.ends: list[tuple[float, int, int, str]] = []
        """(time, n, attempt, result) of every attempt ended; result is the job state it led
        to, or "interrupted"."""
        self.interrupted: dict[str, int] = {q: 0 for q in self.queues}
        self.failed: dict[str, int] = {q: 0 for q in self.queues}
        self.log: list[tuple[Any, ...]] = []
        self.tick = 0
        """Counts commands, to order what happens at one instant (commands apply in order)."""

    # -- queries --

    def running_in(self, queue: str) -> list[int]:
        return sorted(n for n, r in self.runs.items() if r.job.queue.name == queue)

    def pending(self, queue: str | None = None) -> list[MJob]:
        return [
            j for j in self.jobs.values() if j.state == PENDING and (queue is None or j.queue.name == queue)
        ]

    def due(self, queue: str) -> list[MJob]:
        jobs = [j for j in self.pending(queue) if j.run_at <= self.now]
        return sorted(jobs, key=lambda j: (-j.priority, j.run_at, j.seq))

    def idle(self) -> bool:
        return not self.runs and not self.pending()

    def next_time(self) -> float | None:
        """When the next thing happens by itself (an attempt ends, the grace ends, a job falls
        due while its queue has room), or None."""
        times = [r.end for r in self.runs.values()]
        if self.closing and self.runs and self.grace_end is not None:
            times.append(self.grace_end)
        if self.open_ and not self.closing:
            for name, q in self.queues.items():
                if len(self.running_in(name)) < q.max_workers:
                    times.extend(j.run_at for j in self.pending(name) if j.run_at > self.now)
        return min(times, default=None)

    # -- commands --

    def advance_to(self, t: float) -> None:
        self.log.append(("advance", t))
        self.tick += 1
        self._run_until(t)

    def _run_until(self, t: float) -> None:
        """Process everything that happens by itself up to and including `t`."""
        while True:
            e = self.next_time()
            if e is None or e > t:
                break
            self._instant(e)
        self.now = max(self.now, t)

    def open(self) -> None:
        self.log.append(("open",))
        self.tick += 1
        self.open_, self.closing, self.grace_end = True, False, None
        self._fill()
        self._run_until(self.now)

    def enqueue(self, n: int, spec: JobSpec) -> int:
        self.log.append(("enqueue", n, spec))
        self.tick += 1
        self.seq += 1
        job = MJob(n, self.seq, spec, self.queues[spec.queue], spec.priority, self.now + spec.delay)
        self.jobs[n] = job
        self._fill()
        self._run_until(self.now)
        return self.seq

    def cancel(self, n: int) -> str:
        """Returns the state right after the request, as `Runtime.cancel` reports it."""
        self.log.append(("cancel", n))
        self.tick += 1
        job = self.jobs[n]
        if job.final:
            return job.state
        if job.state == RUNNING:
            if not job.cancel_requested:
                job.cancel_requested = True
                self._end(self.runs[n], self.now, cut="cancel")
                self._fill()
                self._run_until(self.now)
            return RUNNING
        self._finalize(job, "cancelled", self.now)
        return "cancelled"

    def shutdown(self, grace: float, skip: float | None = None) -> float:
        """Shut the runtime down at `now`; returns the time at which it is closed."""
        self.log.append(("shutdown", grace, skip))
        self.tick += 1
        self.closing = True
        self.grace_end = self.now + (grace if skip is None else min(grace, skip))
        while self.runs:
            e = min(min(r.end for r in self.runs.values()), self.grace_end)
            self._instant(max(e, self.now))
        self.open_, self.closing, self.grace_end = False, False, None
        return self.now

    # -- the simulation --

    def _instant(self, e: float) -> None:
        self.now = e
        for n in sorted(n for n, r in self.runs.items() if r.end <= e):
            self._end(self.runs[n], e, cut=None)
        if self.closing and self.grace_end is not None and e >= self.grace_end:
            for n in sorted(self.runs):
                self._end(self.runs[n], e, cut="shutdown")
        self._fill()

    def _fill(self) -> None:
        if not self.open_ or self.closing:
            return
        for name, q in sorted(self.queues.items()):
            free = q.max_workers - len(self.running_in(name))
            for job in self.due(name)[: max(free, 0)]:
                self._start(job)

    def _start(self, job: MJob) -> None:
        job.state = RUNNING
        job.attempt += 1
        k = job.execs
        job.execs += 1
        step = job.spec.step(k)
        body = step.body_time()
        timeout = job.queue.timeout
        timed_out = timeout is not None and body > timeout
        end = self.now + (timeout if timed_out else body)  # type: ignore[operator]
        self.runs[job.n] = MRun(job, job.attempt, k, self.now, end, timed_out, step)
        self.starts.append((self.now, job.n, job.attempt, k))

    def _end(self, run: MRun, t: float, cut: str | None) -> None:
        job = run.job
        del self.runs[job.n]
        n, k = job.n, run.exec
        message: str | None = None
        if cut == "cancel":
            result = "cancelled"
        elif cut == "shutdown":
            result = "interrupted"
        elif run.timed_out:
            result, message = "fail", timeout_message(job.queue.timeout)  # type: ignore[arg-type]
        elif run.step.outcome == RAISE:
            result, message = "fail", raise_message(n, k)
        elif run.step.outcome == SNOOZE:
            result = "snooze"
        elif run.step.outcome == DISCARD:
            result, message = "discarded", discard_message(n, k)
        else:
            result = "completed"
        if message is not None:
            job.errors.append((run.attempt, t, message))
            self.failed[job.queue.name] += 1
        if result == "fail":
            result = "discarded" if run.attempt >= job.queue.max_attempts else "retryable"
        if job.cancel_requested and result in ("retryable", "snooze", "interrupted"):
            result = "cancelled"
        self.ends.append((t, n, run.attempt, result))
        if result in FINAL:
            self._finalize(job, result, t)
        elif result == "retryable":
            job.state, job.run_at = PENDING, t + job.queue.retry_delay(run.attempt)
        elif result == "snooze":
            job.state, job.run_at = PENDING, t + run.step.snooze
            job.attempt -= 1
        else:  # interrupted
            job.state, job.run_at = PENDING, t
            job.attempt -= 1
            self.interrupted[job.queue.name] += 1

    def _finalize(self, job: MJob, state: str, t: float) -> None:
        job.state = state
        job.finalized_at = t
        job.finalized_tick = self.tick


def replay(queues: list[QueueSpec], log: list[tuple[Any, ...]], keep: set[int]) -> Model:
    """A fresh model fed the same commands, with only the jobs numbered in `keep`: what the
    runtime must do for those jobs had the others never existed (P08, P11)."""
    model = Model(queues)
    for entry in log:
        op = entry[0]
        if op == "advance":
            model.advance_to(entry[1])
        elif op == "open":
            model.open()
        elif op == "enqueue":
            if entry[1] in keep:
                model.enqueue(entry[1], entry[2])
        elif op == "cancel":
            if entry[1] in keep:
                model.cancel(entry[1])
        elif op == "shutdown":
            model.shutdown(entry[1], entry[2])
    return model
