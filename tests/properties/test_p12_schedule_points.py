"""P12 -- exact schedule points on virtual time.

For a drawn schedule (a 5- or 6-field cron expression, a macro or an `@every` interval), a drawn
timezone (including ones with a half-hour DST shift) and a drawn start time (often the day before a
DST transition), a scheduler started at that time and run on virtual time enqueues exactly the
ticks cronsim gives going forward from the start: none missing, none twice, none extra, each at
its point (the scheduler's clock reads the tick when it enqueues it). The oracle is cronsim
itself (and the epoch multiples for `@every`), not `nursery_jobs.cron`.

Runs on memory here and on every durable backend in `test_durable.py` (deterministic mode:
their calls block the Trio thread, so virtual time never jumps during a query).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any
from zoneinfo import ZoneInfo

import trio
import trio.testing
from cronsim import CronSim
from hypothesis import given, settings
from hypothesis import strategies as st

import nursery_jobs as nj
from nursery_jobs.services.periodic import Scheduler

from .audit import fail
from .harness import MEMORY, Store, examples

ZONES = ("UTC", "America/New_York", "Europe/Paris", "Australia/Lord_Howe", "Asia/Kolkata")
# Days with a DST transition in one of the zones (the start is drawn around them, or anywhere).
TRANSITIONS = tuple(
    datetime(*d, tzinfo=timezone.utc).timestamp()
    for d in ((2026, 3, 8, 7), (2026, 11, 1, 6), (2026, 3, 29, 1), (2026, 10, 25, 1), (2026, 4, 4, 15), (2026, 10, 3, 16))
)
FIELDS = st.tuples(
    st.sampled_from(["*", "*/5", "0", "30", "15,45", "0-10/3", "*/20"]),
    st.sampled_from(["*", "2", "1", "*/6", "0-3", "1,2"]),
    st.sampled_from(["*", "*", "1", "*/2", "8-14"]),
    st.sampled_from(["*", "*", "3,11", "*/3"]),
    st.sampled_from(["*", "*", "1-5", "0", "SUN"]),
).map(" ".join)
SECONDS = st.sampled_from(["0", "*/15", "30", "*/20"])
SCHEDULES = st.one_of(
    FIELDS,
    st.tuples(SECONDS, FIELDS).map(" ".join),
    st.sampled_from(["@hourly", "@daily", "@midnight", "@weekly", "@monthly"]),
    st.sampled_from(["@every 30s", "@every 90s", "@every 7m", "@every 1h", "@every 2h30m"]),
)
STARTS = st.one_of(
    st.tuples(st.sampled_from(TRANSITIONS), st.floats(-0.9 * 86400, 0.1 * 86400)).map(sum),
    st.floats(1.5e9, 2.0e9),
)
MAX_TICKS = 25
SPAN = 86400


def _zone(name: str) -> Any:
    return timezone.utc if name == "UTC" else ZoneInfo(name)


def oracle(schedule: str, zone: str, start: float, end: float) -> list[float]:
    """The ticks in (start, end], at most MAX_TICKS: cronsim's forward sequence from `start`."""
    if schedule.startswith("@every"):
        units = {"s": 1, "m": 60, "h": 3600}
        spec, seconds, number = schedule.split()[1], 0, ""
        for ch in spec:
            if ch.isdigit():
                number += ch
            else:
                seconds, number = seconds + int(number) * units[ch], ""
        out, k = [], int(start // seconds) + 1
        while k * seconds <= end and len(out) < MAX_TICKS:
            out.append(float(k * seconds))
            k += 1
        return out
    expr = nj.cron.MACROS.get(schedule, schedule)
    ticks = []
    for dt in CronSim(expr, datetime.fromtimestamp(int(start // 1), _zone(zone))):
        t = dt.timestamp()
        if t > end or len(ticks) >= MAX_TICKS:
            break
        ticks.append(t)
    return ticks


def window(schedule: str, zone: str, start: float) -> tuple[list[float], float]:
    """The ticks a run from `start` must enqueue, and when it stops: the ticks in
    (start, start + SPAN], at most MAX_TICKS, and a stop that is never one of them.

    Stopped at the very instant of a tick, the scheduler may or may not enqueue it: its wake-up
    and the stop are one virtual instant, Trio runs the two tasks in either order, and a stop
    that lands first is a shutdown, after which no tick may be enqueued. So when the last tick
    ends the window (the 25th, or one at start + SPAN: an hourly schedule from a whole hour)
    the run goes on half a second past it; ticks are whole seconds at least 15 s apart, so no
    other tick falls in that half second."""
    expected = oracle(schedule, zone, start, start + SPAN)
    if expected and (len(expected) == MAX_TICKS or expected[-1] >= start + SPAN):
        return expected, expected[-1] + 0.5
    return expected, start + SPAN


def check(data: st.DataObject, store: Store = MEMORY) -> None:
    schedule = data.draw(SCHEDULES, "schedule")
    zone = data.draw(st.sampled_from(ZONES), "timezone")
    start = data.draw(STARTS, "start")
    expected, end = window(schedule, zone, start)

    app = nj.App()

    @app.periodic(schedule, timezone=zone)
    @app.job()
    async def tick(ctx: nj.JobContext) -> None:
        pass

    periodic = app.periodic_schedules["tick"]
    taken: list[tuple[float, float]] = []

    async def main() -> None:
        backend = store.build() if store.build is not None else nj.MemoryBackend()
        await backend.open()  # may take virtual time (a connect retried): the clock starts after it
        opened_at = trio.current_time()
        clock = lambda: start + (trio.current_time() - opened_at)  # noqa: E731
        inner = backend.enqueue_tick  # type: ignore[attr-defined]

        async def recording(name: str, at: float, job: Any) -> Any:
            result = await inner(name, at, job)
            if result is not None:
                taken.append((at, clock()))
            return result

        backend.enqueue_tick = recording  # type: ignore[attr-defined]
        try:
            scheduler = Scheduler(backend, [periodic], closing=lambda: False, clock=clock)  # type: ignore[arg-type]
            async with trio.open_nursery() as nursery:
                await nursery.start(scheduler.run)
                await trio.sleep(end - start)
                nursery.cancel_scope.cancel()
        finally:
            await backend.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    ticks = [t for t, _ in taken]
    if ticks != expected:
        fail("P12", f"{schedule!r} in {zone} from {start!r}: enqueued {ticks}, cronsim gives {expected}")
    # On virtual time a tick is taken at its point: within a millisecond (a float of epoch
    # seconds is exact to ~2e-7 s), where a relative bound of 1e-6 allowed half an hour.
    late = [(t, at) for t, at in taken if not t <= at < t + 1e-3]
    if late:
        fail("P12", f"{schedule!r} in {zone}: ticks enqueued off their point (tick, clock): {late}")


@settings(max_examples=examples(30))
@given(data=st.data())
def test_p12_schedule_points(data: st.DataObject) -> None:
    check(data)


class Drawn:
    """Stands for `st.data()` with the draws given: replays one example without Hypothesis."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        return self.values.pop(0)


# Found on SQLite in a full run: '@every 1h' from a whole hour ticks at start + SPAN, the very
# instant the run used to stop (SQLite lost that tick every time, memory about half the time).
TICK_AT_THE_END = ("@every 1h", "UTC", TRANSITIONS[0])


def test_the_run_never_stops_at_the_instant_of_a_tick() -> None:
    # each ticks at start + SPAN from a whole hour (the first three) or at its 25th tick
    for schedule in ("@every 1h", "@hourly", "0 * * * *", "@every 30s", "*/15 * * * * *"):
        expected, end = window(schedule, "UTC", TRANSITIONS[0])
        assert expected[-1] < end < expected[-1] + 1, (schedule, expected[-1], end)
        assert end not in oracle(schedule, "UTC", TRANSITIONS[0], end + 1), (schedule, end)


def test_a_tick_at_the_end_of_the_window_is_enqueued() -> None:
    for _ in range(20):  # which of the two tasks runs first at the instant is Trio's draw
        check(Drawn(*TICK_AT_THE_END))  # type: ignore[arg-type]
