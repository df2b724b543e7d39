"""The blocked-loop watchdog: which job held the Trio event loop, and for how long.

Trio is cooperative. A task runs until its next checkpoint, and until then nothing else in the
process runs: no other job, no cancel scope's deadline, no request handler. A handler that calls
`time.sleep(3)` (or a blocking client, or a long CPU loop) therefore stalls every job of every
queue for 3 s, overruns its own timeout without being cut, and still completes. Nothing in Trio
says so. This module does: a `trio.abc.Instrument` times every task step, and a step that held
the loop longer than a threshold is logged as a warning naming the job whose code ran in it.

Measuring. The instrument takes a real-time timestamp at the end of every task step
(`after_task_step`) and at the end of every I/O wait (`after_io_wait`). The time from the
previous timestamp to a step's end is that step, plus the few microseconds of scheduling before
it; the wait for I/O or for a timer is never counted, because the timestamp is taken again when
the wait ends. The clock is real time (`time.perf_counter`, injectable for tests) and never
Trio's: a loop blocked for 3 s is blocked for 3 s whatever a `MockClock` says.

Cost. The obvious shape -- `before_task_step` stores a start time per task in a dict,
`after_task_step` pops it and looks up the task's job -- cost 9 % of a no-op job's instructions
in the memory benchmark. Most of an instrument's price is Trio's dispatch of each hook call
(about 3,500 instructions, several times the body), and a no-op job takes 1.35 steps. So: one
hook per step, with the timestamp kept from the previous one, and `after_io_wait`, which runs
once per scheduler batch (0.19 per job under load); the fast path is a clock read, a
subtraction, a store and a compare on slots, with no lookup and no allocation. That costs 4 %
(benchmarks/RESULTS.md has the figures). Only a step over the threshold pays for finding out
whose it was.

Attribution. The instrument knows a `trio.lowlevel.Task`, not a job: whoever registers hands it
`describe(task) -> Culprit | Holder | None`, called only for an offending step. A `Holder` is
code that is no job's but has a name the operator knows better than its task's (an app's
resource, opening in the runtime's task). Any other task (a runtime service, a task of the
service around the runtime) is still reported, by its Trio task name and the place where it
gave the loop back: it stalled the jobs just the same, and the name is often all an operator
needs. A registration may also hand an `observe(task, culprit, seconds)`, told of every offending
step, repeats included (the log groups those): what metrics count.

One instrument per `trio.run`. Several runtimes may run in one Trio run; each registers its
threshold and describe function with a shared instrument (held in a `RunVar`), which is added
when the first registers and removed when the last leaves. It watches at the smallest
registered threshold -- a blocked loop stalls every runtime, so the most watchful one decides --
and reports each step once, naming the job by the first describe function that knows it.

Rate. The first offending step of a job (or of a task that is not a job's) is logged at once.
Further steps of the same job within `REPEAT_WINDOW` seconds are counted, and one summary line
is logged when the window closes: a CPU-bound job that yields every 0.3 s for five minutes gives
one line at once and then one every 10 s, not a thousand. Windows are closed after I/O waits and
when the last runtime leaves, so no timer task is needed and nothing counted is lost.
"""

from __future__ import annotations

import logging
import math
import os
import time
from contextlib import contextmanager
from typing import Callable, Iterator, NamedTuple

import trio

__all__ = ["Culprit", "Holder", "LoopWatch", "REPEAT_WINDOW", "watch_blocked_loop"]

log = logging.getLogger("nursery_jobs")

REPEAT_WINDOW = 10.0
"""Seconds during which further offending steps of one job are counted instead of logged."""

default_clock: Callable[[], float] = time.perf_counter
"""The real-time clock a new watch reads (tests replace it with one they advance by hand)."""

ADVICE = (
    "no other task or job of this process ran meanwhile, and no timeout can cut code that does not "
    "await: run blocking calls with nursery_jobs.run_blocking, or add `await trio.sleep(0)` to long CPU loops"
)

_ASYNCIO_HINT = (
    ": asyncio code runs inside this task, an `asyncio=True` handler's included, and Trio cannot "
    "see which asyncio task held it"
)
_TRIO_DIR = os.path.dirname(trio.__file__) + os.sep
_TRIO_ASYNCIO_PART = os.sep + "trio_asyncio" + os.sep  # its loop's frames say nothing about the culprit
_LIBRARY_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class Culprit(NamedTuple):
    """The job whose code ran in an offending step."""

    job_id: int
    kind: str
    queue: str
    ended: bool = False
    """The attempt ended within the step (so there is no await of the handler to point at)."""
    child: str | None = None
    """The name of the job's child task (`ctx.children()`) that held the loop, if not the worker."""


class Holder(NamedTuple):
    """Code that is not a job's but that an operator knows by a name of its own: an app's
    resource, opening or closing in the runtime's task. `label` names it in the warning; the
    record carries `name` in a field called `field` (``resource="http"``)."""

    field: str
    name: str
    label: str
    ended: str | None = None
    """Where the step ended when it ran to the end of the holder's code (``its open``), so there is
    no await of its own to point at."""


Describe = Callable[[trio.lowlevel.Task], "Culprit | Holder | None"]
Observe = Callable[[trio.lowlevel.Task, "Culprit | Holder | None", float], None]
"""Told of every offending step (the task, whose it was, the seconds it held the loop), where the
log groups repeats: for metrics."""


class _Registration:
    __slots__ = ("threshold", "describe", "observe")

    def __init__(self, threshold: float, describe: Describe, observe: Observe | None = None) -> None:
        self.threshold = threshold
        self.describe = describe
        self.observe = observe


class _Repeats:
    """Offending steps of one job (or task) counted since its last line in the log."""

    __slots__ = ("label", "extra", "since", "until", "steps", "seconds", "longest")

    def __init__(self, label: str, extra: dict[str, object], since: float) -> None:
        self.label = label
        self.extra = extra
        self.since = since
        self.until = since + REPEAT_WINDOW
        self.steps = 0
        self.seconds = 0.0
        self.longest = 0.0


class LoopWatch(trio.abc.Instrument):
    """The instrument. Use `watch_blocked_loop`, which shares one per Trio run."""

    # Slots: the hooks read and write these on every step, and a slot is the cheapest attribute
    # CPython has (the memory benchmark counted 10.4k instructions per job with a __dict__, 6.8k
    # with slots).
    __slots__ = ("_clock", "_last", "threshold", "_registrations", "_repeats", "_close_at")

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._last = clock()
        self.threshold = math.inf
        """The smallest registered threshold (inf with none: nothing is reported)."""
        self._registrations: list[_Registration] = []
        self._repeats: dict[object, _Repeats] = {}
        self._close_at = math.inf

    def __repr__(self) -> str:
        return f"<LoopWatch threshold={self.threshold:g} s runtimes={len(self._registrations)}>"

    # -- the hooks: the fast path, run for every step --

    def after_io_wait(self, timeout: float) -> None:
        now = self._last = self._clock()
        if now >= self._close_at:
            try:
                self._close_windows(now, everything=False)
            except Exception:  # a hook that raises is disabled by Trio: never let it
                self._repeats.clear()
                self._close_at = math.inf
                log.exception("blocked-loop watchdog: could not log its summaries; they are dropped", extra={"event": "watchdog_failed"})

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        now = self._clock()
        held = now - self._last
        self._last = now
        if held > self.threshold:
            self._offending_step(task, held, now)

    # -- registrations --

    def register(self, threshold: float, describe: Describe, observe: Observe | None = None) -> _Registration:
        reg = _Registration(threshold, describe, observe)
        self._registrations.append(reg)
        self.threshold = min(r.threshold for r in self._registrations)
        return reg

    def unregister(self, reg: _Registration) -> bool:
        """Forget `reg`; True if it was the last one (the watch should then be removed)."""
        self._registrations.remove(reg)
        self.threshold = min((r.threshold for r in self._registrations), default=math.inf)
        if self._registrations:
            return False
        try:
            self._close_windows(self._clock(), everything=True)
        except Exception:  # the instrument must still be removed
            log.exception(
                "blocked-loop watchdog: could not log its last summaries; they are dropped", extra={"event": "watchdog_failed"}
            )
        return True

    # -- the slow path: an offending step --

    def _offending_step(self, task: trio.lowlevel.Task, held: float, now: float) -> None:
        # A hook that raises is disabled by Trio for the rest of the run: nothing here may raise.
        try:
            culprit, reg = self._culprit(task)
            key: object
            if culprit is None:
                key = task
            elif isinstance(culprit, Holder):
                key = (culprit.field, culprit.name, culprit.label)
            else:
                key = (culprit.job_id, culprit.kind, culprit.queue)
            repeats = self._repeats.get(key)
            if repeats is not None:
                repeats.steps += 1
                repeats.seconds += held
                repeats.longest = max(repeats.longest, held)
            else:
                self._log_first(task, culprit, key, held, now)
            if reg is not None and reg.observe is not None:
                reg.observe(task, culprit, held)
        except Exception:
            log.exception(
                "blocked-loop watchdog: could not report a step of %.2f s in task %r",
                held,
                task.name,
                extra={"event": "watchdog_failed", "task": task.name},
            )
        # Reporting took time of its own: the next step is measured from here.
        self._last = self._clock()

    def _culprit(self, task: trio.lowlevel.Task) -> tuple[Culprit | Holder | None, _Registration | None]:
        """Whose the step was, by the first registration that knows, and that registration (the
        first one when none does: the step is counted once, by one runtime)."""
        for reg in self._registrations:
            culprit = reg.describe(task)
            if culprit is not None:
                return culprit, reg
        return None, self._registrations[0] if self._registrations else None

    def _log_first(
        self, task: trio.lowlevel.Task, culprit: Culprit | Holder | None, key: object, held: float, now: float
    ) -> None:
        ended = culprit.ended if culprit is not None else False
        released = None if ended else released_at(task, jobs=culprit is not None)
        extra: dict[str, object]
        if culprit is None:
            label = f"task {task.name!r} (not a job{_ASYNCIO_HINT if task.name.startswith('trio_asyncio') else ''})"
            extra = {"job_id": None, "kind": None, "queue": None}
        elif isinstance(culprit, Holder):
            label = culprit.label
            extra = {"job_id": None, "kind": None, "queue": None, culprit.field: culprit.name}
        else:
            label = f"job {culprit.job_id} (kind {culprit.kind!r}, queue {culprit.queue!r})"
            if culprit.child is not None:
                label += f" in its child task {culprit.child!r}"
            extra = {"job_id": culprit.job_id, "kind": culprit.kind, "queue": culprit.queue}
        extra["task"] = task.name
        extra["event"] = "blocked_loop"
        if ended:
            where = f", up to the end of {culprit.ended if isinstance(culprit, Holder) else 'its attempt'}"
        elif released is not None:
            where = f" (it gave the loop back at {released})"
        elif getattr(task.coro, "cr_frame", True) is None:
            where = ", up to the end of the task"
        else:
            where = ""
        log.warning(
            "blocked event loop: %s held the Trio loop for %.2f s without a checkpoint%s; %s",
            label,
            held,
            where,
            ADVICE,
            extra={**extra, "seconds": held, "steps": 1, "longest": held, "released_at": released},
        )
        repeats = self._repeats[key] = _Repeats(label, extra, now)
        self._close_at = min(self._close_at, repeats.until)

    def _close_windows(self, now: float, *, everything: bool) -> None:
        """Log a summary for every window that has closed (all of them if `everything`), and
        forget the windows that counted nothing, so a later step is logged in full again."""
        close_at = math.inf
        for key, repeats in list(self._repeats.items()):
            if not everything and repeats.until > now:
                close_at = min(close_at, repeats.until)
                continue
            if repeats.steps:
                log.warning(
                    "blocked event loop: %s held the Trio loop %s in the last %.1f s: %.2f s in all, the "
                    "longest %.2f s; %s",
                    repeats.label,
                    "once more" if repeats.steps == 1 else f"{repeats.steps} more times",
                    now - repeats.since,
                    repeats.seconds,
                    repeats.longest,
                    ADVICE,
                    extra={
                        **repeats.extra,
                        "seconds": repeats.seconds,
                        "steps": repeats.steps,
                        "longest": repeats.longest,
                        "released_at": None,
                    },
                )
            if repeats.steps and not everything:
                # Still offending: keep counting in a new window rather than logging each step.
                repeats.since, repeats.until = now, now + REPEAT_WINDOW
                repeats.steps, repeats.seconds, repeats.longest = 0, 0.0, 0.0
                close_at = min(close_at, repeats.until)
            else:
                del self._repeats[key]
        self._close_at = close_at


def released_at(task: trio.lowlevel.Task, *, jobs: bool) -> str | None:
    """Where `task` is suspended now: the await that ended the step, as a chain of
    ``file:line in function`` from the task's outermost frame to its innermost.

    Trio's frames are left out, and so are this library's frames above the caller's own code
    (the worker loop above a job's handler): the chain starts where the caller's code does, and
    goes on into the library if that is where the await is (an `enqueue_many`). A task of the
    library itself shows the library's frames; for a job whose handler is no longer on the stack
    there is nothing useful to show. Long chains keep their first frame and last two.
    """
    chain: list[str] = []
    theirs = False
    for frame, lineno in task.iter_await_frames():
        path = frame.f_code.co_filename
        if path.startswith(_TRIO_DIR) or _TRIO_ASYNCIO_PART in path:
            continue
        ours = path.startswith(_LIBRARY_DIR)
        if not ours and not theirs:
            theirs = True
            chain.clear()  # the library's frames above the caller's code say nothing
        chain.append(f"{os.path.basename(path)}:{lineno} in {frame.f_code.co_name}")
    if not chain or (jobs and not theirs):
        return None
    if len(chain) > 3:
        chain = [chain[0], "...", *chain[-2:]]
    return " > ".join(chain)


_WATCH: trio.lowlevel.RunVar[LoopWatch | None] = trio.lowlevel.RunVar("nursery_jobs.loop_watch", default=None)


@contextmanager
def watch_blocked_loop(
    threshold: float | None,
    describe: Describe,
    *,
    clock: Callable[[], float] | None = None,
    observe: Observe | None = None,
) -> Iterator[LoopWatch | None]:
    """Report steps that hold the loop longer than `threshold` seconds, for the block; `observe`
    is told of each (by the registration that knew whose it was).

    `None` watches nothing. Joins the Trio run's watch if one is installed (`clock` is then the
    first registrant's), else installs one; the last to leave removes it, also when the block
    is left by an exception.
    """
    if threshold is None:
        yield None
        return
    watch = _WATCH.get()
    if watch is None:
        watch = LoopWatch(clock or default_clock)
        trio.lowlevel.add_instrument(watch)
        _WATCH.set(watch)
    reg = watch.register(threshold, describe, observe)
    try:
        yield watch
    finally:
        if watch.unregister(reg):
            _WATCH.set(None)
            try:
                trio.lowlevel.remove_instrument(watch)
            except KeyError:
                pass  # Trio disabled it already, after a hook raised (and logged why)
