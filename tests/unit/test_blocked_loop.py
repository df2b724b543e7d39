"""The blocked-loop watchdog: a step that holds the Trio loop is logged, naming the job.

Blocking is real time, so the watchdog reads a real-time clock, never Trio's. Most tests here
replace that clock (`watchdog.default_clock`) with one they advance by hand inside a handler:
"this step held the loop for 0.5 s" without sleeping, and no step the machine's load stretches
counts. One test blocks for real, with `time.sleep`, to show the whole path end to end.
"""

from __future__ import annotations

import logging
import math
import time

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.infra import watchdog


class FakeClock:
    """A real-time clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(watchdog, "default_clock", fake)
    return fake


@pytest.fixture
def caplog_warnings(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.WARNING, logger="nursery_jobs")
    return caplog


def blocked(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith("blocked event loop")]


def settings(threshold: float | None) -> nj.RuntimeSettings:
    return nj.RuntimeSettings(blocked_loop_warning=threshold)


async def test_a_handler_that_sleeps_without_awaiting_is_named_and_still_completes(caplog_warnings) -> None:
    app = nj.App()
    app.queue("slowq", max_workers=2, timeout=0.1)

    @app.job(queue="slowq")
    async def sleepy(ctx: nj.JobContext) -> None:
        time.sleep(0.3)  # the real thing: no checkpoint for 0.3 s, three times the job's timeout

    with trio.fail_after(10):
        async with nj.open_runtime(app, settings=settings(0.1)) as rt:
            job_id = await sleepy.enqueue()
            receipt = await rt.wait(job_id, timeout=5)
    # Trio cannot cut code that never awaits: the attempt overran its deadline and completed.
    assert receipt.state is nj.JobState.COMPLETED
    [record] = [r for r in blocked(caplog_warnings) if getattr(r, "job_id", None) == job_id]
    assert record.levelno == logging.WARNING
    assert (record.kind, record.queue) == ("sleepy", "slowq")  # type: ignore[attr-defined]
    assert record.seconds >= 0.3 and record.steps == 1  # type: ignore[attr-defined]
    text = record.getMessage()
    assert f"job {job_id} (kind 'sleepy', queue 'slowq') held the Trio loop for 0." in text
    assert "up to the end of its attempt" in text and "nursery_jobs.run_blocking" in text


async def test_handlers_that_await_log_nothing_even_over_hours_of_virtual_time(autojump_clock, caplog_warnings) -> None:
    # Real time here: if the watchdog read Trio's clock, each hour-long sleep would be a step of
    # an hour. A threshold of 1 s keeps the machine's own hiccups out of it.
    app = nj.App()
    app.queue("q", max_workers=4, timeout=None)

    @app.job(queue="q")
    async def patient(ctx: nj.JobContext, n: int) -> None:
        for _ in range(n):
            await trio.sleep(3600)

    with trio.fail_after(10 * 3600):  # virtual time: the work takes 6 h of it
        async with nj.open_runtime(app, settings=settings(1.0)) as rt:
            assert watchdog._WATCH.get() is not None  # watching, and seeing nothing
            ids = await patient.enqueue_many([{"n": 3}] * 8 + [{"n": 0}] * 200)
            receipts = [await rt.wait(i, timeout=4 * 3600 * 3) for i in ids]
    assert {r.state for r in receipts} == {nj.JobState.COMPLETED}
    assert trio.current_time() > 3 * 3600  # the hours did pass, on the Trio clock
    assert blocked(caplog_warnings) == []


async def test_the_clock_is_real_time_whatever_trios_clock_says(autojump_clock, caplog_warnings) -> None:
    app = nj.App()
    app.queue("q", max_workers=1, timeout=None)

    @app.job(queue="q")
    async def leaps(ctx: nj.JobContext) -> None:
        # 20 s of virtual time inside one step, and no real time (more would outlast rescue_after
        # and have the job rescued while it runs)
        autojump_clock.jump(20)

    @app.job(queue="q")
    async def blocks(ctx: nj.JobContext) -> None:
        time.sleep(0.2)  # real blocking, which the MockClock does not see

    with trio.fail_after(600):
        async with nj.open_runtime(app, settings=settings(0.1)) as rt:
            leap, block = await leaps.enqueue(), await blocks.enqueue()
            assert (await rt.wait(leap, timeout=10)).done and (await rt.wait(block, timeout=10)).done
    assert [r.kind for r in blocked(caplog_warnings)] == ["blocks"]  # type: ignore[attr-defined]


class WaitsTakeTime(trio.abc.Instrument):
    """Each wait of the loop for I/O and timers takes 5 s of (fake) real time."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def before_io_wait(self, timeout: float) -> None:
        self.clock.advance(5.0)


async def test_time_the_loop_spends_waiting_is_never_counted(clock, autojump_clock, caplog_warnings) -> None:
    app = nj.App()
    app.queue("q", max_workers=2, timeout=None)

    @app.job(queue="q")
    async def napper(ctx: nj.JobContext) -> None:
        for _ in range(3):
            await trio.sleep(60)

    waits = WaitsTakeTime(clock)
    trio.lowlevel.add_instrument(waits)
    try:
        with trio.fail_after(3600):
            async with nj.open_runtime(app, settings=settings(0.1)) as rt:
                ids = await napper.enqueue_many([{}] * 4)
                assert all([(await rt.wait(i, timeout=600)).done for i in ids])
    finally:
        trio.lowlevel.remove_instrument(waits)
    assert clock.now > 1000.0 + 10 * 5.0  # the waits did take (fake) time
    assert blocked(caplog_warnings) == []


async def test_a_child_task_is_attributed_to_its_job(clock, caplog_warnings) -> None:
    app = nj.App()
    app.queue("q", max_workers=2, timeout=None)

    @app.job(queue="q")
    async def parent(ctx: nj.JobContext) -> None:
        async def crunch() -> None:
            await trio.sleep(0)
            clock.advance(0.5)  # 0.5 s of CPU work without a checkpoint
            await trio.sleep(0)

        async with ctx.children() as children:
            children.spawn(crunch, name="crunch")

    with trio.fail_after(10):
        async with nj.open_runtime(app, settings=settings(0.1)) as rt:
            job_id = await parent.enqueue()
            assert (await rt.wait(job_id, timeout=5)).done
    [record] = blocked(caplog_warnings)
    assert (record.job_id, record.kind, record.queue) == (job_id, "parent", "q")  # type: ignore[attr-defined]
    assert record.seconds == pytest.approx(0.5)  # type: ignore[attr-defined]
    assert record.task == f"job-{job_id}/crunch"  # type: ignore[attr-defined]
    assert f"job {job_id} (kind 'parent', queue 'q') in its child task 'job-{job_id}/crunch'" in record.getMessage()
    assert record.released_at.startswith("test_blocked_loop.py:")  # type: ignore[attr-defined]
    assert record.released_at.endswith(" in crunch")  # type: ignore[attr-defined]


async def test_the_warning_says_where_the_handler_gave_the_loop_back(clock, caplog_warnings) -> None:
    app = nj.App()
    app.queue("q", max_workers=1, timeout=None)

    @app.job(queue="q")
    async def fetch_then_parse(ctx: nj.JobContext) -> None:
        await trio.sleep(0)
        clock.advance(2.0)
        await trio.sleep(0)  # the await that ends the blocked step
        await trio.sleep(0)

    with trio.fail_after(10):
        async with nj.open_runtime(app, settings=settings(0.1)) as rt:
            job_id = await fetch_then_parse.enqueue()
            assert (await rt.wait(job_id, timeout=5)).done
    [record] = blocked(caplog_warnings)
    assert record.job_id == job_id and record.seconds == pytest.approx(2.0)  # type: ignore[attr-defined]
    assert record.released_at.endswith(" in fetch_then_parse")  # type: ignore[attr-defined]
    assert f"(it gave the loop back at {record.released_at})" in record.getMessage()  # type: ignore[attr-defined]


async def test_a_task_that_is_not_a_job_is_named_by_its_task(clock, caplog_warnings) -> None:
    app = nj.App()
    with trio.fail_after(10):
        async with nj.open_runtime(app, settings=settings(0.1)):
            await trio.sleep(0)
            clock.advance(0.7)  # the service's own code, blocking
            await trio.sleep(0)
    [record] = blocked(caplog_warnings)
    assert (record.job_id, record.kind, record.queue) == (None, None, None)  # type: ignore[attr-defined]
    assert record.seconds == pytest.approx(0.7)  # type: ignore[attr-defined]
    # The chain of frames ends in this test, where the step gave the loop back.
    assert record.released_at.endswith(" in test_a_task_that_is_not_a_job_is_named_by_its_task")  # type: ignore[attr-defined]
    assert record.task == trio.lowlevel.current_task().name  # type: ignore[attr-defined]
    assert f"task {record.task!r} (not a job) held the Trio loop for 0.70 s" in record.getMessage()  # type: ignore[attr-defined]


async def test_an_app_resource_that_blocks_is_named_not_the_runtimes_task(clock, caplog_warnings) -> None:
    # A resource opens and closes in the runtime's own task: the warning names the resource, the
    # code the operator wrote, not 'nursery_jobs.runtime._serve' or the test's task.
    app = nj.App()

    @app.resource
    async def http():
        clock.advance(0.6)  # a synchronous client's connect
        yield "client"
        await trio.sleep(0)
        clock.advance(0.4)  # its blocking close
        await trio.sleep(0)

    with trio.fail_after(10):
        async with nj.open_runtime(app, settings=settings(0.1)):
            await trio.sleep(0)
    opening, closing = blocked(caplog_warnings)
    for record in (opening, closing):
        assert (record.resource, record.job_id, record.kind, record.queue) == ("http", None, None, None)  # type: ignore[attr-defined]
    assert opening.seconds == pytest.approx(0.6) and closing.seconds == pytest.approx(0.4)  # type: ignore[attr-defined]
    assert opening.getMessage().startswith(
        "blocked event loop: resource 'http' (while opening) held the Trio loop for 0.60 s without a checkpoint, "
        "up to the end of its open; "
    )
    assert closing.getMessage().startswith("blocked event loop: resource 'http' (while closing) held the Trio loop for 0.40 s")
    assert closing.released_at.endswith(" in http")  # type: ignore[attr-defined]


async def test_a_job_that_keeps_blocking_is_summarised_not_logged_per_step(clock, caplog_warnings) -> None:
    app = nj.App()
    app.queue("q", max_workers=1, timeout=None)

    @app.job(queue="q")
    async def cpu_bound(ctx: nj.JobContext) -> None:
        for _ in range(1000):  # 1,000 slices of 0.3 s: 300 s of CPU, yielding between slices
            clock.advance(0.3)
            await trio.sleep(0)

    with trio.fail_after(30):
        async with nj.open_runtime(app, settings=settings(0.1)) as rt:
            job_id = await cpu_bound.enqueue()
            assert (await rt.wait(job_id, timeout=5)).done
    records = blocked(caplog_warnings)
    assert {r.job_id for r in records} == {job_id}  # type: ignore[attr-defined]
    # One line at once, then one per REPEAT_WINDOW (10 s) of the 300 s: about 30, not 1,000.
    assert 25 <= len(records) <= 35
    assert records[0].steps == 1 and "more times in the last 10." in records[1].getMessage()  # type: ignore[attr-defined]
    # Nothing is lost: the last window is logged when the runtime leaves.
    assert sum(r.steps for r in records) == 1000  # type: ignore[attr-defined]
    assert math.isclose(sum(r.seconds for r in records), 300.0)  # type: ignore[attr-defined]
    assert max(r.longest for r in records) == pytest.approx(0.3)  # type: ignore[attr-defined]


async def test_none_turns_the_watchdog_off(clock, caplog_warnings) -> None:
    app = nj.App()
    app.queue("q", max_workers=1, timeout=None)

    @app.job(queue="q")
    async def hog(ctx: nj.JobContext) -> None:
        clock.advance(5.0)

    with trio.fail_after(10):
        async with nj.open_runtime(app, settings=settings(None)) as rt:
            assert watchdog._WATCH.get() is None
            assert (await rt.wait(await hog.enqueue(), timeout=5)).done
    assert blocked(caplog_warnings) == []


async def test_the_instrument_is_removed_when_the_runtime_exits_also_on_error(clock, caplog_warnings) -> None:
    app = nj.App()
    with trio.fail_after(10):
        async with nj.open_runtime(app, settings=settings(0.1)):
            watch = watchdog._WATCH.get()
            assert watch is not None
        assert watchdog._WATCH.get() is None
        with pytest.raises(KeyError):
            trio.lowlevel.remove_instrument(watch)  # Trio no longer has it

        with pytest.raises(BaseExceptionGroup) as raised:
            async with nj.open_runtime(app, settings=settings(0.1)):
                watch = watchdog._WATCH.get()
                raise ValueError("the service broke")
        assert raised.group_contains(ValueError)
        assert watchdog._WATCH.get() is None
        with pytest.raises(KeyError):
            trio.lowlevel.remove_instrument(watch)
        clock.advance(1.0)  # blocking after the runtimes are gone: nobody is watching
        await trio.sleep(0)
    assert blocked(caplog_warnings) == []


async def test_two_runtimes_share_one_watch_and_report_each_step_once(clock, caplog_warnings) -> None:
    first, second = nj.App(), nj.App()
    first.queue("q", max_workers=1, timeout=None)
    second.queue("q", max_workers=1, timeout=None)

    @first.job(queue="q")
    async def of_first(ctx: nj.JobContext) -> None:
        clock.advance(0.4)

    @second.job(queue="q")
    async def of_second(ctx: nj.JobContext, seconds: float) -> None:
        clock.advance(seconds)

    with trio.fail_after(10):
        async with nj.open_runtime(second, settings=settings(0.5)) as rt2:
            async with nj.open_runtime(first, settings=settings(0.3)) as rt1:
                assert watchdog._WATCH.get() is not None
                one = await of_first.enqueue()
                two = await rt2.enqueue("of_second", {"seconds": 0.4})  # over the first's 0.3 s
                assert (await rt1.wait(one, timeout=5)).done and (await rt2.wait(two, timeout=5)).done
            # The first runtime left; the second still watches, at its own threshold (0.5 s).
            assert watchdog._WATCH.get() is not None
            under = await rt2.enqueue("of_second", {"seconds": 0.4})
            again = await rt2.enqueue("of_second", {"seconds": 0.6})
            assert (await rt2.wait(under, timeout=5)).done and (await rt2.wait(again, timeout=5)).done
        assert watchdog._WATCH.get() is None
    named = [(r.kind, r.job_id) for r in blocked(caplog_warnings)]  # type: ignore[attr-defined]
    # Both memory backends number their jobs from 1: the kind tells them apart.
    assert named == [("of_first", one), ("of_second", two), ("of_second", again)]


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, "0.25", True])
def test_a_bad_threshold_is_a_config_error(bad: object) -> None:
    with pytest.raises(nj.ConfigError, match="blocked_loop_warning"):
        nj.RuntimeSettings(blocked_loop_warning=bad)  # type: ignore[arg-type]


def test_the_default_is_on_at_a_quarter_second() -> None:
    assert nj.RuntimeSettings().blocked_loop_warning == 0.25
    assert nj.RuntimeSettings(blocked_loop_warning=None).blocked_loop_warning is None
    assert nj.RuntimeSettings(blocked_loop_warning=2).blocked_loop_warning == 2


async def test_a_describe_function_that_fails_does_not_disable_the_watch(clock, caplog_warnings) -> None:
    # Trio disables an instrument whose hook raises; the watchdog must absorb its own errors.
    calls = []

    def describe(task: trio.lowlevel.Task) -> watchdog.Culprit | None:
        calls.append(task)
        if len(calls) == 1:
            raise RuntimeError("describe broke")
        return None

    with trio.fail_after(10):
        with watchdog.watch_blocked_loop(0.1, describe):
            clock.advance(0.2)
            await trio.sleep(0)
            clock.advance(0.3)
            await trio.sleep(0)
    messages = [r.getMessage() for r in caplog_warnings.records]
    assert any("could not report a step of 0.20 s" in m for m in messages)
    assert [r.seconds for r in blocked(caplog_warnings)] == [pytest.approx(0.3)]  # type: ignore[attr-defined]
