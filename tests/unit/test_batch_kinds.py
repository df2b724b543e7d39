"""Batch kinds (`@app.batch_job`): what a declaration refuses and why, how a batch kind is
enqueued and called, and the testing kit (run_job, drain, check_at_least_once) on batch kinds,
on the memory backend in virtual time."""

from __future__ import annotations

from typing import Any, TypedDict

import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs.testing import TestRuntime

app = nj.App()
app.queue("idx", max_workers=2, timeout=30)

written: dict[int, str] = {}
appended: list[int] = []


@app.batch_job(queue="idx", max_size=10, max_wait=0.5)
async def upsert(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> list[nj.BatchJob]:
    await trio.sleep(0.1)
    for job in jobs:
        written[job.args["doc_id"]] = job.args.get("title", "")  # keyed: a second run changes nothing
    await trio.sleep(0.1)
    return [job for job in jobs if job.args.get("reject") and job.attempt == 1]


@app.batch_job(queue="idx", max_size=10, max_wait=0.5)
async def append(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> None:
    await trio.sleep(0.1)
    appended.extend(job.args["n"] for job in jobs)  # not idempotent
    await trio.sleep(0.1)


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture
def nj_app() -> nj.App:
    written.clear()
    appended.clear()
    return app


def _fresh() -> nj.App:
    fresh = nj.App()
    fresh.queue("q", max_workers=1)
    return fresh


async def handler(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> None:
    pass


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"concurrency_key": lambda args: "k"}, "does not take concurrency_key=: a per-key or rate limit counts each job's start"),
        ({"max_concurrent": 2}, "does not take max_concurrent="),
        ({"rate": object()}, "does not take rate="),
        ({"rate_key": lambda args: "k"}, "does not take rate_key="),
        ({"asyncio": True}, "does not take asyncio=True: a batch handler is a Trio coroutine"),
        ({"max_size": 0}, "max_size must be an int from 1 to 1,000, not 0"),
        ({"max_size": 1001}, "max_size must be an int from 1 to 1,000"),
        ({"max_size": True}, "max_size must be an int"),
        ({"max_wait": -1}, "max_wait must be a finite number of seconds >= 0"),
        ({"max_wait": float("inf")}, "max_wait must be a finite number"),
        ({"queue": "nowhere"}, "unknown queue 'nowhere'"),
        ({"colour": "red"}, "unknown option colour='red'"),
    ],
)
def test_what_a_batch_kind_cannot_have_is_refused_at_declaration(options: dict[str, Any], match: str) -> None:
    options = {"queue": "q", **options}
    with pytest.raises(nj.ConfigError, match=match):
        _fresh().batch_job(**options)(handler)


def test_asyncio_false_is_accepted() -> None:
    kind = _fresh().batch_job(queue="q", asyncio=False)(handler)
    assert isinstance(kind, nj.BatchKind) and kind.max_size == 20 and kind.max_wait == 0.1


async def takes_args(ctx: nj.BatchContext, doc_id: int) -> None:
    pass


async def takes_more(ctx: nj.BatchContext, jobs: list[nj.BatchJob], extra: int) -> None:
    pass


async def job_context(ctx: nj.JobContext, jobs: list[nj.BatchJob]) -> None:
    pass


async def not_a_list(ctx: nj.BatchContext, jobs: int) -> None:
    pass


class Point:
    pass


async def untyped_items(ctx: nj.BatchContext, jobs: list[Point]) -> None:
    pass


async def class_args(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Point]]) -> None:
    pass


def plain_def(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> None:
    pass


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (takes_args, r"its jobs parameter is annotated <class 'int'>; annotate it list\[nj.BatchJob\]"),
        (takes_more, r"must take \(ctx, jobs\) and nothing else"),
        (job_context, "its first parameter 'ctx' .* is where the BatchContext goes"),
        (not_a_list, r"annotate it list\[nj.BatchJob\]"),
        (untyped_items, "annotate them nj.BatchJob"),
        (class_args, "cannot be checked at enqueue; use a TypedDict"),
        (plain_def, "must be an `async def`"),
    ],
)
def test_a_handler_that_does_not_take_a_batch_is_refused(fn: Any, match: str) -> None:
    with pytest.raises(nj.ConfigError, match=match):
        _fresh().batch_job(queue="q")(fn)


async def plain_handler(ctx: nj.JobContext) -> None:
    pass


def test_a_name_taken_by_a_plain_kind_is_refused() -> None:
    fresh = _fresh()
    fresh.job(queue="q", name="handler")(plain_handler)
    with pytest.raises(nj.ConfigError, match="registered twice"):
        fresh.batch_job(queue="q")(handler)


class Doc(TypedDict):
    doc_id: int
    title: str


async def typed(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Doc]]) -> None:
    pass


def test_typed_args_are_checked_and_plain_ones_are_any_json_mapping() -> None:
    fresh = _fresh()
    kind = fresh.batch_job(queue="q")(typed)
    opts = nj.app.EnqueueOptions()
    assert kind.new_job({"doc_id": 1, "title": "a", "extra": [1]}, opts, 0.0).args_json
    with pytest.raises(nj.ArgsError, match="argument 'doc_id' must be int"):
        kind.new_job({"doc_id": "1", "title": "a"}, opts, 0.0)
    with pytest.raises(nj.ArgsError, match="do not fit its args type: object missing required field `title`"):
        kind.new_job({"doc_id": 1}, opts, 0.0)
    untyped = fresh.batch_job(queue="q")(handler)
    assert untyped.new_job({"anything": {"at": "all"}}, opts, 0.0).args_json
    with pytest.raises(nj.ArgsError, match="JSON"):
        untyped.new_job({"t": (1, 2)}, opts, 0.0)


async def test_run_job_follows_a_batch_kinds_job_through_its_retries(runtime: TestRuntime) -> None:
    job = await nj.testing.run_job(upsert, doc_id=1, title="a", reject=True)
    assert job.state is nj.JobState.COMPLETED and job.attempt == 2
    assert [e.message for e in job.errors] == ["the batch handler returned this job as not handled"]
    assert written == {1: "a"}


async def test_drain_runs_the_batches_and_returns_each_job_once(runtime: TestRuntime) -> None:
    await upsert.enqueue_many([{"doc_id": n} for n in range(25)])
    finals = await runtime.drain()
    assert len(finals) == 25 and all(j.state is nj.JobState.COMPLETED for j in finals)
    assert sorted(written) == list(range(25))


async def test_check_at_least_once_cuts_a_batch_of_one(runtime: TestRuntime) -> None:
    tried = await nj.testing.check_at_least_once(upsert, {"doc_id": 3, "title": "t"}, observe=lambda: dict(written))
    assert tried == 3  # two checkpoints, then after the last
    with pytest.raises(nj.testing.NotIdempotent, match="append.*is not idempotent"):
        await nj.testing.check_at_least_once(append, {"n": 1}, observe=lambda: list(appended), reset=appended.clear)


async def test_calling_a_batch_kind_calls_its_handler(runtime: TestRuntime) -> None:
    assert await append(None, []) is None  # type: ignore[arg-type]


async def test_claims_for_a_collecting_batch_in_a_mixed_queue_do_not_pile_up_plain_jobs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A claim for a batch's room may bring plain jobs (claims are by queue); they wait for a
    worker and count against the room, so the queue never holds more than one room's worth."""
    mixed = nj.App()
    mixed.queue("m", max_workers=2, timeout=30)

    @mixed.batch_job(queue="m", max_size=10, max_wait=2)
    async def bulk(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> None:
        pass

    @mixed.job(queue="m")
    async def slow(ctx: nj.JobContext, n: int) -> None:
        await trio.sleep(5)

    async with nj.open_runtime(mixed, grace=0) as rt:
        await bulk.enqueue()
        await slow.enqueue_many([{"n": n} for n in range(100)])
        await trio.sleep(0.5)  # the batch collects (max_wait 2 s); the claims for its room bring plain jobs
        running = (await rt.stats())["m"].running
    assert running <= 2 + 9, running  # the workers' two jobs and the batch's room of 9, never the backlog


async def test_middleware_runs_once_around_each_batch_with_its_context(autojump_clock: trio.testing.MockClock) -> None:
    wrapped = nj.App()
    wrapped.queue("w", max_workers=1, timeout=30)
    seen: list[tuple[str, int]] = []

    async def around(ctx: Any, call_next: Any) -> Any:
        seen.append((type(ctx).__name__, len(ctx.jobs)))
        return await call_next(ctx)

    wrapped.middleware(around)

    @wrapped.batch_job(queue="w", max_size=5, max_wait=0)
    async def bulk(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> list[nj.BatchJob]:
        return [j for j in jobs if j.args["n"] == 0 and j.attempt == 1]

    async with nj.open_runtime(wrapped, grace=0) as rt:
        ids = await bulk.enqueue_many([{"n": n} for n in range(5)])
        receipts = [await rt.wait(i, timeout=30) for i in ids]
    assert all(r.state is nj.JobState.COMPLETED for r in receipts)
    assert seen == [("BatchContext", 5), ("BatchContext", 1)]  # the returned job alone, on its retry


async def test_a_batchs_children_are_cut_with_it_at_its_timeout(autojump_clock: trio.testing.MockClock) -> None:
    timed = nj.App()
    timed.queue("t", max_workers=1, timeout=30)
    cut: list[str | None] = []

    @timed.batch_job(queue="t", max_size=5, max_wait=0, timeout=2, max_attempts=1)
    async def bulk(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> None:
        async def part(job: nj.BatchJob) -> None:
            try:
                await trio.sleep(100)
            finally:
                cut.append(ctx.cancel_reason)

        async with ctx.children() as tasks:
            for job in jobs:
                tasks.spawn(part, job)

    async with nj.open_runtime(timed, grace=0) as rt:
        ids = await bulk.enqueue_many([{"n": n} for n in range(3)])
        receipts = [await rt.wait(i, timeout=30) for i in ids]
    assert [r.state for r in receipts] == [nj.JobState.DISCARDED] * 3
    assert cut == ["timeout"] * 3


class Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


@pytest.mark.parametrize("returned", ["a string", {"a": 1}, 5, Unprintable(), [Unprintable()]])
async def test_whatever_a_batch_handler_returns_never_crashes_the_worker(
    returned: Any, autojump_clock: trio.testing.MockClock
) -> None:
    odd = nj.App()
    odd.queue("o", max_workers=1, timeout=30)

    @odd.batch_job(queue="o", max_size=5, max_wait=0, max_attempts=1)
    async def bulk(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> Any:
        return returned

    async with nj.open_runtime(odd, grace=0) as rt:
        ids = await bulk.enqueue_many([{"n": n} for n in range(2)])
        jobs = [await rt.get_job(i) for i in ids if (await rt.wait(i, timeout=30)).done]
        later = await rt.wait(await bulk.enqueue(n=9), timeout=30)  # the worker still runs batches
    assert [j.state for j in jobs] == [nj.JobState.DISCARDED] * 2
    assert later.done
    message = jobs[0].errors[0].message
    assert "the batch handler returned" in message or "no repr" in message, message


async def test_events_and_ticks_become_jobs_of_a_batch_kind(autojump_clock: trio.testing.MockClock) -> None:
    fed = nj.App()
    fed.queue("f", max_workers=1, timeout=30)
    seen: list[Any] = []

    @fed.periodic("@every 10s", run_at_start=True, args={"doc_id": 0})
    @fed.subscribe("doc.written")
    @fed.batch_job(queue="f", max_size=10, max_wait=0.5)
    async def bulk(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> None:
        seen.append(sorted(j.args["doc_id"] for j in jobs))

    async with nj.open_runtime(fed, grace=0) as rt:
        for n in range(1, 4):
            await rt.publish("doc.written", {"doc_id": n})
        await trio.sleep(5)
    got = sorted(d for batch in seen for d in batch)
    assert set(got) == {0, 1, 2, 3} and got.count(0) >= 1  # the ticks' jobs (the start's, and any tick since)
    assert [1, 2, 3] == [d for d in got if d]  # each event one job
    assert any(len(batch) >= 3 for batch in seen)  # the events, collected together


async def test_a_running_batch_keeps_adding_work_through_the_shutdown(autojump_clock: trio.testing.MockClock) -> None:
    """A batch is one attempt for the shutdown's rule (docs/shutdown.md): it runs while any of
    its jobs does, so its handler and its children may still enqueue in the grace."""
    app = nj.App()
    added: list[int] = []

    @app.job()
    async def follow_up(ctx: nj.JobContext, n: int) -> None:
        pass

    @app.batch_job(max_size=2, max_wait=0.1, timeout=None)
    async def deliver(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> None:
        await trio.sleep(2)  # the shutdown begins meanwhile
        async with ctx.client.transaction() as conn:
            added.append(await follow_up.enqueue_tx(conn, n=0))

        async def child() -> None:
            added.append(await follow_up.enqueue(n=1))

        async with ctx.children() as tasks:
            tasks.spawn(child)

    backend = nj.MemoryBackend()
    async with nj.open_runtime(app, backend=backend, grace=10) as rt:
        ids = await rt.enqueue_many("deliver", [{}, {}])
        await trio.sleep(1)
        rt.begin_shutdown()
    assert [(await backend.get_job(i)).state for i in ids] == [nj.JobState.COMPLETED] * 2
    assert len(added) == 2
