"""The Prometheus extra (`nursery_jobs.contrib.prometheus`): what each metric counts, that labels
stay within what the app declares, and that the queue gauges cost one `rt.stats()` per interval
however often they are scraped. Two processes adding up: tests/processes/test_observability.py."""

from __future__ import annotations

import datetime
from typing import Any

import attrs
import prometheus_client
import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import NewJob
from nursery_jobs.contrib.prometheus import PrometheusMetrics, lag_of
from nursery_jobs.infra import watchdog

FAST_RETRY = nj.RetryPolicy(base=1.0, factor=1.0, cap=1.0, jitter=0.0)


def value(metrics: PrometheusMetrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


async def scrape(app: Any) -> tuple[int, bytes]:
    """One GET of `app`, as an ASGI server would make it."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/metrics", "query_string": b"", "headers": []}
    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


async def test_attempts_are_counted_by_queue_kind_and_outcome_with_their_run_time_and_wait(autojump_clock) -> None:
    app = nj.App()
    app.queue("one", max_workers=1, timeout=5)
    metrics = PrometheusMetrics(app)

    @app.job(queue="one", retry=FAST_RETRY, max_attempts=2)
    async def work(ctx: nj.JobContext, fail: bool, seconds: float) -> None:
        await trio.sleep(seconds)
        if fail:
            raise ValueError("no")

    @app.job(queue="one", timeout=1, max_attempts=1)
    async def slow(ctx: nj.JobContext) -> None:
        await trio.sleep(10)

    async with nj.open_runtime(app) as rt:
        ids = [await work.enqueue(fail=False, seconds=2), await work.enqueue(fail=True, seconds=0), await slow.enqueue()]
        for job_id in ids:
            await rt.wait(job_id, timeout=60)
    assert value(metrics, "nursery_jobs_attempts_total", queue="one", kind="work", outcome="completed") == 1
    assert value(metrics, "nursery_jobs_attempts_total", queue="one", kind="work", outcome="retry") == 1
    assert value(metrics, "nursery_jobs_attempts_total", queue="one", kind="work", outcome="discard") == 1
    assert value(metrics, "nursery_jobs_attempts_total", queue="one", kind="slow", outcome="discard") == 1
    assert value(metrics, "nursery_jobs_attempt_timeouts_total", queue="one", kind="slow") == 1
    assert value(metrics, "nursery_jobs_attempt_duration_seconds_count", queue="one", kind="work") == 3
    assert value(metrics, "nursery_jobs_attempt_duration_seconds_sum", queue="one", kind="work") == pytest.approx(2.0)
    # One worker: the failing job and the slow one waited 2 s each for it; the retry started when
    # its backoff ended.
    assert value(metrics, "nursery_jobs_attempt_wait_seconds_sum", queue="one") == pytest.approx(4.0)
    assert value(metrics, "nursery_jobs_attempt_wait_seconds_count", queue="one") == 4
    assert value(metrics, "nursery_jobs_attempt_wait_seconds_bucket", queue="one", le="5.0") == 4


async def test_labels_are_the_declared_queues_and_kinds_whatever_the_jobs_carry(autojump_clock) -> None:
    app = nj.App()
    metrics = PrometheusMetrics(app)

    @app.job(unique=lambda args: args["key"])
    async def keyed(ctx: nj.JobContext, key: str) -> None:
        pass

    def series() -> set[tuple[str, tuple[tuple[str, str], ...]]]:
        return {
            (s.name, tuple(sorted(s.labels.items())))
            for family in metrics.registry.collect()
            for s in family.samples
            if s.name.startswith("nursery_jobs_attempt")
        }

    backend = nj.MemoryBackend()
    async with nj.open_runtime(app, backend=backend) as rt:
        await metrics.refresh(rt)  # the first scrape: every declared kind's series, at 0
        before = series()
        ids = await keyed.enqueue_many([{"key": f"k{i}"} for i in range(50)])
        [(stray, _)] = await backend.insert_many([NewJob("gone_kind", "default", "{}", 0, None, 1)])
        for job_id in [*ids, stray]:
            await rt.wait(job_id, timeout=5)
    added = series() - before
    # Fifty distinct keys added no series; the one job of a kind the app does not declare added
    # the series of one label, "(undeclared)", whatever the kind stored.
    assert added and all(("kind", "(undeclared)") in labels for _, labels in added)
    assert value(metrics, "nursery_jobs_attempts_total", queue="default", kind="keyed", outcome="completed") == 50
    assert value(metrics, "nursery_jobs_attempts_total", queue="default", kind="(undeclared)", outcome="discard") == 1
    labels = {s.labels.get("kind") for family in metrics.registry.collect() for s in family.samples}
    assert labels <= {None, "keyed", "(undeclared)"}


async def test_the_queue_gauges_read_the_stats_once_per_interval_however_often_they_are_scraped(autojump_clock) -> None:
    app = nj.App()
    app.queue("mail", max_workers=3)
    metrics = PrometheusMetrics(app, interval=15)

    @app.job(queue="mail")
    async def send(ctx: nj.JobContext) -> None:
        await trio.sleep(100)

    async with nj.open_runtime(app, grace=0) as rt:
        reads = []
        stats = rt.stats

        async def counted() -> Any:
            reads.append(trio.current_time())
            return await stats()

        rt.stats = counted  # type: ignore[method-assign]
        await send.enqueue_many([{}] * 5)
        await send.options(delay=60).enqueue()
        await trio.sleep(1)
        serve = metrics.asgi_app(rt)
        async with trio.open_nursery() as nursery:  # 20 scrapers at once: one read
            for _ in range(20):
                nursery.start_soon(scrape, serve)
        status, body = await scrape(serve)
        prometheus_client.generate_latest(metrics.registry)  # a plain scrape of the registry reads nothing
        assert len(reads) == 1 and status == 200
        assert b'nursery_jobs_queue_depth{queue="mail",state="running"} 3.0' in body
        assert b'nursery_jobs_queue_depth{queue="mail",state="available"} 2.0' in body
        assert b'nursery_jobs_queue_depth{queue="mail",state="scheduled"} 1.0' in body
        assert b'nursery_jobs_workers_busy{queue="mail"} 3.0' in body
        await trio.sleep(15)
        await scrape(serve)
        await scrape(serve)
        assert len(reads) == 2


async def test_a_stats_read_that_fails_keeps_the_last_snapshot_and_is_counted(autojump_clock) -> None:
    app = nj.App()
    metrics = PrometheusMetrics(app, interval=1, stats_timeout=2)

    @app.job()
    async def work(ctx: nj.JobContext) -> None:
        pass

    async with nj.open_runtime(app) as rt:
        await metrics.refresh(rt)
        stats = rt.stats

        async def broken() -> Any:
            raise nj.BackendUnavailable("the database is down")

        async def hung() -> Any:
            await trio.sleep_forever()

        for bad in (broken, hung):
            rt.stats = bad  # type: ignore[method-assign]
            await trio.sleep(1)
            await metrics.refresh(rt)
        rt.stats = stats  # type: ignore[method-assign]
    assert value(metrics, "nursery_jobs_stats_errors_total") == 2
    assert metrics.registry.get_sample_value("nursery_jobs_workers", {"queue": "default"}) == 10


@attrs.frozen
class WithLag:
    name: str = "q"
    available: int = 1
    scheduled: int = 0
    retryable: int = 0
    running: int = 0
    running_here: int = 0
    max_workers_here: int = 0
    lag: Any = None


def test_the_lag_is_read_in_seconds_where_the_stats_report_it() -> None:
    assert lag_of(WithLag(lag=2.5)) == 2.5  # type: ignore[arg-type]
    assert lag_of(WithLag(lag=datetime.timedelta(minutes=2))) == 120.0  # type: ignore[arg-type]
    assert lag_of(WithLag(lag=None)) is None  # type: ignore[arg-type]
    assert lag_of(nj.QueueStats("q", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)) is None
    metrics = PrometheusMetrics(nj.App())
    metrics._gauges.stats = {"q": WithLag(lag=7.0)}  # type: ignore[dict-item]
    assert metrics.registry.get_sample_value("nursery_jobs_queue_lag_seconds", {"queue": "q"}) == 7.0


async def test_blocked_loop_seconds_by_kind_and_rescues_are_counted(monkeypatch: pytest.MonkeyPatch, autojump_clock) -> None:
    fake = [1000.0]
    monkeypatch.setattr(watchdog, "default_clock", lambda: fake[0])
    app = nj.App()
    metrics = PrometheusMetrics(app)

    @app.job()
    async def hog(ctx: nj.JobContext) -> None:
        fake[0] += 0.5
        await trio.sleep(0)

    backend = nj.MemoryBackend()
    settings = nj.RuntimeSettings(heartbeat_interval=1, rescue_after=5, rescue_interval=1)
    async with nj.open_runtime(app, backend=backend, settings=settings) as rt:
        await backend.insert_many([NewJob("hog", "elsewhere", "{}", 0, None, 3), NewJob("hog", "elsewhere", "{}", 0, None, 3)])
        await backend.claim("elsewhere", 2)
        await rt.wait(await hog.enqueue(), timeout=5)
        await trio.sleep(8)
    assert value(metrics, "nursery_jobs_event_loop_blocked_seconds_total", kind="hog") == pytest.approx(0.5)
    assert value(metrics, "nursery_jobs_event_loop_blocked_steps_total", kind="hog") == 1
    assert value(metrics, "nursery_jobs_rescued_jobs_total") == 2


def test_a_bad_interval_is_refused() -> None:
    with pytest.raises(nj.ConfigError, match="interval"):
        PrometheusMetrics(nj.App(), interval=0)
