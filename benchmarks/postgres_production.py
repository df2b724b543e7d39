"""PostgreSQL under production conditions: draining a backlog from a pre-filled, analyzed table,
against a hand-written psycopg loop on the same table in the same run.

`postgres_throughput.py` enqueues while the runtime works, on a table analyzed while empty. In
production the jobs table is analyzed by autovacuum while it is full, and a deploy or an outage
leaves a backlog. This script measures that case, the way the peers' own benchmarks do
(Procrastinate's and pgqueuer's: pre-fill, ANALYZE, drain):

- **Tables.** One schema per size, made by the runtime's own migrations: 10k, 100k and 1M
  `available` no-op jobs (`INSERT ... SELECT generate_series`); the 1M schema also holds 1M
  `completed` rows finished an hour ago, which retention keeps (24 h). Before every measured drain
  the table is put back in that shape (the drained rows deleted, as many new `available` rows
  inserted) and `VACUUM (ANALYZE, INDEX_CLEANUP ON)`d, so the statistics are always those of a full table with no
  row `running`: the statistics a generic plan is made from in production.
- **A drain** takes D jobs off the table (D = 5,000 at 1 worker, 10,000 at 8 and 32, at most the
  table's size; the 10k table is drained to empty). Runtime: `nj.run` of one queue with W
  workers in this process; the clock starts when the first handler starts (or `main` does, if
  that is earlier) and stops at the recorded outcome of the D-th handler (`rt.wait`). Then the
  runtime shuts down, and the run counts as *unwritten* if any row is still `running` after it,
  or the log says `not written`.
- **The loop** is what a peer benchmark measures: one psycopg connection (sync, autocommit,
  psycopg's defaults but `jit = off`, as the runtime's own sessions) that claims up to W rows with ``UPDATE ... WHERE id IN (SELECT ... FOR
  UPDATE SKIP LOCKED LIMIT W) RETURNING``, runs a no-op per row, and marks them completed with
  one ``UPDATE ... WHERE id = ANY(...)``; two transactions per batch, until D rows are done.
  The same table, the same rows, the same indexes.
- **Rounds** run every size and worker count once; within a cell, loop and runtime alternate
  which goes first. The judged ratio is the median of the per-round ratios.
- **Two processes**: 1 and then 2 worker processes (this file with ``--worker``, each an
  `nj.run` worker with 32 workers) drain the largest table (1M available beside 1M completed:
  since the lean claim one process drains ~23k jobs/s, and two emptied the 100k table within
  the window); once every process has started, the rate is the outcomes written in a fixed
  window (two counts of the completed rows).
  Alternating 1 and 2 per round; judged on the median of per-round ratios.
- **Idle latency** with the 1M completed rows in the table (before the 1M available rows are
  added): 10 parked workers, one probe job at a time, enqueue -> handler start.

Targets (from the issue): runtime ≥ 1.0× the loop at 32 workers, ≥ 1.5× at 1 and 8 (at every
size); the 1M-row drain ≥ 0.8× the 10k-row drain (runtime, each worker count); 2 processes ≥
1.3× one; no outcome left unwritten in any run; idle enqueue -> start p50 ≤ 2.5 ms, p99 ≤ 5 ms.

Usage (PostgreSQL on 127.0.0.1:5432, or the admin URL in NJ_BENCH_PG_URL; the script creates
and drops its own database, even when it fails):

    .venv/bin/python benchmarks/postgres_production.py                 # full run, ~4 min on a 2-core machine
    .venv/bin/python benchmarks/postgres_production.py --rounds 1 --sizes 10000,1000000
    .venv/bin/python benchmarks/postgres_production.py --smoke         # tiny: proves it runs
    .venv/bin/python benchmarks/postgres_production.py --check         # exit 1 on a missed target

Results are recorded in benchmarks/RESULTS.md. Speed is never asserted in tests.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import attrs
import psycopg
import trio
from psycopg import sql

import nursery_jobs as nj

try:  # imported as `benchmarks.postgres_production`
    from .durable_side import (
        QUEUE, Tally, add_bench_kinds, add_process_kinds, idle_latency, run_app, serve_worker, worker_processes,
    )
    from .pg_common import PgUnavailable, backend_url, fresh_schema, median_ratio, percentile, render_table, throwaway_database
    from .report import conclude
except ImportError:  # run as a script: benchmarks/ is sys.path[0]
    from durable_side import (  # type: ignore[no-redef]
        QUEUE, Tally, add_bench_kinds, add_process_kinds, idle_latency, run_app, serve_worker, worker_processes,
    )
    from pg_common import (  # type: ignore[no-redef]
        PgUnavailable,
        backend_url,
        fresh_schema,
        median_ratio,
        percentile,
        render_table,
        throwaway_database,
    )
    from report import conclude  # type: ignore[no-redef]

__all__ = ["Sizes", "main"]

TARGET_VS_LOOP = {1: 1.5, 8: 1.5, 32: 1.0}
TARGET_SIZE = 0.8
TARGET_PROCS = 1.3
TARGET_START_P50 = 0.0025
TARGET_START_P99 = 0.005
RAN_OUT = "the table ran out of jobs within the window: lengthen the table or shorten the window"
STALLED = "no outcome was written within the window: the machine stalled the processes; lengthen the window"


@attrs.frozen
class Sizes:
    sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    """Available jobs in each table."""
    kept: int = 1_000_000
    """Completed rows kept by retention in the largest table (and there during the latency probe)."""
    workers: tuple[int, ...] = (1, 8, 32)
    drain: dict[int, int] = attrs.field(factory=lambda: {1: 5_000, 8: 10_000, 32: 10_000})
    """Jobs per drain at each worker count (at most the table's size)."""
    rounds: int = 3
    proc_workers: int = 32
    proc_rounds: int = 3
    proc_window: float = 3.0
    """Seconds of the 1- and 2-process measuring window."""
    proc_warmup: float = 0.5
    probes: int = 200
    probe_workers: int = 10


SMOKE = Sizes(
    sizes=(300, 20_000), kept=2_000, workers=(1, 8), drain={1: 30, 8: 100, 32: 100}, rounds=1,
    proc_workers=8, proc_rounds=1, proc_window=0.2, proc_warmup=0.0, probes=10,
)  # fmt: skip


# -- tables ---------------------------------------------------------------------------------------

_COLS = "(kind, queue, args, state, attempt, max_attempts, priority, run_at, created_at, attempted_at, finalized_at)"


def _t(schema: str) -> sql.Composed:
    return sql.SQL("{}.jobs").format(sql.Identifier(schema))


def fill(conn: psycopg.Connection[Any], schema: str, available: int, kept: int) -> None:
    """Add `kept` completed rows (an hour old: retention keeps them) and `available` due jobs."""
    now = time.time()
    if kept:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} " + _COLS + " SELECT 'kept', %s, '{{}}', 'completed', 1, 25, 0,"
                " %s + g * 1e-4, %s + g * 1e-4, %s + g * 1e-4, %s + g * 1e-4 FROM generate_series(1, %s) g"
            ).format(_t(schema)),
            (QUEUE, now - 7200, now - 7200, now - 3700, now - 3600 - kept * 1e-4, kept),
        )
    add_available(conn, schema, available, now - 3600)


def add_available(conn: psycopg.Connection[Any], schema: str, n: int, run_at: float) -> None:
    if n > 0:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} " + _COLS + " SELECT 'noop', %s, '{{}}', 'available', 0, 25, 0,"
                " %s + g * 1e-6, %s, NULL, NULL FROM generate_series(1, %s) g"
            ).format(_t(schema)),
            (QUEUE, run_at, run_at, n),
        )


def restore(url: str, schema: str, size: int) -> None:
    """Back to `size` available jobs (plus the kept rows), vacuumed and analyzed with no row
    running: what autovacuum would have seen on a full table."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DELETE FROM {} WHERE kind <> 'kept' AND (state <> 'available' OR queue <> %s)").format(_t(schema)), (QUEUE,)
        )
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE state = 'available' AND queue = %s").format(_t(schema)), (QUEUE,)
        ).fetchone()
        add_available(conn, schema, size - int(row[0]) if row else size, time.time() - 60)
        # INDEX_CLEANUP ON: on a large table VACUUM skips the indexes when few pages hold dead
        # rows, and the claim index would keep every earlier round's drained entries, which each
        # claim then steps over: the rounds would not start from the same table.
        conn.execute(sql.SQL("VACUUM (ANALYZE, INDEX_CLEANUP ON) {}").format(_t(schema)))


def running_rows(url: str, schema: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE state = 'running'").format(_t(schema))).fetchone()
    return int(row[0]) if row else 0


# -- the hand-written loop --------------------------------------------------------------------------


def _noop(job_id: int, kind: str, args: str) -> None:
    return None


def loop_drain(url: str, schema: str, n: int, batch: int, on_done: Callable[[], None] | None = None) -> float:
    """Seconds for one sync psycopg connection to claim, run and complete n jobs, `batch` at a time.
    `on_done` is called once the n jobs are done, before the connection closes (a measurement
    that needs the connection's server process still there: cpu_accounting.py)."""
    s = sql.Identifier(schema)
    claim = sql.SQL(
        "UPDATE {s}.jobs SET state = 'running', attempt = attempt + 1, attempted_at = %(now)s, heartbeat_at = %(now)s"
        " WHERE id IN (SELECT id FROM {s}.jobs WHERE queue = %(queue)s"
        "  AND state = 'available' AND NOT parked AND run_at <= %(now)s"
        "  ORDER BY priority DESC, run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
        " RETURNING id, kind, args"
    ).format(s=s)
    complete = sql.SQL(
        "UPDATE {s}.jobs SET state = 'completed', finalized_at = %s, heartbeat_at = NULL WHERE id = ANY(%s)"
    ).format(s=s)
    done = 0
    # `NOT parked` (migration 0011) is part of the `jobs_available` index's predicate: without it
    # the loop's claim cannot use the index and sorts the whole table on every call.
    with psycopg.connect(url, autocommit=True) as conn:
        # The runtime's sessions run with `jit = off` (POOL_SESSION); the loop gets the same, so it
        # is the strongest hand-written baseline.
        conn.execute("SET jit = off")
        started = time.perf_counter()
        while done < n:
            rows = conn.execute(claim, {"now": time.time(), "queue": QUEUE, "limit": min(batch, n - done)}).fetchall()
            if not rows:
                break
            for job_id, kind, args in rows:
                _noop(job_id, kind, args)
            conn.execute(complete, (time.time(), [r[0] for r in rows]))
            done += len(rows)
        elapsed = time.perf_counter() - started
        if on_done is not None:
            on_done()
    if done != n:
        raise RuntimeError(f"the loop completed {done} of {n} jobs: the table ran out")
    return elapsed


# -- the runtime ------------------------------------------------------------------------------------


class _Unwritten(logging.Handler):
    """Collects the runtime's `not written` shutdown errors."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "not written" in message:
            self.messages.append(message)


def build_app(workers: int, launchers: int = 1) -> tuple[nj.App, list[Tally]]:
    """The bench queue with its `noop` and `probe` kinds, and what worker processes need."""
    app = nj.App()
    box = add_bench_kinds(app, workers)
    add_process_kinds(app, __file__, launchers)
    return app, box


def runtime_drain(url: str, schema: str, n: int, workers: int) -> tuple[float, str | None]:
    """(seconds, what was left unwritten or None) for the runtime to run n jobs off the table."""
    app, box = build_app(workers)
    tally = box[0] = Tally(n)
    unwritten = _Unwritten()
    logger = logging.getLogger("nursery_jobs")
    logger.addHandler(unwritten)

    async def main(rt: nj.Runtime) -> float:
        started = time.perf_counter()
        with trio.fail_after(max(120.0, n / 100)):
            await tally.done.wait()
            receipt = await rt.wait(tally.last_id, timeout=30.0)
        elapsed = time.perf_counter() - min(started, tally.first or started)
        if not receipt.done:
            raise RuntimeError(f"job {tally.last_id} ran but its outcome was not recorded: {receipt}")
        return elapsed

    try:
        elapsed: float = run_app(main, app, backend_url(url, schema), queues=[QUEUE])
    finally:
        logger.removeHandler(unwritten)
    left = running_rows(url, schema)
    problem = None
    if left or unwritten.messages:
        problem = f"{left} rows left running" + (f"; log: {unwritten.messages[0][:300]}" if unwritten.messages else "")
    return elapsed, problem


def runtime_latency(url: str, schema: str, probes: int, workers: int) -> list[float]:
    app, box = build_app(workers)

    async def main(rt: nj.Runtime) -> tuple[list[float], list[float]]:
        return await idle_latency(rt, box[0], probes)

    starts, _receipts = run_app(main, app, backend_url(url, schema), queues=[QUEUE])
    return list(starts)


def processes_rate(url: str, schema: str, procs: int, workers: int, window: float, warmup: float) -> tuple[float, str | None]:
    """(outcomes written per second by `procs` worker processes in the window, problem or None).

    The worker processes are started by jobs of this process's own runtime (`launch`, which
    runs them with `trio.run_process`); cancelling a launcher job stops its process with SIGTERM,
    a graceful shutdown. The window opens `warmup` after every process reported ready."""
    app, _box = build_app(workers, launchers=procs)
    burl = backend_url(url, schema)
    logs = [f"/tmp/nj_prod_worker_{os.getpid()}_{i}.log" for i in range(procs)]

    async def main(rt: nj.Runtime) -> tuple[float, str | None]:
        async with worker_processes(rt, burl, workers, logs):
            await trio.sleep(warmup)
            t0 = time.perf_counter()
            c0 = (await rt.stats())[QUEUE]
            await trio.sleep(window)
            t1 = time.perf_counter()
            c1 = (await rt.stats())[QUEUE]
            done = c1.completed - c0.completed
            problem = RAN_OUT if c1.available == 0 else STALLED if done == 0 else None
            return done / (t1 - t0), problem

    try:
        rate, problem = run_app(main, app, burl, queues=["launch"])
        for path in logs:
            with open(path) as f:
                err = f.read()
            if "not written" in err:
                problem = problem or f"a worker process: {err.strip()[:300]}"
    finally:
        for path in logs:
            if os.path.exists(path):
                os.remove(path)
    left = running_rows(url, schema)
    if left:
        problem = problem or f"{left} rows left running after the worker processes stopped"
    return rate, problem


# -- the run ----------------------------------------------------------------------------------------


@attrs.define
class Figures:
    sizes: Sizes
    loop: dict[tuple[int, int], list[float]] = attrs.field(factory=dict)
    """(table size, workers) -> jobs/s per round."""
    rt: dict[tuple[int, int], list[float]] = attrs.field(factory=dict)
    procs: dict[int, list[float]] = attrs.field(factory=dict)
    """Processes -> outcomes/s per round (an invalid round's figure too, never judged)."""
    invalid_rounds: set[int] = attrs.field(factory=set)
    """Process rounds (0-based) in which either side's figure was invalid."""
    problems: list[str] = attrs.field(factory=list)
    """Runs that left an outcome unwritten."""
    invalid: list[str] = attrs.field(factory=list)
    """Runs whose figure does not count (the table ran out of jobs, or nothing was written, in the window)."""
    starts: list[float] = attrs.field(factory=list)
    synchronous_commit: str = "?"

    def vs_loop(self, size: int, workers: int) -> float:
        return median_ratio(self.rt[size, workers], self.loop[size, workers])

    def size_ratio(self, workers: int) -> float:
        small, large = min(self.sizes.sizes), max(self.sizes.sizes)
        return statistics.median(self.rt[large, workers]) / statistics.median(self.rt[small, workers])

    def procs_pairs(self) -> list[tuple[float, float]]:
        """(2-process, 1-process) rates of the rounds where both figures are valid."""
        if 1 not in self.procs or 2 not in self.procs:
            return []
        rounds = zip(self.procs[2], self.procs[1])
        return [pair for r, pair in enumerate(rounds) if r not in self.invalid_rounds]

    def procs_ratio(self) -> float | None:
        pairs = self.procs_pairs()
        if not pairs:
            return None
        return median_ratio([two for two, _ in pairs], [one for _, one in pairs])

    def verdicts(self) -> dict[str, bool]:
        out: dict[str, bool] = {}
        for size in self.sizes.sizes:
            for w in self.sizes.workers:
                out[f"runtime / loop, {size:,} rows, {w} workers"] = self.vs_loop(size, w) >= TARGET_VS_LOOP.get(w, 1.0)
        if len(self.sizes.sizes) > 1:
            for w in self.sizes.workers:
                out[f"{max(self.sizes.sizes):,}-row / {min(self.sizes.sizes):,}-row drain, {w} workers"] = (
                    self.size_ratio(w) >= TARGET_SIZE
                )
        ratio = self.procs_ratio()
        if ratio is not None:
            out["2 processes / 1"] = ratio >= TARGET_PROCS
        out["no outcome left unwritten"] = not self.problems
        if self.invalid:
            out["every process run valid"] = False
        if self.starts:
            out["idle start p50"] = percentile(self.starts, 50) <= TARGET_START_P50
            out["idle start p99"] = percentile(self.starts, 99) <= TARGET_START_P99
        return out


def _schema(size: int) -> str:
    return f"nj_prod_{size}"


def measure(db: str, s: Sizes, *, log: Callable[[str], None] = print) -> Figures:
    f = Figures(s)
    largest = max(s.sizes)
    with psycopg.connect(db, autocommit=True) as conn:
        f.synchronous_commit = str(conn.execute("SHOW synchronous_commit").fetchone()[0])  # type: ignore[index]
    for size in s.sizes:
        t0 = time.monotonic()
        fresh_schema(db, _schema(size))
        with psycopg.connect(db, autocommit=True) as conn:
            fill(conn, _schema(size), 0 if size == largest else size, s.kept if size == largest else 0)
            conn.execute(sql.SQL("VACUUM ANALYZE {}").format(_t(_schema(size))))
        log(f"filled {_schema(size)} in {time.monotonic() - t0:.1f} s")

    # Idle latency with the kept rows in the table and no backlog.
    gc.collect()
    f.starts = runtime_latency(db, _schema(largest), s.probes, s.probe_workers)
    log(f"idle enqueue -> start p50 {percentile(f.starts, 50) * 1e3:.2f} ms, p99 {percentile(f.starts, 99) * 1e3:.2f} ms "
        f"({s.kept:,} completed rows in the table)")  # fmt: skip
    t0 = time.monotonic()
    with psycopg.connect(db, autocommit=True) as conn:
        add_available(conn, _schema(largest), largest, time.time() - 3600)
    log(f"added {largest:,} available rows to {_schema(largest)} in {time.monotonic() - t0:.1f} s")

    def drain_size(size: int, workers: int) -> int:
        return min(size, s.drain.get(workers, 10_000))

    def run_loop(size: int, workers: int) -> float:
        restore(db, _schema(size), size)
        gc.collect()
        n = drain_size(size, workers)
        return n / loop_drain(db, _schema(size), n, workers)

    def run_rt(size: int, workers: int) -> float:
        restore(db, _schema(size), size)
        gc.collect()
        n = drain_size(size, workers)
        elapsed, problem = runtime_drain(db, _schema(size), n, workers)
        if problem:
            f.problems.append(f"{size:,} rows, {workers} workers: {problem}")
            log(f"  UNWRITTEN: {problem}")
        return n / elapsed

    # Unmeasured warm-up of both sides: imports, first connections, the server's caches.
    run_loop(min(s.sizes), max(s.workers))
    run_rt(min(s.sizes), max(s.workers))

    for r in range(s.rounds):
        for size in s.sizes:
            for workers in s.workers:
                if r % 2 == 0:
                    b = run_loop(size, workers)
                    v = run_rt(size, workers)
                else:
                    v = run_rt(size, workers)
                    b = run_loop(size, workers)
                f.loop.setdefault((size, workers), []).append(b)
                f.rt.setdefault((size, workers), []).append(v)
                log(f"round {r + 1}/{s.rounds} {size:>9,} rows, {workers:>2} workers: "
                    f"loop {b:,.0f}/s  runtime {v:,.0f}/s  ratio {v / b:.2f}")  # fmt: skip

    proc_size = max(s.sizes)  # room for ~100k jobs a window at every rate seen
    for r in range(s.proc_rounds):
        for procs in ((1, 2) if r % 2 == 0 else (2, 1)):
            restore(db, _schema(proc_size), proc_size)
            rate, problem = processes_rate(db, _schema(proc_size), procs, s.proc_workers, s.proc_window, s.proc_warmup)
            if problem in (RAN_OUT, STALLED):
                f.invalid_rounds.add(r)
                f.invalid.append(f"{procs} processes, round {r + 1}: {problem}")
                log(f"  INVALID: {problem}")
            elif problem:
                f.problems.append(f"{procs} processes: {problem}")
                log(f"  UNWRITTEN: {problem}")
            f.procs.setdefault(procs, []).append(rate)
            log(f"round {r + 1}/{s.proc_rounds} {procs} worker process(es) x {s.proc_workers} workers, "
                f"{proc_size:,} rows: {rate:,.0f}/s")  # fmt: skip
    return f


def table(f: Figures) -> str:
    ok = {k: "PASS" if v else "FAIL" for k, v in f.verdicts().items()}
    med = statistics.median
    s = f.sizes
    rows: list[Sequence[str]] = [("metric", "value", "target", "result")]
    for size in s.sizes:
        for w in s.workers:
            key = f"runtime / loop, {size:,} rows, {w} workers"
            rounds = ", ".join(f"{a / b:.2f}" for a, b in zip(f.rt[size, w], f.loop[size, w]))
            rows.append((
                f"{size:,} rows, {w} workers: loop / runtime (median jobs/s)",
                f"{med(f.loop[size, w]):,.0f} / {med(f.rt[size, w]):,.0f}", "", "",
            ))  # fmt: skip
            rows.append((f"  ratio (rounds {rounds})", f"{f.vs_loop(size, w):.2f}", f">= {TARGET_VS_LOOP.get(w, 1.0)}", ok[key]))
    if len(s.sizes) > 1:
        for w in s.workers:
            key = f"{max(s.sizes):,}-row / {min(s.sizes):,}-row drain, {w} workers"
            rows.append((f"runtime {key}", f"{f.size_ratio(w):.2f}", f">= {TARGET_SIZE}", ok[key]))
            loop_ratio = med(f.loop[max(s.sizes), w]) / med(f.loop[min(s.sizes), w])
            rows.append(("  (loop, the same)", f"{loop_ratio:.2f}", "(reported)", ""))
    for procs, values in sorted(f.procs.items()):
        rows.append((f"{procs} worker process(es) x {s.proc_workers} workers (median)", f"{med(values):,.0f} jobs/s", "", ""))
    ratio = f.procs_ratio()
    if ratio is not None:
        rounds = ", ".join(f"{a / b:.2f}" for a, b in f.procs_pairs())
        rows.append((f"2 processes / 1 (rounds {rounds})", f"{ratio:.2f}", f">= {TARGET_PROCS}", ok["2 processes / 1"]))
    rows.append(("runs with an outcome left unwritten", str(len(f.problems)), "0", ok["no outcome left unwritten"]))
    if f.starts:
        rows += [
            (f"idle enqueue -> start p50 ({len(f.starts)} samples, {s.kept:,} completed rows)",
             f"{percentile(f.starts, 50) * 1e3:.2f} ms", f"<= {TARGET_START_P50 * 1e3:g} ms", ok["idle start p50"]),
            ("idle enqueue -> start p99", f"{percentile(f.starts, 99) * 1e3:.2f} ms", f"<= {TARGET_START_P99 * 1e3:g} ms", ok["idle start p99"]),
        ]  # fmt: skip
    rows.append(("synchronous_commit", f.synchronous_commit, "", ""))
    return render_table(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="nursery_jobs on PostgreSQL under production conditions")
    parser.add_argument("--smoke", action="store_true", help="tiny tables, one round: proves the script runs")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--rounds", type=int, help=f"rounds (default {Sizes().rounds})")
    parser.add_argument("--sizes", help="comma-separated table sizes (default 10000,100000,1000000)")
    parser.add_argument("--workers-list", help="comma-separated worker counts (default 1,8,32)")
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=32, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return serve_worker(build_app, args.worker, args.workers)
    sizes = SMOKE if args.smoke else Sizes()
    if args.rounds:
        sizes = attrs.evolve(sizes, rounds=args.rounds, proc_rounds=args.rounds)
    if args.sizes:
        sizes = attrs.evolve(sizes, sizes=tuple(int(x) for x in args.sizes.split(",")))
    if args.workers_list:
        sizes = attrs.evolve(sizes, workers=tuple(int(x) for x in args.workers_list.split(",")))
    print(f"nursery_jobs PostgreSQL production-conditions benchmark: {sizes}")
    print(
        f"python {sys.version.split()[0]}, trio {trio.__version__}, psycopg {psycopg.__version__} "
        f"({psycopg.pq.__impl__}), nursery_jobs {nj.__version__}"
    )
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    started = time.monotonic()
    try:
        with throwaway_database("prod") as db:
            figures = measure(db, sizes)
    except PgUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    print()
    print(table(figures))
    for problem in figures.problems:
        print(f"unwritten: {problem}")
    for note in figures.invalid:
        print(f"invalid (not judged): {note}")
    return conclude(figures.verdicts(), started=started, smoke=args.smoke, check=args.check)


if __name__ == "__main__":
    sys.exit(main())
