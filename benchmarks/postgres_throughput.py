"""PostgreSQL-backend benchmark: end-to-end throughput, enqueue cost and idle latency, each judged
as a ratio against a raw baseline measured in the same run (never as an absolute time).

The claims it checks (each with its target, from the issue):

1. **Throughput, one process.** N no-op jobs end to end (``enqueue_many`` of N, then every job
   claimed, run and its outcome written) reach >= 0.5 of a raw baseline: the same N rows
   `COPY`-ed into a table of the runtime's own schema (same indexes), then claimed with
   ``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT k) RETURNING`` over the
   `available` rows (the partial index the schema has for them, since migration 0002; every raw
   row is available, so it needs no promotion of scheduled ones) and completed
   with one ``UPDATE ... WHERE id = ANY(...)``, k = 100 rows per transaction, two autocommit
   transactions per batch, one connection, psycopg sync (the runtime's own driver). The runtime
   side runs a queue of K = 100 workers, so it claims at most 100 jobs per statement as well.
   The clock stops when the outcome of the job that ran last is recorded.
   Reported beside it, not judged: the same run with the work done by 1 and by 2 worker
   *processes* (``sys.executable`` running this file with ``--worker``, each a ``nj.run`` worker
   of the queue) while this process only enqueues; the clock starts once every worker reported
   ready, so interpreter start-up is not measured.
2. **Enqueue, one by one.** ``rt.enqueue`` in a loop reaches >= 0.8 of a raw loop of single-row
   ``INSERT ... RETURNING id`` statements, each its own (autocommit) transaction.
3. **Enqueue, bulk.** ``enqueue_many`` of 10,000 reaches >= 0.5 of a raw ``COPY`` of the same rows.
4. **Idle latency.** On an idle queue with 10 parked workers, enqueue one job at a time
   (``time.perf_counter`` before ``rt.enqueue``; the handler records its own start), waiting for
   its receipt and a short pause before the next: enqueue -> handler start p50 <= 2.5 ms and
   p99 <= 5 ms; enqueue -> ``rt.wait`` receipt p50 <= 10 ms.

Throughput and enqueue rounds alternate baseline and runtime on tables emptied before each
side (``TRUNCATE``), and the judged ratio is the median of the per-round ratios (each pair ran
back to back, which cancels most of a shared machine's drift).

Usage (PostgreSQL on 127.0.0.1:5432, trust auth, or the admin URL in NJ_BENCH_PG_URL; the script
creates and drops its own database):

    .venv/bin/python benchmarks/postgres_throughput.py            # full run, a few minutes
    .venv/bin/python benchmarks/postgres_throughput.py --check    # exit 1 if a target is missed
    .venv/bin/python benchmarks/postgres_throughput.py --smoke    # tiny sizes: only proves it runs

Results are recorded in benchmarks/RESULTS.md. Speed is never asserted in tests.
"""

from __future__ import annotations

import argparse
import gc
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

try:  # imported as `benchmarks.postgres_throughput`
    from .durable_side import (
        QUEUE, Tally, add_bench_kinds, add_process_kinds, idle_latency, run_app, serve_worker, worker_processes,
    )
    from .report import conclude, load_average
    from .pg_common import (
        PgUnavailable,
        ServerCpu,
        backend_url,
        fresh_schema,
        median_ratio,
        percentile,
        render_table,
        throwaway_database,
        truncate,
    )
except ImportError:  # run as a script: benchmarks/ is sys.path[0]
    from durable_side import (  # type: ignore[no-redef]
        QUEUE, Tally, add_bench_kinds, add_process_kinds, idle_latency, run_app, serve_worker, worker_processes,
    )
    from report import conclude, load_average  # type: ignore[no-redef]
    from pg_common import (  # type: ignore[no-redef]
        PgUnavailable,
        ServerCpu,
        backend_url,
        fresh_schema,
        median_ratio,
        percentile,
        render_table,
        throwaway_database,
        truncate,
    )

__all__ = ["Figures", "Sizes", "main"]

TARGET_THROUGHPUT = 0.5
TARGET_ENQUEUE_ONE = 0.8
TARGET_ENQUEUE_MANY = 0.5
TARGET_START_P50 = 0.0025
TARGET_START_P99 = 0.005
TARGET_RECEIPT_P50 = 0.010

RT_SCHEMA = "nj_rt"
RAW_SCHEMA = "nj_raw"


@attrs.frozen
class Sizes:
    jobs: int = 10_000
    """No-op jobs per end-to-end throughput round (runtime and baseline alike)."""
    rounds: int = 5
    batch: int = 100
    """k: the baseline's rows per claim/complete transaction, and the runtime queue's max_workers."""
    proc_rounds: int = 3
    """Rounds of the 1- and 2-worker-process runs."""
    procs: tuple[int, ...] = (1, 2)
    one_by_one: int = 2_000
    """Jobs per round of the one-by-one enqueue comparison."""
    bulk: int = 10_000
    """Jobs per round of the enqueue_many / COPY comparison."""
    probes: int = 200
    """Sequential samples for the idle latency."""
    probe_workers: int = 10


SMOKE = Sizes(jobs=300, rounds=1, batch=100, proc_rounds=1, procs=(2,), one_by_one=50, bulk=300, probes=10)


@attrs.frozen
class Figures:
    sizes: Sizes
    raw_e2e: list[float]
    """Raw baseline end to end, jobs/s per round."""
    rt_e2e: list[float]
    raw_cpu: list[float]
    """Client CPU seconds per job, per round (the whole process, every thread)."""
    rt_cpu: list[float]
    raw_server_cpu: list[float]
    """Server CPU seconds per job (the backends of the benchmark database), per round; empty if
    /proc could not be read."""
    rt_server_cpu: list[float]
    procs_e2e: dict[int, list[float]]
    """Worker processes -> jobs/s per round (enqueued by this process, run by the workers)."""
    raw_insert: list[float]
    rt_enqueue: list[float]
    raw_copy: list[float]
    rt_enqueue_many: list[float]
    start_latency: list[float]
    receipt_latency: list[float]
    floor_start: list[float]
    """The raw latency floor (`raw_latency_floor`): reported beside the judged figures."""
    floor_receipt: list[float]
    synchronous_commit: str

    @property
    def throughput_ratio(self) -> float:
        return median_ratio(self.rt_e2e, self.raw_e2e)

    @property
    def cpu_ratio(self) -> float | None:
        """Raw (client + server) CPU per job / runtime (client + server) CPU per job, median of
        rounds: what the wall ratio would be on a machine whose cores were all ours."""
        if not self.raw_server_cpu or not self.rt_server_cpu:
            return None
        return statistics.median(
            (rc + rs) / (tc + ts) for rc, rs, tc, ts in zip(self.raw_cpu, self.raw_server_cpu, self.rt_cpu, self.rt_server_cpu)
        )

    @property
    def enqueue_one_ratio(self) -> float:
        return median_ratio(self.rt_enqueue, self.raw_insert)

    @property
    def enqueue_many_ratio(self) -> float:
        return median_ratio(self.rt_enqueue_many, self.raw_copy)

    def verdicts(self) -> dict[str, bool]:
        return {
            "throughput ratio (1 process)": self.throughput_ratio >= TARGET_THROUGHPUT,
            "enqueue one-by-one ratio": self.enqueue_one_ratio >= TARGET_ENQUEUE_ONE,
            "enqueue_many ratio": self.enqueue_many_ratio >= TARGET_ENQUEUE_MANY,
            "idle start p50": percentile(self.start_latency, 50) <= TARGET_START_P50,
            "idle start p99": percentile(self.start_latency, 99) <= TARGET_START_P99,
            "idle receipt p50": percentile(self.receipt_latency, 50) <= TARGET_RECEIPT_P50,
        }


# -- the raw baselines (sync psycopg, one connection, no Trio) --------------------------------------

_COLUMNS = "kind, queue, args, state, max_attempts, priority, run_at, created_at"


def _raw_row(now: float) -> tuple[Any, ...]:
    return ("noop", QUEUE, "{}", "available", 25, 0, now, now)


def _raw_copy(conn: psycopg.Connection[Any], n: int) -> None:
    now = time.time()
    row = _raw_row(now)
    with conn.cursor() as cur:
        with cur.copy(
            sql.SQL("COPY {}.jobs (" + _COLUMNS + ") FROM STDIN").format(sql.Identifier(RAW_SCHEMA))
        ) as copy:
            for _ in range(n):
                copy.write_row(row)


def raw_end_to_end(url: str, n: int, batch: int) -> tuple[float, float, float | None]:
    """(wall, client CPU, server CPU) seconds for: COPY n rows, then claim + complete them
    `batch` rows per transaction."""
    s = sql.Identifier(RAW_SCHEMA)
    claim = sql.SQL(
        "UPDATE {s}.jobs SET state = 'running', attempt = attempt + 1, attempted_at = %(now)s, heartbeat_at = %(now)s"
        " WHERE id IN (SELECT id FROM {s}.jobs WHERE queue = %(queue)s"
        "  AND state = 'available' AND NOT parked AND run_at <= %(now)s"
        "  ORDER BY priority DESC, run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
        " RETURNING id, kind, args::text, attempt"
    ).format(s=s)
    complete = sql.SQL(
        "UPDATE {s}.jobs SET state = 'completed', finalized_at = %s, heartbeat_at = NULL WHERE id = ANY(%s)"
    ).format(s=s)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")
        server = ServerCpu(url)
        server.start()
        cpu = time.process_time()
        started = time.perf_counter()
        with conn.transaction():
            _raw_copy(conn, n)
        done = 0
        while True:
            rows = conn.execute(claim, {"now": time.time(), "queue": QUEUE, "limit": batch}).fetchall()
            if not rows:
                break
            conn.execute(complete, (time.time(), [r[0] for r in rows]))
            done += len(rows)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        server.stop()
    if done != n:
        raise RuntimeError(f"raw baseline completed {done} of {n} rows")
    return elapsed, cpu, server.seconds


def raw_insert_loop(url: str, n: int) -> float:
    """Seconds for n single-row INSERT ... RETURNING id statements, each committed on its own."""
    q = sql.SQL("INSERT INTO {}.jobs (" + _COLUMNS + ") VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING id").format(
        sql.Identifier(RAW_SCHEMA)
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")
        started = time.perf_counter()
        for _ in range(n):
            now = time.time()
            conn.execute(q, _raw_row(now)).fetchone()
        return time.perf_counter() - started


def raw_latency_floor(url: str, probes: int) -> tuple[list[float], list[float]]:
    """The least any PostgreSQL job queue pays between enqueue and start / receipt, per sample:
    an INSERT committed on one connection, the claim UPDATE committed on a second (the worker's),
    then the completion UPDATE committed there and the state read back on the first. Sync
    psycopg, no Trio, no NOTIFY, no thread hop: the database's round trips and commits only."""
    s = sql.Identifier(RAW_SCHEMA)
    insert = sql.SQL("INSERT INTO {}.jobs (" + _COLUMNS + ") VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING id").format(s)
    claim = sql.SQL(
        "UPDATE {s}.jobs SET state = 'running', attempt = attempt + 1, attempted_at = %(now)s, heartbeat_at = %(now)s"
        " WHERE id IN (SELECT id FROM {s}.jobs WHERE queue = %(queue)s"
        "  AND state = 'available' AND NOT parked AND run_at <= %(now)s"
        "  ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)"
        " RETURNING id, kind, args::text, attempt"
    ).format(s=s)
    complete = sql.SQL("UPDATE {}.jobs SET state = 'completed', finalized_at = %s WHERE id = %s").format(s)
    read = sql.SQL("SELECT state FROM {}.jobs WHERE id = %s").format(s)
    starts: list[float] = []
    receipts: list[float] = []
    with psycopg.connect(url, autocommit=True) as client, psycopg.connect(url, autocommit=True) as worker:
        for i in range(probes + 3):
            time.sleep(0.005)
            t0 = time.perf_counter()
            (job_id,) = client.execute(insert, _raw_row(time.time())).fetchone()  # type: ignore[misc]
            rows = worker.execute(claim, {"now": time.time(), "queue": QUEUE}).fetchall()
            t1 = time.perf_counter()
            worker.execute(complete, (time.time(), rows[0][0]))
            (state,) = client.execute(read, (job_id,)).fetchone()  # type: ignore[misc]
            t2 = time.perf_counter()
            if rows[0][0] != job_id or state != "completed":
                raise RuntimeError(f"raw latency floor: claimed {rows}, state {state!r}")
            if i >= 3:  # the first samples warm the connections: not measured
                starts.append(t1 - t0)
                receipts.append(t2 - t0)
    return starts, receipts


def raw_copy(url: str, n: int) -> float:
    """Seconds to COPY n rows in one transaction."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT 1")
        started = time.perf_counter()
        with conn.transaction():
            _raw_copy(conn, n)
        return time.perf_counter() - started


# -- the runtime side -------------------------------------------------------------------------------


def build_app(workers: int, launchers: int = 0) -> tuple[nj.App, list[Tally]]:
    """The benchmark's app. Worker processes build the same one, so every kind is known there:
    `bench`, the measured queue (`noop`, `probe`), and what worker processes need (`ctl`,
    `launch`: durable_side.add_process_kinds)."""
    app = nj.App()
    box = add_bench_kinds(app, workers)
    add_process_kinds(app, __file__, launchers)
    return app, box


def runtime_end_to_end(url: str, n: int, workers: int, db: str | None = None) -> tuple[float, float, float | None]:
    """(wall, client CPU, server CPU) seconds for the runtime, in this one process, to
    enqueue_many n no-op jobs and run them all, up to the recorded outcome of the job that ran
    last. Client CPU is the whole process's (every thread's), over the same span; server CPU
    that of the backends serving database `db` (None: not measured)."""
    app, box = build_app(workers)
    tally = box[0] = Tally(n)

    server = ServerCpu(db) if db else None

    async def main(rt: nj.Runtime) -> tuple[float, float, float | None]:
        await trio.sleep(0.05)  # let every worker park before the clock starts
        if server:
            server.start()  # blocks the loop for a moment, before the clock starts
        cpu = time.process_time()
        started = time.perf_counter()
        await rt.enqueue_many("noop", ({} for _ in range(n)))
        with trio.fail_after(max(60.0, n / 200)):
            await tally.done.wait()
            receipt = await rt.wait(tally.last_id, timeout=30.0)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        if server:
            server.stop()
        if not receipt.done:
            raise RuntimeError(f"job {tally.last_id} ran but its outcome was not recorded: {receipt}")
        stats = (await rt.stats())[QUEUE]
        if stats.completed != n:
            raise RuntimeError(f"expected {n} completed jobs, the backend holds {stats}")
        return elapsed, cpu, server.seconds if server else None

    result: tuple[float, float, float | None] = run_app(main, app, url)
    return result


def runtime_enqueue_loop(url: str, n: int) -> float:
    """Seconds for n `rt.enqueue` calls in a row, on an enqueue-only runtime."""
    app, _box = build_app(1)

    async def main(rt: nj.Runtime) -> float:
        await rt.enqueue("noop")  # first use of a pooled connection: not measured
        started = time.perf_counter()
        for _ in range(n):
            await rt.enqueue("noop")
        return time.perf_counter() - started

    result: float = run_app(main, app, url, queues=[])
    return result


def runtime_enqueue_many(url: str, n: int) -> float:
    """Seconds for one `rt.enqueue_many` of n jobs, on an enqueue-only runtime."""
    app, _box = build_app(1)

    async def main(rt: nj.Runtime) -> float:
        await rt.enqueue_many("noop", [{}])  # first use of a pooled connection: not measured
        started = time.perf_counter()
        await rt.enqueue_many("noop", ({} for _ in range(n)))
        return time.perf_counter() - started

    result: float = run_app(main, app, url, queues=[])
    return result


def runtime_latency(url: str, probes: int, workers: int) -> tuple[list[float], list[float]]:
    """(enqueue -> handler start, enqueue -> receipt) in seconds, `probes` sequential samples."""
    app, box = build_app(workers)

    async def main(rt: nj.Runtime) -> tuple[list[float], list[float]]:
        return await idle_latency(rt, box[0], probes)

    result: tuple[list[float], list[float]] = run_app(main, app, url)
    return result


def runtime_processes(url: str, n: int, workers: int, procs: int) -> float:
    """Seconds for `procs` worker processes to run n no-op jobs this process enqueues, from the
    `enqueue_many` (after every worker reported ready) to the last outcome recorded."""
    app, _box = build_app(workers, launchers=procs)

    async def main(rt: nj.Runtime) -> float:
        async with worker_processes(rt, url, workers, [None] * procs):
            await trio.sleep(0.1)  # every worker parked
            started = time.perf_counter()
            ids = await rt.enqueue_many("noop", ({} for _ in range(n)))
            with trio.fail_after(max(60.0, n / 200)):
                await rt.wait(ids[-1], timeout=max(60.0, n / 200))
                while (await rt.stats())[QUEUE].completed < n:
                    await trio.sleep(0.001)
            return time.perf_counter() - started

    result: float = run_app(main, app, url, queues=["launch"])
    return result


# -- the run ---------------------------------------------------------------------------------------


def measure(db: str, sizes: Sizes, *, log: Callable[[str], None] = print) -> Figures:
    fresh_schema(db, RT_SCHEMA)
    fresh_schema(db, RAW_SCHEMA)
    rt_url = backend_url(db, RT_SCHEMA)

    def paired(name: str, rounds: int, size: int, raw: Callable[[], float], rt: Callable[[], float]) -> tuple[list[float], list[float]]:
        raws: list[float] = []
        rts: list[float] = []
        for i in range(rounds):
            truncate(db, RT_SCHEMA, RAW_SCHEMA)
            gc.collect()
            b = size / raw()
            truncate(db, RT_SCHEMA, RAW_SCHEMA)
            gc.collect()
            r = size / rt()
            raws.append(b)
            rts.append(r)
            log(f"{name} round {i + 1}/{rounds}: raw {b:,.0f}/s  runtime {r:,.0f}/s  ratio {r / b:.2f}")
        return raws, rts

    # One unmeasured warm-up of each side, so imports and first-use costs are out of round 1.
    truncate(db, RT_SCHEMA, RAW_SCHEMA)
    raw_end_to_end(db, min(sizes.jobs, 1_000), sizes.batch)
    runtime_end_to_end(rt_url, min(sizes.jobs, 1_000), sizes.batch)

    raw_cpu: list[float] = []
    rt_cpu: list[float] = []
    raw_server: list[float] = []
    rt_server: list[float] = []

    def timed(fn: Callable[[], tuple[float, float, float | None]], cpus: list[float], servers: list[float]) -> float:
        wall, cpu, server = fn()
        cpus.append(cpu / sizes.jobs)
        if server is not None:
            servers.append(server / sizes.jobs)
        return wall

    raw_e2e, rt_e2e = paired(
        "end-to-end",
        sizes.rounds,
        sizes.jobs,
        lambda: timed(lambda: raw_end_to_end(db, sizes.jobs, sizes.batch), raw_cpu, raw_server),
        lambda: timed(lambda: runtime_end_to_end(rt_url, sizes.jobs, sizes.batch, db), rt_cpu, rt_server),
    )
    procs_e2e: dict[int, list[float]] = {}
    for procs in sizes.procs:
        for i in range(sizes.proc_rounds):
            truncate(db, RT_SCHEMA)
            gc.collect()
            r = sizes.jobs / runtime_processes(rt_url, sizes.jobs, sizes.batch, procs)
            procs_e2e.setdefault(procs, []).append(r)
            log(f"{procs} worker process(es) round {i + 1}/{sizes.proc_rounds}: {r:,.0f}/s")
    raw_insert, rt_enqueue = paired(
        "enqueue one-by-one",
        sizes.rounds,
        sizes.one_by_one,
        lambda: raw_insert_loop(db, sizes.one_by_one),
        lambda: runtime_enqueue_loop(rt_url, sizes.one_by_one),
    )
    raw_copy_, rt_many = paired(
        "enqueue_many / COPY",
        sizes.rounds,
        sizes.bulk,
        lambda: raw_copy(db, sizes.bulk),
        lambda: runtime_enqueue_many(rt_url, sizes.bulk),
    )
    truncate(db, RT_SCHEMA, RAW_SCHEMA)
    gc.collect()
    floor_starts, floor_receipts = raw_latency_floor(db, sizes.probes)
    gc.collect()
    starts, receipts = runtime_latency(rt_url, sizes.probes, sizes.probe_workers)
    with psycopg.connect(db) as conn:
        sync = str(conn.execute("SHOW synchronous_commit").fetchone()[0])  # type: ignore[index]
    return Figures(
        sizes, raw_e2e, rt_e2e, raw_cpu, rt_cpu, raw_server, rt_server, procs_e2e, raw_insert, rt_enqueue, raw_copy_, rt_many,
        starts, receipts, floor_starts, floor_receipts, sync,
    )  # fmt: skip


def table(f: Figures) -> str:
    ok = {k: "PASS" if v else "FAIL" for k, v in f.verdicts().items()}
    s = f.sizes
    med = statistics.median
    rows: list[Sequence[str]] = [
        ("metric", "value", "target", "result"),
        (f"raw: COPY + claim/complete k={s.batch} (median)", f"{med(f.raw_e2e):,.0f} jobs/s", "", ""),
        (f"runtime: 1 process, K={s.batch} (median)", f"{med(f.rt_e2e):,.0f} jobs/s", "", ""),
        ("throughput ratio, 1 process (median of round ratios)", f"{f.throughput_ratio:.2f}", f">= {TARGET_THROUGHPUT}", ok["throughput ratio (1 process)"]),
        ("client CPU per job, raw / runtime (median)", f"{med(f.raw_cpu) * 1e6:.0f} / {med(f.rt_cpu) * 1e6:.0f} us", "(reported)", ""),
    ]
    if f.cpu_ratio is not None:
        rows += [
            ("server CPU per job, raw / runtime (median)",
             f"{med(f.raw_server_cpu) * 1e6:.0f} / {med(f.rt_server_cpu) * 1e6:.0f} us", "(reported)", ""),
            ("CPU-time ratio, client + server (median of rounds)", f"{f.cpu_ratio:.2f}", "(reported)", ""),
        ]  # fmt: skip
    for procs, values in sorted(f.procs_e2e.items()):
        rows.append(
            (f"runtime: {procs} worker process(es), K={s.batch} each (median)",
             f"{med(values):,.0f} jobs/s (x{med(values) / med(f.raw_e2e):.2f} raw)", "(reported)", "")
        )  # fmt: skip
    rows += [
        ("raw: INSERT + commit, one by one (median)", f"{med(f.raw_insert):,.0f} jobs/s", "", ""),
        ("runtime: rt.enqueue, one by one (median)", f"{med(f.rt_enqueue):,.0f} jobs/s", "", ""),
        ("enqueue one-by-one ratio", f"{f.enqueue_one_ratio:.2f}", f">= {TARGET_ENQUEUE_ONE}", ok["enqueue one-by-one ratio"]),
        (f"raw: COPY of {s.bulk:,} (median)", f"{med(f.raw_copy):,.0f} jobs/s", "", ""),
        (f"runtime: enqueue_many of {s.bulk:,} (median)", f"{med(f.rt_enqueue_many):,.0f} jobs/s", "", ""),
        ("enqueue_many ratio", f"{f.enqueue_many_ratio:.2f}", f">= {TARGET_ENQUEUE_MANY}", ok["enqueue_many ratio"]),
        (f"idle enqueue -> start p50 ({len(f.start_latency)} samples)", f"{percentile(f.start_latency, 50) * 1e3:.2f} ms", f"<= {TARGET_START_P50 * 1e3:g} ms", ok["idle start p50"]),
        ("idle enqueue -> start p99", f"{percentile(f.start_latency, 99) * 1e3:.2f} ms", f"<= {TARGET_START_P99 * 1e3:g} ms", ok["idle start p99"]),
        ("idle enqueue -> receipt p50", f"{percentile(f.receipt_latency, 50) * 1e3:.2f} ms", f"<= {TARGET_RECEIPT_P50 * 1e3:g} ms", ok["idle receipt p50"]),
        ("idle enqueue -> receipt p99", f"{percentile(f.receipt_latency, 99) * 1e3:.2f} ms", "(reported)", ""),
        ("raw floor: INSERT, then claim on a 2nd connection p50 / p99",
         f"{percentile(f.floor_start, 50) * 1e3:.2f} / {percentile(f.floor_start, 99) * 1e3:.2f} ms", "(reported)", ""),
        ("raw floor: ... + complete + read back p50 / p99",
         f"{percentile(f.floor_receipt, 50) * 1e3:.2f} / {percentile(f.floor_receipt, 99) * 1e3:.2f} ms", "(reported)", ""),
        ("synchronous_commit (every commit waits for the WAL flush when on)", f.synchronous_commit, "", ""),
    ]  # fmt: skip
    return render_table(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="nursery_jobs PostgreSQL-backend throughput, enqueue cost and latency")
    parser.add_argument(
        "--smoke", "--quick", dest="smoke", action="store_true",
        help="tiny sizes, one round: proves the script runs (--quick: its older name)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--jobs", type=int, help=f"jobs per end-to-end round (default {Sizes().jobs:,})")
    parser.add_argument("--rounds", type=int, help=f"alternating rounds (default {Sizes().rounds})")
    parser.add_argument(
        "--synchronous-commit",
        choices=("on", "off"),
        help="set synchronous_commit on the benchmark database (default: the server's setting); "
        "'off' takes the disk's flush time out of every commit, runtime and baselines alike",
    )
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=Sizes().batch, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return serve_worker(build_app, args.worker, args.workers)
    sizes = SMOKE if args.smoke else Sizes()
    overrides = {k: v for k, v in (("jobs", args.jobs), ("rounds", args.rounds)) if v}
    sizes = attrs.evolve(sizes, **overrides)

    print(f"nursery_jobs PostgreSQL benchmark: {sizes}")
    print(
        f"python {sys.version.split()[0]}, trio {trio.__version__}, psycopg {psycopg.__version__} "
        f"({psycopg.pq.__impl__}), nursery_jobs {nj.__version__}"
    )
    print(f"load average at start: {load_average()} ({os.cpu_count()} CPUs)")
    started = time.monotonic()
    try:
        with throwaway_database("pg") as db:
            with psycopg.connect(db, autocommit=True) as conn:
                if args.synchronous_commit:
                    conn.execute(
                        sql.SQL("ALTER DATABASE {} SET synchronous_commit = {}").format(
                            sql.Identifier(conn.info.dbname), sql.SQL(args.synchronous_commit)
                        )
                    )
            with psycopg.connect(db) as conn:  # a new session sees the database's setting
                row = conn.execute("SHOW synchronous_commit").fetchone()
                print(f"server: PostgreSQL {conn.info.server_version}, synchronous_commit={row[0] if row else '?'}")
            figures = measure(db, sizes)
    except PgUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    print()
    print(table(figures))
    return conclude(figures.verdicts(), started=started, smoke=args.smoke, check=args.check)


if __name__ == "__main__":
    sys.exit(main())
