"""Per-key and per-queue limits end to end: the runtime runs at most `max_concurrent` jobs of a
key and `global_max_workers` of a queue at once, a busy key never delays another, and a freed
slot starts the key's next job by a wake-up, not a poll: the stores here poll every 60 s, so a
missed wake-up shows as a gap of a minute. (Gaps are bounded, not exact: on a loaded machine a
slow database call lets virtual time jump to the next timer, a heartbeat or the rescuer's tick.)"""

from __future__ import annotations

from typing import Any

import pytest
import trio

import nursery_jobs as nj


async def test_one_endpoint_at_a_time_and_a_slow_endpoint_delays_no_other(make_backend, autojump_clock) -> None:
    app = nj.App()
    app.queue("webhook", max_workers=8, timeout=30)
    running: dict[int, int] = {}
    peak: dict[int, int] = {}
    started: dict[int, list[float]] = {}
    order: dict[int, list[int]] = {}

    @app.job(queue="webhook", concurrency_key=lambda args: f"endpoint:{args['endpoint_id']}", max_concurrent=1)
    async def deliver(ctx: nj.JobContext, endpoint_id: int, n: int) -> None:
        running[endpoint_id] = running.get(endpoint_id, 0) + 1
        peak[endpoint_id] = max(peak.get(endpoint_id, 0), running[endpoint_id])
        started.setdefault(endpoint_id, []).append(trio.current_time())
        order.setdefault(endpoint_id, []).append(n)
        try:
            await trio.sleep(10 if endpoint_id == 0 else 1)  # endpoint 0 is slow
        finally:
            running[endpoint_id] -= 1

    async with nj.open_runtime(app, backend=make_backend(), grace=0) as rt:
        t0 = trio.current_time()
        slow = await deliver.enqueue_many([{"endpoint_id": 0, "n": n} for n in range(5)])
        fast = await deliver.enqueue_many([{"endpoint_id": e, "n": n} for n in range(3) for e in (1, 2, 3)])
        for job_id in fast:
            assert (await rt.wait(job_id, timeout=30)).state is nj.JobState.COMPLETED
        fast_done = trio.current_time() - t0
        for job_id in slow:
            assert (await rt.wait(job_id, timeout=60)).state is nj.JobState.COMPLETED
        stats = (await rt.stats())["webhook"]
    assert peak == {0: 1, 1: 1, 2: 1, 3: 1}
    assert order == {e: list(range(5 if e == 0 else 3)) for e in range(4)}  # enqueue order per key
    assert fast_done < started[0][-1] - t0  # none waited behind the slow endpoint's backlog
    gaps = [b - a - 10 for a, b in zip(started[0], started[0][1:])]
    assert all(0 <= gap < 30 for gap in gaps), gaps  # each starts once the last ended, woken
    assert stats.failed_attempts == 0 and stats.completed == 14


async def test_global_max_workers_bounds_the_queue_across_runtimes(store, autojump_clock) -> None:
    """Two runtimes on one store, as two processes, each with 4 workers: at most 3 run at once."""
    app = nj.App()
    app.queue("q", max_workers=4, timeout=30, global_max_workers=3)
    now_running = 0
    peak = 0

    @app.job(queue="q")
    async def unit(ctx: nj.JobContext, n: int) -> None:
        nonlocal now_running, peak
        now_running += 1
        peak = max(peak, now_running)
        try:
            await trio.sleep(1)
        finally:
            now_running -= 1

    async with nj.open_runtime(app, backend=store.open(), grace=0) as one, nj.open_runtime(
        app, backend=store.open(), grace=0
    ):
        ids = await one.enqueue_many("unit", [{"n": n} for n in range(12)])
        for job_id in ids:
            assert (await one.wait(job_id, timeout=60)).state is nj.JobState.COMPLETED
    assert peak == 3


async def test_global_max_workers_in_one_runtime_starts_the_next_job_as_one_ends(make_backend, autojump_clock) -> None:
    app = nj.App()
    app.queue("q", max_workers=5, timeout=30, global_max_workers=2)
    spans: list[tuple[float, float]] = []

    @app.job(queue="q")
    async def unit(ctx: nj.JobContext, n: int) -> None:
        start = trio.current_time()
        await trio.sleep(1)
        spans.append((start, trio.current_time()))

    async with nj.open_runtime(app, backend=make_backend(), grace=0) as rt:
        ids = await unit.enqueue_many([{"n": n} for n in range(6)])
        for job_id in ids:
            assert (await rt.wait(job_id, timeout=300)).state is nj.JobState.COMPLETED
    spans.sort()
    assert max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans) == 2  # never 3 at once
    ends = sorted(b for _, b in spans)
    waits = [start - ends[i] for i, (start, _) in enumerate(spans[2:])]  # the i-th end freed a slot
    assert all(0 <= w < 30 for w in waits), waits


async def test_a_key_function_that_raises_is_an_args_error_naming_the_kind(make_backend, autojump_clock) -> None:
    app = nj.App()

    @app.job(concurrency_key=lambda args: f"endpoint:{args['endpoint_id']}")
    async def deliver(ctx: nj.JobContext, **args: Any) -> None:
        return None

    async with nj.open_runtime(app, backend=make_backend(), grace=0) as rt:
        with pytest.raises(nj.ArgsError, match="concurrency_key function of job 'deliver' raised KeyError"):
            await deliver.enqueue(other=1)
        with pytest.raises(nj.ArgsError, match="concurrency key of job 'deliver'"):
            await rt.enqueue_many("deliver", [{"endpoint_id": 1}, {"endpoint_id": "\x00"}])
        assert (await rt.stats())["default"].available == 0  # the batch was refused whole


@pytest.mark.parametrize("limited", ["concurrency_key", "rate"])
async def test_under_global_max_workers_a_key_refused_in_the_pick_holds_back_no_unlimited_job(
    make_backend, autojump_clock, limited
) -> None:
    """A queue with `global_max_workers` 5 and 5 workers: 3 jobs of one key first in claim
    order (a limit of 1 at once, or 1 start per 100 s), then 4 jobs with no limit. The claim
    due at 1 s starts one of the key's jobs and all 4 others: the room is 5, and only the key
    refuses the rest. A claim cut short by a key or a rate is not a full queue (it looks again
    at once); one cut short by the room is (the peak stays 5)."""
    app = nj.App()
    app.queue("q", max_workers=5, timeout=300, global_max_workers=5)
    started: list[str | None] = []
    now_running = 0
    peak = 0
    key = lambda args: args["key"]  # noqa: E731 - None for the jobs with no limit
    limits: dict[str, Any] = (
        {"concurrency_key": key, "max_concurrent": 1} if limited == "concurrency_key" else {"rate": nj.Rate(1, per=100), "rate_key": key}
    )

    @app.job(queue="q", **limits)
    async def work(ctx: nj.JobContext, key: str | None, n: int) -> None:
        nonlocal now_running, peak
        started.append(key)
        now_running += 1
        peak = max(peak, now_running)
        try:
            await trio.sleep(50)
        finally:
            now_running -= 1

    async with nj.open_runtime(app, backend=make_backend(), grace=0) as rt:
        # Due in 1 s: one claim finds them all due at once (a wake-up of the insert, or its
        # NOTIFY heard back, claims before they are due and sets the fetcher's timer to 1 s).
        ids = await rt.enqueue_many(
            work, [{"key": "k", "n": n} for n in range(3)] + [{"key": None, "n": n} for n in range(4)], delay=1
        )
        await trio.sleep(6)  # far less than a poll (60 s), the rate's slot (100 s) or a job (50 s)
        assert started.count("k") == 1 and started.count(None) == 4, started
        for job_id in ids:
            assert (await rt.wait(job_id, timeout=600)).state is nj.JobState.COMPLETED
    assert peak == 5
