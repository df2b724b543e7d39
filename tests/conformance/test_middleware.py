"""Middleware on every backend: what `around_enqueue` stores with a job (its meta) comes back to
every attempt of it and never into its args, and an attempt's wait is timed from when its job
became due, as the backend stored it."""

from __future__ import annotations

from typing import Any, Sequence

import trio

import nursery_jobs as nj

FAST_RETRY = nj.RetryPolicy(base=5.0, factor=1.0, cap=5.0, jitter=0.0)


class Traced(nj.Middleware):
    def __init__(self) -> None:
        self.ends: list[nj.AttemptEnd] = []

    async def around_enqueue(self, jobs: Sequence[nj.EnqueuedJob], call_next: Any) -> list[nj.JobId]:
        for job in jobs:
            job.meta["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            job.meta["note"] = 'quotes " and \\ and ünïcode'
        return await call_next()

    def attempt_ended(self, end: nj.AttemptEnd) -> None:
        self.ends.append(end)


async def test_meta_is_stored_with_the_job_for_every_attempt_and_left_out_of_its_args(make_backend, autojump_clock):
    app = nj.App()
    traced = Traced()
    app.middleware(traced)
    seen = []

    @app.job(retry=FAST_RETRY)
    async def work(ctx: nj.JobContext, n: int, **rest: Any) -> None:
        seen.append((ctx.attempt, n, rest, ctx.meta))
        if ctx.attempt == 1:
            raise ValueError("once")

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        one = await work.enqueue(n=1)
        empty = await work.options(delay=3).enqueue(n=2)
        await rt.wait(one, timeout=60)
        await rt.wait(empty, timeout=60)
        job = await rt.get_job(one)
    meta = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "note": 'quotes " and \\ and ünïcode'}
    assert sorted(seen, key=lambda s: (s[1], s[0])) == [(1, 1, {}, meta), (2, 1, {}, meta), (1, 2, {}, meta), (2, 2, {}, meta)]
    assert job.args == {"n": 1}
    waits = sorted((e.job_id, e.attempt, round(e.wait, 3)) for e in traced.ends)
    # Due at once, at its delay's end, at its backoff's end: each started when it became due.
    assert waits == [(one, 1, 0.0), (one, 2, 0.0), (empty, 1, 0.0), (empty, 2, 0.0)]


async def test_a_job_stored_with_meta_runs_in_a_process_that_has_no_middleware(make_backend, autojump_clock):
    producer, consumer = nj.App(), nj.App()
    producer.middleware(Traced())
    seen = []

    @producer.job(name="work")
    async def work_p(ctx: nj.JobContext, n: int) -> None: ...

    @consumer.job(name="work")
    async def work_c(ctx: nj.JobContext, n: int) -> None:
        seen.append((n, sorted(ctx.meta)))

    backend = make_backend()
    async with nj.open_runtime(producer, backend=backend, queues=[]):
        job_id = await work_p.enqueue(n=7)
    async with nj.open_runtime(consumer, backend=backend) as rt:
        receipt = await rt.wait(job_id, timeout=10)
    assert receipt.state is nj.JobState.COMPLETED and seen == [(7, ["note", "traceparent"])]


async def test_a_job_waiting_for_a_worker_is_told_how_long_it_waited(make_backend, autojump_clock):
    app = nj.App()
    app.queue("one", max_workers=1, timeout=60, claim_ahead=False)
    traced = Traced()
    app.middleware(traced)

    @app.job(queue="one")
    async def work(ctx: nj.JobContext, seconds: float) -> None:
        await trio.sleep(seconds)

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        first = await work.enqueue(seconds=4)
        second = await work.enqueue(seconds=0)
        await rt.wait(first, timeout=60)
        await rt.wait(second, timeout=60)
    got = {e.job_id: e for e in traced.ends}
    assert 3.5 <= got[second].wait <= 5.5 and 3.5 <= got[first].duration <= 5.5
