"""The client's side of a bounded queue (`Client._insert_bounded`): a crowd of enqueues waiting
on one full queue costs the store about one attempt per poll, not one per waiter, and an enqueue
that finds room wakes the others at once. The queue's rule itself is the backends' (contract and
conformance suites); here the store is the memory backend, counting the attempts."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.config import PUSH_POLL


class Counting(nj.MemoryBackend):
    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0

    async def insert_many(self, jobs: Any, bounds: Any = None) -> Any:
        if bounds:
            self.attempts += 1
        return await super().insert_many(jobs, bounds)


def app_of(push_timeout: float, max_length: int = 1) -> tuple[nj.App, nj.JobKind]:
    app = nj.App()
    app.queue("bounded", max_workers=1, max_length=max_length, push_timeout=push_timeout)

    @app.job(queue="bounded")
    async def work(ctx: nj.JobContext, n: int) -> None:
        pass

    return app, work


async def test_a_crowd_of_waiters_polls_the_store_about_once_per_poll(autojump_clock) -> None:
    app, work = app_of(push_timeout=10.0)
    backend = Counting()
    refused = 0
    async with nj.open_runtime(app, backend=backend, queues=[]):
        await work.enqueue(n=0)
        backend.attempts = 0

        async def waiter(n: int) -> None:
            nonlocal refused
            with pytest.raises(nj.QueueFull):
                await work.enqueue(n=n)
            refused += 1

        async with trio.open_nursery() as nursery:
            for n in range(50):
                nursery.start_soon(waiter, n)
    assert refused == 50
    # Alone, one waiter makes about 10 s / 0.25 s = 40 polls after its first try; 50 of them
    # would make 2,000. Together: their 50 first tries, then about one poll per 0.25 s each.
    assert backend.attempts <= 50 + 3 * (10.0 / PUSH_POLL[1]), backend.attempts


async def test_an_enqueue_that_finds_room_wakes_the_others(autojump_clock) -> None:
    app, work = app_of(push_timeout=10.0, max_length=2)  # two can get in at once
    async with nj.open_runtime(app, backend=nj.MemoryBackend(), queues=[]) as rt:
        held = [await work.enqueue(n=0), await work.enqueue(n=1)]
        done: list[float] = []

        async def waiter(n: int, start: float) -> None:
            await trio.sleep(start)  # staggered: their own polls never fall at one time
            await work.enqueue(n=n)
            done.append(trio.current_time())

        async with trio.open_nursery() as nursery:
            for n, start in enumerate((0.0, 0.07, 0.13)):
                nursery.start_soon(waiter, n + 2, start)
            await trio.sleep(5)  # every waiter is at its longest poll delay now
            t0 = trio.current_time()
            for job_id in held:
                await rt.cancel(job_id)
            with trio.fail_after(1):
                while len(done) < 2:
                    await trio.sleep(0.001)
            nursery.cancel_scope.cancel()
    # The first to poll got in and woke the others: the second got in at the same moment.
    assert done[0] - t0 <= PUSH_POLL[1] and done[1] - done[0] < 0.005
