"""Prometheus metrics for a runtime (``pip install 'nursery_jobs[prometheus]'``; docs/metrics.md).

`PrometheusMetrics(app)` registers itself as the app's middleware and keeps its metrics in a
`prometheus_client` registry of its own (or the one given):

- counters and histograms fed by the middleware hooks, in the worker's task, per attempt: attempts
  by queue, kind and outcome, their run time and their wait; loop-blocking seconds by kind (the
  blocked-loop watchdog's findings); rescues;
- gauges of each queue's depth by state, its lag, and this process's busy workers, read from
  `rt.stats()`: at most once per `interval` per process, whoever asks (`refresh`; the ASGI app
  refreshes before it answers when the snapshot is older), and never by the scrape itself (the
  registry serves the last snapshot), so N scrapers cost the database what one does.

Labels are bounded by what the app declares: `queue` is a declared queue, `kind` a declared kind
(a job of a kind this app does not declare is counted under ``kind="(undeclared)"``), `outcome`
and `state` fixed sets; no key, id or argument ever becomes a label.

Cost: a dictionary look-up, a counter increment and two histogram observations per attempt (the
`benchmarks/hooks.py` figures: RESULTS.md). `prometheus_client` guards each value with a
`threading.Lock`, held only for the increment, never across an await, so it is safe on the Trio
thread.
"""

from __future__ import annotations

import datetime
import math
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence

import trio

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram, make_asgi_app
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - the extra is installed wherever its tests run
    raise ImportError(
        f"nursery_jobs.contrib.prometheus needs prometheus-client ({exc}): pip install 'nursery_jobs[prometheus]'"
    ) from exc

from ..app import App
from ..errors import ConfigError
from ..middleware import AttemptEnd, LoopBlocked, Middleware

if TYPE_CHECKING:
    from ..client import Client, QueueStats

__all__ = ["BUCKETS", "OUTCOMES", "STATES", "UNDECLARED", "PrometheusMetrics"]

OUTCOMES = ("completed", "retry", "snooze", "discard", "cancelled", "interrupted")
"""The values of the `outcome` label (`nj.AttemptEnd.outcome`)."""

STATES = ("available", "scheduled", "retryable", "running")
"""The values of the depth gauge's `state` label: the jobs not final yet, fleet-wide."""

UNDECLARED = "(undeclared)"
"""The `kind` label of a job whose kind this app does not declare (it is discarded unrun): the
value the database holds never becomes a label."""

BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 3600.0)
"""Seconds, from 10 ms to the hour a background job's run or wait can take. Ten, not the messaging
conventions' fourteen up to 10 s: each bucket is a line of every scrape for every kind, and the
text exposition's cost is per line."""

ASGIApp = Callable[[Mapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def lag_of(stats: QueueStats) -> float | None:
    """A queue's lag: the age, in seconds, of its oldest job that is due and waiting for a worker
    (None when none is). `QueueStats.lag` says it where the runtime reports it; until then there
    is no lag to report."""
    lag = getattr(stats, "lag", None)
    if isinstance(lag, datetime.timedelta):
        return lag.total_seconds()
    return float(lag) if isinstance(lag, (int, float)) and not isinstance(lag, bool) else None


class PrometheusMetrics(Middleware):
    """The metrics of `app`'s runtimes in this process (module docstring; the table of names in
    docs/metrics.md). Registers itself with ``app.middleware(self)``: make it before the runtime
    opens. `registry`: where the metrics live (default: a new one; pass
    ``prometheus_client.REGISTRY`` to serve them with the process's other metrics). `interval`:
    seconds a `rt.stats()` snapshot is served before `refresh` reads another (scrape intervals
    are 15-60 s). `buckets`: the histograms' bounds, in seconds. `namespace`: the names' prefix."""

    def __init__(
        self,
        app: App,
        *,
        registry: CollectorRegistry | None = None,
        interval: float = 15.0,
        buckets: Sequence[float] = BUCKETS,
        namespace: str = "nursery_jobs",
        stats_timeout: float = 5.0,
    ) -> None:
        if not (isinstance(interval, (int, float)) and math.isfinite(interval) and interval > 0):
            raise ConfigError(f"interval must be a finite number of seconds > 0, not {interval!r}")
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.interval = float(interval)
        self.stats_timeout = stats_timeout
        ns = namespace
        self._app = app
        self._attempts = attempts = Counter(
            "attempts", "Attempts that ended, by queue, kind and outcome (a timeout is a retry or a discard).",
            ["queue", "kind", "outcome"], namespace=ns, registry=self.registry,
        )  # fmt: skip
        self._duration = Histogram(
            "attempt_duration_seconds", "How long each attempt ran.", ["queue", "kind"], namespace=ns,
            registry=self.registry, buckets=buckets,
        )  # fmt: skip
        self._wait = Histogram(
            "attempt_wait_seconds", "How long each attempt's job waited for a worker once due (enqueued, run_at, "
            "backoff or snooze over), by queue: the workers' shortfall is a queue's.", ["queue"], namespace=ns,
            registry=self.registry, buckets=buckets,
        )  # fmt: skip
        self._timeouts = Counter(
            "attempt_timeouts", "Attempts cut by their timeout.", ["queue", "kind"], namespace=ns, registry=self.registry
        )
        self._blocked = Counter(
            "event_loop_blocked_seconds", "Seconds steps held the Trio loop past blocked_loop_warning, by the kind whose "
            "code ran (empty: no job's).", ["kind"], namespace=ns, registry=self.registry,
        )  # fmt: skip
        self._blocked_steps = Counter(
            "event_loop_blocked_steps", "Steps that held the Trio loop past blocked_loop_warning, by kind.", ["kind"],
            namespace=ns, registry=self.registry,
        )  # fmt: skip
        self._rescued = Counter(
            "rescued_jobs", "Running jobs whose worker stopped heartbeating, made runnable again by this process.",
            namespace=ns, registry=self.registry,
        )  # fmt: skip
        self._snapshot_errors = Counter(
            "stats_errors", "rt.stats() reads that failed or timed out (the last snapshot is served).",
            namespace=ns, registry=self.registry,
        )  # fmt: skip
        self._series: dict[tuple[str, str], tuple[dict[str, Any], Any, Any]] = {}
        """Every series of each declared (queue, kind), made once (`_declare`): an attempt costs
        one dictionary look-up (`labels()` would cost a lock and a tuple per call), and every
        series exists at 0 before its first attempt, which rate() needs. A queue's undeclared
        kind gets its series at its first job (`_series_of`)."""
        self._kinds: frozenset[str] = frozenset()
        self._declare()
        self._gauges = _StatsCollector(ns)
        self.registry.register(self._gauges)
        self._read_at = -math.inf
        self._reading: trio.Event | None = None
        app.middleware(self)

    def _declare(self) -> None:
        """Make the series of every (queue, kind) the app declares now (kinds declared after
        this object was made are found at their first attempt, or at the next refresh)."""
        kinds = {name: kind.queue for name, kind in self._app.kinds.items()}
        for kind, queue in kinds.items():
            self._series_of(queue, kind)
        self._kinds = frozenset(kinds)

    def _series_of(self, queue: str, kind: str) -> tuple[dict[str, Any], Any, Any]:
        series = self._series.get((queue, kind))
        if series is None:
            series = self._series[(queue, kind)] = (
                {o: self._attempts.labels(queue, kind, o) for o in OUTCOMES},
                self._duration.labels(queue, kind),
                self._wait.labels(queue),
            )
        return series

    def _label(self, kind: str) -> str:
        if kind not in self._kinds:
            self._declare()
        return kind if kind in self._kinds else UNDECLARED

    # -- the middleware hooks --

    def attempt_ended(self, end: AttemptEnd) -> None:
        series = self._series.get((end.queue, end.kind))
        if series is None:
            if end.queue not in self._app.queues:
                return  # a queue this app does not declare: not this app's job
            series = self._series_of(end.queue, self._label(end.kind))
        counters, duration, wait = series
        counters[end.outcome].inc()
        duration.observe(end.duration)
        wait.observe(end.wait)
        if end.timed_out:
            self._timeouts.labels(end.queue, self._label(end.kind)).inc()

    def loop_blocked(self, blocked: LoopBlocked) -> None:
        kind = "" if blocked.kind is None else self._label(blocked.kind)
        self._blocked.labels(kind).inc(blocked.seconds)
        self._blocked_steps.labels(kind).inc()

    def jobs_rescued(self, job_ids: Sequence[int]) -> None:
        self._rescued.inc(len(job_ids))

    # -- the gauges --

    async def refresh(self, client: Client) -> None:
        """Read `client.stats()` into the gauges, unless the snapshot is younger than
        `interval`; one read at a time, however many callers (the others wait for it, within
        `stats_timeout`). A read that fails or takes longer than `stats_timeout` counts in
        ``stats_errors_total`` and leaves the last snapshot in place: a scrape never fails
        for the database."""
        if trio.current_time() - self._read_at < self.interval:
            return
        self._declare()
        if self._reading is not None:
            with trio.move_on_after(self.stats_timeout):
                await self._reading.wait()
            return
        self._reading = done = trio.Event()
        try:
            stats: Mapping[str, QueueStats] | None = None
            with trio.move_on_after(self.stats_timeout):
                try:
                    stats = await client.stats()
                except Exception:
                    stats = None
            if stats is None:
                self._snapshot_errors.inc()
            else:
                self._gauges.stats = stats
            self._read_at = trio.current_time()
        finally:
            self._reading = None
            done.set()

    def asgi_app(self, client: Client) -> ASGIApp:
        """An ASGI app serving the registry (mount it at ``/metrics``), which refreshes the
        gauges first when the snapshot is older than `interval` (`refresh`)."""
        serve = make_asgi_app(self.registry)

        async def app(scope: Mapping[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]) -> None:
            if scope.get("type") == "lifespan":
                while True:
                    message = await receive()
                    kind = message.get("type", "")
                    if kind == "lifespan.startup":
                        await send({"type": "lifespan.startup.complete"})
                    elif kind == "lifespan.shutdown":
                        await send({"type": "lifespan.shutdown.complete"})
                        return
            await self.refresh(client)
            await serve(scope, receive, send)

        return app


class _StatsCollector(Collector):
    """The gauges, from the last `rt.stats()` snapshot: a scrape reads no database."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.stats: Mapping[str, QueueStats] = {}

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        return list(self._families())

    def _families(self) -> Iterator[Metric]:
        ns = self.namespace
        depth = GaugeMetricFamily(
            f"{ns}_queue_depth", "Jobs of the queue not final yet, by state, in every process (fleet-wide).",
            labels=["queue", "state"],
        )  # fmt: skip
        lag = GaugeMetricFamily(
            f"{ns}_queue_lag_seconds", "Age of the queue's oldest job due and waiting for a worker (fleet-wide).",
            labels=["queue"],
        )  # fmt: skip
        busy = GaugeMetricFamily(
            f"{ns}_workers_busy", "Attempts of the queue running in this process.", labels=["queue"]
        )
        limit = GaugeMetricFamily(f"{ns}_workers", "This process's worker limit for the queue.", labels=["queue"])
        for name, s in sorted(self.stats.items()):
            for state in STATES:
                depth.add_metric([name, state], float(getattr(s, state)))
            seconds = lag_of(s)
            if seconds is not None:
                lag.add_metric([name], seconds)
            busy.add_metric([name], float(s.running_here))
            limit.add_metric([name], float(s.max_workers_here))
        yield from (depth, lag, busy, limit)
