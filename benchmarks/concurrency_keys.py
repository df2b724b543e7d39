"""Per-key concurrency benchmark: throughput with a per-key limit of 1 against the number of
distinct keys, as a ratio of the unlimited throughput in the same run; the worst overshoot seen;
and enqueue -> start latency when every key has a free slot.

What it measures, per backend (PostgreSQL; SQLite and memory beside it):

1. **Throughput.** A table pre-filled with N no-op jobs of one queue (PostgreSQL and SQLite: rows
   inserted directly, then `ANALYZE`d; memory: `insert_many`), drained by one runtime of W
   workers until M jobs completed; jobs per second from the first start to the M-th. The
   unlimited side's jobs have no key; the keyed side's job n has the key ``k<n % K>`` with
   `max_concurrent` 1, for K in 1, 10, 1,000 and 100,000. The unlimited side's job n carries the
   same key as an argument only, and its handler does the same bookkeeping, so the sides differ
   by the limit alone: the ratio is the cost of the limit (``--bare-unlimited``: the unlimited
   jobs have no arguments, whose decoding the runtime skips, and no bookkeeping; the ratio then
   also charges the limit for parsing the keyed jobs' arguments, ~4 us a job, which is a large
   share of a no-op job's cost on memory). Rounds alternate the sides, each on a
   freshly filled table, and the figure is the median of the per-round ratios keyed / unlimited.
   (With K keys at a limit of 1 at most K jobs run at once, so K = 1 runs one job at a time by
   design: its figure is the cost of the limit, not a target.)
2. **Overshoot.** Every handler of the keyed side counts the running jobs of its key on entry;
   the worst count seen above 1 over every run is the overshoot (target 0).
3. **Latency.** On an idle keyed queue, one job at a time, each with a key no job holds (one
   free slot per key): ``perf_counter`` before ``enqueue`` to the handler's start, p50 and p99,
   beside the same for jobs with no key.
4. **Latency behind a full key.** The same probes (a new key each time, and no key), one at a
   time, while one other key with a limit of 1 is full (each of its jobs holds its slot for
   `busy_hold` seconds) and has a backlog of `jobs` due jobs: the claim "a busy key never delays
   jobs of other keys" as p50 and p99 enqueue -> start.

5. **Claim cost** (``--claim-cost``, PostgreSQL only): `claim` and `finish_many` called one at a
   time with no runtime, over an unkeyed backlog and at one key with a long and a short backlog
   (`claim_cost`).

Usage (PostgreSQL on 127.0.0.1:5432, or the admin URL in NJ_BENCH_PG_URL; the script creates
and drops its own database):

    .venv/bin/python benchmarks/concurrency_keys.py
    .venv/bin/python benchmarks/concurrency_keys.py --smoke   # tiny sizes: only proves it runs

Results are recorded in benchmarks/RESULTS.md ("Per-key concurrency"). Speed is never asserted in
tests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import attrs
import trio

import nursery_jobs as nj

try:  # imported as `benchmarks.concurrency_keys`
    from .per_backend import JOB_COLUMNS, add_backend_options, backlog, fresh_store, measure_each_backend, sizes_from
    from .pg_common import PgUnavailable, percentile, render_table, throwaway_database
except ImportError:  # run as a script: benchmarks/ is sys.path[0]
    from per_backend import JOB_COLUMNS, add_backend_options, backlog, fresh_store, measure_each_backend, sizes_from  # type: ignore[no-redef]
    from pg_common import PgUnavailable, percentile, render_table, throwaway_database  # type: ignore[no-redef]

QUEUE = "bench"
SCHEMA = "keyed"


@attrs.frozen
class Sizes:
    jobs: int = 50_000
    """Pre-filled backlog per run."""
    measured: int = 15_000
    """Completions measured per run (the backlog stays large while they are counted). 4,000
    until 2026-12-04: at ~20,000 jobs/s on PostgreSQL a window of 0.2 s, and single rounds'
    ratios ranged 0.56-0.96 in one run; 15,000 make it ~1 s."""
    serial_measured: int = 600
    """Completions measured with a single key (one job at a time)."""
    few_jobs: int = 20_000
    few_measured: int = 4_000
    """Backlog and completions with fewer keys than workers (10): the limit, not the claim,
    sets their pace (at most that many run at once), so their figures are the limit's cost,
    not a target, and the sizes they always had keep them comparable between runs."""
    workers: int = 32
    rounds: int = 5
    """Paired rounds; the figure is the median of their ratios."""
    keys: tuple[int, ...] = (1, 10, 1_000, 100_000)
    probes: int = 200
    busy_hold: float = 0.05
    """Seconds each job of the busy key runs, in the latency-behind-a-full-key measurement."""
    backends: tuple[str, ...] = ("postgres", "sqlite", "memory")
    same_args: bool = True
    """The unlimited side's jobs carry the keyed side's arguments (their key as an argument, with
    no limit) and its handler's bookkeeping: the two sides then differ by the limit alone
    (False: ``--bare-unlimited``)."""


SMOKE = Sizes(
    jobs=300, measured=100, serial_measured=20, few_jobs=300, few_measured=100, workers=8, rounds=1, keys=(1, 1_000), probes=10
)


class Box:
    """Shared by a run's handlers and its main (one Trio thread)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.done = trio.Event()
        self.running: dict[str, int] = {}
        self.worst = 0
        self.started: dict[int, float] = {}
        self.hold = 0.0
        """Seconds a keyed job whose key does not start with "probe" runs (0: a no-op)."""


def build_app(workers: int, box: list[Box]) -> nj.App:
    app = nj.App()
    app.queue(QUEUE, max_workers=workers, timeout=60)

    async def body(ctx: nj.JobContext, key: str | None) -> None:
        b = box[0]
        b.started[ctx.id] = time.perf_counter()
        if key is not None:
            n = b.running.get(key, 0) + 1
            b.running[key] = n
            b.worst = max(b.worst, n)
        b.count += 1
        if b.count == 1:
            b.first = time.perf_counter()
        if b.count == b.target:
            b.last = time.perf_counter()
            b.done.set()
        await trio.lowlevel.checkpoint()
        if key is not None:
            b.running[key] -= 1

    @app.job(queue=QUEUE, name="plain")
    async def plain(ctx: nj.JobContext, n: int = 0, key: str | None = None) -> None:
        await body(ctx, key)

    @app.job(queue=QUEUE, name="keyed", concurrency_key=lambda args: args["key"], max_concurrent=1)
    async def keyed(ctx: nj.JobContext, key: str, n: int = 0) -> None:
        if box[0].hold and not key.startswith("probe"):
            box[0].started[ctx.id] = time.perf_counter()
            await trio.sleep(box[0].hold)
            return
        await body(ctx, key)

    return app


# -- filling --


KEY_COLUMNS = (*JOB_COLUMNS, "concurrency_key", "max_concurrent")


def table_rows(n: int, keys: int | None, limited: bool = True) -> list[tuple[Any, ...]]:
    """`n` due jobs as rows of the jobs table (KEY_COLUMNS): `plain` ones with no key, or
    `keyed` ones, job g with the key ``k<g % keys>`` at a limit of 1 (`limited` False: `plain`
    ones with that key as an argument only, `Sizes.same_args`)."""
    now = time.time() - 60
    if keys is None:
        return [("plain", QUEUE, "{}", "available", 25, 0, now + g * 1e-6, now, None, None) for g in range(1, n + 1)]
    if not limited:
        return [("plain", QUEUE, '{"key": "k%d"}' % (g % keys), "available", 25, 0, now + g * 1e-6, now, None, None)
                for g in range(1, n + 1)]  # fmt: skip
    return [("keyed", QUEUE, '{"key": "k%d"}' % (g % keys), "available", 25, 0, now + g * 1e-6, now, f"k{g % keys}", 1)
            for g in range(1, n + 1)]  # fmt: skip


# -- one drain --


def drain(backend: str, target: str, s: Sizes, keys: int | None, limited: bool = True) -> tuple[float, int]:
    """(jobs per second, worst running count of one key) for one freshly filled backlog."""
    few = keys is not None and keys < s.workers
    measured = s.serial_measured if keys == 1 else s.few_measured if few else s.measured
    box = [Box(measured)]
    app = build_app(s.workers, box)
    where = backlog(backend, target, SCHEMA, KEY_COLUMNS, table_rows(s.few_jobs if few else s.jobs, keys, limited))

    async def main(rt: nj.Runtime) -> None:
        with trio.fail_after(600):
            await box[0].done.wait()

    nj.run(main, app=app, backend=where, grace=0.0)
    b = box[0]
    return measured / max(b.last - b.first, 1e-9), b.worst


def latency(backend: str, target: str, s: Sizes, keyed: bool) -> list[float]:
    """Enqueue -> handler start, seconds, on an idle queue; keyed: a new key each time."""
    box = [Box(0)]
    app = build_app(s.workers, box)
    where = fresh_store(backend, target, SCHEMA)

    async def main(rt: nj.Runtime) -> list[float]:
        out: list[float] = []
        await trio.sleep(0.1)
        for i in range(s.probes + 3):
            await trio.sleep(0.005)
            t0 = time.perf_counter()
            if keyed:
                job_id = await rt.enqueue("keyed", {"key": f"probe{i}"})
            else:
                job_id = await rt.enqueue("plain")
            receipt = await rt.wait(job_id, timeout=5.0)
            if not receipt.done:
                raise RuntimeError(f"probe {job_id} did not finish within 5 s")
            if i >= 3:  # the first ones warm the connections
                out.append(box[0].started.pop(job_id) - t0)
        return out

    result: list[float] = nj.run(main, app=app, backend=where, grace=0.0)
    return result


def latency_behind_busy_key(backend: str, target: str, s: Sizes) -> tuple[list[float], list[float], int]:
    """Enqueue -> start of probe jobs (a new key each; and no key), one at a time, while the key
    ``k0`` (limit 1) is full and has `s.few_jobs` due jobs waiting; and how many of its jobs ran."""
    box = [Box(0)]
    box[0].hold = s.busy_hold
    app = build_app(s.workers, box)
    where = backlog(backend, target, SCHEMA, KEY_COLUMNS, table_rows(s.few_jobs, 1))

    async def main(rt: nj.Runtime) -> tuple[list[float], list[float], int]:
        keyed: list[float] = []
        plain: list[float] = []
        await trio.sleep(0.5)  # the busy key's first job holds its slot; the backlog waits
        for i in range(s.probes + 3):
            await trio.sleep(0.005)
            t0 = time.perf_counter()
            job_id = await (rt.enqueue("keyed", {"key": f"probe{i}"}) if i % 2 else rt.enqueue("plain"))
            receipt = await rt.wait(job_id, timeout=10.0)
            if not receipt.done:
                raise RuntimeError(f"probe {job_id} did not finish within 10 s")
            if i >= 3:
                (keyed if i % 2 else plain).append(box[0].started.pop(job_id) - t0)
        return keyed, plain, len(box[0].started)

    result: tuple[list[float], list[float], int] = nj.run(main, app=app, backend=where, grace=0.0)
    return result


def claim_cost(url: str) -> dict[str, tuple[float, float]]:
    """PostgreSQL, one backend call at a time (a runtime with no queue holds the backend open):
    median ms of `claim` (up to 32) and of `finish_many` of what it claimed, (a) over 20,000
    unkeyed jobs (300 claims), (b) at one key with a limit of 1 and a backlog of 20,000, and (c)
    of 200 (20 claims to warm up, then 150)."""
    from nursery_jobs.backends import Outcome, OutcomeKind
    from nursery_jobs.backends.postgres import PostgresBackend

    def loop(n: int, warm: int) -> tuple[float, float]:
        backend = PostgresBackend(url, schema=SCHEMA)

        async def calls(rt: nj.Runtime) -> tuple[float, float]:
            claims: list[float] = []
            finishes: list[float] = []
            for i in range(warm + n):
                t0 = time.perf_counter()
                got = await backend.claim(QUEUE, 32)
                t1 = time.perf_counter()
                await backend.finish_many([Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in got.jobs])
                if i >= warm:
                    claims.append(t1 - t0)
                    finishes.append(time.perf_counter() - t1)
            return statistics.median(claims) * 1e3, statistics.median(finishes) * 1e3

        result: tuple[float, float] = nj.run(calls, app=nj.App(), backend=backend, queues=[])
        return result

    out = {}
    for name, jobs, keys, n, warm in (("unkeyed", 20_000, None, 300, 0), ("1 key, 20,000 waiting", 20_000, 1, 150, 20),
                                      ("1 key, 200 waiting", 200, 1, 150, 20)):  # fmt: skip
        backlog("postgres", url, SCHEMA, KEY_COLUMNS, table_rows(jobs, keys))
        out[name] = loop(n, warm)
    return out


# -- the run --


def measure(backend: str, target: str, s: Sizes, log: Callable[[str], None]) -> list[list[str]]:
    ratios: dict[int, list[float]] = {k: [] for k in s.keys}
    rates: dict[int | None, list[float]] = {k: [] for k in (None, *s.keys)}
    worst = 0
    for r in range(s.rounds):
        for keys in s.keys:
            # The sides alternate which goes first, so neither always runs on a machine the
            # other has just warmed (or left autovacuum behind on).
            if r % 2 == 0:
                base, _ = drain(backend, target, s, keys if s.same_args else None, limited=False)
                rate, w = drain(backend, target, s, keys)
            else:
                rate, w = drain(backend, target, s, keys)
                base, _ = drain(backend, target, s, keys if s.same_args else None, limited=False)
            worst = max(worst, w)
            rates[None].append(base)
            rates[keys].append(rate)
            ratios[keys].append(rate / base)
            log(f"  {backend} round {r + 1}: unlimited {base:,.0f}/s, {keys:,} keys {rate:,.0f}/s -> {rate / base:.2f} (worst {w})")
    plain = latency(backend, target, s, keyed=False)
    keyed = latency(backend, target, s, keyed=True)
    busy_keyed, busy_plain, busy_ran = latency_behind_busy_key(backend, target, s)
    log(f"  {backend} behind a full key: {busy_ran} of its jobs ran during {len(busy_keyed) + len(busy_plain)} probes")
    rows = []
    for keys in s.keys:
        rows.append([
            backend, f"{keys:,}", f"{statistics.median(rates[keys]):,.0f}", f"{statistics.median(rates[None]):,.0f}",
            f"{statistics.median(ratios[keys]):.2f}", str(max(worst - 1, 0)),
        ])  # fmt: skip
    rows.append([
        backend, "latency", f"p50 {percentile(keyed, 50) * 1e3:.2f} ms / p99 {percentile(keyed, 99) * 1e3:.2f} ms",
        f"p50 {percentile(plain, 50) * 1e3:.2f} ms / p99 {percentile(plain, 99) * 1e3:.2f} ms", "", "",
    ])  # fmt: skip
    rows.append([
        backend, "latency behind a full key",
        f"p50 {percentile(busy_keyed, 50) * 1e3:.2f} ms / p99 {percentile(busy_keyed, 99) * 1e3:.2f} ms",
        f"p50 {percentile(busy_plain, 50) * 1e3:.2f} ms / p99 {percentile(busy_plain, 99) * 1e3:.2f} ms", "", "",
    ])  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_backend_options(parser, "rounds per number of keys (default 2)")
    parser.add_argument("--keys", default=None, help="comma-separated numbers of distinct keys (default 1,10,1000,100000)")
    parser.add_argument("--same-args", action="store_true", help="the default (kept for older commands): the unlimited side's jobs carry the keyed side's arguments")
    parser.add_argument("--bare-unlimited", action="store_true", help="the unlimited side's jobs have no arguments and no bookkeeping")
    parser.add_argument("--claim-cost", action="store_true", help="only the claim and outcome cost, one call at a time (PostgreSQL)")
    args = parser.parse_args(argv)
    if args.claim_cost:
        try:
            with throwaway_database("keyed") as url:
                for name, (claim_ms, finish_ms) in claim_cost(url).items():
                    print(f"{name}: claim {claim_ms:.2f} ms, finish {finish_ms:.2f} ms (medians)")
        except PgUnavailable as exc:
            print(exc, file=sys.stderr)
            return 2
        return 0
    s = sizes_from(args, Sizes(), SMOKE)
    if args.keys:
        s = attrs.evolve(s, keys=tuple(int(k) for k in args.keys.split(",")))
    if args.bare_unlimited:
        s = attrs.evolve(s, same_args=False)
    print(f"per-key concurrency: {s.jobs:,} jobs pre-filled ({s.few_jobs:,} for fewer keys than workers),"
          f" {s.workers} workers, keys {s.keys}, {s.rounds} round(s)"
          + (", the unlimited side with the same arguments" if s.same_args else ", the unlimited side with no arguments"))  # fmt: skip
    started = time.perf_counter()
    try:
        rows = measure_each_backend(s.backends, "keyed", lambda backend, target: measure(backend, target, s, print))
    except PgUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    header = ["backend", "keys (limit 1)", "keyed jobs/s", "unlimited jobs/s", "ratio", "overshoot"]
    print()
    print(render_table([header, *rows]))
    print(
        "\n(latency rows: enqueue -> start with a free slot, keyed (a new key each) | unlimited; behind a full key:"
        f" the same while one other key is full with a backlog of {s.few_jobs:,}; {time.perf_counter() - started:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
