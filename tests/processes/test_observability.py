"""The metrics and tracing extras across processes: two runtimes on one durable store (SQLite,
PostgreSQL), each with its own app, registry and tracer provider as two processes would have.
The attempt counters of the two add up to the jobs run; the spans of the one that enqueued and
of the one that ran are linked through the trace context stored with each job, across retries,
snoozes and cancels, and no job's span is current in another's attempt."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import nursery_jobs as nj
from nursery_jobs.contrib.otel import Tracing
from nursery_jobs.contrib.prometheus import PrometheusMetrics
from tests.processes.procutil import Store

FAST = nj.RuntimeSettings(grace=1.0)
RETRY = nj.RetryPolicy(base=0.05, factor=1.0, cap=0.05, jitter=0.0)
N = 60


def _worker_app(store: Store) -> nj.App:
    app = nj.App()
    app.queue("work", max_workers=4, poll_interval=0.05, timeout=10)
    return app


@pytest.mark.timeout(90)
async def test_the_attempt_counters_of_two_processes_add_up_to_the_jobs_run(store: Store) -> None:
    apps = [_worker_app(store) for _ in range(2)]
    metrics = [PrometheusMetrics(app) for app in apps]
    ran: list[list[int]] = [[], []]
    for i, app in enumerate(apps):

        @app.job(queue="work", name="task", retry=RETRY)
        async def task(ctx: nj.JobContext, n: int, _i: int = i) -> None:
            ran[_i].append(n)
            await trio.sleep(0.01)
            if n % 10 == 0 and ctx.attempt == 1:
                raise ValueError("first attempt of every tenth job fails")

    with trio.fail_after(60):
        async with nj.open_runtime(apps[0], backend=store.url, settings=FAST) as one:
            async with nj.open_runtime(apps[1], backend=store.url, settings=FAST):
                ids = await one.enqueue_many("task", [{"n": n} for n in range(N)])
                for job_id in ids:
                    assert (await one.wait(job_id, timeout=30)).state is nj.JobState.COMPLETED

    def total(outcome: str, m: PrometheusMetrics) -> float:
        return m.registry.get_sample_value("nursery_jobs_attempts_total", {"queue": "work", "kind": "task", "outcome": outcome}) or 0.0

    assert sum(total("completed", m) for m in metrics) == N
    assert sum(total("retry", m) for m in metrics) == N // 10
    assert [total("completed", m) + total("retry", m) for m in metrics] == [len(r) for r in ran]
    assert all(ran), f"one process ran nothing ({[len(r) for r in ran]}): the test would prove nothing"


@pytest.mark.timeout(90)
async def test_spans_link_across_the_process_that_sends_and_the_one_that_runs(store: Store) -> None:
    sender, runner = nj.App(), _worker_app(store)
    sender.queue("work", max_workers=1)
    exported = [InMemorySpanExporter(), InMemorySpanExporter()]
    providers = []
    for exporter in exported:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        providers.append(provider)
    Tracing(sender, tracer_provider=providers[0])
    Tracing(runner, tracer_provider=providers[1])
    seen: dict[tuple[int, int], int] = {}
    snoozed: set[int] = set()
    cancel_started = trio.Event()

    @sender.job(queue="work", name="task")
    async def task_s(ctx: nj.JobContext, how: str) -> None: ...

    @runner.job(queue="work", name="task", retry=RETRY, timeout=None)
    async def task_r(ctx: nj.JobContext, how: str) -> None:
        seen[(ctx.id, ctx.attempt + len(snoozed & {ctx.id}))] = trace.get_current_span().get_span_context().span_id
        if how == "retry" and ctx.attempt == 1:
            raise ValueError("again")
        if how == "snooze" and ctx.id not in snoozed:
            snoozed.add(ctx.id)
            raise nj.Snooze(0.05)
        if how == "cancel":
            cancel_started.set()
            await trio.sleep_forever()

    hows = ["ok", "retry", "snooze", "cancel", "ok", "retry"]
    with trio.fail_after(60):
        async with nj.open_runtime(runner, backend=store.url, settings=FAST):
            async with nj.open_runtime(sender, backend=store.url, queues=[], settings=FAST) as rt:
                tracer = providers[0].get_tracer("the service")
                ids = []
                for how in hows:
                    with tracer.start_as_current_span(f"request {how}"):
                        ids.append(await task_s.enqueue(how=how))
                await cancel_started.wait()
                await rt.cancel(ids[hows.index("cancel")])
                receipts = [await rt.wait(job_id, timeout=30) for job_id in ids]
    assert [r.state for r in receipts] == [
        nj.JobState.CANCELLED if how == "cancel" else nj.JobState.COMPLETED for how in hows
    ]
    sends = {int(s.attributes["messaging.message.id"]): s for s in exported[0].get_finished_spans() if s.name == "send work"}
    requests = {s.context.span_id: s for s in exported[0].get_finished_spans() if s.name.startswith("request")}
    processes = [s for s in exported[1].get_finished_spans() if s.name == "process work"]
    assert sorted(sends) == sorted(ids)
    assert all(s.parent is not None and s.parent.span_id in requests for s in sends.values())
    by_job = {job_id: [p for p in processes if p.attributes["messaging.message.id"] == str(job_id)] for job_id in ids}
    outcomes = {job_id: [p.attributes["nursery_jobs.outcome"] for p in sorted(ps, key=lambda p: p.start_time)] for job_id, ps in by_job.items()}
    assert outcomes == {
        job_id: {"ok": ["completed"], "retry": ["retry", "completed"], "snooze": ["snooze", "completed"], "cancel": ["cancelled"]}[how]
        for job_id, how in zip(ids, hows)
    }
    for job_id, ps in by_job.items():
        for p in ps:  # each attempt: a trace of its own, linked to its own job's send span, no other
            assert p.parent is None
            assert [(link.context.trace_id, link.context.span_id) for link in p.links] == [
                (sends[job_id].context.trace_id, sends[job_id].context.span_id)
            ]
    span_ids = {p.context.span_id for p in processes}
    assert set(seen.values()) <= span_ids and len(set(seen.values())) == len(seen)  # each attempt saw its own span
    assert not list(itertools.chain.from_iterable(s.links for s in exported[0].get_finished_spans()))
