"""Outbox relay throughput and receipt latency with 64 waiters.

What it measures:

1. **Relay events per second** (PostgreSQL, SQLite). The jobs table is pre-filled with N jobs
   of a queue nobody works, then `ANALYZE`d. One runtime, with no workers (so the figure is the
   relay's, not the handlers'), publishes N events on one topic with one subscriber kind, in
   transactions of B events each (`rt.transaction()` and `nj.publish`, one call per event);
   the time is from the
   first publish to the moment the outbox is empty with every publish committed, i.e. every
   event's job exists. The baseline, in the same run on the same pre-filled table, is
   `kind.enqueue_many` of the same N jobs in batches of B. Rounds alternate the sides, each on a
   fresh table; the figure is the median of the per-round ratios relay / enqueue_many. Two
   more sides split that time: "publish alone" (the same publishes by an app that subscribes
   to nothing, so no relay runs) and "relay alone" (a subscribing runtime started on that
   full outbox, timed from its start until the outbox is empty).
2. **Receipt latency with 64 waiters** (memory, PostgreSQL). 64 tasks each enqueue a no-op job
   and `rt.wait` for it at once (64 is `max_waiters`, so none is refused); the latency is from
   the handler's return to `wait`'s return (p50, p99), beside enqueue -> receipt.

Usage (PostgreSQL on 127.0.0.1:5432, or the admin URL in NJ_BENCH_PG_URL; the script creates
and drops its own database, even on failure):

    .venv/bin/python benchmarks/outbox_relay.py
    .venv/bin/python benchmarks/outbox_relay.py --smoke   # tiny sizes: only proves it runs

Results are recorded in benchmarks/RESULTS.md ("Outbox relay and receipts"). Speed is never
asserted in tests.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import attrs
import psycopg
import trio
from psycopg import sql

import nursery_jobs as nj
from nursery_jobs.infra.owner import open_owner

try:  # imported as `benchmarks.outbox_relay`
    from .per_backend import JOB_COLUMNS, backlog
    from .pg_common import PgUnavailable, backend_url, fresh_schema, percentile, render_table, throwaway_database
except ImportError:  # run as a script: benchmarks/ is sys.path[0]
    from per_backend import JOB_COLUMNS, backlog  # type: ignore[no-redef]
    from pg_common import PgUnavailable, backend_url, fresh_schema, percentile, render_table, throwaway_database  # type: ignore[no-redef]

SCHEMA = "relay"
TOPIC = "bench.event"


@attrs.frozen
class Sizes:
    events: int = 20_000
    batch: int = 500
    """Events (or jobs) per transaction."""
    prefill: int = 20_000
    rounds: int = 3
    waiters: int = 64
    receipt_rounds: int = 30


SMOKE = Sizes(events=100, batch=50, prefill=100, rounds=1, receipt_rounds=1)


def build_app(finished: dict[int, float]) -> nj.App:
    app = nj.App()
    app.queue("relayed", max_workers=1, timeout=60)
    app.queue("receipt", max_workers=8, timeout=60, poll_interval=0.1)

    @app.subscribe(TOPIC)
    @app.job(queue="relayed")
    async def on_event(ctx: nj.JobContext, n: int) -> None:
        return None

    @app.job(queue="receipt")
    async def quick(ctx: nj.JobContext) -> None:
        finished[ctx.id] = time.perf_counter()

    return app


# -- relay --


def filler_rows(n: int) -> list[tuple[Any, ...]]:
    """`n` due jobs of a queue nobody works (JOB_COLUMNS)."""
    now = time.time()
    return [("filler", "filler", "{}", "available", 25, 0, now, now)] * n


def one_side(backend: str, target: str, s: Sizes, side: str) -> tuple[float, float]:
    """Seconds until all `s.events` jobs exist, and seconds of publishing, for one side:
    "enqueue_many"; "relay" (publish while the relay runs); "drain" (publish with no relay
    running, by an app that subscribes to nothing, then time a subscribing runtime from its
    start until the outbox is empty)."""
    app = build_app({})
    on_event = app.kind("on_event")
    where = backlog(backend, target, SCHEMA, JOB_COLUMNS, filler_rows(s.prefill), analyze=("outbox",))
    if backend == "postgres":

        def pending() -> bool:
            with psycopg.connect(target, autocommit=True) as conn:
                row = conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {}.outbox)").format(sql.Identifier(SCHEMA))).fetchone()
            return bool(row and row[0])

        def made() -> int:
            with psycopg.connect(target, autocommit=True) as conn:
                row = conn.execute(
                    sql.SQL("SELECT count(*) FROM {}.jobs WHERE kind = 'on_event'").format(sql.Identifier(SCHEMA))
                ).fetchone()
            return int(row[0]) if row else 0
    else:

        def _one(query: str) -> Any:
            conn = sqlite3.connect(target, timeout=30)
            try:
                return conn.execute(query).fetchone()[0]
            finally:
                conn.close()

        def pending() -> bool:
            return bool(_one("SELECT EXISTS (SELECT 1 FROM nj_outbox)"))

        def made() -> int:
            return int(_one("SELECT count(*) FROM nj_jobs WHERE kind = 'on_event'"))

    batches = [[{"n": i} for i in range(b, min(b + s.batch, s.events))] for b in range(0, s.events, s.batch)]

    async def publish_all(rt: nj.Runtime) -> None:
        for batch in batches:
            async with rt.transaction() as conn:
                for payload in batch:
                    await nj.publish(conn, TOPIC, payload)

    async def main(rt: nj.Runtime) -> tuple[float, float]:
        with trio.fail_after(600):
            t0 = time.perf_counter()
            published = 0.0
            if side == "relay":
                await publish_all(rt)
                published = time.perf_counter() - t0
            if side == "enqueue_many":
                for batch in batches:
                    await on_event.enqueue_many(batch)
            else:
                while await nj.run_blocking(pending):
                    await trio.sleep(0.002)
            took = time.perf_counter() - t0
        count = await nj.run_blocking(made)
        if count != s.events:
            raise RuntimeError(f"{count} jobs made of {s.events} events")
        return took, published

    if side == "drain":
        t0 = time.perf_counter()
        nj.run(publish_all, app=nj.App(), backend=where, queues=[], grace=0.0)
        published = time.perf_counter() - t0
        t0 = time.perf_counter()  # the relay starts with the runtime
        drained = nj.run(main, app=app, backend=where, queues=[], grace=0.0)
        if drained is None:
            raise RuntimeError("the run was interrupted")
        return time.perf_counter() - t0, published
    result = nj.run(main, app=app, backend=where, queues=[], grace=0.0)
    if result is None:
        raise RuntimeError("the run was interrupted")
    return result


def relay_rows(backend: str, target: str, s: Sizes, log: Callable[[str], None]) -> list[str]:
    ratios, drain_ratios, rates, drains, publishes, plains = [], [], [], [], [], []
    for r in range(s.rounds):
        plain = s.events / one_side(backend, target, s, "enqueue_many")[0]
        took, published = one_side(backend, target, s, "relay")
        relayed = s.events / took
        drained_in, published_alone = one_side(backend, target, s, "drain")
        drained = s.events / drained_in
        ratios.append(relayed / plain)
        drain_ratios.append(drained / plain)
        rates.append(relayed)
        drains.append(drained)
        publishes.append(s.events / published_alone)
        plains.append(plain)
        log(f"  {backend} round {r + 1}: publish+relay {relayed:,.0f} events/s (publishing {published:.2f} s of {took:.2f} s), "
            f"relay alone {drained:,.0f} events/s, publish alone {s.events / published_alone:,.0f} events/s, "
            f"enqueue_many {plain:,.0f} jobs/s")  # fmt: skip
    med = statistics.median
    return [backend, f"{med(rates):,.0f}", f"{med(drains):,.0f}", f"{med(publishes):,.0f}", f"{med(plains):,.0f}",
            f"{med(ratios):.2f}", f"{med(drain_ratios):.2f}"]  # fmt: skip


# -- receipts --


def receipt_latency(where: Any, s: Sizes) -> tuple[list[float], list[float], int]:
    """(handler return -> receipt, enqueue -> receipt, refused), seconds, over every round."""
    finished: dict[int, float] = {}
    app = build_app(finished)
    quick = app.kind("quick")

    async def main(rt: nj.Runtime) -> tuple[list[float], list[float], int]:
        after_finish: list[float] = []
        whole: list[float] = []
        refused = 0

        async def one() -> None:
            nonlocal refused
            t0 = time.perf_counter()
            job_id = await quick.enqueue()
            receipt = await rt.wait(job_id, timeout=10)
            t1 = time.perf_counter()
            if not receipt.done:
                refused += 1
                return
            after_finish.append(t1 - finished.pop(job_id))
            whole.append(t1 - t0)

        with trio.fail_after(600):
            await rt.wait(await quick.enqueue(), timeout=10)  # warm the connections
            for _ in range(s.receipt_rounds):
                async with open_owner("waiters") as waiters:
                    for i in range(s.waiters):
                        waiters.spawn(one, name=f"waiter {i}")
        return after_finish, whole, refused

    result = nj.run(main, app=app, backend=where, grace=0.0)
    if result is None:
        raise RuntimeError("the run was interrupted")
    return result


def receipt_row(name: str, where: Any, s: Sizes) -> list[str]:
    after, whole, refused = receipt_latency(where, s)

    def ms(xs: list[float], p: float) -> str:
        return f"{percentile(xs, p) * 1e3:.2f}"

    return [name, str(len(after)), ms(after, 50), ms(after, 99), ms(whole, 50), ms(whole, 99), str(refused)]


# -- the run --


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: only proves the script runs")
    options = parser.parse_args(argv)
    s = SMOKE if options.smoke else Sizes()

    def log(line: str) -> None:
        print(line, flush=True)

    log(f"outbox relay: {s.events:,} events in transactions of {s.batch}, {s.prefill:,} jobs pre-filled, "
        f"{s.rounds} round(s); receipts: {s.waiters} waiters x {s.receipt_rounds} round(s)")  # fmt: skip
    relay: list[list[str]] = []
    receipts: list[list[str]] = []
    try:
        with throwaway_database("relay") as url:
            relay.append(relay_rows("postgres", url, s, log))
            with tempfile.TemporaryDirectory() as tmp:
                relay.append(relay_rows("sqlite", str(Path(tmp) / "relay.db"), s, log))
            receipts.append(receipt_row("memory", "memory://", s))
            fresh_schema(url, SCHEMA)
            receipts.append(receipt_row("postgres", backend_url(url, SCHEMA), s))
    except PgUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    print()
    print(render_table([["backend", "publish+relay events/s", "relay alone events/s", "publish alone events/s",
                         "enqueue_many jobs/s", "publish+relay / enqueue_many", "relay alone / enqueue_many"], *relay]))  # fmt: skip
    print()
    print(render_table([["backend", "receipts", "return -> receipt p50 ms", "p99 ms", "enqueue -> receipt p50 ms",
                         "p99 ms", "refused"], *receipts]))  # fmt: skip
    if options.smoke:
        print("smoke run: nothing judged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
