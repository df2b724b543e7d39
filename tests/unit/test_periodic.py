"""Periodic jobs: `@app.periodic` declarations, and the scheduler service on virtual time."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any, Callable

import attrs
import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs.app import Periodic
from nursery_jobs.backends import InsertResult, NewJob
from nursery_jobs.services.periodic import Scheduler

UTC = timezone.utc
T0 = datetime(2026, 1, 1, 12, 3, tzinfo=UTC).timestamp()
"""The Unix time at virtual time 0 in these tests: 12:03, two minutes before a */5 tick."""


def _minute(m: int, h: int = 12) -> float:
    return datetime(2026, 1, 1, h, m, tzinfo=UTC).timestamp()


def _clock() -> float:
    return T0 + trio.current_time()


def _schedule(schedule: str = "*/5 * * * *", **kw: Any) -> Periodic:
    app = nj.App()

    @app.periodic(schedule, **kw)
    @app.job()
    async def tick(ctx: nj.JobContext) -> None:
        pass

    return app.periodic_schedules["tick"]


async def _jobs(backend: nj.MemoryBackend) -> int:
    return sum(attrs.astuple(c)[0] + attrs.astuple(c)[1] for c in (await backend.stats()).values())


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def _run_for(seconds: float, *schedulers: Scheduler) -> None:
    async with trio.open_nursery() as nursery:
        for s in schedulers:
            await nursery.start(s.run)
        await trio.sleep(seconds)
        nursery.cancel_scope.cancel()


# -- declarations --


def test_periodic_stacks_above_job_and_returns_the_kind() -> None:
    app = nj.App()
    app.queue("maintenance", max_workers=1)

    @app.periodic("@hourly", timezone="Europe/Paris", missed="run_once")
    @app.job(queue="maintenance")
    async def purge(ctx: nj.JobContext, days: int = 7) -> None:
        pass

    assert isinstance(purge, nj.JobKind) and app.kind("purge") is purge
    p = app.periodic_schedules["purge"]
    assert (p.name, p.schedule, p.cron.timezone, p.missed, p.enabled, p.run_at_start) == (
        "purge", "@hourly", "Europe/Paris", "run_once", True, False,
    )  # fmt: skip
    assert p.new_job(0.0).queue == "maintenance"


def test_periodic_on_a_plain_function_registers_it_on_the_queue_given() -> None:
    app = nj.App()
    app.queue("maintenance", max_workers=1)

    @app.periodic("@every 10m", queue="maintenance", name="sweep", args={"deep": True})
    async def sweep(ctx: nj.JobContext, deep: bool) -> None:
        pass

    assert app.kind("sweep").queue == "maintenance"
    assert json.loads(app.periodic_schedules["sweep"].new_job(0.0).args_json) == {"deep": True}


def test_two_schedules_of_one_kind_need_their_own_names() -> None:
    app = nj.App()

    @app.job()
    async def report(ctx: nj.JobContext, period: str) -> None:
        pass

    app.periodic("@daily", args={"period": "day"})(report)
    with pytest.raises(nj.ConfigError, match="declared twice"):
        app.periodic("@weekly", args={"period": "week"})(report)
    app.periodic("@weekly", args={"period": "week"}, name="weekly-report")(report)
    assert sorted(app.periodic_schedules) == ["report", "weekly-report"]


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"schedule": "61 * * * *"}, "invalid cron expression"),
        ({"schedule": "@every"}, "write an interval"),
        ({"queue": "nope"}, "unknown queue 'nope'"),
        ({"timezone": "Nowhere/Town"}, "unknown timezone"),
        ({"missed": "all"}, "missed must be one of"),
        ({"enabled": 1}, "enabled must be True or False"),
        ({"run_at_start": "yes"}, "run_at_start must be True or False"),
        ({"args": [1]}, "args must be a mapping"),
    ],
)
def test_a_bad_declaration_is_a_config_error_when_declared(kw: dict[str, Any], needle: str) -> None:
    app = nj.App()
    schedule = kw.pop("schedule", "@hourly")
    with pytest.raises(nj.ConfigError, match=needle):
        app.periodic(schedule, **kw)  # before any decorating


def test_args_that_do_not_fit_the_handler_and_a_queue_that_differs_are_config_errors() -> None:
    app = nj.App()
    app.queue("other", max_workers=1)

    @app.job()
    async def work(ctx: nj.JobContext, n: int) -> None:
        pass

    with pytest.raises(nj.ConfigError, match="do not fit"):
        app.periodic("@hourly")(work)
    with pytest.raises(nj.ConfigError, match="runs on queue 'default', not 'other'"):
        app.periodic("@hourly", queue="other", args={"n": 1})(work)
    foreign = nj.App()
    with pytest.raises(nj.ConfigError, match="not registered on this app"):
        foreign.periodic("@hourly", args={"n": 1})(work)


# -- the scheduler on virtual time --


async def test_each_tick_is_enqueued_once_at_its_time(autojump_clock: trio.testing.MockClock) -> None:
    backend = nj.MemoryBackend()
    sched = Scheduler(backend, [_schedule()], closing=lambda: False, clock=_clock)
    await _run_for(27 * 60 + 1, sched)  # 12:03 -> 12:30:01
    assert await _jobs(backend) == 6  # 12:05, 12:10, ..., 12:30
    (state,) = (await backend.schedule_states(["tick"])).values()
    assert state.last_tick == _minute(30)


async def test_any_number_of_schedulers_on_one_store_enqueue_one_job_per_tick(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = nj.MemoryBackend()
    s = _schedule("* * * * * *")  # every second
    many = [Scheduler(backend, [s], closing=lambda: False, clock=_clock) for _ in range(5)]
    await _run_for(30.5, *many)
    assert await _jobs(backend) == 30


@pytest.mark.parametrize("missed, expected", [("skip", 0), ("run_once", 1)])
async def test_after_downtime_skip_enqueues_no_missed_tick_run_once_one(
    autojump_clock: trio.testing.MockClock, missed: str, expected: int
) -> None:
    backend = nj.MemoryBackend()
    s = _schedule(missed=missed)
    await _run_for(2 * 60 + 1, Scheduler(backend, [s], closing=lambda: False, clock=_clock))  # 12:05 enqueued
    assert await _jobs(backend) == 1
    await trio.sleep(16 * 60)  # down over 12:10, 12:15 and 12:20; back at 12:21:01
    await _run_for(60, Scheduler(backend, [s], closing=lambda: False, clock=_clock))
    assert await _jobs(backend) == 1 + expected
    if expected:
        (state,) = (await backend.schedule_states(["tick"])).values()
        assert state.last_tick == _minute(20)  # the latest missed tick, once


async def test_a_scheduler_never_enqueues_once_closing(autojump_clock: trio.testing.MockClock) -> None:
    backend = nj.MemoryBackend()
    closing = False
    sched = Scheduler(backend, [_schedule("* * * * * *")], closing=lambda: closing, clock=_clock)
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        await trio.sleep(10.5)
        closing = True
        before = await _jobs(backend)
        await trio.sleep(60)
        assert await _jobs(backend) == before == 10
        nursery.cancel_scope.cancel()


class _Flaky(nj.MemoryBackend):
    """Fails every enqueue of a tick until `healthy`."""

    healthy = False
    calls = 0

    async def enqueue_tick(self, name: str, tick: float, job: NewJob) -> InsertResult | None:
        self.calls += 1
        if not self.healthy:
            raise nj.BackendUnavailable("down for the test")
        return await super().enqueue_tick(name, tick, job)


async def test_a_failing_store_is_retried_and_the_latest_tick_stands_for_those_it_missed(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    backend = _Flaky()
    sched = Scheduler(backend, [_schedule()], closing=lambda: False, clock=_clock)
    async with trio.open_nursery() as nursery:
        await nursery.start(sched.run)
        await trio.sleep(13 * 60)  # 12:16: the ticks 12:05, 12:10 and 12:15 failed
        assert await _jobs(backend) == 0 and 3 <= backend.calls <= 20  # bounded retries, backing off
        backend.healthy = True
        await trio.sleep(61)
        assert await _jobs(backend) == 1
        (state,) = (await backend.schedule_states(["tick"])).values()
        assert state.last_tick == _minute(15)
        nursery.cancel_scope.cancel()
    assert "periodic: enqueueing tick 2026-01-01T12:05:00+00:00 of schedule 'tick' failed" in caplog.text


async def test_run_at_start_enqueues_one_job_unless_one_from_a_start_is_pending(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = nj.MemoryBackend()
    s = _schedule("@daily", run_at_start=True)
    await _run_for(1, Scheduler(backend, [s], closing=lambda: False, clock=_clock))
    await _run_for(1, Scheduler(backend, [s], closing=lambda: False, clock=_clock))
    assert await _jobs(backend) == 1  # the first is still pending
    assert await backend.schedule_states(["tick"]) == {}  # a start is not a tick


async def test_a_disabled_schedule_enqueues_nothing_and_is_listed(autojump_clock: trio.testing.MockClock) -> None:
    backend = nj.MemoryBackend()
    s = _schedule("* * * * * *", enabled=False)
    sched = Scheduler(backend, [s], closing=lambda: False, clock=_clock)
    await _run_for(10, sched)
    assert await _jobs(backend) == 0
    (info,) = await sched.describe()
    assert (info.name, info.enabled, info.next_tick, info.last_tick, info.last_outcome) == ("tick", False, None, None, None)


# -- in the runtime --


def _app(record: list[float] | None = None, schedule: str = "* * * * * *") -> nj.App:
    app = nj.App()

    @app.periodic(schedule)
    @app.job()
    async def beat(ctx: nj.JobContext) -> None:
        if record is not None:
            record.append(trio.current_time())

    @app.periodic("@yearly", enabled=False)
    @app.job()
    async def yearly(ctx: nj.JobContext) -> None:
        pass

    return app


async def test_the_runtime_runs_its_schedules_and_lists_them(autojump_clock: trio.testing.MockClock) -> None:
    record: list[float] = []
    backend = nj.MemoryBackend()
    async with nj.open_runtime(_app(record), backend=backend) as rt:
        await trio.sleep(5.5)
        beat, yearly = await rt.periodic()
    assert 5 <= len(record) <= 6
    assert (beat.name, beat.schedule, beat.kind, beat.enabled, beat.timezone) == ("beat", "* * * * * *", "beat", True, "UTC")
    assert beat.last_tick is not None and beat.next_tick is not None
    assert (beat.next_tick - beat.last_tick).total_seconds() == 1
    assert beat.last_outcome is nj.JobState.COMPLETED and beat.last_job_id is not None
    assert (yearly.name, yearly.enabled, yearly.next_tick, yearly.last_tick) == ("yearly", False, None, None)


async def test_the_runtime_enqueues_no_tick_once_its_shutdown_began(autojump_clock: trio.testing.MockClock) -> None:
    backend = nj.MemoryBackend()
    async with nj.open_runtime(_app(), backend=backend, queues=[]) as rt:
        await trio.sleep(3.5)
        rt.begin_shutdown()
        before = await _jobs(backend)
        await trio.sleep(30)
        assert await _jobs(backend) == before >= 3


def test_the_packages_backends_all_store_schedules(tmp_path: Any) -> None:
    from nursery_jobs.backends.postgres import PostgresBackend
    from nursery_jobs.backends.sqlite import SqliteBackend

    for cls in (nj.MemoryBackend, SqliteBackend, PostgresBackend):
        assert all(callable(getattr(cls, m, None)) for m in ("schedule_states", "enqueue_tick")), cls
    assert isinstance(nj.MemoryBackend(), nj.backends.ScheduleStore)
    assert isinstance(SqliteBackend(str(tmp_path / "j.db")), nj.backends.ScheduleStore)


class _NoSchedules:
    """A backend without the ScheduleStore capability (delegates the rest)."""

    def __init__(self) -> None:
        self._inner = nj.MemoryBackend()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name in ("schedule_states", "enqueue_tick"):
            raise AttributeError(name)
        return getattr(self._inner, name)  # type: ignore[no-any-return]


async def test_schedules_on_a_backend_that_cannot_store_them_are_a_config_error() -> None:
    with pytest.raises(nj.ConfigError, match="cannot store them"):
        async with nj.open_runtime(_app(), backend=_NoSchedules()):  # type: ignore[arg-type]
            pass
