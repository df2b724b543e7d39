"""The OpenTelemetry extra (`nursery_jobs.contrib.otel`), with the SDK's in-memory exporter: the
send and process spans and their attributes, the link (or parent) from the one to the other,
each outcome, and no span of one job current in another. Across two runtimes on one durable
store: tests/processes/test_observability.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import nursery_jobs as nj
from nursery_jobs.contrib.otel import SCHEMA_URL, Tracing

FAST_RETRY = nj.RetryPolicy(base=1.0, factor=1.0, cap=1.0, jitter=0.0)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp


@pytest.fixture
def no_detach_failures(caplog: pytest.LogCaptureFixture) -> Any:
    caplog.set_level(logging.ERROR, logger="opentelemetry")
    yield
    assert not [r for r in caplog.records if "detach" in r.getMessage()], "a context was detached in the wrong task"


def spans(exporter: InMemorySpanExporter, name_start: str) -> list[ReadableSpan]:
    return sorted((s for s in exporter.get_finished_spans() if s.name.startswith(name_start)), key=lambda s: s.start_time or 0)


async def test_an_enqueue_sends_and_each_attempt_processes_linked_to_it(exporter, provider, no_detach_failures, autojump_clock) -> None:
    app = nj.App()
    app.queue("mail", max_workers=1)
    Tracing(app, tracer_provider=provider)
    tracer = provider.get_tracer("the service")
    inside: list[Any] = []

    @app.job(queue="mail", retry=FAST_RETRY)
    async def send(ctx: nj.JobContext, to: str) -> None:
        inside.append(trace.get_current_span().get_span_context().span_id)
        with tracer.start_as_current_span("smtp"):
            async with ctx.children() as tasks:
                tasks.spawn(child)
        if ctx.attempt == 1:
            raise ConnectionError("smtp down")

    async def child() -> None:
        with tracer.start_as_current_span("child"):
            await trio.sleep(0)

    async with nj.open_runtime(app) as rt:
        with tracer.start_as_current_span("request") as request:
            job_id = await send.enqueue(to="ada@example.com")
            assert trace.get_current_span() is request  # the send span is not left current
        await rt.wait(job_id, timeout=10)
    [request_span] = spans(exporter, "request")
    [sent] = spans(exporter, "send ")
    processed = spans(exporter, "process ")
    assert sent.name == "send mail" and sent.kind is SpanKind.PRODUCER
    assert sent.parent is not None and sent.parent.span_id == request_span.context.span_id
    assert dict(sent.attributes or {}) == {
        "messaging.system": "nursery_jobs",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "mail",
        "nursery_jobs.kind": "send",
        "messaging.message.id": str(job_id),
    }
    assert sent.instrumentation_scope is not None and sent.instrumentation_scope.schema_url == SCHEMA_URL
    assert [p.name for p in processed] == ["process mail", "process mail"]
    for attempt, span in enumerate(processed, 1):
        assert span.kind is SpanKind.CONSUMER and span.parent is None  # a trace of its own...
        assert [link.context.span_id for link in span.links] == [sent.context.span_id]  # ...linked to the send
        assert span.attributes is not None
        assert span.attributes["messaging.message.id"] == str(job_id) and span.attributes["nursery_jobs.attempt"] == attempt
    first, second = processed
    assert first.attributes is not None and first.attributes["nursery_jobs.outcome"] == "retry"
    assert first.attributes["error.type"] == "ConnectionError" and first.status.status_code is StatusCode.ERROR
    assert second.attributes is not None and second.attributes["nursery_jobs.outcome"] == "completed"
    assert "error.type" not in second.attributes and second.status.status_code is StatusCode.UNSET
    assert inside == [p.context.span_id for p in processed]  # current while the handler ran
    smtp, child = spans(exporter, "smtp"), spans(exporter, "child")
    assert [k.parent.span_id for k in smtp if k.parent] == [p.context.span_id for p in processed]
    assert [k.parent.span_id for k in child if k.parent] == [k.context.span_id for k in smtp]  # ctx.children() inherit it


async def test_parent_creation_makes_the_send_span_the_parent(exporter, provider, autojump_clock) -> None:
    app = nj.App()
    Tracing(app, tracer_provider=provider, parent="creation")

    @app.job()
    async def work(ctx: nj.JobContext) -> None:
        pass

    async with nj.open_runtime(app) as rt:
        await rt.wait(await work.enqueue(), timeout=5)
    [sent], [processed] = spans(exporter, "send"), spans(exporter, "process")
    assert processed.parent is not None and processed.parent.span_id == sent.context.span_id
    assert processed.context.trace_id == sent.context.trace_id and list(processed.links) == []
    with pytest.raises(nj.ConfigError, match="parent"):
        Tracing(nj.App(), parent="child")  # type: ignore[arg-type]


async def test_timeouts_snoozes_cancels_and_shutdowns_end_each_span_with_its_outcome(exporter, provider, no_detach_failures, autojump_clock) -> None:
    app = nj.App()
    Tracing(app, tracer_provider=provider)
    started = trio.Event()
    snoozed: list[int] = []

    @app.job(timeout=1, max_attempts=1)
    async def slow(ctx: nj.JobContext) -> None:
        await trio.sleep(5)

    @app.job()
    async def later(ctx: nj.JobContext) -> None:
        if not snoozed:
            snoozed.append(ctx.id)
            raise nj.Snooze(2)

    @app.job(timeout=None)
    async def forever(ctx: nj.JobContext) -> None:
        started.set()
        await trio.sleep_forever()

    async with nj.open_runtime(app, grace=0) as rt:
        await rt.wait(await slow.enqueue(), timeout=5)
        await rt.wait(await later.enqueue(), timeout=5)
        job_id = await forever.enqueue()
        await started.wait()
        await rt.cancel(job_id)
        await rt.wait(job_id, timeout=5)
        started = trio.Event()
        await forever.enqueue()
        await started.wait()
    got = [(s.attributes or {}).get("nursery_jobs.outcome") for s in spans(exporter, "process")]
    errors = [(s.attributes or {}).get("error.type") for s in spans(exporter, "process")]
    assert got == ["discard", "snooze", "completed", "cancelled", "interrupted"]
    assert errors == ["timeout", None, None, None, None]


async def test_a_span_is_never_current_in_the_next_job_of_the_same_worker(exporter, provider, no_detach_failures, autojump_clock) -> None:
    app = nj.App()
    app.queue("one", max_workers=1)
    Tracing(app, tracer_provider=provider)
    seen: list[tuple[int, int, int]] = []

    @app.job(queue="one", retry=FAST_RETRY, max_attempts=2, timeout=1)
    async def work(ctx: nj.JobContext, how: str) -> None:
        seen.append((ctx.id, ctx.attempt, trace.get_current_span().get_span_context().span_id))
        if how == "raise":
            raise ValueError("x")
        if how == "hang":
            await trio.sleep(5)  # cut by its timeout: the span's detach runs as Cancelled unwinds

    async with nj.open_runtime(app) as rt:
        ids = await work.enqueue_many([{"how": h} for h in ("raise", "ok", "hang", "ok")])
        for job_id in ids:
            await rt.wait(job_id, timeout=30)
        outside = trace.get_current_span()
    processed = {
        (int((s.attributes or {})["messaging.message.id"]), (s.attributes or {})["nursery_jobs.attempt"]): s
        for s in spans(exporter, "process")
    }
    assert len(seen) == len(processed) == 6
    for job_id, attempt, span_id in seen:
        assert span_id == processed[(job_id, attempt)].context.span_id
    assert all(s.parent is None for s in processed.values())
    assert outside is trace.INVALID_SPAN  # nothing leaked into the task that opened the runtime


async def test_a_batch_is_one_span_linked_to_every_job_it_ran(exporter, provider, autojump_clock) -> None:
    app = nj.App()
    Tracing(app, tracer_provider=provider)

    @app.batch_job(max_size=3, max_wait=1)
    async def index(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> list[nj.BatchJob]:
        return [jobs[0]]  # not handled: retried

    async with nj.open_runtime(app) as rt:
        first = await index.enqueue(doc=1)
        rest = await index.enqueue_many([{"doc": 2}, {"doc": 3}])
        await trio.sleep(0.5)
        for job_id in (first, *rest):
            await rt.wait(job_id, timeout=0.1)
    sends = spans(exporter, "send")
    batch = spans(exporter, "process")[0]
    assert batch.attributes is not None and batch.attributes["messaging.batch.message_count"] == 3
    assert {link.context.span_id for link in batch.links} == {s.context.span_id for s in sends}
    assert batch.attributes["error.type"] == "_OTHER" and batch.status.status_code is StatusCode.ERROR
    assert [(s.attributes or {}).get("messaging.batch.message_count") for s in sends] == [None, 2]
