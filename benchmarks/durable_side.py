"""The runtime side both durable-backend benchmarks measure the same way: the no-op and probe
job kinds with their tally, `nj.run` with no grace, and the idle enqueue -> start / receipt
probe loop. No database imports (each script brings its own baselines)."""

from __future__ import annotations

import time
from typing import Any, Callable

import trio

import nursery_jobs as nj

__all__ = ["JOB_TIMEOUT", "QUEUE", "Tally", "add_bench_kinds", "idle_latency", "run_app"]

QUEUE = "bench"
JOB_TIMEOUT = 30.0


class Tally:
    """Shared between a run's handlers and its main (one Trio thread)."""

    def __init__(self, target: int = 0) -> None:
        self.target = target
        self.count = 0
        self.last_id = 0
        self.done = trio.Event()
        self.started_at: dict[int, float] = {}


def add_bench_kinds(app: nj.App, workers: int) -> list[Tally]:
    """Declare the measured queue (`workers` workers) with its `noop` kind, which counts towards
    the tally's target, and `probe`, which records when it started. Returns the tally's box:
    replace ``box[0]`` to start a new count."""
    app.queue(QUEUE, max_workers=workers, timeout=JOB_TIMEOUT)
    box: list[Tally] = [Tally()]

    @app.job(queue=QUEUE)
    async def noop(ctx: nj.JobContext) -> None:
        tally = box[0]
        tally.count += 1
        if tally.count == tally.target:
            tally.last_id = ctx.id
            tally.done.set()

    @app.job(queue=QUEUE)
    async def probe(ctx: nj.JobContext) -> None:
        box[0].started_at[ctx.id] = time.perf_counter()

    return box


def run_app(main: Callable[[nj.Runtime], Any], app: nj.App, url: str, **kw: Any) -> Any:
    """`nj.run` with no grace; a run cut short by a signal stops the benchmark."""
    result = nj.run(main, app=app, backend=url, grace=0.0, **kw)
    if result is None:
        raise KeyboardInterrupt
    return result


async def idle_latency(rt: nj.Runtime, tally: Tally, probes: int) -> tuple[list[float], list[float]]:
    """(enqueue -> handler start, enqueue -> receipt) in seconds, `probes` sequential samples,
    each enqueued once the queue is idle again."""
    await trio.sleep(0.1)  # every worker parked, the first claim answered
    for _ in range(3):  # warm the connections: not measured
        await rt.wait(await rt.enqueue("probe"), timeout=5.0)
    starts: list[float] = []
    receipts: list[float] = []
    for _ in range(probes):
        await trio.sleep(0.005)  # idle again: the completer and the fetcher parked
        t0 = time.perf_counter()
        job_id = await rt.enqueue("probe")
        receipt = await rt.wait(job_id, timeout=5.0)
        t1 = time.perf_counter()
        if not receipt.done:
            raise RuntimeError(f"probe job {job_id} did not finish within 5 s: {receipt}")
        starts.append(tally.started_at.pop(job_id) - t0)
        receipts.append(t1 - t0)
    return starts, receipts
