"""Enqueue cost into a bounded queue near full, against an unbounded queue, on every backend.

What it measures: one runtime with no workers, on a store pre-filled with 100,000 final jobs
(another queue; PostgreSQL and SQLite `ANALYZE`d after the fill) and, in each of the queues
"bounded" (`max_length=N`) and "free" (unbounded), N - M - 1 pending jobs, so that the M
enqueues of a round take the bounded queue to one short of full: every one of them pays the
full check (the lock and a count that reads N rows of the pending index) and none is refused.
Three sides, alternated in each round, each M single `kind.enqueue` calls one after another:

- "free, no bound in the app": the unbounded queue with the client's bounds emptied, which is
  exactly what an app that declares no bounded queue runs;
- "free": the unbounded queue of an app that has a bounded one (its enqueue looks the queue up
  in a dict, once);
- "bounded": the bounded queue, near full.

After each side its M jobs are cancelled (untimed), so every round starts from the same
lengths. The figure per side is the median over rounds of the mean cost per enqueue; the
ratios are per round, medians reported.

Usage (PostgreSQL on 127.0.0.1:5432, or the admin URL in NJ_BENCH_PG_URL; the script creates
and drops its own database):

    .venv/bin/python benchmarks/bounded_queues.py
    .venv/bin/python benchmarks/bounded_queues.py --smoke   # tiny sizes: only proves it runs

Results are recorded in benchmarks/RESULTS.md ("Bounded queues"). Speed is never asserted in
tests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import attrs

import nursery_jobs as nj

try:  # imported as `benchmarks.bounded_queues`
    from .per_backend import JOB_COLUMNS, backlog
    from .pg_common import PgUnavailable, backend_url, render_table, throwaway_database
except ImportError:  # run as a script: benchmarks/ is sys.path[0]
    from per_backend import JOB_COLUMNS, backlog  # type: ignore[no-redef]
    from pg_common import PgUnavailable, backend_url, render_table, throwaway_database  # type: ignore[no-redef]

SCHEMA = "nj_bench_bounded"
SIDES = ("free, no bound in the app", "free", "bounded")


@attrs.frozen
class Sizes:
    final_rows: int = 100_000
    bounds: tuple[int, ...] = (1_000, 10_000, 100_000)
    per_side: int = 200
    rounds: int = 5


SMOKE = Sizes(final_rows=200, bounds=(50,), per_side=10, rounds=1)


def build_app(max_length: int) -> tuple[nj.App, nj.JobKind[Any, Any], nj.JobKind[Any, Any]]:
    app = nj.App()
    app.queue("bounded", max_workers=1, max_length=max_length, push_timeout=0)
    app.queue("free", max_workers=1)

    @app.job(queue="bounded")
    async def into_bounded(ctx: nj.JobContext, n: int) -> None:
        pass

    @app.job(queue="free")
    async def into_free(ctx: nj.JobContext, n: int) -> None:
        pass

    return app, into_bounded, into_free


FILL_COLUMNS = (*JOB_COLUMNS, "finalized_at")


def fill_rows(final_rows: int, pending: int, now: float) -> list[tuple[Any, ...]]:
    rows = [("filler", "filler", "{}", "completed", 25, 0, now, now, now) for _ in range(final_rows)]
    for queue, kind in (("bounded", "into_bounded"), ("free", "into_free")):
        rows += [(kind, queue, '{"n": 0}', "available", 25, 0, now, now, None) for _ in range(pending)]
    return rows


def fill(backend: str, target: str, final_rows: int, pending: int) -> None:
    """The durable store at `target` holds `final_rows` completed jobs and `pending` due ones
    in each of the queues "bounded" and "free"."""
    backlog(backend, target, SCHEMA, FILL_COLUMNS, fill_rows(final_rows, pending, time.time()))


async def memory_fill(rt: nj.Runtime, kinds: Sequence[nj.JobKind[Any, Any]], pending: int) -> None:
    for kind in kinds:
        for start in range(0, pending, 1_000):
            await rt.enqueue_many(kind, [{"n": 0}] * min(1_000, pending - start))


def measure(target: str, max_length: int, s: Sizes, fill: Callable[[], None] | None) -> dict[str, list[float]]:
    """Per side, the mean seconds per enqueue of each round."""
    app, into_bounded, into_free = build_app(max_length)
    pending = max_length - s.per_side - 1
    if fill is not None:
        fill()
    out: dict[str, list[float]] = {side: [] for side in SIDES}

    async def main(rt: nj.Runtime) -> None:
        if fill is None:
            await memory_fill(rt, (into_bounded, into_free), pending)
        bounds = dict(rt.bounds)
        for _ in range(s.rounds):
            for side in SIDES:
                kind = into_bounded if side == "bounded" else into_free
                rt.bounds = {} if side == SIDES[0] else bounds
                ids = []
                t0 = time.perf_counter()
                for n in range(s.per_side):
                    ids.append(await kind.enqueue(n=n))
                out[side].append((time.perf_counter() - t0) / s.per_side)
                rt.bounds = bounds
                for job_id in ids:
                    await rt.cancel(job_id)
        stats = await rt.stats()
        assert stats["bounded"].queued == pending, stats["bounded"]

    nj.run(main, app=app, backend=target, queues=[])
    return out


def rows_for(name: str, target: str, s: Sizes, fill: Callable[[int], Callable[[], None] | None], log: Callable[[str], None]) -> list[list[str]]:
    rows = []
    for max_length in s.bounds:
        log(f"{name}: max_length {max_length:,}, {s.final_rows:,} final rows, {max_length - s.per_side - 1:,} pending per queue")
        got = measure(target, max_length, s, fill(max_length))
        med = {side: statistics.median(v) * 1e6 for side, v in got.items()}
        plain = statistics.median(a / b for a, b in zip(got["free"], got[SIDES[0]]))
        bounded = statistics.median(a / b for a, b in zip(got["bounded"], got[SIDES[0]]))
        rows.append([
            name, f"{max_length:,}", f"{med[SIDES[0]]:.1f}", f"{med['free']:.1f}", f"{med['bounded']:.1f}",
            f"{plain:.2f}", f"{bounded:.2f}",
        ])  # fmt: skip
        log(f"  {rows[-1]}")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: only proves the script runs")
    options = parser.parse_args(argv)
    s = SMOKE if options.smoke else Sizes()

    def log(line: str) -> None:
        print(line, flush=True)

    rows: list[list[str]] = []
    try:
        rows += rows_for("memory", "memory://", s, lambda n: None, log)
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "bounded.db")
            rows += rows_for(
                "sqlite", f"sqlite:///{path}", s, lambda n: lambda: fill("sqlite", path, s.final_rows, n - s.per_side - 1), log
            )
        with throwaway_database("bounded") as url:
            rows += rows_for(
                "postgres", backend_url(url, SCHEMA), s, lambda n: lambda: fill("postgres", url, s.final_rows, n - s.per_side - 1), log
            )
    except PgUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    print()
    print(render_table([["backend", "max_length", "free, no bound in app µs", "free µs", "bounded near full µs",
                         "free / no bound", "bounded / no bound"], *rows]))  # fmt: skip
    if options.smoke:
        print("smoke run: nothing judged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
