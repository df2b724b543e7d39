"""Outcomes of an attempt: completed, retried with backoff, discarded, snoozed, timed out."""

from __future__ import annotations

from typing import TypedDict

import pytest
import trio

import nursery_jobs as nj

FAST_RETRY = nj.RetryPolicy(base=10.0, factor=2.0, cap=1000.0, jitter=0.0)


async def test_return_completes_the_job(make_backend, autojump_clock):
    app = nj.App()
    seen = []

    @app.job()
    async def greet(ctx: nj.JobContext, name: str) -> None:
        seen.append((ctx.kind, ctx.attempt, ctx.max_attempts, ctx.args, name))

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        job_id = await greet.enqueue(name="ada")
        receipt = await rt.wait(job_id, timeout=5)
        job = await rt.get_job(job_id)
    assert receipt == nj.Receipt(job_id, True, nj.JobState.COMPLETED, None)
    assert seen == [("greet", 1, 25, {"name": "ada"}, "ada")]
    assert job.state is nj.JobState.COMPLETED and job.attempt == 1 and job.errors == ()
    assert job.finalized_at is not None


async def test_failure_is_retried_with_backoff_and_keeps_the_traceback(make_backend, autojump_clock):
    app = nj.App()
    starts = []

    @app.job(retry=FAST_RETRY)
    async def flaky(ctx: nj.JobContext) -> None:
        starts.append(trio.current_time())
        if ctx.attempt < 3:
            raise ConnectionError(f"refused on attempt {ctx.attempt}")

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        t0 = trio.current_time()
        job_id = await flaky.enqueue()
        await trio.sleep(1)
        mid = await rt.get_job(job_id)
        receipt = await rt.wait(job_id, timeout=100)
        job = await rt.get_job(job_id)
    assert mid.state is nj.JobState.RETRYABLE
    assert receipt.done and receipt.state is nj.JobState.COMPLETED
    # backoff 10 s after attempt 1, 20 s after attempt 2 (no jitter): exact on virtual time
    assert [round(s - t0, 6) for s in starts] == [0.0, 10.0, 30.0]
    assert job.attempt == 3
    assert [e.message for e in job.errors] == [
        "ConnectionError: refused on attempt 1",
        "ConnectionError: refused on attempt 2",
    ]
    assert "Traceback" in job.errors[0].traceback and "flaky" in job.errors[0].traceback


async def test_failing_job_is_discarded_after_max_attempts(make_backend, autojump_clock):
    app = nj.App()
    attempts = []

    @app.job(max_attempts=3, retry=FAST_RETRY)
    async def doomed(ctx: nj.JobContext) -> None:
        attempts.append(ctx.attempt)
        raise ValueError("bad input")

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        job_id = await doomed.enqueue()
        receipt = await rt.wait(job_id, timeout=1000)
        stats = await rt.stats()
    assert attempts == [1, 2, 3]
    assert receipt.state is nj.JobState.DISCARDED and receipt.error == "ValueError: bad input"
    assert stats["default"].discarded == 1 and stats["default"].failed_attempts == 3


async def test_discard_ends_the_job_with_its_reason(make_backend, autojump_clock):
    app = nj.App()
    runs = []

    @app.job()
    async def judge(ctx: nj.JobContext) -> None:
        runs.append(ctx.attempt)
        raise nj.Discard("document was deleted")

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        job_id = await judge.enqueue()
        receipt = await rt.wait(job_id, timeout=100)
    assert runs == [1]
    assert receipt.state is nj.JobState.DISCARDED and receipt.error == "document was deleted"


async def test_snooze_runs_again_later_without_spending_an_attempt(make_backend, autojump_clock):
    app = nj.App()
    starts = []

    @app.job(max_attempts=1)
    async def sleepy(ctx: nj.JobContext) -> None:
        starts.append((trio.current_time(), ctx.attempt))
        if len(starts) < 3:
            raise nj.Snooze(7)

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        t0 = trio.current_time()
        job_id = await sleepy.enqueue()
        await trio.sleep(1)
        mid = await rt.get_job(job_id)
        receipt = await rt.wait(job_id, timeout=100)
        job = await rt.get_job(job_id)
    assert mid.state is nj.JobState.SCHEDULED and mid.attempt == 0
    assert [(round(t - t0, 6), a) for t, a in starts] == [(0.0, 1), (7.0, 1), (14.0, 1)]
    assert receipt.state is nj.JobState.COMPLETED and job.attempt == 1 and job.errors == ()


async def test_timeout_fires_exactly_and_is_retryable(make_backend, autojump_clock):
    app = nj.App()
    app.queue("slow", max_workers=2, timeout=30)
    ended = []

    @app.job(queue="slow", timeout=5, max_attempts=2, retry=FAST_RETRY)
    async def stuck(ctx: nj.JobContext) -> None:
        try:
            await trio.sleep(3600)
        finally:
            ended.append((trio.current_time(), ctx.deadline))

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        t0 = trio.current_time()
        job_id = await stuck.enqueue()
        await trio.sleep(6)
        first = await rt.get_job(job_id)
        receipt = await rt.wait(job_id, timeout=100)
    assert first.state is nj.JobState.RETRYABLE
    assert first.errors[0].message == "timed out after 5 s"
    assert round(ended[0][0] - t0, 6) == 5.0 and ended[0][1] == ended[0][0]
    assert receipt.state is nj.JobState.DISCARDED and receipt.error == "timed out after 5 s"


async def test_queue_timeout_applies_when_the_job_sets_none(make_backend, autojump_clock):
    app = nj.App()
    app.queue("q", max_workers=1, timeout=2)

    @app.job(queue="q", max_attempts=1)
    async def stuck(ctx: nj.JobContext) -> None:
        await trio.sleep(3600)

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        job_id = await stuck.enqueue()
        receipt = await rt.wait(job_id, timeout=10)
    assert receipt.state is nj.JobState.DISCARDED and receipt.error == "timed out after 2 s"


async def test_a_job_exception_never_crashes_the_runtime(make_backend, autojump_clock):
    app = nj.App()

    @app.job(max_attempts=1)
    async def bad(ctx: nj.JobContext, n: int) -> None:
        if n % 2:
            raise RuntimeError("odd")
        if n == 4:
            raise ExceptionGroup("children failed", [KeyError("x")])

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        ids = await bad.enqueue_many([{"n": n} for n in range(6)])
        receipts = [await rt.wait(i, timeout=10) for i in ids]
    states = [r.state for r in receipts]
    assert states == [
        nj.JobState.COMPLETED,
        nj.JobState.DISCARDED,
        nj.JobState.COMPLETED,
        nj.JobState.DISCARDED,
        nj.JobState.DISCARDED,
        nj.JobState.DISCARDED,
    ]


async def test_unknown_kind_and_undecodable_args_are_discarded_with_an_error(make_backend, autojump_clock):
    from nursery_jobs.backends import NewJob

    app = nj.App()

    @app.job()
    async def known(ctx: nj.JobContext) -> None:
        pass

    backend = make_backend()
    async with nj.open_runtime(app, backend=backend) as rt:
        bad_kind, bad_args = await backend.insert_many(
            [
                NewJob("vanished", "default", "{}", 0, None, 25),
                NewJob("known", "default", "[1, 2]", 0, None, 25),
            ]
        )
        r1 = await rt.wait(bad_kind.id, timeout=5)
        r2 = await rt.wait(bad_args.id, timeout=5)
        ok = await rt.wait(await known.enqueue(), timeout=5)
    assert r1.state is nj.JobState.DISCARDED and "unknown job kind 'vanished'" in r1.error
    assert r2.state is nj.JobState.DISCARDED and "could not be decoded" in r2.error
    assert ok.state is nj.JobState.COMPLETED


async def test_args_stored_without_the_handlers_check_are_discarded_before_the_call(make_backend, autojump_clock):
    # What `nursery-jobs enqueue` without --app stores, or a process running an older version
    # of the app: args that bind to the handler but have the wrong types, and a batch job whose
    # args miss a field of its TypedDict. No attempt could succeed: none is made.
    from nursery_jobs.backends import NewJob

    app = nj.App()
    called: list[object] = []

    @app.job(retry=FAST_RETRY)
    async def deliver(ctx: nj.JobContext, event_id: int, tags: list[str] | None = None) -> None:
        called.append(event_id)

    @app.batch_job(max_size=5, max_wait=0)
    async def index(ctx: nj.BatchContext, jobs: list[nj.BatchJob[_Doc]]) -> None:
        called.extend(j.args["doc_id"] for j in jobs)

    backend = make_backend()
    async with nj.open_runtime(app, backend=backend) as rt:
        stored = await backend.insert_many(
            [
                NewJob("deliver", "default", '{"event_id": "x"}', 0, None, 25),
                NewJob("deliver", "default", '{"event_id": 1, "tags": [2]}', 0, None, 25),
                NewJob("index", "default", '{"title": "no id"}', 0, None, 25),
            ]
        )
        receipts = [await rt.wait(s.id, timeout=5) for s in stored]
        jobs = [await rt.get_job(s.id) for s in stored]
        ok = [await rt.wait(await deliver.enqueue(event_id=7), timeout=5), await rt.wait(await index.enqueue(doc_id=8), timeout=5)]
    assert [r.state for r in receipts] == [nj.JobState.DISCARDED] * 3
    assert [j.attempt for j in jobs] == [1, 1, 1]  # discarded at once, not retried 25 times
    assert called == [7, 8]
    assert [r.state for r in ok] == [nj.JobState.COMPLETED] * 2
    first, second, third = (j.errors[-1].message for j in jobs)
    assert first.startswith("job args do not fit the handler: job 'deliver': argument 'event_id' must be int, not 'x'")
    assert "Enqueue it again with args that fit" in first
    assert "argument 'tags' must be list[str] | None, not [2]" in second
    assert "job 'index': args {'title': 'no id'} do not fit its args type" in third and "doc_id" in third


class _Doc(TypedDict):
    doc_id: int


@pytest.mark.parametrize("jitter", [0.0, 0.1])
def test_retry_policy_delays(jitter):
    import random

    policy = nj.RetryPolicy(base=1.0, factor=2.0, cap=60.0, jitter=jitter)
    rng = random.Random(1)
    delays = [policy.delay(n, rng) for n in range(1, 10)]
    nominal = [1, 2, 4, 8, 16, 32, 60, 60, 60]
    for d, n in zip(delays, nominal):
        assert n * (1 - jitter) <= d <= n * (1 + jitter)
    assert nj.RetryPolicy().delay(25, rng) <= 6 * 3600 * 1.1


async def test_a_handler_that_swallows_cancellation_still_gets_the_fired_scopes_outcome(make_backend, autojump_clock):
    app = nj.App()

    @app.job(timeout=5, retry=nj.RetryPolicy(base=1000, jitter=0))
    async def swallow(ctx: nj.JobContext) -> None:
        try:
            await trio.sleep(3600)
        except trio.Cancelled:
            return  # wrong, but it must not turn a timeout, cancel or shutdown into "completed"

    backend = make_backend()
    async with nj.open_runtime(app, backend=backend, grace=1) as rt:
        timed_out = await swallow.enqueue()
        assert (await rt.wait(timed_out, timeout=6)).error == "timed out after 5 s"
        assert (await rt.get_job(timed_out)).state is nj.JobState.RETRYABLE
        cancelled = await swallow.enqueue()
        await trio.sleep(1)
        await rt.cancel(cancelled)
        assert (await rt.wait(cancelled, timeout=1)).state is nj.JobState.CANCELLED
        cut = await swallow.enqueue()
        await trio.sleep(0.5)
    job = await backend.get_job(cut)
    assert job.state is nj.JobState.AVAILABLE and job.attempt == 0
    assert rt.interrupted == [cut]


async def test_child_failures_are_reported_by_their_own_messages(make_backend, autojump_clock):
    app = nj.App()

    async def bad(text: str) -> None:
        raise ValueError(text)

    @app.job(max_attempts=1)
    async def one(ctx: nj.JobContext) -> None:
        async with ctx.children() as tasks:
            tasks.spawn(bad, "child broke")

    @app.job(max_attempts=1)
    async def two(ctx: nj.JobContext) -> None:
        async with ctx.children() as tasks:
            tasks.spawn(bad, "a")
            tasks.spawn(bad, "b")

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        r1 = await rt.wait(await one.enqueue(), timeout=5)
        r2 = await rt.wait(await two.enqueue(), timeout=5)
    assert r1.error == "ValueError: child broke"
    assert r2.error in ("2 errors: ValueError: a; ValueError: b", "2 errors: ValueError: b; ValueError: a")


async def test_a_job_that_completed_after_failures_reports_no_error(make_backend, autojump_clock):
    app = nj.App()

    @app.job(retry=nj.RetryPolicy(base=1, jitter=0))
    async def second_time_lucky(ctx: nj.JobContext) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("busy")

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        job_id = await second_time_lucky.enqueue()
        receipt = await rt.wait(job_id, timeout=10)
        assert receipt == nj.Receipt(job_id, True, nj.JobState.COMPLETED, None)
        assert [e.message for e in (await rt.get_job(job_id)).errors] == ["RuntimeError: busy"]
