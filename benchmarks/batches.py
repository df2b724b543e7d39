"""Batch handler benchmark: throughput of a batch kind (`max_size` 20 and 100) against the same
work done as single jobs, on each backend, in one run.

What it measures, per backend (PostgreSQL, SQLite, memory):

- A table pre-filled with N jobs of one kind, `work`, in one queue (PostgreSQL and SQLite: rows
  inserted directly, then `ANALYZE`d; memory: `insert_many`), drained by one runtime of W
  workers until M jobs completed; jobs per second from the first handler call's return to the
  moment the backend reports the outcomes of the first M written (the jobs of the first call
  not counted), so a batch is counted once its outcomes are stored, not when it is handed out. The same rows serve each side; only the declaration of `work` differs: a plain
  `@app.job` (one job per call), or an `@app.batch_job` of `max_size` 20 or 100 (`max_wait`
  0.05 s: a backlog fills every batch, so the wait never runs).
- The work is one call per handler invocation to a service with a fixed round trip
  (`Sizes.work_ms`, 0 and 1: no work at all, the runtime's own cost; and a 1 ms bulk
  request, which a single job pays once per job and a batch once per batch).
- Rounds alternate the sides, each on a freshly filled table; figures are medians over rounds,
  and each batch side is also given as a ratio of the single side measured in the same round.

Usage (PostgreSQL on 127.0.0.1:5432, or the admin URL in NJ_BENCH_PG_URL; the script creates
and drops its own database):

    .venv/bin/python benchmarks/batches.py
    .venv/bin/python benchmarks/batches.py --smoke   # tiny sizes: only proves it runs

Results are recorded in benchmarks/RESULTS.md ("Batch handlers"). Speed is never asserted in
tests.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import attrs
import trio

import nursery_jobs as nj

try:  # imported as `benchmarks.batches`
    from .per_backend import JOB_COLUMNS, add_backend_options, backlog, measure_each_backend, sizes_from
    from .pg_common import PgUnavailable, render_table
except ImportError:  # run as a script: benchmarks/ is sys.path[0]
    from per_backend import JOB_COLUMNS, add_backend_options, backlog, measure_each_backend, sizes_from  # type: ignore[no-redef]
    from pg_common import PgUnavailable, render_table  # type: ignore[no-redef]

QUEUE = "bench"
SCHEMA = "batches"


@attrs.frozen
class Sizes:
    jobs: int = 24_000
    """Pre-filled backlog per run."""
    measured: int = 12_000
    """Completions measured per run of a batch side (the backlog stays large while counted)."""
    single_measured: int = 4_000
    """Completions measured per run of the single side."""
    workers: int = 8
    rounds: int = 2
    batch_sizes: tuple[int, ...] = (20, 100)
    work_ms: tuple[float, ...] = (0.0, 1.0)
    backends: tuple[str, ...] = ("postgres", "sqlite", "memory")


SMOKE = Sizes(jobs=400, measured=200, single_measured=100, workers=4, rounds=1, work_ms=(0.0,))


class Box:
    """Shared by a run's handlers and its main (one Trio thread): jobs counted as each handler
    call returns."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.calls = 0
        self.first = 0.0
        self.first_jobs = 0
        self.done = trio.Event()

    def ran(self, n: int) -> None:
        if self.calls == 0:
            self.first, self.first_jobs = time.perf_counter(), n
        self.count += n
        self.calls += 1
        if self.count >= self.target:
            self.done.set()


def build_app(workers: int, batch: int | None, work_ms: float, box: Box) -> nj.App:
    app = nj.App()
    app.queue(QUEUE, max_workers=workers, timeout=60)

    async def round_trip() -> None:
        if work_ms:
            await trio.sleep(work_ms / 1000)
        else:
            await trio.lowlevel.checkpoint()

    if batch is None:

        @app.job(queue=QUEUE, name="work")
        async def single(ctx: nj.JobContext, **args: Any) -> None:
            await round_trip()
            box.ran(1)

    else:

        @app.batch_job(queue=QUEUE, name="work", max_size=batch, max_wait=0.05)
        async def batched(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Any]]) -> None:
            await round_trip()
            box.ran(len(jobs))

    return app


# -- filling --


def backlog_rows(n: int) -> list[tuple[Any, ...]]:
    """`n` due `work` jobs, oldest first (the columns are JOB_COLUMNS)."""
    now = time.time() - 60
    return [("work", QUEUE, "{}", "available", 25, 0, now + g * 1e-6, now) for g in range(1, n + 1)]


# -- one drain --


def drain(backend: str, target: str, s: Sizes, batch: int | None, work_ms: float) -> tuple[float, int]:
    """(jobs per second, handler calls) for one freshly filled backlog."""
    box = Box(s.single_measured if batch is None else s.measured)
    app = build_app(s.workers, batch, work_ms, box)
    where = backlog(backend, target, SCHEMA, JOB_COLUMNS, backlog_rows(s.jobs))

    async def main(rt: nj.Runtime) -> tuple[float, int]:
        with trio.fail_after(600):
            await box.done.wait()
            returned = box.count
            while (await rt.stats())[QUEUE].completed < returned:  # their outcomes written too
                await trio.sleep(0.001)
        end = time.perf_counter()
        # From the first call's return: the jobs of every later return, written.
        return (returned - box.first_jobs) / max(end - box.first, 1e-9), box.calls

    result = nj.run(main, app=app, backend=where, grace=0.0)
    assert result is not None  # None only when a signal ended the run
    return result


# -- the run --


def measure(backend: str, target: str, s: Sizes, log: Callable[[str], None]) -> list[list[str]]:
    rows = []
    for work_ms in s.work_ms:
        rates: dict[int | None, list[float]] = {b: [] for b in (None, *s.batch_sizes)}
        ratios: dict[int, list[float]] = {b: [] for b in s.batch_sizes}
        for r in range(s.rounds):
            single, _ = drain(backend, target, s, None, work_ms)
            rates[None].append(single)
            line = [f"  {backend} work {work_ms:g} ms round {r + 1}: single {single:,.0f}/s"]
            for size in s.batch_sizes:
                rate, calls = drain(backend, target, s, size, work_ms)
                rates[size].append(rate)
                ratios[size].append(rate / single)
                line.append(f"batch {size} {rate:,.0f}/s ({rate / single:.1f}x, {calls} calls)")
            log(", ".join(line))
        row = [backend, f"{work_ms:g} ms", f"{statistics.median(rates[None]):,.0f}"]
        for size in s.batch_sizes:
            row.append(f"{statistics.median(rates[size]):,.0f} ({statistics.median(ratios[size]):.1f}x)")
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_backend_options(parser, "rounds per side (default 2)")
    s = sizes_from(parser.parse_args(argv), Sizes(), SMOKE)
    print(
        f"batch handlers: {s.jobs:,} jobs pre-filled, {s.workers} workers, batch sizes {s.batch_sizes}, "
        f"work {s.work_ms} ms per call, {s.rounds} round(s); load before: {os.getloadavg()[0]:.2f}"
    )
    started = time.perf_counter()
    try:
        rows = measure_each_backend(s.backends, "batches", lambda backend, target: measure(backend, target, s, print))
    except PgUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    header = ["backend", "work per call", "single jobs/s", *(f"batch {b} jobs/s (x single)" for b in s.batch_sizes)]
    print()
    print(render_table([header, *rows]))
    print(f"\n({time.perf_counter() - started:.0f} s; load after: {os.getloadavg()[0]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
