"""The runtime side the durable-backend benchmarks measure the same way: the no-op and probe
job kinds with their tally, `nj.run` with no grace, the idle enqueue -> start / receipt probe
loop, and worker processes run as jobs of the measuring process. No database imports (each
script brings its own baselines)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import asynccontextmanager, nullcontext
from typing import IO, Any, AsyncIterator, Callable, ContextManager, Sequence

import trio

import nursery_jobs as nj

__all__ = [
    "JOB_TIMEOUT",
    "QUEUE",
    "Tally",
    "add_bench_kinds",
    "add_process_kinds",
    "idle_latency",
    "run_app",
    "serve_worker",
    "worker_processes",
]

QUEUE = "bench"
JOB_TIMEOUT = 30.0


class Tally:
    """Shared between a run's handlers and its main (one Trio thread)."""

    def __init__(self, target: int = 0) -> None:
        self.target = target
        self.count = 0
        self.last_id = 0
        self.first = 0.0
        """perf_counter() when the first no-op of this count started (a drain's clock)."""
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
        if tally.count == 1:
            tally.first = time.perf_counter()
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


def add_process_kinds(app: nj.App, script: str, launchers: int) -> None:
    """Declare what worker processes need: `ctl`, a queue nobody works, where a worker process
    enqueues a `ready` job once its runtime is up; and `launch`, whose jobs run
    ``script --worker URL --workers N`` with ``trio.run_process``, so the processes are owned and
    stopped by the runtime (a remote cancel of the job sends its process SIGTERM)."""
    app.queue("ctl", max_workers=1, timeout=JOB_TIMEOUT)
    app.queue("launch", max_workers=max(1, launchers), timeout=None)

    @app.job(queue="ctl")
    async def ready(ctx: nj.JobContext, pid: int) -> None:
        return None

    @app.job(queue="launch", max_attempts=1)
    async def launch(ctx: nj.JobContext, url: str, workers: int, log: str | None = None) -> None:
        cmd = [sys.executable, os.path.abspath(script), "--worker", url, "--workers", str(workers)]
        sink: ContextManager[IO[bytes] | None] = open(log, "wb") if log else nullcontext()
        with sink as err:
            await trio.run_process(cmd, check=False, stdin=subprocess.DEVNULL, stderr=err)


@asynccontextmanager
async def worker_processes(
    rt: nj.Runtime, url: str, workers: int, logs: Sequence[str | None]
) -> AsyncIterator[None]:
    """Run one worker process per entry of `logs` (its stderr file, or None), and wait until
    every one has reported ready (at most 60 s); on exit, stop them all with SIGTERM, a graceful
    shutdown, and wait for them (shielded, at most 60 s)."""

    async def ready() -> int:  # `ready` jobs wait on `ctl` for ever; count only the new ones
        counts = (await rt.stats()).get("ctl")
        return counts.available if counts else 0

    before = await ready()
    launchers = [await rt.enqueue("launch", {"url": url, "workers": workers, "log": log}) for log in logs]
    try:
        with trio.fail_after(60):
            while await ready() < before + len(logs):
                await trio.sleep(0.02)
        yield
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(60):
            for job_id in launchers:
                await rt.cancel(job_id)
            for job_id in launchers:
                await rt.wait(job_id, timeout=30.0)


def serve_worker(build_app: Callable[[int], tuple[nj.App, Any]], url: str, workers: int) -> int:
    """A script's ``--worker`` mode: work the bench queue until SIGTERM (sent when its launcher
    job is cancelled); enqueue a `ready` job on `ctl` once the runtime is up."""
    app, _box = build_app(workers)

    async def main(rt: nj.Runtime) -> None:
        await rt.enqueue("ready", {"pid": os.getpid()})
        await trio.sleep_forever()

    nj.run(main, app=app, backend=url, grace=5.0, queues=[QUEUE])
    return 0
