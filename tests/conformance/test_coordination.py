"""Periodic jobs and locks end to end: runtimes sharing one store (as processes sharing a
database; on memory, two runtimes on one instance) enqueue each tick once and hold a lock one at
a time."""

from __future__ import annotations

from typing import Any

import trio

import nursery_jobs as nj


def _instances(test_backend: Any, request: Any) -> list[nj.Backend]:
    made = test_backend.new_store(request)
    first = made.open()
    return [first, made.open()] if made.shared else [first, first]


async def test_two_runtimes_on_one_store_hold_a_lock_one_at_a_time(test_backend, request, autojump_clock) -> None:
    a, b = _instances(test_backend, request)
    events: list[str] = []
    async with nj.open_runtime(nj.App(), backend=a, queues=[]) as rt_a, nj.open_runtime(nj.App(), backend=b, queues=[]) as rt_b:

        async def hold(rt: nj.Runtime, tag: str) -> None:
            for _ in range(2):
                async with rt.lock("shared", ttl=30, timeout=600):
                    events.append(f"{tag}+")
                    await trio.sleep(40)  # past its ttl: renewed
                    events.append(f"{tag}-")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold, rt_a, "a")
            nursery.start_soon(hold, rt_b, "b")
    assert len(events) == 8
    assert all(events[i][0] == events[i + 1][0] and events[i][1] == "+" for i in range(0, 8, 2)), events


async def test_two_runtimes_on_one_store_enqueue_each_tick_once(test_backend, request, autojump_clock) -> None:
    a, b = _instances(test_backend, request)
    app = nj.App()

    @app.periodic("*/5 * * * * *")
    @app.job()
    async def tick(ctx: nj.JobContext) -> None:
        pass

    async with nj.open_runtime(app, backend=a) as rt_a, nj.open_runtime(app, backend=b, queues=[]):
        await trio.sleep(31)
        (info,) = await rt_a.periodic()
        stats = (await rt_a.stats())["default"]
    done = stats.completed + stats.queued + stats.running
    assert 1 <= done <= 7 and info.last_job_id is not None  # at most one job per 5 s tick in 31 s
