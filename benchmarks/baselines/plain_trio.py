"""The throughput baseline: the runtime's work, done by hand in plain Trio.

K workers pull no-op items from one memory channel; each call runs inside `trio.fail_after`
(the per-job timeout) and a try/except (the per-job error capture). That is the least any job
runtime on Trio has to do per job, so `runtime jobs/s / baseline items/s` says what the runtime's
bookkeeping costs: claiming, the attempt scope, the context, outcomes written through the
completer. The items are all sent before the clock stops, as `enqueue_many` does.
"""

from __future__ import annotations

import math
import time

import trio

__all__ = ["run_baseline"]


async def _noop(item: int) -> None:
    return None


async def _baseline(n: int, workers: int, timeout: float) -> tuple[float, float]:
    send, receive = trio.open_memory_channel[int](math.inf)
    done = 0
    failed = 0

    async def worker(items: trio.MemoryReceiveChannel[int]) -> None:
        nonlocal done, failed
        async with items:
            async for item in items:
                try:
                    with trio.fail_after(timeout):
                        await _noop(item)
                except Exception:
                    failed += 1
                done += 1

    started, cpu_started = trio.current_time(), time.process_time()
    async with trio.open_nursery() as nursery:
        for _ in range(workers):
            nursery.start_soon(worker, receive.clone())
        receive.close()
        async with send:
            for i in range(n):
                send.send_nowait(i)
    elapsed, cpu = trio.current_time() - started, time.process_time() - cpu_started
    if done != n or failed:
        raise RuntimeError(f"baseline processed {done} of {n} items, {failed} failed")
    return elapsed, cpu


def run_baseline(n: int, workers: int, timeout: float = 30.0) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) that `workers` plain-Trio workers take to
    process `n` no-op items."""
    return trio.run(_baseline, n, workers, timeout)
