"""Per-key rate limit benchmark: how exactly each backend keeps a rate (starts per window
against the rate, and the worst window seen), and what a rate-keyed queue whose rate is never
reached costs against an unlimited one in the same run.

What it measures, per backend (PostgreSQL; SQLite and memory beside it):

1. **Accuracy.** A table pre-filled (PostgreSQL and SQLite: rows inserted directly, then
   `ANALYZE`d; memory: `insert_many`) with K keys x J jobs of `Rate(L, per=P)`, enqueued first
   (every claim meets them first), and behind them a backlog of unlimited jobs; one runtime of
   W workers drains it. From the start times the backend recorded (each job's `attempted_at`,
   the claim's clock): per key, the starts in each window [t0 + i*P, t0 + (i+1)*P) counted
   from the key's first start (the full windows' mean and max), and the most starts any
   half-open window of P seconds held (the worst window; the guarantee is <= L). "Used" is the
   share of the rate the key got: starts after the first window per window elapsed, against L.
2. **Throughput, rate not reached.** The same pre-filled backlog of N no-op jobs, drained until
   M completed, jobs per second from the first start to the M-th: once with no key (unlimited),
   once with job n keyed ``r<n % 1000>`` under `Rate(100_000, per=1)` (never reached). Rounds
   alternate the sides on freshly filled tables; the figure is the median of the per-round
   ratios rate-keyed / unlimited.
3. **Behind a key over its rate** (``--behind``, or with the default run): `backlog` due jobs of
   one key under `Rate(10, per=60)`, first in claim order, so the key is over its rate after its
   first claim and stays so. (a) Latency: probes enqueued one at a time, alternately a job with a
   new rate key and one with none, ``perf_counter`` before ``enqueue`` to the handler's start,
   p50 and p99. (b) Drain: `behind_jobs` unlimited jobs enqueued behind the backlog, jobs per
   second of those from the first start to the last. Each against the same run with no backlog
   (the same probes; the same unlimited jobs alone), in the same process.

Usage (PostgreSQL on 127.0.0.1:5432, or the admin URL in NJ_BENCH_PG_URL; the script creates
and drops its own database):

    .venv/bin/python benchmarks/rate_limits.py
    .venv/bin/python benchmarks/rate_limits.py --smoke   # tiny sizes: only proves it runs

Results are recorded in benchmarks/RESULTS.md ("Rate limits"). Speed is never asserted in tests.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import attrs
import psycopg
import trio
from psycopg import sql

import nursery_jobs as nj

try:  # imported as `benchmarks.rate_limits`
    from .per_backend import JOB_COLUMNS, add_backend_options, backlog, measure_each_backend, sizes_from
    from .pg_common import PgUnavailable, percentile, render_table
except ImportError:  # run as a script: benchmarks/ is sys.path[0]
    from per_backend import JOB_COLUMNS, add_backend_options, backlog, measure_each_backend, sizes_from  # type: ignore[no-redef]
    from pg_common import PgUnavailable, percentile, render_table  # type: ignore[no-redef]

QUEUE = "bench"
SCHEMA = "rated"


@attrs.frozen
class Sizes:
    keys: int = 10
    """Rate keys of the accuracy run."""
    per_key: int = 500
    """Jobs per key in the accuracy run (at `limit` per window: per_key / limit windows)."""
    limit: int = 100
    per: float = 1.0
    unlimited: int = 5_000
    """Unlimited jobs behind the rate-keyed ones in the accuracy run."""
    jobs: int = 20_000
    """Pre-filled backlog of a throughput run."""
    measured: int = 8_000
    throughput_keys: int = 1_000
    throughput_rate: int = 100_000
    workers: int = 32
    rounds: int = 4
    backends: tuple[str, ...] = ("postgres", "sqlite", "memory")
    backlog: int = 20_000
    """Due jobs of the one key over its rate, ahead of everything, in the "behind" runs."""
    backlog_limit: int = 10
    backlog_per: float = 60.0
    probes: int = 200
    behind_jobs: int = 2_000
    """Unlimited jobs drained behind the backlog."""


SMOKE = Sizes(
    keys=2, per_key=20, limit=10, per=0.5, unlimited=50, jobs=300, measured=100, throughput_keys=10, workers=8, rounds=1,
    backlog=300, probes=10, behind_jobs=100,
)  # fmt: skip


class Box:
    """Shared by a run's handlers and its main (one Trio thread)."""

    def __init__(self, target: int, counted: str | None) -> None:
        self.started: dict[int, float] = {}
        self.target = target
        self.counted = counted
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.done = trio.Event()


def build_app(workers: int, box: list[Box], s: Sizes) -> nj.App:
    app = nj.App()
    app.queue(QUEUE, max_workers=workers, timeout=60)

    def count(kind: str, job_id: int) -> None:
        b = box[0]
        b.started[job_id] = time.perf_counter()
        if b.counted is not None and kind != b.counted:
            return
        b.count += 1
        if b.count == 1:
            b.first = time.perf_counter()
        if b.count == b.target:
            b.last = time.perf_counter()
            b.done.set()

    @app.job(queue=QUEUE, name="plain")
    async def plain(ctx: nj.JobContext, n: int = 0) -> None:
        count("plain", ctx.id)
        await trio.lowlevel.checkpoint()

    @app.job(queue=QUEUE, name="rated", rate=nj.Rate(s.limit, per=s.per), rate_key=lambda args: args["key"])
    async def rated(ctx: nj.JobContext, key: str, n: int = 0) -> None:
        count("rated", ctx.id)
        await trio.lowlevel.checkpoint()

    return app


# -- filling: `rows` are (kind, key, limit, per), oldest first --


def fill_rows(s: Sizes, *, accuracy: bool, keyed: bool) -> list[tuple[str, str | None, int | None, float | None]]:
    if accuracy:
        rated = [("rated", f"r{g % s.keys}", s.limit, s.per) for g in range(s.keys * s.per_key)]
        return [*rated, *(("plain", None, None, None) for _ in range(s.unlimited))]
    if not keyed:
        return [("plain", None, None, None)] * s.jobs
    return [("rated", f"r{g % s.throughput_keys}", s.throughput_rate, 1.0) for g in range(s.jobs)]


RATE_COLUMNS = (*JOB_COLUMNS, "rate_key", "rate_limit", "rate_per")


def table_rows(rows: list[tuple[str, str | None, int | None, float | None]]) -> list[tuple[Any, ...]]:
    """`rows` as rows of the jobs table (RATE_COLUMNS), due in their order."""
    now = time.time() - 60
    return [(k, QUEUE, "{}" if rk is None else '{"key": "%s"}' % rk, "available", 25, 0, now + o * 1e-6, now, rk, rl, rp)
            for o, (k, rk, rl, rp) in enumerate(rows, start=1)]  # fmt: skip


# -- one drain --


def drain(backend: str, target: str, s: Sizes, *, accuracy: bool, keyed: bool) -> tuple[float, dict[str, list[float]]]:
    """(jobs per second of the counted kind, each rate key's recorded starts) for one freshly
    filled backlog."""
    gc.collect()  # the previous run's rows are garbage: collected here, not during this run
    rows = fill_rows(s, accuracy=accuracy, keyed=keyed)
    target_count = s.keys * s.per_key if accuracy else s.measured
    box = [Box(target_count, "rated" if accuracy else None)]
    app = build_app(s.workers, box, s)
    where = backlog(backend, target, SCHEMA, RATE_COLUMNS, table_rows(rows))
    memory = where if isinstance(where, nj.MemoryBackend) else None

    async def main(rt: nj.Runtime) -> dict[str, list[float]]:
        with trio.fail_after(600):
            await box[0].done.wait()
        starts: dict[str, list[float]] = {}
        if memory is not None and accuracy:
            for job_id, (_, rk, _, _) in enumerate(rows, start=1):
                if rk is not None:
                    job = await memory.get_job(job_id)
                    if job.attempted_at is not None:
                        starts.setdefault(rk, []).append(job.attempted_at)
        return starts

    starts: dict[str, list[float]] = nj.run(main, app=app, backend=where, grace=0.0)
    if accuracy and backend != "memory":
        starts = read_starts(backend, target)
    b = box[0]
    return target_count / max(b.last - b.first, 1e-9), starts


def read_starts(backend: str, target: str) -> dict[str, list[float]]:
    if backend == "postgres":
        with psycopg.connect(target, autocommit=True) as conn:
            got = conn.execute(
                sql.SQL("SELECT rate_key, attempted_at FROM {}.jobs WHERE rate_key IS NOT NULL AND attempted_at IS NOT NULL").format(
                    sql.Identifier(SCHEMA)
                )
            ).fetchall()
    else:
        import sqlite3

        conn2 = sqlite3.connect(target)
        got = conn2.execute("SELECT rate_key, attempted_at FROM nj_jobs WHERE rate_key IS NOT NULL AND attempted_at IS NOT NULL").fetchall()
        conn2.close()
    starts: dict[str, list[float]] = {}
    for key, at in got:
        starts.setdefault(key, []).append(float(at))
    return starts


def window_figures(starts: list[float], limit: int, per: float) -> tuple[float, int, int, float]:
    """(mean and max starts of the full aligned windows, the worst sliding window, the share of
    the rate used after the first window)."""
    s = sorted(starts)
    t0, end = s[0], s[-1]
    full = int((end - t0) // per)
    counts = [0] * max(full, 1)
    for t in s:
        i = int((t - t0) // per)
        if i < full:
            counts[i] += 1
    worst, j = 0, 0
    for i in range(len(s)):  # the most starts in [s[i], s[i] + per)
        while j < len(s) and s[j] < s[i] + per:
            j += 1
        worst = max(worst, j - i)
    elapsed = (end - t0) / per
    used = (len(s) - limit) / (elapsed * limit) if elapsed > 0 else 0.0
    return statistics.mean(counts), max(counts), worst, used


# -- behind a key over its rate --


def behind_rows(s: Sizes, *, backlog: bool, plain: int) -> list[tuple[str, str | None, int | None, float | None]]:
    """The slow key's backlog (if `backlog`), then `plain` unlimited jobs, in claim order."""
    slow = [("rated", "slow", s.backlog_limit, s.backlog_per)] * (s.backlog if backlog else 0)
    return [*slow, *(("plain", None, None, None) for _ in range(plain))]


def behind(backend: str, target: str, s: Sizes, *, with_backlog: bool) -> tuple[list[float], list[float], float]:
    """(enqueue -> start of the rate-keyed probes, of the unlimited probes, seconds; unlimited
    jobs per second drained behind the backlog), with or without the slow key's backlog."""
    gc.collect()
    box = [Box(s.behind_jobs, "plain")]
    app = build_app(s.workers, box, s)
    rows = behind_rows(s, backlog=with_backlog, plain=s.behind_jobs)
    where = backlog(backend, target, SCHEMA, RATE_COLUMNS, table_rows(rows))

    async def main(rt: nj.Runtime) -> tuple[list[float], list[float], float]:
        b = box[0]
        with trio.fail_after(600):
            await b.done.wait()  # the drain: the unlimited jobs behind the backlog
        rate = s.behind_jobs / max(b.last - b.first, 1e-9)
        b.counted = "none"
        keyed: list[float] = []
        plain: list[float] = []
        for i in range(s.probes + 4):
            await trio.sleep(0.005)
            t0 = time.perf_counter()
            job_id = await (rt.enqueue("rated", {"key": f"probe{i}"}) if i % 2 else rt.enqueue("plain"))
            receipt = await rt.wait(job_id, timeout=30.0)
            if not receipt.done:
                raise RuntimeError(f"probe {job_id} did not finish within 30 s")
            if i >= 4:  # the first ones warm the connections
                (keyed if i % 2 else plain).append(b.started.pop(job_id) - t0)
        return keyed, plain, rate

    result: tuple[list[float], list[float], float] = nj.run(main, app=app, backend=where, grace=0.0)
    return result


def ms(values: list[float]) -> str:
    return f"p50 {percentile(values, 50) * 1e3:.2f} / p99 {percentile(values, 99) * 1e3:.2f} ms"


def measure_behind(backend: str, target: str, s: Sizes, log: Callable[[str], None]) -> list[list[str]]:
    got: dict[bool, list[tuple[list[float], list[float], float]]] = {False: [], True: []}
    for r in range(s.rounds):
        for side in ((True, False) if r % 2 else (False, True)):  # alternate which runs first
            got[side].append(behind(backend, target, s, with_backlog=side))
            k, p, rate = got[side][-1]
            log(f"  {backend} behind round {r + 1} backlog={side}: rated {ms(k)}, plain {ms(p)}, drain {rate:,.0f}/s")
    out: list[list[str]] = []
    for side in (False, True):
        keyed = [v for k, _, _ in got[side] for v in k]
        plain = [v for _, p, _ in got[side] for v in p]
        rates = [rate for _, _, rate in got[side]]
        out.append([backend, f"{s.backlog:,} at {s.backlog_limit} per {s.backlog_per:g} s" if side else "none",
                    ms(keyed), ms(plain), f"{statistics.median(rates):,.0f}"])  # fmt: skip
    ratios = [a[2] / b[2] for a, b in zip(got[True], got[False])]
    p99 = percentile([v for k, p, _ in got[True] for v in k + p], 99) / percentile([v for k, p, _ in got[False] for v in k + p], 99)
    out[-1].append(f"p99 x{p99:.1f}, drain x{statistics.median(ratios):.2f}")
    out[0].append("")
    return out


# -- the run --


def measure(backend: str, target: str, s: Sizes, log: Callable[[str], None]) -> list[list[str]]:
    _, starts = drain(backend, target, s, accuracy=True, keyed=True)
    figures = [window_figures(v, s.limit, s.per) for v in starts.values()]
    mean = statistics.mean(f[0] for f in figures)
    top = max(f[1] for f in figures)
    worst = max(f[2] for f in figures)
    used = statistics.mean(f[3] for f in figures)
    log(f"  {backend} accuracy: {len(starts)} keys, windows mean {mean:.1f} max {top}, worst sliding {worst}, used {used:.2f}")
    ratios: list[float] = []
    rates: dict[bool, list[float]] = {False: [], True: []}
    for r in range(s.rounds):
        if r % 2:  # alternate which side runs first: a run warms what the next one uses
            rate, _ = drain(backend, target, s, accuracy=False, keyed=True)
            base, _ = drain(backend, target, s, accuracy=False, keyed=False)
        else:
            base, _ = drain(backend, target, s, accuracy=False, keyed=False)
            rate, _ = drain(backend, target, s, accuracy=False, keyed=True)
        rates[False].append(base)
        rates[True].append(rate)
        ratios.append(rate / base)
        log(f"  {backend} round {r + 1}: unlimited {base:,.0f}/s, rate-keyed {rate:,.0f}/s -> {rate / base:.2f}")
    return [[
        backend, f"{s.limit} per {s.per:g} s", f"{mean:.1f} / {top}", str(worst), f"{used:.2f}",
        f"{statistics.median(rates[True]):,.0f}", f"{statistics.median(rates[False]):,.0f}", f"{statistics.median(ratios):.2f}",
    ]]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_backend_options(parser, "throughput rounds (default 4)")
    parser.add_argument("--behind", action="store_true", help="only the runs behind a key over its rate")
    args = parser.parse_args(argv)
    s = sizes_from(args, Sizes(), SMOKE)
    print(
        f"rate limits: accuracy {s.keys} keys x {s.per_key} jobs at {s.limit} per {s.per:g} s before {s.unlimited:,}"
        f" unlimited; throughput {s.jobs:,} pre-filled over {s.throughput_keys:,} keys; {s.workers} workers"
    )
    started = time.perf_counter()
    behind_table: list[list[str]] = []

    def both(backend: str, target: str) -> list[list[str]]:
        behind_table.extend(measure_behind(backend, target, s, print))
        return [] if args.behind else measure(backend, target, s, print)

    try:
        rows = measure_each_backend(s.backends, "rated", both)
    except PgUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    header = ["backend", "rate", "starts per window (mean / max)", "worst window", "used",
              "rate-keyed jobs/s", "unlimited jobs/s", "ratio"]  # fmt: skip
    print()
    if rows:
        print(render_table([header, *rows]))
    behind_header = ["backend", "backlog over its rate", "rate-keyed probe start", "unlimited probe start",
                     "unlimited drained behind, jobs/s", "with / without"]  # fmt: skip
    print(render_table([behind_header, *behind_table]))
    print(f"\n({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
