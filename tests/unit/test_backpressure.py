"""Backpressure from the completer: a slow outcome write can never grow the number of running
rows, and no outcome batch grows without bound.

An outcome not yet written is a job still `running` in the backend. If finished jobs freed
their worker slot before their outcome was written, a slow write would let the fetcher claim
on and on: more rows running, each write slower, each batch larger (seen on an analyzed
PostgreSQL table: thousands of jobs left running after a clean shutdown). A queue stops
claiming while more than `max(max_workers, 32)` outcomes wait to be written; with the jobs it
claims ahead (at most `min(max_workers, 32)`), its running rows stay below the sum.
"""

from __future__ import annotations

from typing import Sequence

import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs.backends import Outcome
from nursery_jobs.execution.completer import MAX_BATCH
from nursery_jobs.execution.executor import OUTCOME_SLACK, PREFETCH_MAX, PREFETCH_PER_WORKER


class SlowWrites(nj.MemoryBackend):
    """Every outcome batch takes `delay` seconds to be written (a slow disk, a slow plan)."""

    never_yields = False

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.batches: list[int] = []
        self.peak_running = 0

    async def claim(self, queue: str, limit: int):  # type: ignore[no-untyped-def]
        result = await super().claim(queue, limit)
        self.peak_running = max(self.peak_running, len(self._running))
        return result

    async def finish_many(self, outcomes: Sequence[Outcome]) -> None:
        self.batches.append(len(outcomes))
        await trio.sleep(self.delay)
        await super().finish_many(outcomes)


def _app(workers: int) -> nj.App:
    app = nj.App()
    app.queue("q", max_workers=workers, timeout=None)

    @app.job(queue="q")
    async def quick(ctx: nj.JobContext) -> None:
        await trio.sleep(0.001)

    return app


@pytest.mark.parametrize("workers", [4, 64])
async def test_a_slow_write_never_lets_running_rows_pile_up(autojump_clock: trio.testing.MockClock, workers: int) -> None:
    backend = SlowWrites(delay=1.0)
    slack = max(workers, OUTCOME_SLACK)
    prefetch = min(PREFETCH_PER_WORKER * workers, PREFETCH_MAX)  # jobs claimed ahead, not started yet
    async with nj.open_runtime(_app(workers), backend=backend, grace=60) as rt:
        ids = await rt.enqueue_many("quick", [{}] * 2000)
        for job_id in ids:
            assert (await rt.wait(job_id, timeout=6000)).state is nj.JobState.COMPLETED
    # running in the backend = attempts in progress + jobs claimed ahead + outcomes not yet written
    assert backend.peak_running <= workers + prefetch + slack, backend.peak_running
    assert max(backend.batches) <= workers + prefetch + slack


async def test_an_outcome_batch_is_capped(autojump_clock: trio.testing.MockClock) -> None:
    workers = 3 * MAX_BATCH  # more unwritten outcomes at once than one batch may carry
    backend = SlowWrites(delay=1.0)
    app = nj.App()
    app.queue("q", max_workers=workers, timeout=None)

    @app.job(queue="q")
    async def noop(ctx: nj.JobContext) -> None:
        pass

    async with nj.open_runtime(app, backend=backend) as rt:
        ids = await rt.enqueue_many("noop", [{}] * workers)
        assert (await rt.wait(ids[-1], timeout=600)).done
    assert max(backend.batches) == MAX_BATCH and sum(backend.batches) == workers


async def test_an_outcome_waiting_to_be_written_keeps_its_row_from_being_rescued(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Until its outcome is written, a finished job is `running` in the backend: the process
    keeps heartbeating it, so another process does not rescue and run again a job that is done."""
    backend = SlowWrites(delay=20.0)  # far past rescue_after
    settings = nj.RuntimeSettings(heartbeat_interval=1.0, rescue_after=5.0, rescue_interval=1.0)
    ran: list[int] = []
    app = nj.App()
    app.queue("q", max_workers=2, timeout=None)

    @app.job(queue="q")
    async def once(ctx: nj.JobContext) -> None:
        ran.append(ctx.id)

    async with nj.open_runtime(app, backend=backend, settings=settings) as rt:
        # another process sharing the backend, doing only upkeep (rescue)
        async with nj.open_runtime(app, backend=backend, settings=settings, queues=[]):
            job_id = await rt.enqueue("once", {})
            receipt = await rt.wait(job_id, timeout=60)
            job = await rt.get_job(job_id)
    assert receipt.state is nj.JobState.COMPLETED
    assert ran == [job_id] and job.attempt == 1 and job.errors == ()
