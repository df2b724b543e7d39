"""PostgreSQL soak: does the jobs table stay lean, and the claim cheap, after hours of churn?

Every job makes dead row versions: its claim and its outcome each leave the previous version
behind (no update of the runtime's is HOT: each changes an indexed column), and retention
deletes the row. Autovacuum removes them when the table's per-table thresholds say so. Until
then the claim steps over the dead entries a claimed row left at the front of the `available`
index, and the heap and the indexes grow. This script runs the runtime for a long time with
retention on and watches that happen.

It runs on a **private cluster** (initdb and pg_ctl in a temp dir, a free port: tests/pg_cluster.py),
so the autovacuum that runs is real, with the server's default settings, and nothing shared is
touched. The table is first given a history of `--history` discarded jobs (kept for a week by
retention, like a production table holding its recent failures), vacuumed and analyzed. Then
one process runs the runtime (a queue of `--workers` no-op workers, retention every 5 s keeping
completed jobs `--keep` seconds) and enqueues at `--rate` jobs/s (default `--jobs` / `--duration`;
0: as fast as they drain, with at most 2,000 pending), in one `enqueue_many` every `--tick`
seconds (default 1). The batch matters: a claimed row's dead entry in the `available` index is
removed by the insert that fills its page only when the claims keep up within a page's worth of
entries (small batches); otherwise it waits for a vacuum. Every `--interval` seconds it samples:

- jobs/s completed since the last sample;
- sizes: `pg_total_relation_size` of the table, its heap, and each index;
- `n_live_tup`, `n_dead_tup`, HOT updates, autovacuum and autoanalyze counts
  (`pg_stat_user_tables`);
- the claim's cost: `EXPLAIN (ANALYZE, BUFFERS)` of the runtime's own claim statement on its
  generic plan, with the pool's session settings, for 10 jobs, rolled back (median of 5):
  shared buffers hit + read, those of them its searches read (the scans that find the due jobs
  and the next due time, where dead entries cost; the rest is updating the rows it found, the
  same per row whatever the table holds, and zero when the queue happened to be empty), and
  execution time.

At the end it compares the start of the run (the samples of its first 10 %, at least 60 s, the
first sample excluded) with its end (the last 10 %, at least 60 s), medians of each:

- PASS when the claim's search buffers at the end are at most 1.5x those at the start (or at
  most 10 more: a claim that steps over nothing reads 5-10 buffers), and the
  throughput at the end is at least 0.8x the start's; a full run must also put `--jobs`
  through. (Execution time is reported, not judged: on a shared machine it moves with the load.)

`--defaults` resets migration 0005's per-table autovacuum settings to the server's defaults
first, for the side-by-side. `--smoke` runs for ~4 s with small sizes and judges nothing (a
test runs it).

    .venv/bin/python benchmarks/postgres_soak.py                       # 30 min, 1M jobs, tuned
    .venv/bin/python benchmarks/postgres_soak.py --duration 300 --defaults
    .venv/bin/python benchmarks/postgres_soak.py --smoke

Results are recorded in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import attrs
import psycopg
import trio
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: tests/pg_cluster.py is imported from the repo
    sys.path.insert(0, str(ROOT))

import nursery_jobs as nj  # noqa: E402
from nursery_jobs.backends.postgres import _QUERIES, POOL_SESSION, migrate  # noqa: E402
from tests import pg_cluster  # noqa: E402

SCHEMA = "soak"
QUEUE = "soak"
TUNED = (
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_analyze_scale_factor",
    "autovacuum_analyze_threshold",
)
FLAT_OUT_PENDING = 2_000
CLAIM_LIMIT = 10
CLAIM_SLACK = 10
"""A claim with nothing dead to step over reads 5-10 buffers; a few index pages more is not growth."""
SERVER_SETTINGS = (
    # The private cluster's own defaults are sized for short tests; a soak wants a server shaped
    # like a small production one. Autovacuum's settings stay the server's defaults.
    "shared_buffers = 256MB\n"
    "max_wal_size = 2GB\n"
    "log_autovacuum_min_duration = 0\n"
)


@attrs.define
class Options:
    duration: float
    jobs: int
    rate: float
    interval: float
    history: int
    keep: float
    workers: int
    tick: float
    defaults: bool
    smoke: bool


@attrs.define
class Sample:
    t: float
    done: int
    jobs_per_s: float
    total_bytes: int
    heap_bytes: int
    index_bytes: dict[str, int]
    live: int
    dead: int
    upd: int
    hot_upd: int
    autovacuums: int
    autoanalyzes: int
    claim_buffers: float
    claim_search: float
    claim_ms: float


def _claim_text() -> tuple[str, list[str]]:
    """The runtime's claim statement with $n placeholders, and the order of its parameters."""
    text = _QUERIES["claim"].format(s=sql.Identifier(SCHEMA), seq=sql.Literal("")).as_string(None)
    names: list[str] = []

    def named(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", named, text), names


def _walk(node: dict[str, Any]) -> Any:
    yield node
    for child in node.get("Plans", ()):
        yield from _walk(child)


class Sampler:
    """One connection of its own, used from one thread at a time."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        text, self.names = _claim_text()
        for setting, value in POOL_SESSION.items():
            self.conn.execute(f"SET {setting} = {value}")
        types = {"queue": "text", "now": "float8", "limit": "bigint"}
        self.conn.execute(f"PREPARE soak_claim ({', '.join(types[n] for n in self.names)}) AS {text}")
        self.t0 = time.monotonic()
        self.last: tuple[float, int] | None = None

    def claim_cost(self) -> tuple[float, float, float]:
        """(shared buffers hit + read, of them those its searches read, execution ms) of one
        claim of CLAIM_LIMIT jobs. The search is the scans that find the due jobs and the next
        due time (every scan of the table but the primary-key lookups of its updates): where
        dead index entries and row versions cost. The rest is the updates of the rows it
        claimed, which cost the same per row whatever the table holds."""
        values = {"queue": QUEUE, "now": time.time(), "limit": CLAIM_LIMIT}
        args = sql.SQL(", ").join(sql.Literal(values[n]) for n in self.names)
        with self.conn.transaction(force_rollback=True):
            (plan,) = self.conn.execute(
                sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE soak_claim({})").format(args)
            ).fetchone()  # type: ignore[misc]
        doc = (plan if isinstance(plan, list) else json.loads(plan))[0]
        top = doc["Plan"]
        search = sum(
            n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0)
            for n in _walk(top)
            if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"] and n.get("Index Name") != "jobs_pkey"
        )
        total = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
        return float(total), float(search), float(doc["Execution Time"])

    def sample(self, done: int) -> Sample:
        now = time.monotonic()
        t = now - self.t0
        rate = 0.0
        if self.last is not None and now > self.last[0]:
            rate = (done - self.last[1]) / (now - self.last[0])
        self.last = (now, done)
        costs = [self.claim_cost() for _ in range(5)]
        buffers = statistics.median(c[0] for c in costs)
        search = statistics.median(c[1] for c in costs)
        ms = statistics.median(c[2] for c in costs)
        row = self.conn.execute(
            "SELECT pg_total_relation_size(relid), pg_relation_size(relid), n_live_tup, n_dead_tup,"
            " n_tup_upd, n_tup_hot_upd, autovacuum_count, autoanalyze_count"
            " FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'jobs'",
            (SCHEMA,),
        ).fetchone()
        assert row is not None
        indexes = dict(
            self.conn.execute(
                "SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes"
                " WHERE schemaname = %s AND relname = 'jobs' ORDER BY indexrelname",
                (SCHEMA,),
            ).fetchall()
        )
        return Sample(t, done, rate, row[0], row[1], indexes, row[2], row[3], row[4], row[5], row[6], row[7], buffers, search, ms)

    def close(self) -> None:
        self.conn.close()


def prepare(url: str, opts: Options) -> None:
    applied = migrate(url, SCHEMA)
    print(f"migrated schema {SCHEMA!r}: {', '.join(applied)}")
    with psycopg.connect(url, autocommit=True) as conn:
        table = sql.SQL("{}.jobs").format(sql.Identifier(SCHEMA))
        if opts.defaults:
            conn.execute(sql.SQL("ALTER TABLE {} RESET ({})").format(table, sql.SQL(", ").join(map(sql.SQL, TUNED))))
        (reloptions,) = conn.execute(
            "SELECT reloptions FROM pg_class WHERE oid = %s::regclass", (f'"{SCHEMA}".jobs',)
        ).fetchone()  # type: ignore[misc]
        print(f"jobs table storage parameters: {reloptions or 'none (server defaults)'}")
        now = time.time()
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (kind, queue, args, state, attempt, max_attempts, priority, run_at, created_at,"
                " attempted_at, finalized_at, failed_attempts)"
                " SELECT 'noop', %s, '{{}}', 'discarded', 1, 1, 0, %s - g, %s - g, %s - g, %s, 1"
                " FROM generate_series(1, %s) g"
            ).format(table),
            (QUEUE, now, now, now, now, opts.history),
        )
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(table))
        print(f"history: {opts.history:,} discarded jobs (kept by retention), vacuumed and analyzed")


def soak(url: str, opts: Options) -> tuple[list[Sample], int]:
    app = nj.App()
    app.queue(QUEUE, max_workers=opts.workers, timeout=30)
    done = [0]

    @app.job(queue=QUEUE)
    async def noop(ctx: nj.JobContext) -> None:
        done[0] += 1

    settings = nj.RuntimeSettings(keep_completed=opts.keep, retention_interval=5.0)
    samples: list[Sample] = []
    through = [0]

    async def main(rt: nj.Runtime) -> None:
        sampler = await nj.run_blocking(Sampler, url)
        try:
            samples.append(await nj.run_blocking(sampler.sample, 0))
            _print_sample(samples[-1])
            start = trio.current_time()
            enqueued = 0
            next_sample = start + opts.interval
            end = start + opts.duration
            while (now := trio.current_time()) < end:
                if opts.rate > 0:
                    tick = (now - start) // opts.tick * opts.tick  # enqueue in batches, every `tick` s
                    want = round(min(tick, opts.duration) * opts.rate) - enqueued
                    want = min(want, max(0, 20 * FLAT_OUT_PENDING - (enqueued - done[0])))
                else:
                    want = FLAT_OUT_PENDING - (enqueued - done[0])
                if want >= 50 or (want > 0 and opts.rate > 0):
                    await rt.enqueue_many(noop, [{}] * want)
                    enqueued += want
                if now >= next_sample:
                    samples.append(await nj.run_blocking(sampler.sample, done[0]))
                    _print_sample(samples[-1], enqueued - done[0])
                    next_sample += opts.interval
                await trio.sleep(0.05)
            if opts.rate > 0 and (rest := round(opts.duration * opts.rate) - enqueued) > 0:
                await rt.enqueue_many(noop, [{}] * rest)  # the last fraction of a batch
                enqueued += rest
            with trio.move_on_after(60):
                while done[0] < enqueued:
                    await trio.sleep(0.1)
            print(f"drained: {done[0]:,} of {enqueued:,} enqueued jobs ran")
            through[0] = done[0]
            if done[0] < enqueued:
                raise RuntimeError(f"{enqueued - done[0]} jobs did not run within 60 s of the last enqueue")
        finally:
            await nj.run_blocking(sampler.close)

    result = nj.run(main, app=app, backend=f"{url}?schema={SCHEMA}", grace=0.0, settings=settings)
    if result is None and not samples:
        raise KeyboardInterrupt
    return samples, through[0]


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f}"


def _print_sample(s: Sample, pending: int = 0) -> None:
    idx = " ".join(f"{name.removeprefix('jobs_')}={_mb(b)}" for name, b in s.index_bytes.items())
    print(
        f"t={s.t:6.0f}s done={s.done:>9,} {s.jobs_per_s:7.0f} jobs/s pending={pending:>6,} "
        f"total={_mb(s.total_bytes)}MB heap={_mb(s.heap_bytes)}MB live={s.live:,} dead={s.dead:,} "
        f"hot={s.hot_upd}/{s.upd} av={s.autovacuums} aa={s.autoanalyzes} "
        f"claim={s.claim_buffers:.0f} buf (search {s.claim_search:.0f}) {s.claim_ms:.2f} ms | idx MB: {idx}",
        flush=True,
    )


def _window(samples: list[Sample], lo: float, hi: float) -> list[Sample]:
    return [s for s in samples if lo <= s.t <= hi]


def judge(samples: list[Sample], through: int, opts: Options) -> bool:
    if len(samples) < 3:
        print("too few samples to judge")
        return False
    length = samples[-1].t
    width = max(0.1 * length, min(60.0, 0.3 * length))
    head = _window(samples[1:], samples[1].t, samples[1].t + width)
    tail = _window(samples, length - width, length)

    def med(group: list[Sample], field: str) -> float:
        return float(statistics.median(getattr(s, field) for s in group))

    rows = [
        ("jobs/s", "jobs_per_s", "{:,.0f}"),
        ("claim buffers (hit + read)", "claim_buffers", "{:,.0f}"),
        ("claim search buffers", "claim_search", "{:,.0f}"),
        ("claim execution ms", "claim_ms", "{:.2f}"),
        ("n_dead_tup", "dead", "{:,.0f}"),
        ("n_live_tup", "live", "{:,.0f}"),
        ("table total MB", "total_bytes", "{:,.0f}"),
        ("heap MB", "heap_bytes", "{:,.0f}"),
    ]
    print(f"\nstart = median of {len(head)} samples in t={head[0].t:.0f}..{head[-1].t:.0f} s; "
          f"end = median of {len(tail)} samples in t={tail[0].t:.0f}..{tail[-1].t:.0f} s")  # fmt: skip
    print("| measure | start | end | end / start | max over the run |\n|---|---|---|---|---|")
    for label, field, fmt in rows:
        a, b = med(head, field), med(tail, field)
        peak = max(getattr(s, field) for s in samples[1:])
        if field.endswith("bytes"):
            a, b, peak = a / 1e6, b / 1e6, peak / 1e6
        ratio = f"{b / a:.2f}" if a else "-"
        print(f"| {label} | {fmt.format(a)} | {fmt.format(b)} | {ratio} | {fmt.format(peak)} |")
    for name in samples[-1].index_bytes:
        a = statistics.median(s.index_bytes.get(name, 0) for s in head) / 1e6
        b = statistics.median(s.index_bytes.get(name, 0) for s in tail) / 1e6
        peak = max(s.index_bytes.get(name, 0) for s in samples[1:]) / 1e6
        print(f"| index {name} MB | {a:,.1f} | {b:,.1f} | {b / a if a else 0:.2f} | {peak:,.1f} |")
    last = samples[-1]
    print(f"\njobs through: {through:,} ({last.done:,} in the {last.t:.0f} s sampled, {last.done / last.t:,.0f} jobs/s); "
          f"autovacuums: {last.autovacuums}, autoanalyzes: {last.autoanalyzes}; "
          f"HOT updates: {last.hot_upd:,} of {last.upd:,}")  # fmt: skip
    tenths = []
    for i in range(10):
        part = _window(samples[1:], length * i / 10, length * (i + 1) / 10)
        if part:
            tenths.append(f"{med(part, 'claim_buffers'):.0f}/{med(part, 'claim_search'):.0f}/{med(part, 'dead') / 1000:.0f}k")
    print(f"claim buffers / search buffers / n_dead_tup by tenth of the run: {' '.join(tenths)}")
    # How the claim's cost follows the dead rows: its buffers at the quarter of the samples with
    # the most dead tuples against the quarter with the fewest.
    ranked = sorted(samples[1:], key=lambda s: s.dead)
    q = max(1, len(ranked) // 4)
    few, many = ranked[:q], ranked[-q:]
    print(f"claim buffers (search) at the fewest dead tuples (median {med(few, 'dead'):,.0f}): "
          f"{med(few, 'claim_buffers'):,.0f} ({med(few, 'claim_search'):,.0f}); "
          f"at the most (median {med(many, 'dead'):,.0f}): {med(many, 'claim_buffers'):,.0f} ({med(many, 'claim_search'):,.0f})")  # fmt: skip
    if opts.smoke:
        print("\nsmoke run: nothing judged")
        return True
    claim_start, claim_end = med(head, "claim_search"), med(tail, "claim_search")
    claim_ratio = claim_end / max(claim_start, 1.0)
    claim_ok = claim_end <= max(1.5 * claim_start, claim_start + CLAIM_SLACK)
    rate_ratio = med(tail, "jobs_per_s") / max(med(head, "jobs_per_s"), 1e-9)
    checks = [
        (f"claim search buffers end / start = {claim_end:.0f} / {claim_start:.0f} = {claim_ratio:.2f}"
         f" (<= 1.5, or within {CLAIM_SLACK} buffers)", claim_ok),  # fmt: skip
        (f"throughput end / start = {rate_ratio:.2f} (>= 0.8)", rate_ratio >= 0.8),
        (f"jobs through = {through:,} (>= {opts.jobs:,})", through >= opts.jobs),
    ]
    for text, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}: {text}")
    ok = all(ok for _, ok in checks)
    print(f"\n{'PASS' if ok else 'FAIL'} ({'server defaults' if opts.defaults else 'migration 0005 settings'})")
    return ok


def run(opts: Options) -> bool:
    with pg_cluster.private_cluster() as cluster:
        with (cluster.data / "postgresql.conf").open("a") as conf:
            conf.write(SERVER_SETTINGS)
        cluster.restart()
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE soak")
            settings = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN ('autovacuum', 'autovacuum_naptime',"
                    " 'autovacuum_vacuum_scale_factor', 'autovacuum_vacuum_threshold', 'autovacuum_vacuum_cost_delay',"
                    " 'autovacuum_vacuum_cost_limit', 'shared_buffers', 'server_version')"
                ).fetchall()
            )
        print(f"private cluster on port {cluster.port}: {settings}")
        url = cluster.url.rpartition("/")[0] + "/soak"
        prepare(url, opts)
        samples, through = soak(url, opts)
        try:
            vacuums = [line for line in cluster.log.read_text().splitlines() if "automatic vacuum of table \"soak.soak.jobs\"" in line]
            print(f"server log: {len(vacuums)} automatic vacuums of the jobs table")
        except OSError:
            pass
        return judge(samples, through, opts)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="nursery_jobs PostgreSQL soak: bloat, dead tuples, claim cost")
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of enqueue and drain (default 1800)")
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs to put through (default 1,000,000)")
    parser.add_argument("--rate", type=float, default=None, help="jobs/s enqueued (default jobs / duration; 0: flat out)")
    parser.add_argument("--interval", type=float, default=None, help="seconds between samples (default 30; 15 under 10 min)")
    parser.add_argument("--history", type=int, default=1_000_000, help="discarded jobs in the table first (default 1M)")
    parser.add_argument("--keep", type=float, default=60.0, help="seconds completed jobs are kept (default 60)")
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between enqueue batches (default 1)")
    parser.add_argument("--defaults", action="store_true", help="reset migration 0005's autovacuum settings first")
    parser.add_argument("--smoke", action="store_true", help="~4 s, small sizes, nothing judged")
    ns = parser.parse_args(argv)
    if ns.smoke:
        ns.duration, ns.jobs, ns.history, ns.keep = 4.0, 800, 5_000, 2.0
        ns.interval = ns.interval or 1.0
    interval = ns.interval or (30.0 if ns.duration >= 600 else 15.0)
    rate = ns.jobs / ns.duration if ns.rate is None else ns.rate
    opts = Options(ns.duration, ns.jobs, rate, interval, ns.history, ns.keep, ns.workers, ns.tick, ns.defaults, ns.smoke)
    if pg_cluster.find_bindir() is None:
        print("no PostgreSQL server binaries (initdb) in /usr/lib/postgresql/<version>/bin or NJ_TEST_PG_BINDIR:"
              " the soak needs a private cluster")  # fmt: skip
        return 2
    print(f"nursery_jobs PostgreSQL soak: {opts}")
    print(f"python {sys.version.split()[0]}, psycopg {psycopg.__version__} ({psycopg.pq.__impl__}), nursery_jobs {nj.__version__}")
    return 0 if run(opts) else 1


if __name__ == "__main__":
    sys.exit(main())
