"""Instructions per no-op job: the runtime against the plain-Trio baseline, counted, not timed.

On a shared 2-core machine a baseline round's wall time varied 4x within one run, and even CPU
time moves by tens of percent. `valgrind --tool=callgrind` counts the instructions the process
executes, which does not depend on what else the machine is doing: the same program gives the
same count. This script runs each side under callgrind twice, with N and 3N jobs, and divides the
difference by 2N, so start-up and interpreter costs cancel out. The ratio baseline / runtime is
the throughput ratio an idle machine would show if every instruction cost the same (cache
effects aside), and is the figure to watch when changing the per-job path. The runtime is counted twice, with its
default settings and with the blocked-loop watchdog off (`blocked_loop_warning=None`), so the
watchdog's own per-job price is printed too.

`--args` counts the price of checking a job's arguments against its handler's annotations
instead: the same handler, ``index(ctx, doc_id, title, tags)``, enqueued with the same args,
once unannotated (nothing to check) and once annotated ``doc_id: int, title: str, tags:
list[str]`` (checked at enqueue with msgspec). Both runtimes run with default settings; the
difference is the checking's per-job cost, and each is also shown against the baseline.

`--hooks` counts the price of middleware (docs/middleware.md) instead: the same no-op jobs with
no middleware, with one empty ``async def mw(ctx, call_next)``, with the Prometheus extra
(`nursery_jobs.contrib.prometheus`, needs prometheus-client) and with the OpenTelemetry extra
(`nursery_jobs.contrib.otel` on the SDK's tracer provider with no exporter, needs
opentelemetry-sdk); each difference is that middleware's per-attempt cost.

`--keys K` counts the price of a per-key limit instead (issue 11, as `concurrency_keys.py
--same-args` times it): N pre-filled jobs drained by 32 workers, each carrying ``{"key":
"k<n % K>"}``, once with no limit and once with that key as its concurrency key at a limit of
1. The difference is what the limit costs a job: the claim's admission, the key's running count,
the freed slot and its wake-ups.

Usage:

    .venv/bin/python benchmarks/memory_instructions.py [--jobs 1000]
    .venv/bin/python benchmarks/memory_instructions.py --keys 1000 --workers 32
    .venv/bin/python benchmarks/memory_instructions.py --hooks
    .venv/bin/python benchmarks/memory_instructions.py --smoke   # every side once, no valgrind

Needs valgrind (Debian's package; present on this machine kind), except `--smoke`, which runs
every side once at a tiny size in this process and counts nothing: the test suite runs it so the
sides keep working.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

from typing import Any

import trio

import nursery_jobs as nj

try:
    from .baselines.plain_trio import run_baseline
except ImportError:  # run as a script
    from baselines.plain_trio import run_baseline  # type: ignore[no-redef]


def _runtime(n: int, workers: int, watch: bool = True, hooks: str = "") -> None:
    app = nj.App()
    app.queue("bench", max_workers=workers, timeout=30)
    if hooks == "empty":

        @app.middleware
        async def empty(ctx: nj.JobContext, call_next: Any) -> Any:
            return await call_next(ctx)

    elif hooks == "prometheus":
        from nursery_jobs.contrib.prometheus import PrometheusMetrics

        PrometheusMetrics(app)
    elif hooks == "otel":
        from opentelemetry.sdk.trace import TracerProvider

        from nursery_jobs.contrib.otel import Tracing

        Tracing(app, tracer_provider=TracerProvider())

    @app.job(queue="bench")
    async def noop(ctx: nj.JobContext) -> None:
        return None

    async def main(rt: nj.Runtime) -> None:
        ids = await noop.enqueue_many({} for _ in range(n))
        await rt.wait(ids[-1], timeout=600)

    # Watched: the default settings (the blocked-loop watchdog on); unwatched: the watchdog off.
    settings = nj.RuntimeSettings() if watch else nj.RuntimeSettings(blocked_loop_warning=None)
    nj.run(main, app=app, settings=settings)
    assert trio  # the baseline side is plain Trio (baselines/plain_trio.py)


def _runtime_args(n: int, workers: int, typed: bool) -> None:
    app = nj.App()
    app.queue("bench", max_workers=workers, timeout=30)

    if typed:

        @app.job(queue="bench")
        async def index(ctx: nj.JobContext, doc_id: int, title: str, tags: list[str]) -> None:
            return None

    else:

        @app.job(queue="bench")
        async def index(ctx, doc_id, title, tags):  # type: ignore[no-untyped-def]
            return None

    async def main(rt: nj.Runtime) -> None:
        ids = await index.enqueue_many({"doc_id": i, "title": "a title", "tags": ["a", "b"]} for i in range(n))
        await rt.wait(ids[-1], timeout=600)

    nj.run(main, app=app)


def _runtime_keys(n: int, workers: int, keys: int, limited: bool) -> None:
    from nursery_jobs.backends import NewJob

    app = nj.App()
    app.queue("bench", max_workers=workers, timeout=60)
    done = trio.Event()
    count = [0]

    async def body() -> None:
        count[0] += 1
        if count[0] == n:
            done.set()

    if limited:

        @app.job(queue="bench", name="job", concurrency_key=lambda args: args["key"], max_concurrent=1)
        async def keyed(ctx: nj.JobContext, key: str) -> None:
            await body()

    else:

        @app.job(queue="bench", name="job")
        async def plain(ctx: nj.JobContext, key: str) -> None:
            await body()

    backend = nj.MemoryBackend()
    jobs = [
        NewJob("job", "bench", '{"key": "k%d"}' % (g % keys), 0, None, 25, None, f"k{g % keys}" if limited else None,
               1 if limited else None)
        for g in range(n)
    ]  # fmt: skip
    nj.run(lambda rt: backend.insert_many(jobs), app=nj.App(), backend=backend, queues=[])

    async def main(rt: nj.Runtime) -> None:
        with trio.fail_after(600):
            await done.wait()

    nj.run(main, app=app, backend=backend, grace=0.0)


HOOKS = ("empty", "prometheus", "otel")
SIDES = ("baseline", "runtime", "unwatched", "typed", "untyped", "keyed", "unkeyed", *(f"hooks_{h}" for h in HOOKS))
SMOKE_JOBS = 20
SMOKE_KEYS = 5


def run_side(side: str, n: int, workers: int, keys: int) -> None:
    """One side's program, as callgrind runs it (``--side``): `n` jobs through `workers`."""
    if side == "baseline":
        run_baseline(n, workers)
    elif side in ("runtime", "unwatched"):
        _runtime(n, workers, watch=side == "runtime")
    elif side.startswith("hooks_"):
        _runtime(n, workers, hooks=side.removeprefix("hooks_"))
    elif side in ("typed", "untyped"):
        _runtime_args(n, workers, typed=side == "typed")
    else:
        _runtime_keys(n, workers, keys, limited=side == "keyed")


def _count(side: str, n: int, workers: int, keys: int = 0) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
         "--side", side, "--jobs", str(n), "--workers", str(workers), "--keys", str(keys)],
        capture_output=True, text=True, timeout=1800, check=True,
    ).stderr  # fmt: skip
    match = re.search(r"Collected : (\d+)", out)
    if match is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out[-2000:]}")
    return int(match.group(1))


def per_job(side: str, n: int, workers: int, keys: int = 0) -> float:
    return (_count(side, 3 * n, workers, keys) - _count(side, n, workers, keys)) / (2 * n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--args", action="store_true", help="count the argument check's price instead")
    parser.add_argument("--hooks", action="store_true", help="count the price of middleware and of the extras instead")
    parser.add_argument("--keys", type=int, default=0, help="count the price of a per-key limit over this many keys instead")
    parser.add_argument("--smoke", action="store_true", help="every side once at a tiny size, without valgrind: counts nothing")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        run_side(args.side, args.jobs, args.workers, args.keys)
        return 0
    if args.smoke:
        for side in SIDES:
            run_side(side, SMOKE_JOBS, args.workers, SMOKE_KEYS)
        print(f"smoke run: every side ran {SMOKE_JOBS} jobs without valgrind; nothing counted")
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    if args.keys:
        unkeyed = per_job("unkeyed", args.jobs, args.workers, args.keys)
        keyed = per_job("keyed", args.jobs, args.workers, args.keys)
        print(f"instructions per job, {args.keys:,} keys, {args.workers} workers: no limit {unkeyed:,.0f}, "
              f"limit 1 {keyed:,.0f}; the limit costs {keyed - unkeyed:,.0f} ({(keyed - unkeyed) / unkeyed:+.1%}), "
              f"ratio {unkeyed / keyed:.3f}")  # fmt: skip
        return 0
    if args.hooks:
        bare = per_job("runtime", args.jobs, args.workers)
        print(f"instructions per job: no middleware {bare:,.0f}")
        for hook in HOOKS:
            count = per_job(f"hooks_{hook}", args.jobs, args.workers)
            print(f"  {hook}: {count:,.0f}, +{count - bare:,.0f} ({(count - bare) / bare:+.1%})")
        return 0
    base = per_job("baseline", args.jobs, args.workers)
    if args.args:
        plain = per_job("untyped", args.jobs, args.workers)
        typed = per_job("typed", args.jobs, args.workers)
        print(f"instructions per job: baseline {base:,.0f}; 3 args unannotated {plain:,.0f} (ratio {base / plain:.3f}), "
              f"annotated {typed:,.0f} (ratio {base / typed:.3f})")
        print(f"argument check: {typed - plain:,.0f} instructions per job ({(typed - plain) / plain:+.1%})")
        return 0
    rt = per_job("runtime", args.jobs, args.workers)
    bare = per_job("unwatched", args.jobs, args.workers)
    print(f"instructions per job: baseline {base:,.0f}, runtime {rt:,.0f}; ratio {base / rt:.3f} (target >= 0.5)")
    print(
        f"blocked-loop watchdog: runtime without it {bare:,.0f} per job; it costs {rt - bare:,.0f} "
        f"({(rt - bare) / bare:+.1%})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
