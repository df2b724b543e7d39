"""Where the CPU goes in issue 8's two open cases: 32 workers against the hand-written loop, and
2 worker processes against 1, on a pre-filled, analyzed 100k-row table.

`postgres_production.py` measures jobs/s; this script measures, over the same runs, the CPU
seconds each side spends, to show whether the machine (2 cores shared by the client processes
and the PostgreSQL server) is saturated:

- **(a) the loop**: `postgres_production.loop_drain` (one sync psycopg connection claiming up to
  32 rows per statement, completing them with one more), D jobs.
- **(b) the runtime, one process**: `nj.run` with 32 workers draining D jobs; measured from
  `main`'s start to the D-th outcome's receipt (the drain's clock).
- **(c) 2 worker processes x 32 workers** (`postgres_production.py --worker` children of this
  process, launched as that script launches them); measured over a fixed window once both are up.
- **(a1), (a2) the loop in 1 and in 2 processes** (this file with ``--loop-worker``: each child
  runs `loop_drain` of D / procs jobs once told to start, and reports before its connection
  closes), and **(c1) 1 worker process** (as (c), one child): the same shape of run at 1 and 2
  processes for both, so the loop's own 2/1 on this machine is beside the runtime's.

The ceiling. For each pair (1 process, 2 processes) the script prints how much CPU one process's
drain uses (client + the whole server, in cores) and the best 2/1 the machine could give:
(2 cores - what the rest of the machine used) / (the cores one process uses), at the 1-process
cost per job; and the same at the 2-process cost per job (two processes may cost more per job:
smaller batches), which is the tighter bound.

For each: wall seconds, jobs/s, CPU seconds of the client process(es) (``/proc/<pid>/stat``
utime + stime of this process, all threads, and of its worker children), CPU seconds of the
whole PostgreSQL server (every ``postgres`` process's utime + stime, plus the cutime + cstime
of exited backends, which the postmaster holds once it reaps them, so backends that come and go
during the run count too), the CPU seconds of the server processes serving this run's
database alone (their process titles name it; sampled while the run's connections are open, the
loop's through `loop_drain`'s `on_done`), and the machine's busy and idle time from
``/proc/stat``. The server is shared: its whole figure includes other databases' activity, and
"other" (machine busy minus client minus the whole server) is what the rest of the machine did
meanwhile. Per job: client and server µs.
From the server's statistics (``pg_stat_database`` of the throwaway database, read once every
connection of the run has closed, so every backend has flushed): transactions and rows updated
per job, which is what the runtime sends per job (no pg_stat_statements needed).

Rounds alternate the order of (a), (b), (c); medians are reported. The table is restored to
100k available rows and ``VACUUM (ANALYZE, INDEX_CLEANUP ON)``'d before every run.

Usage (PostgreSQL on 127.0.0.1:5432 or NJ_BENCH_PG_URL; own database, dropped even on failure):

    .venv/bin/python benchmarks/cpu_accounting.py           # ~1 min
    .venv/bin/python benchmarks/cpu_accounting.py --smoke   # tiny: proves it runs

Nothing is judged: the figures are recorded in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from typing import Any, Sequence

import attrs
import psycopg
import trio

import nursery_jobs as nj

try:  # imported as `benchmarks.cpu_accounting`
    from . import postgres_production as prod
    from .baselines.loop_processes import loop_processes
    from .durable_side import QUEUE, Tally, run_app, worker_processes
    from .pg_common import PgUnavailable, backend_url, fresh_schema, render_table, throwaway_database
except ImportError:  # run as a script: benchmarks/ is sys.path[0]
    import postgres_production as prod  # type: ignore[no-redef]
    from baselines.loop_processes import loop_processes  # type: ignore[no-redef]
    from durable_side import QUEUE, Tally, run_app, worker_processes  # type: ignore[no-redef]
    from pg_common import (  # type: ignore[no-redef]
        PgUnavailable,
        backend_url,
        fresh_schema,
        render_table,
        throwaway_database,
    )

__all__ = ["Config", "main"]

TICK = os.sysconf("SC_CLK_TCK")
SCHEMA = "nj_cpu"


@attrs.frozen
class Config:
    size: int = 200_000  # 2 processes at ~27k jobs/s need more than 100k rows for a 3 s window and its start
    drain: int = 20_000
    workers: int = 32
    window: float = 3.0
    warmup: float = 0.5
    rounds: int = 3
    warm: bool = True
    """One unrecorded loop and runtime drain first (imports, connections, the server's caches)."""


SMOKE = Config(size=20_000, drain=100, workers=8, window=0.1, warmup=0.0, rounds=1, warm=False)


# -- CPU counters -----------------------------------------------------------------------------------


def _stat(pid: int | str) -> tuple[str, list[str]] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    head, _, rest = text.rpartition(")")
    return head.partition("(")[2], rest.split()


def process_cpu(pid: int) -> float:
    """utime + stime of one live process (all its threads), seconds; 0 if it is gone."""
    st = _stat(pid)
    return (int(st[1][11]) + int(st[1][12])) / TICK if st else 0.0


def children() -> list[int]:
    me = str(os.getpid())
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(entry)
            if st and st[1][1] == me:
                out.append(int(entry))
    return out


def server_cpu() -> float:
    """Seconds the whole PostgreSQL server has used: every live `postgres` process's utime +
    stime, plus the cutime + cstime its parent holds for the backends already reaped."""
    total = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(entry)
            if st and st[0] == "postgres":
                f = st[1]
                total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
    return total / TICK


def database_cpu(db: str) -> dict[int, float]:
    """utime + stime of each live server process serving database `db` (its name is in the
    process title, ``postgres: ... user db host(port) state``)."""
    out: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    title = f.read().decode(errors="replace").split()
            except OSError:
                continue
            if db in title and title[:1] == ["postgres:"]:
                out[int(entry)] = process_cpu(int(entry))
    return out


def machine() -> tuple[float, float]:
    """(busy, idle) seconds of all CPUs together since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy / TICK, idle / TICK


@attrs.frozen
class Sample:
    wall: float
    client: float
    server: float
    busy: float
    idle: float
    ours: dict[int, float]

    @classmethod
    def take(cls, client_pids: Sequence[int], db: str) -> Sample:
        busy, idle = machine()
        clients = sum(process_cpu(p) for p in client_pids)
        return cls(time.perf_counter(), clients, server_cpu(), busy, idle, database_cpu(db))


@attrs.frozen
class Run:
    side: str
    jobs: int
    wall: float
    client: float
    server: float
    """The whole server (every database)."""
    ours: float
    """The server processes serving this run's database (live at the end of the run)."""
    busy: float
    idle: float
    xacts: float | None = None
    """Transactions per job in the throwaway database (None: not read)."""
    updated: float | None = None

    @property
    def rate(self) -> float:
        return self.jobs / self.wall


def between(side: str, jobs: int, a: Sample, b: Sample) -> Run:
    ours = sum(t - a.ours.get(pid, 0.0) for pid, t in b.ours.items())
    return Run(side, jobs, b.wall - a.wall, b.client - a.client, b.server - a.server, ours, b.busy - a.busy,
               b.idle - a.idle)  # fmt: skip


def dbname(url: str) -> str:
    return url.rpartition("/")[2].partition("?")[0]


def db_counters(url: str) -> tuple[int, int]:
    """(transactions committed, rows updated) in this database so far."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback, tup_updated FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def completed(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {SCHEMA}.jobs WHERE state = 'completed'").fetchone()
    return int(row[0]) if row else 0


def with_counters(url: str, run: Run, before: tuple[int, int], jobs: int) -> Run:
    time.sleep(0.1)  # the run's backends have exited (and flushed their statistics)
    after = db_counters(url)
    # Our own two reading connections add one transaction each: take them off.
    return attrs.evolve(run, xacts=(after[0] - before[0] - 2) / jobs, updated=(after[1] - before[1]) / jobs)


# -- the three sides --------------------------------------------------------------------------------


def side_loop(url: str, c: Config) -> Run:
    me = [os.getpid()]
    before = db_counters(url)
    a = Sample.take(me, dbname(url))
    samples: list[Sample] = []
    prod.loop_drain(url, SCHEMA, c.drain, c.workers, on_done=lambda: samples.append(Sample.take(me, dbname(url))))
    b = samples[0]
    return with_counters(url, between(f"(a) loop, 1 connection, batches of {c.workers}", c.drain, a, b), before, c.drain)


def side_runtime(url: str, c: Config) -> Run:
    app, box = prod.build_app(c.workers)
    tally = box[0] = Tally(c.drain)
    me = [os.getpid()]

    async def main(rt: nj.Runtime) -> tuple[Sample, Sample]:
        a = Sample.take(me, dbname(url))
        with trio.fail_after(max(120.0, c.drain / 100)):
            await tally.done.wait()
            receipt = await rt.wait(tally.last_id, timeout=30.0)
        b = Sample.take(me, dbname(url))
        if not receipt.done:
            raise RuntimeError(f"job {tally.last_id} ran but its outcome was not recorded: {receipt}")
        return a, b

    before, done0 = db_counters(url), completed(url)
    a, b = run_app(main, app, backend_url(url, SCHEMA), queues=[QUEUE])
    jobs = completed(url) - done0  # claimed ahead and finished at shutdown count too
    run = between(f"(b) runtime, 1 process x {c.workers} workers", c.drain, a, b)
    return with_counters(url, run, before, jobs)


def side_processes(url: str, c: Config, procs: int = 2) -> Run:
    app, _box = prod.build_app(c.workers, launchers=procs)
    burl = backend_url(url, SCHEMA)

    async def main(rt: nj.Runtime) -> tuple[Run, list[int]]:
        async with worker_processes(rt, burl, c.workers, [None] * procs):
            await trio.sleep(c.warmup)
            pids = [os.getpid(), *children()]
            c0 = (await rt.stats())[QUEUE]
            a = Sample.take(pids, dbname(url))
            await trio.sleep(c.window)
            b = Sample.take(pids, dbname(url))
            c1 = (await rt.stats())[QUEUE]
            if c1.available == 0:  # the window's count is short: not a figure
                raise RuntimeError(f"{prod.RAN_OUT} (table {c.size:,}, window {c.window} s)")
            label = f"(c{'' if procs > 1 else '1'}) {procs} process{'es' if procs > 1 else ''} x {c.workers} workers (+ this launcher)"
            return between(label, c1.completed - c0.completed, a, b), pids

    before, done0 = db_counters(url), completed(url)
    run, pids = run_app(main, app, burl, queues=["launch"])
    if len(pids) != procs + 1:
        raise RuntimeError(f"expected {procs} worker processes, found children {pids[1:]}")
    return with_counters(url, run, before, completed(url) - done0)


def loop_worker(url: str, n: int, batch: int) -> int:
    """``--loop-worker``: print ``ready``, wait for a line on stdin, drain `n` jobs with
    `loop_drain`, print ``done``, and wait for another line before the connection closes (its
    server process is still there when the launcher samples)."""
    print("ready", flush=True)
    if not sys.stdin.readline():
        return 1  # stdin closed before "go": the launcher gave up; drain nothing

    def done() -> None:
        print("done", flush=True)
        sys.stdin.readline()

    prod.loop_drain(url, SCHEMA, n, batch, on_done=done)
    return 0


def side_loop_procs(url: str, c: Config, procs: int) -> Run:
    cmd = [sys.executable, os.path.abspath(__file__), "--loop-worker", url, "--jobs", str(c.drain // procs),
           "--batch", str(c.workers)]  # fmt: skip
    with loop_processes(cmd, procs) as kids:
        before = db_counters(url)
        a = Sample.take(kids.pids, dbname(url))
        kids.tell("go")
        kids.expect("done")  # a loop process that fails (the table ran out?) prints no "done"
        b = Sample.take(kids.pids, dbname(url))
        kids.tell("exit")
    jobs = procs * (c.drain // procs)
    label = f"(a{procs}) loop, {procs} process{'es' if procs > 1 else ''} x 1 connection, batches of {c.workers}"
    return with_counters(url, between(label, jobs, a, b), before, jobs)


def side_loop_1(url: str, c: Config) -> Run:
    return side_loop_procs(url, c, 1)


def side_loop_2(url: str, c: Config) -> Run:
    return side_loop_procs(url, c, 2)


def side_processes_1(url: str, c: Config) -> Run:
    return side_processes(url, c, procs=1)


# -- the run ----------------------------------------------------------------------------------------


def measure(db: str, c: Config, log: Any = print) -> list[Run]:
    fresh_schema(db, SCHEMA)
    with psycopg.connect(db, autocommit=True) as conn:
        prod.fill(conn, SCHEMA, c.size, 0)
    sides = [side_loop, side_runtime, side_processes, side_loop_1, side_loop_2, side_processes_1]

    def one(fn: Any) -> Run:
        prod.restore(db, SCHEMA, c.size)
        gc.collect()
        return fn(db, c)  # type: ignore[no-any-return]

    if c.warm:  # not recorded
        one(side_loop), one(side_runtime)
    runs: list[Run] = []
    for r in range(c.rounds):
        for fn in sides if r % 2 == 0 else sides[::-1]:
            run = one(fn)
            runs.append(run)
            log(f"round {r + 1}/{c.rounds} {run.side}: {run.rate:,.0f} jobs/s, client {run.client:.2f} s, "
                f"server {run.server:.2f} s (our db {run.ours:.2f} s), machine idle {100 * run.idle / (run.busy + run.idle):.0f} %")  # fmt: skip
    return runs


def table(runs: list[Run]) -> str:
    med = statistics.median
    rows: list[Sequence[str]] = [(
        "side (median of rounds)", "wall s", "jobs/s", "client CPU s", "server CPU s", "client µs/job",
        "server µs/job", "our db's server µs/job", "client cores", "server cores", "our db's server cores", "other busy cores", "machine idle %", "xacts/job", "rows upd/job",
    )]  # fmt: skip
    for side in dict.fromkeys(r.side for r in runs):
        rs = [r for r in runs if r.side == side]

        def m(fn: Any) -> float:
            return float(med(fn(r) for r in rs))

        rows.append((
            side, f"{m(lambda r: r.wall):.2f}", f"{m(lambda r: r.rate):,.0f}", f"{m(lambda r: r.client):.2f}",
            f"{m(lambda r: r.server):.2f}", f"{m(lambda r: 1e6 * r.client / r.jobs):.1f}",
            f"{m(lambda r: 1e6 * r.server / r.jobs):.1f}", f"{m(lambda r: 1e6 * r.ours / r.jobs):.1f}",
            f"{m(lambda r: r.client / r.wall):.2f}", f"{m(lambda r: r.server / r.wall):.2f}",
            f"{m(lambda r: r.ours / r.wall):.2f}", f"{m(lambda r: (r.busy - r.client - r.server) / r.wall):.2f}",
            f"{m(lambda r: 100 * r.idle / (r.busy + r.idle)):.1f}",
            f"{m(lambda r: r.xacts or 0.0):.3f}", f"{m(lambda r: r.updated or 0.0):.2f}",
        ))  # fmt: skip
    return render_table(rows)


PAIRS = (("(a1)", "(a2)"), ("(c1)", "(c)"))
"""The (1 process, 2 processes) sides whose 2/1 and ceiling are reported."""


def ceilings(runs: list[Run]) -> str:
    """Per pair: the measured 2/1 (median of per-round ratios), the cores one process's drain
    uses, and the best 2/1 the 2 cores allow at the 1- and at the 2-process cost per job."""
    med = statistics.median
    cores = os.cpu_count() or 2
    rows: list[Sequence[str]] = [(
        "pair", "1 proc jobs/s", "2 procs jobs/s", "2/1 (rounds)", "1 proc: client + server cores", "other busy cores",
        "ceiling 2/1 at 1-proc cost/job", "ceiling 2/1 at 2-proc cost/job", "2 procs: machine idle %",
    )]  # fmt: skip
    for one, two in PAIRS:
        r1 = [r for r in runs if r.side.startswith(one + " ")]
        r2 = [r for r in runs if r.side.startswith(two + " ")]
        if not r1 or not r2:
            continue
        ratios = [b.rate / a.rate for a, b in zip(r1, r2)]
        used1 = med((r.client + r.server) / r.wall for r in r1)
        other = med(max(0.0, (r.busy - r.client - r.server) / r.wall) for r in r1 + r2)
        per_job2 = med((r.client + r.server) / r.jobs for r in r2)
        rate1 = med(r.rate for r in r1)
        rows.append((
            f"{one} -> {two}", f"{rate1:,.0f}", f"{med(r.rate for r in r2):,.0f}",
            f"{med(ratios):.2f} ({', '.join(f'{x:.2f}' for x in ratios)})", f"{used1:.2f}", f"{other:.2f}",
            f"{(cores - other) / used1:.2f}", f"{(cores - other) / (per_job2 * rate1):.2f}",
            f"{med(100 * r.idle / (r.busy + r.idle) for r in r2):.1f}",
        ))  # fmt: skip
    return render_table(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="CPU accounting: the loop, the runtime, 2 worker processes")
    parser.add_argument("--smoke", action="store_true", help="tiny table, one round: proves the script runs")
    parser.add_argument("--rounds", type=int, help=f"rounds (default {Config().rounds})")
    parser.add_argument("--loop-worker", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.loop_worker:
        return loop_worker(args.loop_worker, args.jobs, args.batch)
    c = SMOKE if args.smoke else Config()
    if args.rounds:
        c = attrs.evolve(c, rounds=args.rounds)
    print(f"nursery_jobs CPU accounting: {c}")
    print(f"python {sys.version.split()[0]}, psycopg {psycopg.__version__} ({psycopg.pq.__impl__}), "
          f"nursery_jobs {nj.__version__}; {os.cpu_count()} CPUs, load average at start "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
    try:
        with throwaway_database("cpu") as db:
            runs = measure(db, c)
    except PgUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    print()
    print(table(runs))
    print()
    print(ceilings(runs))
    if args.smoke:
        print("smoke run: nothing judged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
