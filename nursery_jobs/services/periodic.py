"""The periodic scheduler: each declared schedule's ticks become jobs, exactly once per tick.

Every runtime whose app declares schedules runs one scheduler, with no leader: at each tick
every process calls `ScheduleStore.enqueue_tick(name, tick, job)`, which advances the
schedule's row only if the tick is later than the one stored and inserts the job in the same
transaction, so exactly one process enqueues it (docs/periodic.md states the guarantees).

At start the scheduler reads each schedule's last tick. Ticks that went by before it started
and after that last tick are *missed*: with ``missed="skip"`` it enqueues none of them, with
``"run_once"`` the latest one. From then on it sleeps to the next tick (at most `MAX_SLEEP`, so
that a wall-clock step is noticed) and enqueues it; if it wakes late past several ticks (the
store was unreachable, the loop was blocked), it enqueues the latest one only. A failed enqueue
is logged and tried again after `RETRY_DELAY` (doubling up to `MAX_SLEEP`), until it succeeds or
a later tick replaces it. A tick into a full bounded queue (`QueueFull`) is such a failure,
logged as a warning: the tick is not advanced, so it is tried again the same way, never waited
for (the other schedules go on), and at most one job per tick is ever enqueued. The scheduler never enqueues once `closing()` is true: the runtime
stops it first when its shutdown begins, before claiming stops.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime
from typing import Any, Callable, Protocol, Sequence

import attrs
import trio

from ..backends import Backend, Bounds, InsertResult, NewJob, ScheduleState, ScheduleStore
from ..errors import JobNotFound, QueueFull
from ..jobs import JobState

__all__ = ["MAX_SLEEP", "PeriodicInfo", "RETRY_DELAY", "Scheduler"]

log = logging.getLogger("nursery_jobs")

MAX_SLEEP = 60.0
"""The longest the scheduler sleeps between two looks at the clock."""
RETRY_DELAY = 1.0
"""The first wait before an enqueue or a read of the schedules that failed is tried again."""


class Schedule(Protocol):
    """What the scheduler needs of a declared schedule (`app.Periodic`)."""

    name: str
    kind: Any
    missed: str
    enabled: bool
    run_at_start: bool

    @property
    def schedule(self) -> str: ...

    @property
    def cron(self) -> Any: ...

    def new_job(self, now: float) -> NewJob: ...


class _Store(ScheduleStore, Backend, Protocol):
    pass


@attrs.frozen
class PeriodicInfo:
    """One schedule as `rt.periodic()` shows it."""

    name: str
    schedule: str
    timezone: str
    kind: str
    enabled: bool
    missed: str
    last_tick: datetime | None
    """The latest tick enqueued (by any process), in the schedule's timezone."""
    next_tick: datetime | None
    """The next tick this runtime will enqueue (None: disabled, or never again)."""
    last_job_id: int | None
    last_outcome: JobState | None
    """The state of the last tick's job now (None: no tick yet, or the job was deleted)."""


@attrs.define
class _Slot:
    schedule: Schedule
    next_tick: float | None = None
    retry_at: float | None = None
    delay: float = RETRY_DELAY


class Scheduler:
    """The runtime's periodic scheduler service (see the module docstring)."""

    name = "periodic"

    def __init__(
        self,
        store: _Store,
        schedules: Sequence[Schedule],
        *,
        closing: Callable[[], bool],
        clock: Callable[[], float] | None = None,
        bounds: Bounds | None = None,
    ) -> None:
        """`clock`: Unix time (default: the store's ``now() - wall_offset()``, so virtual under
        `MockClock`); tests pass one that starts at a chosen date."""
        self._store = store
        self._bounds = dict(bounds) if bounds else None
        self._slots = [_Slot(s) for s in schedules if s.enabled]
        self._all = list(schedules)
        self._closing = closing
        self._clock = clock or (lambda: store.now() - store.wall_offset())
        self.started_at: float | None = None

    # -- the service --

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if not self._slots:
            await trio.sleep_forever()
        start = self.started_at = self._clock()
        states = await self._load()
        for slot in self._slots:
            s = slot.schedule
            last = states.get(s.name, ScheduleState(None, None)).last_tick
            slot.next_tick = s.cron.next_after(start if last is None else max(start, last))
            if s.run_at_start:
                await self._start_job(s)
            if s.missed == "run_once" and last is not None:
                missed = s.cron.latest_in(last, start)
                if missed is not None:
                    slot.next_tick = missed  # due now: the loop enqueues it (and only it)
        while True:
            if self._closing():
                await trio.sleep_forever()  # the runtime cancels this service as shutdown begins
            now = self._clock()
            wake = now + MAX_SLEEP
            for slot in self._slots:
                if slot.next_tick is None:
                    continue
                if slot.next_tick <= now and (slot.retry_at is None or slot.retry_at <= now):
                    await self._fire(slot, now)
                if slot.next_tick is not None:
                    wake = min(wake, slot.next_tick if slot.retry_at is None else max(slot.next_tick, slot.retry_at))
            await trio.sleep(max(0.0, wake - self._clock()))

    async def _load(self) -> dict[str, ScheduleState]:
        delay = RETRY_DELAY
        names = [slot.schedule.name for slot in self._slots]
        while True:
            try:
                return dict(await self._store.schedule_states(names))
            except Exception:
                log.exception(
                    "periodic: reading the schedules' last ticks failed; retrying in %g s",
                    delay,
                    extra={"event": "periodic_read_failed", "schedules": names, "retry_in": delay},
                )
            await trio.sleep(delay)
            delay = min(delay * 2, MAX_SLEEP)

    async def _fire(self, slot: _Slot, now: float) -> None:
        s = slot.schedule
        assert slot.next_tick is not None
        # Woken late past several ticks: the latest one stands for them all.
        tick = s.cron.latest_in(slot.next_tick - 1, now) or slot.next_tick
        if self._closing():
            return
        try:
            job = s.new_job(self._store.now())
            if self._bounds and job.queue in self._bounds:
                result = await self._store.enqueue_tick(s.name, tick, job, self._bounds)
            else:
                result = await self._store.enqueue_tick(s.name, tick, job)
        except QueueFull as full:
            slot.retry_at = self._clock() + slot.delay
            log.warning(
                "periodic: tick %s of schedule %r not enqueued: queue %r is full (max_length %d); retrying in %g s",
                _iso(tick, s),
                s.name,
                full.queue,
                full.max_length,
                slot.delay,
                extra={
                    "event": "periodic_queue_full", "schedule": s.name, "tick": tick, "queue": full.queue,
                    "retry_in": slot.delay,
                },
            )  # fmt: skip
            slot.delay = min(slot.delay * 2, MAX_SLEEP)
            return
        except Exception:
            slot.retry_at = self._clock() + slot.delay
            log.exception(
                "periodic: enqueueing tick %s of schedule %r failed; retrying in %g s",
                _iso(tick, s),
                s.name,
                slot.delay,
                extra={"event": "periodic_tick_failed", "schedule": s.name, "tick": tick, "retry_in": slot.delay},
            )
            slot.delay = min(slot.delay * 2, MAX_SLEEP)
            return
        slot.retry_at, slot.delay = None, RETRY_DELAY
        if result is not None:
            log.info(
                "periodic: schedule %r tick %s enqueued job %d",
                s.name,
                _iso(tick, s),
                result.id,
                extra={"event": "periodic_tick", "schedule": s.name, "tick": tick, "job_id": result.id},
            )
        slot.next_tick = s.cron.next_after(max(tick, now))

    async def _start_job(self, s: Schedule) -> InsertResult | None:
        """`run_at_start`: one job unless one from a start is still pending (its unique key)."""
        if self._closing():
            return None
        job = s.new_job(self._store.now())._replace(unique_key=f"periodic:{s.name}:start")
        try:
            if self._bounds and job.queue in self._bounds:
                (result,) = await self._store.insert_many([job], self._bounds)
            else:
                (result,) = await self._store.insert_many([job])
        except QueueFull as full:
            log.warning(
                "periodic: the run_at_start job of schedule %r not enqueued: queue %r is full (max_length %d)",
                s.name,
                full.queue,
                full.max_length,
                extra={"event": "periodic_queue_full", "schedule": s.name, "queue": full.queue},
            )
            return None
        except Exception:
            log.exception(
                "periodic: the run_at_start job of schedule %r failed to enqueue",
                s.name,
                extra={"event": "periodic_start_failed", "schedule": s.name},
            )
            return None
        return result

    # -- reads --

    async def describe(self) -> list[PeriodicInfo]:
        """Every declared schedule, enabled or not, with its stored state and its next tick."""
        store = self._store
        states = await store.schedule_states([s.name for s in self._all])
        nexts = {slot.schedule.name: slot.next_tick for slot in self._slots}
        out = []
        now = self._clock()
        for s in self._all:
            state = states.get(s.name, ScheduleState(None, None))
            outcome = None
            if state.last_job_id is not None:
                try:
                    outcome = (await store.get_job(state.last_job_id)).state
                except JobNotFound:
                    outcome = None
            if not s.enabled:
                upcoming = None
            elif nexts.get(s.name) is not None:
                upcoming = nexts[s.name]
            else:
                upcoming = s.cron.next_after(now if state.last_tick is None else max(now, state.last_tick))
            out.append(
                PeriodicInfo(
                    name=s.name,
                    schedule=s.schedule,
                    timezone=s.cron.timezone,
                    kind=s.kind.name,
                    enabled=s.enabled,
                    missed=s.missed,
                    last_tick=_dt(state.last_tick, s),
                    next_tick=_dt(upcoming, s),
                    last_job_id=state.last_job_id,
                    last_outcome=outcome,
                )
            )
        return out


def _dt(t: float | None, s: Schedule) -> datetime | None:
    if t is None or not math.isfinite(t):
        return None
    try:
        return datetime.fromtimestamp(t, s.cron.zone)
    except (OverflowError, OSError, ValueError):
        return None


def _iso(t: float, s: Schedule) -> str:
    d = _dt(t, s)
    return d.isoformat() if d is not None else repr(t)

