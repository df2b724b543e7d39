"""The PostgreSQL driver bridge comparison: how fast, and whether Trio cancellation is honoured.

For each bridge (see ``baselines/pg_bridge.py`` for what each one is: the sync ceiling, a bare
thread hop, the runtime's former thread bridge, trio-asyncio, and infra's Trio-native bridge that
the runtime uses now), it measures claim +
complete round trips -- a claim statement and a completion statement, each its own autocommit
transaction and its own call through the bridge, on one connection -- at k = 1 (one row per
round trip: the cost of the bridge itself) and k = 100 (rows per second: the cost the runtime's
batching leaves). Plain sync psycopg without Trio is the ceiling every ratio is taken against;
rounds rotate the order of the variants and the judged figure is the median of the per-round
ratios. Every variant gets a table refilled to the same state before it runs.

Then, per bridge: a ``SELECT pg_sleep(10)`` cancelled from Trio after 0.2 s (``move_on_after``)
must return promptly (<= 1 s) and leave the connection usable (``SELECT 1`` answers). The bare
``trio.to_thread.run_sync`` row shows why a thread bridge needs more than the bare hop: it is
reported, not judged.

And the import-order note: in a fresh interpreter, psycopg imported before trio_asyncio makes
an async psycopg call under trio-asyncio fail ("no running event loop"); the table reports
whether that is still so.

The database is created for the run with ``synchronous_commit = off`` unless
``--synchronous-commit on`` is given: this compares bridges, and on a disk whose WAL flush takes
milliseconds the flush would hide the per-call cost being measured (it is the same for all).

Usage:

    .venv/bin/python benchmarks/bridge.py            # full run, a few minutes
    .venv/bin/python benchmarks/bridge.py --check    # exit 1 if a judged check fails
    .venv/bin/python benchmarks/bridge.py --smoke    # tiny sizes, a 2 s sleep: proves it runs
"""

from __future__ import annotations

# First, before anything imports psycopg: trio_asyncio must be imported before it.
try:  # imported as `benchmarks.bridge`
    from .baselines import pg_bridge
except ImportError:  # run as a script: benchmarks/ is sys.path[0]
    from baselines import pg_bridge  # type: ignore[no-redef]

import argparse  # noqa: E402
import gc  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Sequence  # noqa: E402

import attrs  # noqa: E402
import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

try:
    from .pg_common import PgUnavailable, fresh_schema, load_average, render_table, throwaway_database, truncate
except ImportError:
    from pg_common import PgUnavailable, fresh_schema, load_average, render_table, throwaway_database, truncate  # type: ignore[no-redef]

__all__ = ["Figures", "Sizes", "main"]

SCHEMA = "nj_raw"
CANCEL_BOUND_S = 1.0
JUDGED_CANCEL = ("threads", "trio_asyncio", "infra", "infra_cached")
LABELS = {
    "sync": "(c) sync psycopg, no Trio (ceiling)",
    "to_thread": "(a0) bare trio.to_thread.run_sync + sync",
    "threads": "(a) former infra: thread + cancel watcher",
    "trio_asyncio": "(b) AsyncConnection via trio-asyncio",
    "infra": "(d) infra PgPool.run: Trio-native waits",
    "infra_cached": "(d') infra, cursor kept per statement",
}


@attrs.frozen
class Sizes:
    trips_k1: int = 1_000
    trips_k100: int = 100
    rounds: int = 5
    sleep_s: float = 10.0
    """The cancelled statement's pg_sleep."""


SMOKE = Sizes(trips_k1=20, trips_k100=3, rounds=1, sleep_s=2.0)


@attrs.frozen
class Figures:
    sizes: Sizes
    k1: dict[str, list[float]]
    """Variant -> round trips/s per round, k = 1."""
    k100: dict[str, list[float]]
    """Variant -> rows/s per round, k = 100."""
    k1_cpu: dict[str, list[float]]
    """Variant -> client CPU seconds per round trip per round, k = 1 (every thread)."""
    cancels: dict[str, pg_bridge.CancelCheck]
    wrong_order_fails: bool | None
    synchronous_commit: str

    def ratio(self, figures: dict[str, list[float]], variant: str) -> float:
        return statistics.median(v / s for v, s in zip(figures[variant], figures["sync"]))

    def verdicts(self) -> dict[str, bool]:
        out = {}
        for v in JUDGED_CANCEL:
            c = self.cancels[v]
            out[f"{v}: cancel prompt and usable"] = c.prompt(CANCEL_BOUND_S) and c.usable
        return out


def _fill(url: str, rows: int) -> None:
    truncate(url, SCHEMA)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at)"
                " SELECT 'noop', 'bench', '{{}}', 'available', 25, 0, 0, 0 FROM generate_series(1, %s)"
            ).format(sql.Identifier(SCHEMA)),
            (rows,),
        )
        conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(sql.Identifier(SCHEMA)))


_WRONG_ORDER = """
import psycopg, trio_asyncio, trio
async def main():
    async with trio_asyncio.open_loop():
        conn = await trio_asyncio.aio_as_trio(psycopg.AsyncConnection.connect)(URL, autocommit=True)
        await trio_asyncio.aio_as_trio(conn.close)()
try:
    trio.run(main)
except BaseException as exc:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    print("FAILED:", type(exc).__name__, exc)
else:
    print("OK")
"""


def wrong_import_order_fails(url: str) -> bool | None:
    """In a fresh interpreter with psycopg imported first: does trio-asyncio + AsyncConnection
    fail with 'no running event loop'? None if the probe itself could not run."""
    try:
        result = subprocess.run(
            [sys.executable, "-c", f"URL = {url!r}\n" + _WRONG_ORDER], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return None
    out = result.stdout.strip()
    if out.startswith("FAILED:") and "no running event loop" in out:
        return True
    if out == "OK":
        return False
    return None


def measure(db: str, sizes: Sizes, log=print) -> Figures:  # type: ignore[no-untyped-def]
    fresh_schema(db, SCHEMA)
    variants = list(pg_bridge.VARIANTS)
    k1: dict[str, list[float]] = {v: [] for v in variants}
    k100: dict[str, list[float]] = {v: [] for v in variants}
    k1_cpu: dict[str, list[float]] = {v: [] for v in variants}
    # Unmeasured warm-up of each variant (imports, first connections, prepared statements).
    for v in variants:
        _fill(db, 20)
        pg_bridge.measure(v, db, SCHEMA, 1, 10)
    for r in range(sizes.rounds):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for v in order:
            _fill(db, sizes.trips_k1)
            gc.collect()
            wall, cpu = pg_bridge.measure(v, db, SCHEMA, 1, sizes.trips_k1)
            k1[v].append(sizes.trips_k1 / wall)
            k1_cpu[v].append(cpu / sizes.trips_k1)
            _fill(db, 100 * sizes.trips_k100)
            gc.collect()
            wall, _cpu = pg_bridge.measure(v, db, SCHEMA, 100, sizes.trips_k100)
            k100[v].append(100 * sizes.trips_k100 / wall)
        log(
            f"round {r + 1}/{sizes.rounds}: k=1 trips/s "
            + ", ".join(f"{v} {k1[v][-1]:,.0f}" for v in variants)
            + " | k=100 rows/s "
            + ", ".join(f"{v} {k100[v][-1]:,.0f}" for v in variants)
        )
    cancels = {}
    for v in variants:
        cancels[v] = pg_bridge.check_cancel(v, db, sizes.sleep_s)
        log(f"cancel {v}: {cancels[v].detail}; usable after: {cancels[v].usable}")
    with psycopg.connect(db) as conn:
        row = conn.execute("SHOW synchronous_commit").fetchone()
    return Figures(sizes, k1, k100, k1_cpu, cancels, wrong_import_order_fails(db), str(row[0]) if row else "?")


def table(f: Figures) -> str:
    med = statistics.median
    ok = f.verdicts()
    rows: list[Sequence[str]] = [
        ("bridge", "k=1 round trips/s", "x ceiling", "k=1 client CPU/trip", "k=100 rows/s", "x ceiling", f"cancelled pg_sleep({f.sizes.sleep_s:g})", "result")
    ]
    for v in pg_bridge.VARIANTS:
        c = f.cancels[v]
        if v == "sync":
            cancel, verdict = "n/a (no Trio)", ""
        else:
            back = f"returned in {c.returned_after:.2f} s" if c.returned_after is not None else "?"
            cancel = f"{back}, {'usable' if c.usable else 'NOT usable'} after"
            key = f"{v}: cancel prompt and usable"
            verdict = ("PASS" if ok[key] else "FAIL") if key in ok else "(reported)"
        rows.append(
            (LABELS[v], f"{med(f.k1[v]):,.0f} ({2 * med(f.k1[v]):,.0f} q/s)", f"{f.ratio(f.k1, v):.2f}", f"{med(f.k1_cpu[v]) * 1e6:,.0f} us",
             f"{med(f.k100[v]):,.0f}", f"{f.ratio(f.k100, v):.2f}", cancel, verdict)
        )  # fmt: skip
    out = render_table(rows)
    wrong = {True: "yes: 'no running event loop' (confirmed)", False: "no: it worked", None: "could not tell"}[f.wrong_order_fails]
    out += f"\n\nprompt = the cancelled call returned within {CANCEL_BOUND_S:g} s; usable = SELECT 1 answered on the same connection"
    out += f"\npsycopg imported before trio_asyncio breaks AsyncConnection under trio-asyncio: {wrong}"
    out += f"\nsynchronous_commit: {f.synchronous_commit}; k=1: {f.sizes.trips_k1:,} round trips, k=100: {f.sizes.trips_k100:,} round trips, {f.sizes.rounds} rounds (medians)"
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="psycopg bridges for Trio: round trips per second and cancellation")
    parser.add_argument(
        "--smoke", "--quick", dest="smoke", action="store_true",
        help="tiny sizes, one round, a 2 s sleep: proves the script runs (--quick: its older name)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a judged check fails")
    parser.add_argument("--rounds", type=int, help=f"rounds (default {Sizes().rounds})")
    parser.add_argument(
        "--synchronous-commit",
        choices=("on", "off"),
        default="off",
        help="synchronous_commit for the benchmark database (default off: compare bridges, not the disk)",
    )
    args = parser.parse_args(argv)
    sizes = SMOKE if args.smoke else Sizes()
    if args.rounds:
        sizes = attrs.evolve(sizes, rounds=args.rounds)
    if not pg_bridge.import_order_ok():
        print("psycopg was imported before trio_asyncio: the trio-asyncio figures would be wrong", file=sys.stderr)
        return 2
    print(f"nursery_jobs bridge benchmark: {sizes}")
    print(f"python {sys.version.split()[0]}, psycopg {psycopg.__version__} ({psycopg.pq.__impl__})")
    print(f"load average at start: {load_average()} ({os.cpu_count()} CPUs)")
    started = time.monotonic()
    try:
        with throwaway_database("bridge") as db:
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("ALTER DATABASE {} SET synchronous_commit = {}").format(
                        sql.Identifier(conn.info.dbname), sql.SQL(args.synchronous_commit)
                    )
                )
            figures = measure(db, sizes)
    except PgUnavailable as exc:
        print(exc, file=sys.stderr)
        return 2
    print()
    print(table(figures))
    print(f"load average at end: {load_average()}")
    print(f"\n({time.monotonic() - started:.1f} s{'; --smoke: sizes too small for the figures to mean anything' if args.smoke else ''})")
    failed = [k for k, v in figures.verdicts().items() if not v]
    if failed:
        print(f"missed: {', '.join(failed)}")
        if args.check:
            print(f"FAIL: {', '.join(failed)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
