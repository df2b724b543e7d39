"""Executor regressions found by the property suite, pinned as plain examples."""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj


class RoundTripBackend(nj.MemoryBackend):
    """Memory, but claims and writes take time, as on a durable backend."""

    async def claim(self, queue, limit):
        result = await super().claim(queue, limit)
        await trio.sleep(0.01)
        return result

    async def finish_many(self, outcomes):
        await trio.sleep(0.005)
        await super().finish_many(outcomes)


async def test_a_retry_scheduled_while_a_claim_is_in_flight_is_not_lost(autojump_clock):
    # The retry's wake-up (due in 1 s) lands during the fetcher's claim round trip; the claim's
    # answer, read before the retry was written, must not overwrite it.
    app = nj.App()
    app.queue("q", max_workers=1, timeout=None)
    starts = []

    @app.job(queue="q", max_attempts=3, retry=nj.RetryPolicy(base=1, factor=1, cap=1, jitter=0))
    async def flaky(ctx: nj.JobContext) -> None:
        starts.append(trio.current_time())
        raise RuntimeError("boom")

    async with nj.open_runtime(app, backend=RoundTripBackend(), grace=0) as rt:
        job_id = await rt.enqueue("flaky", {})
        await trio.sleep(10)
        assert (await rt.get_job(job_id)).state is nj.JobState.DISCARDED
    # each retry starts its 1 s backoff plus one claim round trip after the failure before it
    # (the first start depends on whether the start-up claim was in flight: not checked)
    assert len(starts) == 3
    assert [round(b - a, 3) for a, b in zip(starts, starts[1:])] == [1.01, 1.01]


class HeartbeatFailsBackend(nj.MemoryBackend):
    """A backend whose heartbeat writes fail, as when the database is unreachable."""

    async def heartbeat(self, running):
        raise ConnectionError("database unreachable")


class HeartbeatHangsBackend(nj.MemoryBackend):
    """A backend whose heartbeat call never answers, as over a network partition that drops
    packets without resetting the connection."""

    async def heartbeat(self, running):
        await trio.sleep_forever()


@pytest.mark.parametrize("backend_class", [HeartbeatFailsBackend, HeartbeatHangsBackend], ids=["fails", "hangs"])
async def test_a_worker_that_cannot_renew_its_heartbeat_cancels_the_job(backend_class, autojump_clock, caplog):
    app = nj.App()
    log = []

    @app.job(timeout=None)
    async def long(ctx: nj.JobContext) -> None:
        try:
            await trio.sleep(3600)
        finally:
            log.append((ctx.cancel_reason, trio.current_time()))

    settings = nj.RuntimeSettings(heartbeat_interval=1, rescue_after=10, rescue_interval=100)
    async with nj.open_runtime(app, backend=backend_class(), settings=settings, grace=0):
        t0 = trio.current_time()
        await long.enqueue()
        await trio.sleep(20)
    # cancelled before anyone could rescue it: at rescue_after / 2 after the last good
    # heartbeat, whether the calls fail or never answer
    reason, at = log[0]
    assert reason == "lost" and at - t0 <= 10 / 2 + 1e-6
    assert "no heartbeat for 5 s (rescue_after is 10 s): cancelling this process's running jobs" in caplog.text


class SlowRetentionBackend(nj.MemoryBackend):
    """Retention and rescue that take long (a big DELETE after downtime)."""

    def __init__(self):
        super().__init__()
        self.beats: list[float] = []

    async def delete_finished(self, before, limit):
        await trio.sleep(30)
        return await super().delete_finished(before, limit)

    async def rescue(self, stale_before):
        await trio.sleep(30)
        return await super().rescue(stale_before)

    async def heartbeat(self, running):
        self.beats.append(trio.current_time())
        return await super().heartbeat(running)


async def test_slow_rescue_and_retention_never_delay_a_heartbeat(autojump_clock):
    app = nj.App()

    @app.job(timeout=None)
    async def long(ctx: nj.JobContext) -> None:
        await trio.sleep(50)

    settings = nj.RuntimeSettings(heartbeat_interval=1, rescue_after=10, rescue_interval=5, retention_interval=5)
    backend = SlowRetentionBackend()
    async with nj.open_runtime(app, backend=backend, settings=settings, grace=0) as rt:
        job_id = await long.enqueue()
        assert (await rt.wait(job_id, timeout=100)).state is nj.JobState.COMPLETED
    gaps = [b - a for a, b in zip(backend.beats, backend.beats[1:])]
    assert len(backend.beats) >= 45 and max(gaps) <= 1 + 1e-6


async def test_memory_backend_keeps_a_bounded_number_of_final_jobs(autojump_clock):
    app = nj.App()

    @app.job()
    async def noop(ctx: nj.JobContext) -> None:
        pass

    backend = nj.MemoryBackend(max_final_jobs=10)
    async with nj.open_runtime(app, backend=backend) as rt:
        ids = await noop.enqueue_many([{}] * 25)
        assert (await rt.wait(ids[-1], timeout=5)).done
        await trio.sleep(1)
        assert (await rt.stats())["default"].completed == 10
        assert (await rt.get_job(ids[-1])).state is nj.JobState.COMPLETED
        with pytest.raises(nj.JobNotFound):
            await rt.get_job(ids[0])


async def test_receipt_from_another_process_on_sqlite_arrives_within_a_poll(tmp_path):
    # Two backend instances on one file behave like two processes: no in-process events cross.
    from nursery_jobs.backends.sqlite import SqliteBackend

    app = nj.App()

    @app.job()
    async def work(ctx: nj.JobContext) -> None:
        await trio.sleep(0.05)

    path = str(tmp_path / "jobs.db")
    web_backend, worker_backend = SqliteBackend(path), SqliteBackend(path)
    web_backend.poll_interval = worker_backend.poll_interval = 0.05
    async with nj.open_runtime(app, backend=worker_backend):
        async with nj.open_runtime(app, backend=web_backend, queues=[]) as web:
            job_id = await work.enqueue()
            t0 = trio.current_time()
            receipt = await web.wait(job_id, timeout=20)
            assert receipt.state is nj.JobState.COMPLETED
            assert trio.current_time() - t0 < 10  # not the full timeout: the waiter re-read it


class ShutdownAfterHandOffBackend(nj.MemoryBackend):
    """Begins the runtime's shutdown at the first `now()` after a claim that took a job. The
    fetcher reads `now()` at the top of its loop, synchronously after handing the claimed jobs to
    idle workers' mailboxes and before any worker ran: the order of a shutdown signal that lands
    between the hand-off and the worker's wake-up (as `run()`'s first signal can)."""

    def __init__(self) -> None:
        super().__init__()
        self.runtime: nj.Runtime | None = None
        self.armed = False
        self.fired_at: float | None = None

    async def claim(self, queue, limit):
        result = await super().claim(queue, limit)
        if result.jobs and self.runtime is not None and self.fired_at is None:
            self.armed = True
        return result

    def now(self) -> float:
        if self.armed:
            self.armed = False
            assert self.runtime is not None
            self.fired_at = trio.current_time()
            self.runtime.begin_shutdown()
        return super().now()


async def test_a_job_handed_to_a_worker_but_not_started_when_shutdown_begins_is_given_back(autojump_clock):
    # Flaky before: tests/unit/test_run.py::test_first_signal_stops_claiming_while_main_still_unwinds
    # saw a job start after main had seen its Cancelled. Nothing may start once shutdown began.
    app = nj.App()
    app.queue("q", max_workers=1, timeout=30)
    started = []

    @app.job(queue="q")
    async def work(ctx: nj.JobContext) -> None:
        started.append(trio.current_time())

    backend = ShutdownAfterHandOffBackend()
    async with nj.open_runtime(app, backend=backend, grace=5) as rt:
        backend.runtime = rt
        job_id = await work.enqueue()
        await trio.sleep(1)
    assert backend.fired_at is not None, "the planted shutdown never ran: the test proves nothing"
    assert started == []
    job = await backend.get_job(job_id)
    assert job.state is nj.JobState.AVAILABLE and job.attempt == 0  # given back, attempt and all
