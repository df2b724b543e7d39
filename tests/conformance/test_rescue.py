"""Crash safety: heartbeats, rescue of stale running jobs, fencing of late workers."""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import Outcome, OutcomeKind

FAST = nj.RuntimeSettings(heartbeat_interval=1, rescue_after=5, rescue_interval=1)


async def test_a_job_claimed_by_a_dead_worker_is_rescued_and_runs(make_backend, autojump_clock):
    app = nj.App()
    runs = []

    @app.job()
    async def work(ctx: nj.JobContext) -> None:
        runs.append(ctx.attempt)

    backend = make_backend()
    await backend.open()
    [res] = await backend.insert_many([_new("work")])
    claimed = await backend.claim("default", 1)  # a worker that then dies without a word
    assert [j.id for j in claimed.jobs] == [res.id]
    async with nj.open_runtime(app, backend=backend, settings=FAST) as rt:
        t0 = trio.current_time()
        receipt = await rt.wait(res.id, timeout=30)
        waited = trio.current_time() - t0
        job = await rt.get_job(res.id)
    assert receipt.state is nj.JobState.COMPLETED and runs == [2]
    assert 5 <= waited <= 5 + 2  # rescue_after, plus at most one rescue interval and a heartbeat
    assert job.errors[0].message.startswith("rescued: its worker stopped heartbeating")
    # the late worker's outcome is fenced off: it cannot overwrite the finished job
    await backend.finish_many([Outcome(res.id, 1, OutcomeKind.RETRY, None, None)])
    assert (await backend.get_job(res.id)).state is nj.JobState.COMPLETED


async def test_heartbeats_keep_a_long_job_from_being_rescued(make_backend, autojump_clock):
    app = nj.App()
    starts = []

    @app.job(timeout=None)
    async def long(ctx: nj.JobContext) -> None:
        starts.append(ctx.attempt)
        await trio.sleep(30)

    async with nj.open_runtime(app, backend=make_backend(), settings=FAST) as rt:
        receipt = await rt.wait(await long.enqueue(), timeout=60)
    assert receipt.state is nj.JobState.COMPLETED and starts == [1]


async def test_a_worker_that_lost_its_job_cancels_it(make_backend, autojump_clock):
    app = nj.App()
    log = []

    @app.job(timeout=None)
    async def long(ctx: nj.JobContext) -> None:
        log.append(("start", ctx.attempt, trio.current_time()))
        try:
            await trio.sleep(30)
        except trio.Cancelled:
            log.append(("cancelled", ctx.attempt, trio.current_time()))
            raise

    backend = make_backend()
    async with nj.open_runtime(app, backend=backend, settings=FAST) as rt:
        job_id = await long.enqueue()
        await trio.sleep(0.5)
        # Someone else decided this worker was dead (say, a paused VM): it rescues the job.
        assert await backend.rescue(backend.now() + 1) == [job_id]
        receipt = await rt.wait(job_id, timeout=100)
    kinds = [(k, a) for k, a, _ in log]
    # attempt 1 is cancelled at the next heartbeat; the rescued job runs again as attempt 2
    assert kinds[:2] == [("start", 1), ("start", 2)] or kinds[:2] == [("start", 1), ("cancelled", 1)]
    assert ("cancelled", 1) in kinds and ("start", 2) in kinds
    cancelled_at = next(t for k, a, t in log if k == "cancelled")
    assert cancelled_at <= 0.5 + FAST.heartbeat_interval + 0.01
    assert receipt.state is nj.JobState.COMPLETED


async def test_cancel_request_reaches_a_job_through_the_heartbeat(make_backend, autojump_clock):
    # A cancel written by another process arrives as a flag on the row, not as an in-process
    # event: the heartbeat picks it up.
    app = nj.App()

    @app.job(timeout=None)
    async def long(ctx: nj.JobContext) -> None:
        await trio.sleep(3600)

    backend = make_backend()
    async with nj.open_runtime(app, backend=backend, settings=FAST) as rt:
        job_id = await long.enqueue()
        await trio.sleep(0.5)
        rt.backend.remove_listener(rt._on_event)  # deaf to in-process events, like a peer
        try:
            assert await backend.cancel(job_id) is nj.JobState.RUNNING
            t0 = trio.current_time()
            while (await backend.get_job(job_id)).state is nj.JobState.RUNNING:
                await trio.sleep(0.25)
        finally:
            rt.backend.add_listener(rt._on_event)
        assert trio.current_time() - t0 <= FAST.heartbeat_interval + 0.5
        assert (await backend.get_job(job_id)).state is nj.JobState.CANCELLED


def test_rescue_after_must_leave_room_for_heartbeats():
    with pytest.raises(nj.ConfigError, match="at least 3 x heartbeat_interval"):
        nj.RuntimeSettings(heartbeat_interval=10, rescue_after=20)


def _new(kind: str):
    from nursery_jobs.backends import NewJob

    return NewJob(kind, "default", "{}", 0, None, 25)


async def test_retention_deletes_final_jobs_by_age_keeping_discarded_longest(make_backend, autojump_clock):
    app = nj.App()

    @app.job(max_attempts=1)
    async def outcome(ctx: nj.JobContext, fail: bool) -> None:
        if fail:
            raise ValueError("no")

    settings = nj.RuntimeSettings(
        keep_completed=100,
        keep_cancelled=100,
        keep_discarded=1000,
        retention_interval=100,
        heartbeat_interval=100,  # few timer wake-ups: each costs real time on durable backends
        rescue_after=300,
        rescue_interval=300,
    )
    async with nj.open_runtime(app, backend=make_backend(), settings=settings) as rt:
        ok = await outcome.enqueue(fail=False)
        bad = await outcome.enqueue(fail=True)
        gone = await outcome.options(delay=5000).enqueue(fail=False)
        await rt.cancel(gone)
        for job_id in (ok, bad):
            await rt.wait(job_id, timeout=5)
        await trio.sleep(250)  # retention ran at +100 (nothing old enough) and at +200
        with pytest.raises(nj.JobNotFound):
            await rt.get_job(ok)
        with pytest.raises(nj.JobNotFound):
            await rt.get_job(gone)
        assert (await rt.get_job(bad)).state is nj.JobState.DISCARDED
        stats = (await rt.stats())["default"]
        assert (stats.completed, stats.cancelled, stats.discarded, stats.failed_attempts) == (0, 0, 1, 1)
        await trio.sleep(1000)
        with pytest.raises(nj.JobNotFound):
            await rt.get_job(bad)
        assert (await rt.stats())["default"].failed_attempts == 0


async def test_retention_deletes_a_backlog_in_short_batches(make_backend, autojump_clock, monkeypatch):
    from nursery_jobs.services import retention

    monkeypatch.setattr(retention, "RETENTION_BATCH", 40)
    app = nj.App()
    app.queue("bulk", max_workers=10, timeout=None)

    @app.job(queue="bulk")
    async def noop(ctx: nj.JobContext, n: int) -> None:
        pass

    settings = nj.RuntimeSettings(
        keep_completed=10, retention_interval=100, heartbeat_interval=100, rescue_after=300, rescue_interval=300
    )
    backend = make_backend()
    calls = []
    delete_finished = backend.delete_finished

    async def counted(before, limit):
        deleted = await delete_finished(before, limit)
        calls.append((limit, deleted))
        return deleted

    backend.delete_finished = counted
    async with nj.open_runtime(app, backend=backend, settings=settings) as rt:
        ids = await noop.enqueue_many([{"n": n} for n in range(130)])
        for job_id in ids:
            assert (await rt.wait(job_id, timeout=50)).done
        await trio.sleep(150)  # retention at +100 finds the backlog
        assert (await rt.stats())["bulk"].completed == 0
    # four calls of at most 40 each (the last short one ends the sweep), none larger
    assert calls[:4] == [(40, 40), (40, 40), (40, 40), (40, 10)]
