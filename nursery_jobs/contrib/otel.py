"""OpenTelemetry tracing of enqueues and attempts (``pip install 'nursery_jobs[otel]'``;
docs/tracing.md).

`Tracing(app)` registers itself as the app's middleware. It follows the messaging semantic
conventions of OpenTelemetry 1.44.0 (`SCHEMA_URL`; every messaging attribute is "development"
there, so the version is pinned, not followed):

- each enqueue call is a PRODUCER span ``send {queue}``, in the caller's context; its context
  is stored with each job it sends (the job's meta: ``traceparent``, ``tracestate``), so every
  attempt of the job, in any process, finds it;
- each attempt is a CONSUMER span ``process {queue}``, started in the attempt's own task (the
  worker's, inside the attempt's scope: `around_attempt`) and current while the handler runs, so
  the handler's own spans and those of its ``ctx.children()`` are its children; it ends with
  the attempt's outcome (`attempt_ended`), with ``error.type`` when the attempt failed. It is a
  new trace **linked** to the send span by default (a job may run hours after it was sent, and
  a worker's ambient context is nobody's); ``parent="creation"`` makes the send span its parent
  instead. A batch's span links every job's send span.

Trio: a task starts with a copy of its spawner's context, so the span is attached in the
attempt's task and detached in the same call before the attempt's end (never across a yield of
a generator), and no span of one job can be current in the next job the worker runs.
"""

from __future__ import annotations

import weakref
from typing import Any, Awaitable, Callable, Literal, Sequence

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - the extra is installed wherever its tests run
    raise ImportError(f"nursery_jobs.contrib.otel needs opentelemetry-api ({exc}): pip install 'nursery_jobs[otel]'") from exc

from .. import __version__
from ..app import App
from ..errors import ConfigError
from ..jobs import BatchContext, JobContext, JobId
from ..middleware import AttemptEnd, CallNext, EnqueuedJob, Middleware

__all__ = ["SCHEMA_URL", "SYSTEM", "Tracing"]

SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"
"""The semantic conventions the spans follow (opentelemetry-semantic-conventions 0.66b2's)."""

SYSTEM = "nursery_jobs"
"""``messaging.system``."""

_FAILED = ("retry", "discard")


class Tracing(Middleware):
    """Spans for `app`'s enqueues and attempts (module docstring). `tracer_provider`: the
    provider to trace with (default: the global one, `trace.set_tracer_provider`).
    `parent`: "link" (the default) links each attempt's span to its job's send span; "creation"
    makes the send span its parent. `propagator`: how the send span's context is written into a
    job and read back (default: W3C trace context alone; the global propagator may add baggage,
    which a job does not need to carry)."""

    def __init__(
        self,
        app: App,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        parent: Literal["link", "creation"] = "link",
        propagator: TextMapPropagator | None = None,
    ) -> None:
        if parent not in ("link", "creation"):
            raise ConfigError(f'parent must be "link" or "creation", not {parent!r}')
        self.parent = parent
        self._tracer = trace.get_tracer("nursery_jobs", __version__, schema_url=SCHEMA_URL, tracer_provider=tracer_provider)
        self._propagator = propagator if propagator is not None else TraceContextTextMapPropagator()
        self._spans: weakref.WeakKeyDictionary[JobContext | BatchContext, list[Any]] = weakref.WeakKeyDictionary()
        """Each running attempt's span, how many of its jobs have yet to end (a batch's are told
        one by one) and why it failed (None: it did not), by its context; a context that is gone
        takes its entry with it."""
        app.middleware(self)

    async def around_enqueue(self, jobs: Sequence[EnqueuedJob], call_next: Callable[[], Awaitable[list[JobId]]]) -> list[JobId]:
        queue = jobs[0].queue
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "send",
            "messaging.operation.type": "send",
            "messaging.destination.name": queue,
            "nursery_jobs.kind": jobs[0].kind,
        }
        if len(jobs) > 1:
            attributes["messaging.batch.message_count"] = len(jobs)
        span = self._tracer.start_span(f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes)
        sent = trace.set_span_in_context(span)
        for job in jobs:
            self._propagator.inject(job.meta, context=sent)
        token = otel_context.attach(sent)
        try:
            ids = await call_next()
        except BaseException as exc:
            otel_context.detach(token)
            if isinstance(exc, Exception):
                span.set_attribute("error.type", type(exc).__qualname__)
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc)))
            span.end()
            raise
        otel_context.detach(token)
        if len(ids) == 1:
            span.set_attribute("messaging.message.id", str(int(ids[0])))
        span.end()
        return ids

    async def around_attempt(self, ctx: JobContext | BatchContext, call_next: CallNext) -> Any:
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": ctx.queue,
            "nursery_jobs.kind": ctx.kind,
        }
        # An empty context, not the worker's: the span belongs to the job, never to whatever
        # span was current where the runtime was opened.
        start_in = otel_context.Context()
        links: list[Link] = []
        if isinstance(ctx, BatchContext):
            attributes["messaging.batch.message_count"] = len(ctx.jobs)
            remaining = len(ctx.jobs)
            for job in ctx.jobs:
                sent = self._sent(job.meta)
                if sent is not None:
                    links.append(Link(sent))
        else:
            remaining = 1
            attributes["messaging.message.id"] = str(ctx.id)
            attributes["nursery_jobs.attempt"] = ctx.attempt
            sent = self._sent(ctx.meta)
            if sent is not None:
                if self.parent == "creation":
                    start_in = trace.set_span_in_context(trace.NonRecordingSpan(sent))
                else:
                    links.append(Link(sent))
        span = self._tracer.start_span(
            f"process {ctx.queue}", context=start_in, kind=SpanKind.CONSUMER, attributes=attributes, links=links
        )
        self._spans[ctx] = [span, remaining, None]
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            return await call_next(ctx)
        finally:
            otel_context.detach(token)

    def attempt_ended(self, end: AttemptEnd) -> None:
        if end.context is None:
            return  # never ran: no span was started
        entry = self._spans.get(end.context)
        if entry is None:
            return
        span = entry[0]
        entry[1] -= 1
        if not isinstance(end.context, BatchContext):
            span.set_attribute("nursery_jobs.outcome", end.outcome)
        if end.outcome in _FAILED and entry[2] is None:  # a batch: its first failed job says why
            entry[2] = end.message or end.outcome
            span.set_attribute("error.type", _error_type(end))
            if end.error is not None and not end.timed_out:
                span.record_exception(end.error)
        if entry[1] > 0:
            return  # a batch's other jobs are still to be told
        if entry[2] is not None:
            span.set_status(Status(StatusCode.ERROR, entry[2]))
        del self._spans[end.context]
        span.end()

    def _sent(self, meta: dict[str, str]) -> trace.SpanContext | None:
        """The send span's context a job carries, if it carries a valid one."""
        if not meta:
            return None
        found = trace.get_current_span(self._propagator.extract(meta)).get_span_context()
        return found if found.is_valid else None


def _error_type(end: AttemptEnd) -> str:
    if end.timed_out:
        return "timeout"
    if end.error is not None:
        return type(end.error).__qualname__
    return "_OTHER"
