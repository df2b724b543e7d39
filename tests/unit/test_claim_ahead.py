"""Claim ahead: the fetcher claims for workers still running, within a small bound.

A claim is a round trip; a worker that waits for it idles. So on a backend whose claim yields,
a queue of several workers also claims up to `prefetch = min(PREFETCH_PER_WORKER * max_workers,
PREFETCH_MAX)` jobs for workers that are still running, fewer as attempts lengthen: as many as
the workers are expected to start within half of `HOLD_BOUND`. A held job is `running` in the backend: it is heartbeated, a cancel request
reaches it before it starts, it is given back if no worker takes it within `HOLD_BOUND`, and
shutdown gives it back at once. The backend here is the memory backend made to yield, with a
claim that takes a round trip of 1 ms on the mock clock.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs.backends import ClaimResult, HeartbeatResult
from nursery_jobs.execution.executor import HOLD_BOUND, OUTCOME_SLACK, PREFETCH_MAX, PREFETCH_PER_WORKER

ROUND_TRIP = 0.001


class RoundTrips(nj.MemoryBackend):
    """A memory backend whose claims take a round trip, recording what each claim asked for."""

    never_yields = False

    def __init__(self) -> None:
        super().__init__()
        self.limits: list[int] = []
        self.peak_running = 0
        self.heartbeats: list[set[int]] = []
        self.executor: object = None

    async def claim(self, queue: str, limit: int) -> ClaimResult:
        if queue == "q":
            self.limits.append(limit)
        await trio.sleep(ROUND_TRIP)
        result = await super().claim(queue, limit)
        self.peak_running = max(self.peak_running, len(self._running))
        return result

    async def heartbeat(self, running: Sequence[tuple[int, int]]) -> HeartbeatResult:
        self.heartbeats.append({job_id for job_id, _ in running})
        return await super().heartbeat(running)


def _app(workers: int, seconds: float = 0.0) -> tuple[nj.App, list[int], list[int]]:
    """A queue of `workers` whose job sleeps `seconds`; returns the app, the ids started, and
    the peak of attempts running at once (one item)."""
    app = nj.App()
    app.queue("q", max_workers=workers, timeout=60)
    started: list[int] = []
    peak = [0, 0]  # [now, peak]

    @app.job(queue="q")
    async def work(ctx: nj.JobContext) -> None:
        started.append(ctx.id)
        peak[0] += 1
        peak[1] = max(peak[1], peak[0])
        try:
            if seconds:
                await trio.sleep(seconds)
        finally:
            peak[0] -= 1

    return app, started, peak


async def test_a_busy_queue_claims_ahead_within_its_bound(autojump_clock: trio.testing.MockClock) -> None:
    workers = 8
    prefetch = min(PREFETCH_PER_WORKER * workers, PREFETCH_MAX)
    backend = RoundTrips()
    app, started, peak = _app(workers, seconds=0.0005)
    async with nj.open_runtime(app, backend=backend) as rt:
        executor = rt.executors["q"]
        held_seen: list[int] = []
        ids = await rt.enqueue_many("work", [{}] * 400)
        while len(started) < 400:
            held_seen.append(executor.held)
            await trio.sleep(0.0002)
        for job_id in ids:
            assert (await rt.wait(job_id, timeout=60)).state is nj.JobState.COMPLETED
    assert sorted(started) == sorted(ids)  # each job ran once
    assert peak[1] <= workers  # claiming ahead never runs more than max_workers at once
    assert max(held_seen) > workers, "never more held than one per worker: the test proves nothing"
    assert max(held_seen) <= prefetch
    # A claim asks for the idle workers plus what the held list lacks of the prefetch, no more.
    assert max(backend.limits) <= workers + prefetch
    assert any(limit > workers for limit in backend.limits)
    assert backend.peak_running <= workers + prefetch + max(workers, OUTCOME_SLACK)


async def test_a_queue_holds_fewer_jobs_ahead_as_its_attempts_lengthen(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Attempts of 0.2 s on 8 workers: the workers start 8 jobs per 0.2 s, so only the 20 they
    are expected to start within half of HOLD_BOUND are held (not the whole prefetch of 32), and
    none waits past HOLD_BOUND to be given back."""
    workers, seconds = 8, 0.2
    expected = int(workers * (HOLD_BOUND / 2) / seconds)
    assert expected < min(PREFETCH_PER_WORKER * workers, PREFETCH_MAX)  # else the test proves nothing
    backend = RoundTrips()
    app, started, _ = _app(workers, seconds=seconds)
    with caplog.at_level(logging.INFO, logger="nursery_jobs"):
        async with nj.open_runtime(app, backend=backend) as rt:
            executor = rt.executors["q"]
            held_seen: list[int] = []
            ids = await rt.enqueue_many("work", [{}] * 200)
            while len(started) < 200:
                held_seen.append(executor.held)
                await trio.sleep(0.01)
            for job_id in ids:
                assert (await rt.wait(job_id, timeout=60)).state is nj.JobState.COMPLETED
    assert sorted(started) == sorted(ids)
    assert max(held_seen) > workers // 2, "nothing held ahead: the test proves nothing"
    assert max(held_seen) <= expected
    assert not [r for r in caplog.records if getattr(r, "event", None) == "claimed_ahead_given_back"]


async def test_jobs_claimed_ahead_are_given_back_at_shutdown(autojump_clock: trio.testing.MockClock) -> None:
    workers = 4
    backend = RoundTrips()
    app, started, _ = _app(workers, seconds=0.01)
    async with nj.open_runtime(app, backend=backend, grace=5) as rt:
        executor = rt.executors["q"]
        ids = await rt.enqueue_many("work", [{}] * 200)
        with trio.fail_after(10):
            while executor.held == 0:
                await trio.sleep(0.001)
        held = executor.held
        rt.begin_shutdown()
        assert executor.held == 0  # given back at once, before the grace
        started_at_shutdown = len(started)
    assert held > 0
    assert len(started) == started_at_shutdown  # nothing started once shutdown began
    jobs = [await backend.get_job(job_id) for job_id in ids]
    assert not [j.id for j in jobs if j.state is nj.JobState.RUNNING]
    ran = {j.id for j in jobs if j.state is nj.JobState.COMPLETED}
    assert ran == set(started)
    back = [j for j in jobs if j.state is nj.JobState.AVAILABLE]
    assert len(back) == 200 - len(started)
    assert all(j.attempt == 0 for j in back)  # given back, attempt and all


async def test_a_queue_of_long_jobs_claims_nothing_ahead(autojump_clock: trio.testing.MockClock) -> None:
    workers = 3
    backend = RoundTrips()
    app, _, _ = _app(workers, seconds=5.0)
    async with nj.open_runtime(app, backend=backend) as rt:
        executor = rt.executors["q"]
        await rt.enqueue_many("work", [{}] * 12)
        for _ in range(30):
            await trio.sleep(0.5)
            assert executor.held == 0, (trio.current_time(), executor._mark, executor._ended, backend.limits)
            assert (await rt.stats())["q"].running <= workers
    assert max(backend.limits) <= workers


async def test_a_held_job_no_worker_takes_in_time_is_given_back(autojump_clock: trio.testing.MockClock) -> None:
    """Quick jobs make the fetcher claim ahead; then every worker is held up by a slow job: the
    held jobs go back to the table after HOLD_BOUND instead of waiting for a worker."""
    workers = 4
    backend = RoundTrips()
    app = nj.App()
    app.queue("q", max_workers=workers, timeout=60)
    gate = trio.Event()
    slow_running: list[int] = []

    @app.job(queue="q")
    async def work(ctx: nj.JobContext, slow: bool) -> None:
        if slow:
            slow_running.append(ctx.id)
            await gate.wait()

    async with nj.open_runtime(app, backend=backend) as rt:
        executor = rt.executors["q"]
        await rt.enqueue_many("work", [{"slow": False}] * 40 + [{"slow": True}] * 40)
        with trio.fail_after(10):
            while not (executor.held and len(slow_running) == workers):
                await trio.sleep(0.0005)
        held = [a.job.id for a in executor._held]
        await trio.sleep(HOLD_BOUND + 0.01)
        assert executor.held == 0
        for job_id in held:
            job = await backend.get_job(job_id)
            assert job.state is not nj.JobState.RUNNING or job_id in slow_running
            assert job_id in slow_running or job.attempt == 0  # given back, attempt and all
        gate.set()
    assert held


async def test_a_held_job_is_heartbeated_and_a_cancel_reaches_it_before_it_starts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    workers = 2
    backend = RoundTrips()
    settings = nj.RuntimeSettings(heartbeat_interval=0.01)
    app = nj.App()
    app.queue("q", max_workers=workers, timeout=60)
    gate = trio.Event()
    started: list[int] = []

    @app.job(queue="q")
    async def work(ctx: nj.JobContext, slow: bool) -> None:
        started.append(ctx.id)
        if slow:
            await gate.wait()

    async with nj.open_runtime(app, backend=backend, settings=settings) as rt:
        executor = rt.executors["q"]
        quick = await rt.enqueue_many("work", [{"slow": False}] * 20)
        slow = await rt.enqueue_many("work", [{"slow": True}] * 10)
        with trio.fail_after(10):
            while not (executor.held and len(started) > 20):
                await trio.sleep(0.0005)
        # Held: running in the backend, not started, and in the attempt registry already (a job
        # just handed to an idle worker's mailbox is running and not started either, but it
        # becomes an attempt only when its worker starts it).
        held_ids = {
            i for i in slow if (await backend.get_job(i)).state is nj.JobState.RUNNING and i in rt.attempts
        } - set(started)
        assert held_ids, "no job was held while the slow ones ran: the test proves nothing"
        victim = min(held_ids)
        await trio.sleep(0.05)  # a few heartbeats
        assert any(victim in beat for beat in backend.heartbeats)
        assert await rt.cancel(victim) is not None
        await trio.sleep(0.01)
        gate.set()
        for job_id in quick + slow:
            await rt.wait(job_id, timeout=60)
    assert victim not in started
    assert (await backend.get_job(victim)).state is nj.JobState.CANCELLED


async def test_no_claim_ahead_where_it_cannot_help_or_is_turned_off(autojump_clock: trio.testing.MockClock) -> None:
    """The memory backend's claim is no round trip, a queue of one worker keeps its strict
    start order, and `claim_ahead=False` turns it off: none of them claims ahead."""
    app, _, _ = _app(4)
    app.queue("single", max_workers=1, timeout=60)
    app.queue("off", max_workers=8, timeout=60, claim_ahead=False)
    app.queue("wide", max_workers=100, timeout=60)
    backend = RoundTrips()
    async with nj.open_runtime(app, backend="memory://") as rt:
        assert rt.executors["q"].prefetch == 0
    async with nj.open_runtime(app, backend=backend) as rt:
        prefetch = {name: executor.prefetch for name, executor in rt.executors.items()}
    per = PREFETCH_PER_WORKER
    assert prefetch == {"default": 10 * per, "q": 4 * per, "single": 0, "off": 0, "wide": PREFETCH_MAX}


async def test_jobs_claimed_ahead_go_back_when_the_runtime_is_torn_down_from_outside(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = RoundTrips()
    app, started, _ = _app(4, seconds=0.01)
    held = 0
    with trio.CancelScope() as outside:
        async with nj.open_runtime(app, backend=backend) as rt:
            executor = rt.executors["q"]
            ids = await rt.enqueue_many("work", [{}] * 200)
            with trio.fail_after(10):
                while executor.held == 0:
                    await trio.sleep(0.001)
            held = executor.held
            outside.cancel()  # no grace: everything is cut, and what nobody started goes back
            await trio.sleep(1)
    assert held > 0
    jobs = [await backend.get_job(job_id) for job_id in ids]
    assert not [j.id for j in jobs if j.state is nj.JobState.RUNNING]
    assert {j.id for j in jobs if j.state is nj.JobState.COMPLETED} <= set(started)


async def test_attempts_run_back_to_back_keep_their_own_deadlines_and_cancels(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A worker that ends an attempt and takes the next held job with no yield in between runs
    both under one cancel scope (`QueueExecutor._worker`'s runs). Each attempt still has its own
    deadline, from its own start, as `ctx.deadline` and as Trio's effective deadline; a timeout
    cuts only the attempt that overran; a cancel reaches only the attempt it names; and a cancel
    that reaches an attempt after it ended cuts nothing that runs."""
    backend = RoundTrips()
    app = nj.App()
    app.queue("q", max_workers=2, timeout=1.0)
    seen: dict[int, tuple[float, float, float]] = {}
    """Per job: its start, ctx.deadline and the effective deadline its handler saw."""
    ran_for: dict[int, float] = {}
    ended: list[Any] = []  # attempts of jobs that completed, for a late cancel
    runtime: list[nj.Runtime] = []

    @app.job(queue="q", max_attempts=1)
    async def work(ctx: nj.JobContext, seconds: float, wait: bool = False, late_cancel: bool = False) -> None:
        start = trio.current_time()
        seen[ctx.id] = (start, ctx.deadline, trio.current_effective_deadline())
        attempt = runtime[0].attempts.get(ctx.id)
        if late_cancel and ended:
            ended[-1].cancel("cancel")  # that attempt has ended: nothing may be cut by it
        try:
            if wait:
                await trio.sleep_forever()  # until its cancel
            if seconds:
                await trio.sleep(seconds)
        finally:
            ran_for[ctx.id] = trio.current_time() - start
        ended.append(attempt)

    async with nj.open_runtime(app, backend=backend) as rt:
        runtime.append(rt)
        executor = rt.executors["q"]
        quick = await rt.enqueue_many("work", [{"seconds": 0}] * 20)
        sleepy = await rt.enqueue_many("work", [{"seconds": 0.6}] * 6)  # each within its own deadline only
        victim = await rt.enqueue("work", {"seconds": 0, "wait": True})
        late = await rt.enqueue_many("work", [{"seconds": 0, "late_cancel": True}] * 20)
        too_slow = await rt.enqueue_many("work", [{"seconds": 2.0}] * 4)
        rest = await rt.enqueue_many("work", [{"seconds": 0}, {"seconds": 0.3}] * 10)
        held_seen = 0
        with trio.fail_after(30):
            while victim not in seen:
                held_seen = max(held_seen, executor.held)
                await trio.sleep(0.0005)
        assert await rt.cancel(victim) is not None
        states = {job_id: (await rt.wait(job_id, timeout=60)).state for job_id in [*quick, *sleepy, victim, *late, *too_slow, *rest]}
    assert held_seen > 0, "nothing was held: no attempts ran back to back, and the test proves nothing"
    for job_id, (start, deadline, effective) in seen.items():
        assert deadline == effective == start + 1.0, job_id
    assert states[victim] is nj.JobState.CANCELLED
    assert {states[i] for i in too_slow} == {nj.JobState.DISCARDED}
    assert all(ran_for[i] == pytest.approx(1.0, abs=1e-9) for i in too_slow)  # cut at its own deadline, no earlier or later
    assert {states[i] for i in [*quick, *sleepy, *late, *rest]} == {nj.JobState.COMPLETED}
