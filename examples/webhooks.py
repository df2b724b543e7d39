"""Webhook delivery: one delivery at a time per endpoint, a timeout per attempt, retries with
backoff, and an index queue that a slow endpoint never delays.

    .venv/bin/python examples/webhooks.py      # about 1 s on the embedded memory backend, exits 0

Three endpoints receive events. Endpoint 1 is slow (each POST takes 0.2 s); endpoint 2 hangs on
its first POST of event 21 (cut by the 0.5 s per-attempt timeout, then retried) and answers 503
once for event 22 (retried after a short backoff). Meanwhile the "index" queue indexes documents:
its jobs are on another queue and carry no endpoint key, so they finish while endpoint 1 is still
busy. The report at the end shows, per endpoint, the most deliveries seen in flight at once
(always 1: `concurrency_key` with `max_concurrent=1`, enforced where jobs are claimed, across
every process) and the order its deliveries started in.

Docs: docs/concurrency.md.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import attrs
import trio

import nursery_jobs as nj

# A small backoff so the example stays short; real deliveries use seconds to hours.
BACKOFF = nj.RetryPolicy(base=0.05, factor=2.0, cap=1.0, jitter=0.0)
SLOW_ENDPOINT = 1
POST_SECONDS = {0: 0.02, 1: 0.2, 2: 0.02}

app = nj.App()
# 8 workers: the per-endpoint limit, not the pool, is what keeps one endpoint's POSTs apart.
app.queue("webhook", max_workers=8, timeout=0.5)  # per attempt
app.queue("index", max_workers=2, timeout=5)


class EndpointError(Exception):
    """The endpoint answered with an error status; the delivery is retried with backoff."""


@attrs.define
class Log:
    """What the handlers saw, in the order they saw it (times from trio's clock)."""

    started: dict[int, list[int]] = attrs.field(factory=lambda: defaultdict(list))  # endpoint -> event ids
    in_flight: dict[int, int] = attrs.field(factory=lambda: defaultdict(int))
    max_in_flight: dict[int, int] = attrs.field(factory=lambda: defaultdict(int))
    attempts: dict[int, int] = attrs.field(factory=lambda: defaultdict(int))  # event id -> attempts begun
    slow_busy_until: float = 0.0
    index_done_at: list[float] = attrs.field(factory=list)


LOG = Log()


async def post(endpoint_id: int, event_id: int, attempt: int) -> None:
    """Stands in for the HTTP POST to the endpoint's URL."""
    if event_id == 21 and attempt == 1:
        await trio.sleep_forever()  # the endpoint never answers: the attempt's timeout cuts it
    await trio.sleep(POST_SECONDS[endpoint_id])
    if event_id == 22 and attempt == 1:
        raise EndpointError(f"endpoint {endpoint_id} answered 503 for event {event_id}")


@app.job(queue="webhook", concurrency_key=lambda a: f"endpoint:{a['endpoint_id']}", max_concurrent=1,
         retry=BACKOFF, max_attempts=5)  # fmt: skip
async def deliver(ctx: nj.JobContext, endpoint_id: int, event_id: int) -> None:
    LOG.started[endpoint_id].append(event_id)
    LOG.attempts[event_id] += 1
    LOG.in_flight[endpoint_id] += 1
    LOG.max_in_flight[endpoint_id] = max(LOG.max_in_flight[endpoint_id], LOG.in_flight[endpoint_id])
    try:
        await post(endpoint_id, event_id, ctx.attempt)
    finally:
        LOG.in_flight[endpoint_id] -= 1
        if endpoint_id == SLOW_ENDPOINT:
            LOG.slow_busy_until = trio.current_time()


@app.job(queue="index")
async def index_document(ctx: nj.JobContext, doc_id: int) -> None:
    await trio.sleep(0.01)  # the search-index update
    LOG.index_done_at.append(trio.current_time())


async def main(rt: nj.Runtime) -> Log:
    global LOG
    LOG = Log()
    began = trio.current_time()
    # Events 10-13 go to the slow endpoint, 1-3 to endpoint 0, 21-23 to endpoint 2.
    events = [{"endpoint_id": e // 10 if e >= 10 else 0, "event_id": e} for e in (1, 10, 21, 11, 2, 22, 12, 3, 23, 13)]
    deliveries = await deliver.enqueue_many(events)
    indexing = await index_document.enqueue_many([{"doc_id": d} for d in range(20)])
    for job_id in deliveries + indexing:
        receipt = await rt.wait(job_id, timeout=10)
        assert receipt.done and receipt.state is nj.JobState.COMPLETED, receipt
    for endpoint_id in sorted(LOG.started):
        print(f"endpoint {endpoint_id}: deliveries started in order {LOG.started[endpoint_id]}, "
              f"at most {LOG.max_in_flight[endpoint_id]} in flight")  # fmt: skip
    retried = {e: n for e, n in sorted(LOG.attempts.items()) if n > 1}
    print(f"retried: {', '.join(f'event {e} ({n} attempts)' for e, n in retried.items())}")
    print(f"index: {len(LOG.index_done_at)} documents done {max(LOG.index_done_at) - began:.2f} s in; "
          f"slow endpoint busy until {LOG.slow_busy_until - began:.2f} s")  # fmt: skip
    return LOG


if __name__ == "__main__":
    nj.run(main, app=app)
    sys.exit(0)
