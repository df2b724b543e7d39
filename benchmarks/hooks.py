"""What middleware costs an attempt, in CPU microseconds, and what a Prometheus scrape costs under load.

Per attempt: N no-op jobs drained by 8 workers on the memory backend, in a fresh `nj.run` each,
with no middleware, one empty ``async def mw(ctx, call_next)``, the Prometheus extra, and the
OpenTelemetry extra (the SDK's tracer provider, no exporter). The sides alternate within each of
R rounds, so the machine's load drifts over all of them alike; each side's figure is its median
CPU time (`time.process_time`) over the rounds, and a middleware's cost is its difference from
the side with none, divided by N. `memory_instructions.py --hooks` counts the same sides in
instructions, which the load does not move.

Scrape: K kinds (10) over 3 queues with the Prometheus extra, 6 workers running no-op jobs that
re-enqueue themselves the whole time; S scrapes through `metrics.asgi_app(rt)` spaced over the
run, each refreshing the queue gauges (the interval is 0.01 s here, so every scrape reads
`rt.stats()`, where in production one scrape per interval does). Each is timed twice: the
whole scrape from the call to its last byte (wall time, which includes the other tasks that ran
while it awaited the stats), and its own work, the registry's text exposition, which runs
without yielding, in CPU time (`time.thread_time`: what the loop spends on it, whatever else the
machine runs). Target: the exposition's p99 under 5 ms.

Usage:

    .venv/bin/python benchmarks/hooks.py [--jobs 5000] [--rounds 5] [--scrapes 200]
    .venv/bin/python benchmarks/hooks.py --smoke   # every side once at a tiny size, nothing judged
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import trio

import nursery_jobs as nj

SIDES = ("none", "empty", "prometheus", "otel")


def _app(side: str) -> nj.App:
    app = nj.App()
    app.queue("bench", max_workers=8, timeout=30)
    if side == "empty":

        @app.middleware
        async def empty(ctx: nj.JobContext, call_next: Any) -> Any:
            return await call_next(ctx)

    elif side == "prometheus":
        from nursery_jobs.contrib.prometheus import PrometheusMetrics

        PrometheusMetrics(app)
    elif side == "otel":
        from opentelemetry.sdk.trace import TracerProvider

        from nursery_jobs.contrib.otel import Tracing

        Tracing(app, tracer_provider=TracerProvider())
    return app


def attempt_cpu(side: str, n: int) -> float:
    """CPU seconds to drain `n` no-op jobs with `side`'s middleware (enqueue included)."""
    app = _app(side)

    @app.job(queue="bench")
    async def noop(ctx: nj.JobContext) -> None:
        return None

    spent = [0.0]

    async def main(rt: nj.Runtime) -> None:
        ids = await noop.enqueue_many({} for _ in range(n))
        start = time.process_time()
        await rt.wait(ids[-1], timeout=600)
        spent[0] = time.process_time() - start

    nj.run(main, app=app, settings=nj.RuntimeSettings(blocked_loop_warning=None))
    return spent[0]


def scrape_times(scrapes: int, kinds_n: int) -> tuple[list[float], list[float], int]:
    """Wall times of whole scrapes, of their expositions alone, and the exposition's lines."""
    import prometheus_client

    from nursery_jobs.contrib.prometheus import PrometheusMetrics

    app = nj.App()
    for q in range(3):
        app.queue(f"q{q}", max_workers=2, timeout=30)
    metrics = PrometheusMetrics(app, interval=0.01)
    kinds = []
    for k in range(kinds_n):

        async def handler(ctx: nj.JobContext) -> None:
            await ctx.client.enqueue(ctx.kind, {})  # keeps the queues busy for the whole run

        kinds.append(app.job(queue=f"q{k % 3}", name=f"kind{k}")(handler))
    times: list[float] = []
    own: list[float] = []
    lines = [0]

    async def get(serve: Any) -> None:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            pass

        scope = {"type": "http", "method": "GET", "path": "/metrics", "query_string": b"", "headers": []}
        await serve(scope, receive, send)

    async def main(rt: nj.Runtime) -> None:
        for kind in kinds:
            await kind.enqueue_many([{}] * 4)
        serve = metrics.asgi_app(rt)
        await trio.sleep(0.2)
        for _ in range(scrapes):
            await trio.sleep(0.02)
            start = time.perf_counter()
            await get(serve)
            times.append(time.perf_counter() - start)
            start = time.thread_time()
            text = prometheus_client.generate_latest(metrics.registry)
            own.append(time.thread_time() - start)
            lines[0] = text.count(b"\n")
        rt.begin_shutdown()

    nj.run(main, app=app, grace=0.0)
    return times, own, lines[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--kinds", type=int, default=10, help="kinds of the scraped app (over 3 queues)")
    parser.add_argument("--smoke", action="store_true", help="every side once at a tiny size: measures nothing")
    args = parser.parse_args()
    if args.smoke:
        args.jobs, args.rounds, args.scrapes, args.kinds = 20, 1, 3, 3
    cpu: dict[str, list[float]] = {side: [] for side in SIDES}
    for _ in range(args.rounds):
        for side in SIDES:
            cpu[side].append(attempt_cpu(side, args.jobs))
    base = statistics.median(cpu["none"])
    print(f"CPU per attempt, median of {args.rounds} rounds of {args.jobs:,} jobs: none {base / args.jobs * 1e6:.2f} us")
    for side in SIDES[1:]:
        extra = (statistics.median(cpu[side]) - base) / args.jobs * 1e6
        print(f"  {side}: {extra:+.2f} us an attempt")
    whole, own, lines = scrape_times(args.scrapes, args.kinds)

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1e3

    verdict = "(smoke)" if args.smoke else "PASS" if pct(own, 0.99) < 5.0 else "FAIL"
    print(
        f"scrape under load, {args.kinds} kinds, {lines} lines, {len(own)} scrapes: exposition CPU p50 {pct(own, 0.5):.2f} ms, "
        f"p99 {pct(own, 0.99):.2f} ms (target < 5 ms) {verdict}; whole scrape with its stats read p50 "
        f"{pct(whole, 0.5):.2f} ms, p99 {pct(whole, 0.99):.2f} ms"
    )
    if args.smoke:
        print("smoke run: nothing judged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
