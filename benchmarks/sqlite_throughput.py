"""SQLite-backend benchmark: end-to-end throughput against a raw sqlite3 baseline, and idle latency.

The claims it checks (the issue sets no SQLite figures; these targets are the PostgreSQL ones,
applied by analogy, and say so in the table):

1. **Throughput.** N no-op jobs end to end (``enqueue_many`` of N, every job claimed, run and its
   outcome written, up to the recorded outcome of the job that ran last) reach >= 0.5 of a raw
   baseline in the same run: plain ``sqlite3`` on a file of the runtime's own schema (the runtime
   creates it), the same journal mode (WAL) and ``synchronous`` setting, the N rows inserted
   with one ``executemany`` in one transaction, then claimed with ``UPDATE ... WHERE id IN
   (SELECT ... LIMIT k) RETURNING`` and completed with one ``UPDATE ... WHERE id IN (...)``, each
   its own ``BEGIN IMMEDIATE`` transaction, k = 100 rows per transaction. The runtime's queue
   has K = 100 workers, so it claims at most 100 jobs per statement as well. Rounds alternate
   baseline and runtime, each on fresh files; the judged ratio is the median of the per-round
   ratios.
2. **Idle latency.** On an idle queue with 10 parked workers, enqueue one job at a time
   (``time.perf_counter`` before ``rt.enqueue``; the handler records its start), waiting for its
   receipt and a short pause before the next: enqueue -> handler start p50 <= 2.5 ms and
   p99 <= 5 ms, enqueue -> ``rt.wait`` receipt p50 <= 10 ms. Reported beside it: the raw floor,
   the same three commits (insert, claim, complete) and a read back with plain sqlite3.
3. **Cross-process latency.** The same probe across two processes: the queue's 10 workers run
   here, and the probes are enqueued by an enqueue-only runtime in another process (this script
   started again, as a web process would enqueue), which awaits each receipt before the next:
   enqueue -> handler start p50 <= 10 ms and p99 <= 50 ms, with the wake-up sockets
   (`nursery_jobs.infra.wake`). Both processes read ``time.monotonic()`` (CLOCK_MONOTONIC on
   Linux: one clock for every process of the host); the web process writes its enqueue times to
   a file, read once it has exited. Beside it, in the same run: the same probes with wake-ups
   off in both processes (``?wake=off``), where only the 1 s poll starts a job (fewer probes:
   each takes up to two polls), and what a wake-up costs the writer: one `WakeRegistry.send`
   with 0, 1, 4 and 16 listening processes (sockets bound in the registry, drained between
   sends), per call.

Files live in a fresh directory under the system temp dir (or ``--dir``), which must be on a
real disk for the figures to mean anything: with ``synchronous=full`` every commit waits for
the WAL to reach the disk, in the runtime and the baseline alike.

Usage:

    .venv/bin/python benchmarks/sqlite_throughput.py                      # full run
    .venv/bin/python benchmarks/sqlite_throughput.py --synchronous normal # the other durable mode
    .venv/bin/python benchmarks/sqlite_throughput.py --check              # exit 1 if a target is missed
    .venv/bin/python benchmarks/sqlite_throughput.py --smoke              # tiny sizes: proves it runs
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from typing import Callable, Sequence

import attrs
import trio

import nursery_jobs as nj
from nursery_jobs.infra.wake import Wake, WakeRegistry

try:  # imported as `benchmarks.sqlite_throughput`
    from .durable_side import QUEUE, Tally, add_bench_kinds, idle_latency, run_app
    from .report import conclude, load_average, percentile, render_table
except ImportError:  # run as a script: benchmarks/ is sys.path[0]
    from durable_side import QUEUE, Tally, add_bench_kinds, idle_latency, run_app  # type: ignore[no-redef]
    from report import conclude, load_average, percentile, render_table  # type: ignore[no-redef]

__all__ = ["Figures", "Sizes", "main"]

TARGET_THROUGHPUT = 0.5
TARGET_START_P50 = 0.0025
TARGET_START_P99 = 0.005
TARGET_RECEIPT_P50 = 0.010
TARGET_CROSS_START_P50 = 0.010
TARGET_CROSS_START_P99 = 0.050
SEND_LISTENERS = (0, 1, 4, 16)
_PENDING = "(state = 'available' OR state = 'scheduled' OR state = 'retryable') AND parked = 0"
"""The raw claim's rows, in the words of the runtime's own claim and of the `nj_jobs_claimable`
index: SQLite uses a partial index only for a query that states its condition, and no index says
``state IN (...)``, with which the claim would read the whole table and sort it."""


@attrs.frozen
class Sizes:
    jobs: int = 10_000
    rounds: int = 5
    batch: int = 100
    """k: the baseline's rows per transaction, and the runtime queue's max_workers."""
    probes: int = 200
    probe_workers: int = 10
    cross_probes: int = 300
    """Cross-process probes with wake-ups."""
    poll_probes: int = 60
    """Cross-process probes with wake-ups off: each waits for up to two 1 s polls."""
    sends: int = 2000
    """`WakeRegistry.send` calls timed per listener count."""


SMOKE = Sizes(jobs=300, rounds=1, batch=100, probes=10, cross_probes=10, poll_probes=2, sends=100)


@attrs.frozen
class Figures:
    sizes: Sizes
    synchronous: str
    raw_e2e: list[float]
    rt_e2e: list[float]
    raw_cpu: list[float]
    """CPU seconds per job, per round (the whole process: SQLite runs in it)."""
    rt_cpu: list[float]
    start_latency: list[float]
    receipt_latency: list[float]
    floor_start: list[float]
    floor_receipt: list[float]
    cross_start: list[float]
    cross_receipt: list[float]
    poll_start: list[float]
    poll_receipt: list[float]
    send_cost: dict[int, float]
    """Listening processes -> seconds per `WakeRegistry.send` (median over `sizes.sends`)."""

    @property
    def throughput_ratio(self) -> float:
        return statistics.median(r / b for r, b in zip(self.rt_e2e, self.raw_e2e))

    def verdicts(self) -> dict[str, bool]:
        return {
            "throughput ratio": self.throughput_ratio >= TARGET_THROUGHPUT,
            "idle start p50": percentile(self.start_latency, 50) <= TARGET_START_P50,
            "idle start p99": percentile(self.start_latency, 99) <= TARGET_START_P99,
            "idle receipt p50": percentile(self.receipt_latency, 50) <= TARGET_RECEIPT_P50,
            "cross-process start p50": percentile(self.cross_start, 50) <= TARGET_CROSS_START_P50,
            "cross-process start p99": percentile(self.cross_start, 99) <= TARGET_CROSS_START_P99,
        }


# -- the runtime side -------------------------------------------------------------------------------


def build_app(workers: int) -> tuple[nj.App, list[Tally]]:
    app = nj.App()
    return app, add_bench_kinds(app, workers)


def _url(path: str, synchronous: str) -> str:
    return f"sqlite:///{os.path.abspath(path)}?synchronous={synchronous}"


def create_file(path: str, synchronous: str) -> None:
    """A new jobs file with the runtime's own schema (the runtime creates it)."""
    app, _box = build_app(1)

    async def main(rt: nj.Runtime) -> bool:
        await trio.lowlevel.checkpoint()
        return True

    run_app(main, app, _url(path, synchronous), queues=[])


def runtime_end_to_end(path: str, synchronous: str, n: int, workers: int) -> tuple[float, float]:
    """(wall, CPU) seconds: enqueue_many n no-op jobs and run them all, up to the recorded
    outcome of the job that ran last. CPU is the whole process's (SQLite runs in it)."""
    app, box = build_app(workers)
    tally = box[0] = Tally(n)

    async def main(rt: nj.Runtime) -> tuple[float, float]:
        await trio.sleep(0.05)  # every worker parked, the start-up claim answered
        cpu = time.process_time()
        started = time.perf_counter()
        await rt.enqueue_many("noop", ({} for _ in range(n)))
        with trio.fail_after(max(60.0, n / 100)):
            await tally.done.wait()
            receipt = await rt.wait(tally.last_id, timeout=30.0)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        if not receipt.done:
            raise RuntimeError(f"job {tally.last_id} ran but its outcome was not recorded: {receipt}")
        stats = (await rt.stats())[QUEUE]
        if stats.completed != n:
            raise RuntimeError(f"expected {n} completed jobs, the backend holds {stats}")
        return elapsed, cpu

    result: tuple[float, float] = run_app(main, app, _url(path, synchronous))
    return result


def runtime_latency(path: str, synchronous: str, probes: int, workers: int) -> tuple[list[float], list[float]]:
    app, box = build_app(workers)

    async def main(rt: nj.Runtime) -> tuple[list[float], list[float]]:
        return await idle_latency(rt, box[0], probes)

    result: tuple[list[float], list[float]] = run_app(main, app, _url(path, synchronous))
    return result


# -- across processes ----------------------------------------------------------------------------


def cross_enqueuer(url: str, out_path: str, probes: int) -> int:
    """The other process, a web process: an enqueue-only runtime that enqueues `probes` probes one
    at a time (after 3 unmeasured ones), awaits each receipt, and writes what it saw to
    `out_path` as JSON: ``[[id, enqueued at (monotonic), seconds to the receipt], ...]``."""
    app, _box = build_app(1)

    async def main(rt: nj.Runtime) -> list[list[float]]:
        for _ in range(3):  # warm both sides: not measured
            await rt.wait(await rt.enqueue("probe"), timeout=5.0)
        out: list[list[float]] = []
        for _ in range(probes):
            await trio.sleep(0.005)  # idle again on both sides
            t0 = time.monotonic()
            job_id = await rt.enqueue("probe")
            receipt = await rt.wait(job_id, timeout=5.0)
            t1 = time.monotonic()
            if not receipt.done:
                raise RuntimeError(f"probe job {job_id} did not finish within 5 s: {receipt}")
            out.append([int(job_id), t0, t1 - t0])
        return out

    result = run_app(main, app, url, queues=[])
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


def cross_latency(path: str, synchronous: str, probes: int, workers: int, wake: bool) -> tuple[list[float], list[float]]:
    """(enqueue in the web process -> start here, enqueue -> receipt there), `probes` sequential
    samples. This process runs the workers; the web process is this script started again, run to
    its end as a blocking call (`nj.run_blocking`) while the workers serve it."""
    url = _url(path, synchronous) + ("" if wake else "&wake=off")
    out_path = path + ".probes"
    app = nj.App()
    app.queue(QUEUE, max_workers=workers, timeout=30.0)
    started: dict[int, float] = {}

    @app.job(queue=QUEUE)
    async def probe(ctx: nj.JobContext) -> None:
        started[int(ctx.id)] = time.monotonic()

    argv = [sys.executable, os.path.abspath(__file__), "--cross-enqueuer", url, out_path, str(probes)]

    async def main(rt: nj.Runtime) -> bool:
        await trio.sleep(0.1)  # every worker parked, the start-up claim answered
        await nj.run_blocking(partial(subprocess.run, argv, stdin=subprocess.DEVNULL, check=True, timeout=60 + 3 * probes))
        return True

    run_app(main, app, url)
    with open(out_path) as f:
        seen = json.load(f)
    return [started[int(i)] - t0 for i, t0, _ in seen], [r for _, _, r in seen]


def send_cost(workdir: str, listeners: int, sends: int) -> float:
    """Median seconds per `WakeRegistry.send` of one queue's wake-up to `listeners` processes
    (sockets bound in the registry and drained between sends, untimed)."""
    sender = WakeRegistry(os.path.join(workdir, f"cost{listeners}.db"))
    assert sender.directory is not None, "the work dir's path is too long for a wake-up registry"
    os.makedirs(sender.directory, exist_ok=True)
    socks = []
    try:
        for i in range(listeners):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(os.path.join(sender.directory, f"{90000 + i}-{i:012x}1.w.sock"))
            sock.setblocking(False)
            socks.append(sock)
        wake = Wake(queues=(QUEUE,))
        times: list[float] = []
        for _ in range(sends):
            t0 = time.perf_counter()
            delivered = sender.send(wake)
            times.append(time.perf_counter() - t0)
            if delivered != listeners:
                raise RuntimeError(f"a wake-up reached {delivered} of {listeners} listeners")
            for sock in socks:
                sock.recv(65536)
    finally:
        sender.close()
        for sock in socks:
            sock.close()
        shutil.rmtree(sender.directory, ignore_errors=True)
    return statistics.median(times)


# -- the raw baseline (plain sqlite3, one connection, no Trio) ---------------------------------------


def _connect(path: str, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=10.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'full' else 'NORMAL'}")
    return conn


_INSERT = (
    "INSERT INTO nj_jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at)"
    " VALUES ('noop', ?, '{}', 'available', 25, 0, ?, ?)"
)
_CLAIM = (
    "UPDATE nj_jobs SET state = 'running', attempt = attempt + 1, attempted_at = ?1, heartbeat_at = ?1"
    f" WHERE id IN (SELECT id FROM nj_jobs WHERE queue = ?2 AND {_PENDING} AND run_at <= ?1"
    "   ORDER BY priority DESC, run_at, id LIMIT ?3)"
    " RETURNING id, kind, args, attempt"
)


def _complete(conn: sqlite3.Connection, ids: list[int], now: float) -> None:
    conn.execute(
        f"UPDATE nj_jobs SET state = 'completed', finalized_at = ?, heartbeat_at = NULL WHERE id IN ({','.join('?' * len(ids))})",
        (now, *ids),
    )


def raw_end_to_end(path: str, synchronous: str, n: int, batch: int) -> tuple[float, float]:
    """(wall, CPU) seconds: insert n rows in one transaction, then claim + complete them
    `batch` rows per transaction."""
    conn = _connect(path, synchronous)
    try:
        cpu = time.process_time()
        started = time.perf_counter()
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(_INSERT, ((QUEUE, now, now) for _ in range(n)))
        conn.execute("COMMIT")
        done = 0
        while True:
            conn.execute("BEGIN IMMEDIATE")
            rows = conn.execute(_CLAIM, (time.time(), QUEUE, batch)).fetchall()
            conn.execute("COMMIT")
            if not rows:
                break
            conn.execute("BEGIN IMMEDIATE")
            _complete(conn, [r[0] for r in rows], time.time())
            conn.execute("COMMIT")
            done += len(rows)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
    finally:
        conn.close()
    if done != n:
        raise RuntimeError(f"raw baseline completed {done} of {n} rows")
    return elapsed, cpu


def raw_latency_floor(path: str, synchronous: str, probes: int) -> tuple[list[float], list[float]]:
    """Per sample: INSERT committed, claim committed, completion committed, state read back."""
    conn = _connect(path, synchronous)
    starts: list[float] = []
    receipts: list[float] = []
    try:
        for i in range(probes + 3):
            time.sleep(0.005)
            t0 = time.perf_counter()
            now = time.time()
            conn.execute("BEGIN IMMEDIATE")
            job_id = conn.execute(_INSERT + " RETURNING id", (QUEUE, now, now)).fetchone()[0]
            conn.execute("COMMIT")
            conn.execute("BEGIN IMMEDIATE")
            rows = conn.execute(_CLAIM, (time.time(), QUEUE, 1)).fetchall()
            conn.execute("COMMIT")
            t1 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            _complete(conn, [rows[0][0]], time.time())
            conn.execute("COMMIT")
            (state,) = conn.execute("SELECT state FROM nj_jobs WHERE id = ?", (job_id,)).fetchone()
            t2 = time.perf_counter()
            if rows[0][0] != job_id or state != "completed":
                raise RuntimeError(f"raw latency floor: claimed {rows}, state {state!r}")
            if i >= 3:
                starts.append(t1 - t0)
                receipts.append(t2 - t0)
    finally:
        conn.close()
    return starts, receipts


# -- the run ---------------------------------------------------------------------------------------


def measure(workdir: str, sizes: Sizes, synchronous: str, *, log: Callable[[str], None] = print) -> Figures:
    counter = iter(range(1_000_000))

    def fresh() -> str:
        path = os.path.join(workdir, f"jobs{next(counter)}.db")
        create_file(path, synchronous)
        return path

    def cleanup(path: str) -> None:
        for suffix in ("", "-wal", "-shm", ".probes"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)

    # Unmeasured warm-up of each side.
    for fn in (
        lambda p: raw_end_to_end(p, synchronous, min(sizes.jobs, 1_000), sizes.batch),
        lambda p: runtime_end_to_end(p, synchronous, min(sizes.jobs, 1_000), sizes.batch),
    ):
        path = fresh()
        fn(path)
        cleanup(path)
    raws: list[float] = []
    rts: list[float] = []
    raw_cpu: list[float] = []
    rt_cpu: list[float] = []
    for i in range(sizes.rounds):
        path = fresh()
        gc.collect()
        wall, cpu = raw_end_to_end(path, synchronous, sizes.jobs, sizes.batch)
        b = sizes.jobs / wall
        raw_cpu.append(cpu / sizes.jobs)
        cleanup(path)
        path = fresh()
        gc.collect()
        wall, cpu = runtime_end_to_end(path, synchronous, sizes.jobs, sizes.batch)
        r = sizes.jobs / wall
        rt_cpu.append(cpu / sizes.jobs)
        cleanup(path)
        raws.append(b)
        rts.append(r)
        log(f"end-to-end round {i + 1}/{sizes.rounds}: raw {b:,.0f}/s  runtime {r:,.0f}/s  ratio {r / b:.2f}")
    path = fresh()
    floor_starts, floor_receipts = raw_latency_floor(path, synchronous, sizes.probes)
    cleanup(path)
    path = fresh()
    gc.collect()
    starts, receipts = runtime_latency(path, synchronous, sizes.probes, sizes.probe_workers)
    cleanup(path)
    cross: dict[bool, tuple[list[float], list[float]]] = {}
    for wake, probes in ((True, sizes.cross_probes), (False, sizes.poll_probes)):
        path = fresh()
        gc.collect()
        cross[wake] = cross_latency(path, synchronous, probes, sizes.probe_workers, wake)
        cleanup(path)
        s = cross[wake][0]
        log(f"cross-process, wake-ups {'on' if wake else 'off'}: start p50 {percentile(s, 50) * 1e3:.2f} ms, p99 {percentile(s, 99) * 1e3:.2f} ms")
    costs = {n: send_cost(workdir, n, sizes.sends) for n in SEND_LISTENERS}
    return Figures(
        sizes, synchronous, raws, rts, raw_cpu, rt_cpu, starts, receipts, floor_starts, floor_receipts,
        cross[True][0], cross[True][1], cross[False][0], cross[False][1], costs,
    )  # fmt: skip


def table(f: Figures) -> str:
    ok = {k: "PASS" if v else "FAIL" for k, v in f.verdicts().items()}
    s = f.sizes
    med = statistics.median
    ms = lambda v: f"{v * 1e3:.2f} ms"  # noqa: E731
    rows: list[Sequence[str]] = [
        ("metric", "value", "target (as for PostgreSQL)", "result"),
        (f"raw sqlite3: insert + claim/complete k={s.batch} (median)", f"{med(f.raw_e2e):,.0f} jobs/s", "", ""),
        (f"runtime: sqlite://, K={s.batch} (median)", f"{med(f.rt_e2e):,.0f} jobs/s", "", ""),
        ("throughput ratio (median of round ratios)", f"{f.throughput_ratio:.2f}", f">= {TARGET_THROUGHPUT}", ok["throughput ratio"]),
        ("CPU per job, raw / runtime (median)", f"{med(f.raw_cpu) * 1e6:.0f} / {med(f.rt_cpu) * 1e6:.0f} us", "(reported)", ""),
        (f"idle enqueue -> start p50 ({len(f.start_latency)} samples)", ms(percentile(f.start_latency, 50)), f"<= {TARGET_START_P50 * 1e3:g} ms", ok["idle start p50"]),
        ("idle enqueue -> start p99", ms(percentile(f.start_latency, 99)), f"<= {TARGET_START_P99 * 1e3:g} ms", ok["idle start p99"]),
        ("idle enqueue -> receipt p50", ms(percentile(f.receipt_latency, 50)), f"<= {TARGET_RECEIPT_P50 * 1e3:g} ms", ok["idle receipt p50"]),
        ("idle enqueue -> receipt p99", ms(percentile(f.receipt_latency, 99)), "(reported)", ""),
        (f"cross-process enqueue -> start p50 ({len(f.cross_start)} samples)", ms(percentile(f.cross_start, 50)), f"<= {TARGET_CROSS_START_P50 * 1e3:g} ms", ok["cross-process start p50"]),
        ("cross-process enqueue -> start p99", ms(percentile(f.cross_start, 99)), f"<= {TARGET_CROSS_START_P99 * 1e3:g} ms", ok["cross-process start p99"]),
        ("cross-process enqueue -> receipt p50 / p99", f"{ms(percentile(f.cross_receipt, 50))} / {ms(percentile(f.cross_receipt, 99))}", "(reported)", ""),
        (f"wake-ups off (poll 1 s): start p50 / p99 ({len(f.poll_start)} samples)", f"{ms(percentile(f.poll_start, 50))} / {ms(percentile(f.poll_start, 99))}", "(reported)", ""),
        ("wake-ups off (poll 1 s): receipt p50 / p99", f"{ms(percentile(f.poll_receipt, 50))} / {ms(percentile(f.poll_receipt, 99))}", "(reported)", ""),
        ("one wake-up send, to " + " / ".join(map(str, f.send_cost)) + " listening processes", " / ".join(f"{v * 1e6:.1f}" for v in f.send_cost.values()) + " us", "(reported)", ""),
        ("raw floor: insert + claim commits p50 / p99", f"{ms(percentile(f.floor_start, 50))} / {ms(percentile(f.floor_start, 99))}", "(reported)", ""),
        ("raw floor: ... + complete commit + read p50 / p99", f"{ms(percentile(f.floor_receipt, 50))} / {ms(percentile(f.floor_receipt, 99))}", "(reported)", ""),
        ("synchronous (WAL)", f.synchronous, "", ""),
    ]  # fmt: skip
    return render_table(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="nursery_jobs SQLite-backend throughput and idle latency")
    parser.add_argument(
        "--smoke", "--quick", dest="smoke", action="store_true",
        help="tiny sizes, one round: proves the script runs (--quick: its older name)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--jobs", type=int, help=f"jobs per round (default {Sizes().jobs:,})")
    parser.add_argument("--rounds", type=int, help=f"alternating rounds (default {Sizes().rounds})")
    parser.add_argument("--synchronous", choices=("full", "normal"), default="full", help="the runtime's default is full")
    parser.add_argument("--dir", help="where to put the database files (default: a new temp dir)")
    parser.add_argument("--cross-enqueuer", nargs=3, metavar=("URL", "OUT", "PROBES"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cross_enqueuer:  # this script, started again as the web process of the cross-process probe
        url, out_path, probes = args.cross_enqueuer
        return cross_enqueuer(url, out_path, int(probes))
    sizes = SMOKE if args.smoke else Sizes()
    overrides = {k: v for k, v in (("jobs", args.jobs), ("rounds", args.rounds)) if v}
    sizes = attrs.evolve(sizes, **overrides)

    print(f"nursery_jobs SQLite benchmark: {sizes}, synchronous={args.synchronous}")
    print(f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, trio {trio.__version__}, nursery_jobs {nj.__version__}")
    print(f"load average at start: {load_average()} ({os.cpu_count()} CPUs)")
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="nj_bench_sqlite_", dir=args.dir)
    try:
        figures = measure(workdir, sizes, args.synchronous)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(table(figures))
    return conclude(figures.verdicts(), started=started, smoke=args.smoke, check=args.check)


if __name__ == "__main__":
    sys.exit(main())
