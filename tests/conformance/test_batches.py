"""Batch handlers (`@app.batch_job`) end to end on every backend: batches of at most `max_size`,
collected for at most `max_wait` after their first job, one outcome per job (the returned jobs
retried on their own attempt counts), a raise or a timeout failing every job as one attempt
each, a shutdown that loses none of them, a cancel that reaches only the job it names, and batch
and plain kinds sharing one queue."""

from __future__ import annotations

from typing import Any, AsyncContextManager, Awaitable, Callable, TypedDict

import pytest
import trio

import nursery_jobs as nj

COMPLETED = nj.JobState.COMPLETED


class Doc(TypedDict):
    doc_id: int


class Record:
    """What the handlers saw: each call's start time, job ids and attempts."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, list[int], list[int]]] = []

    def add(self, jobs: list[nj.BatchJob[Any]]) -> None:
        self.calls.append((trio.current_time(), [j.id for j in jobs], [j.attempt for j in jobs]))

    @property
    def sizes(self) -> list[int]:
        return [len(ids) for _, ids, _ in self.calls]

    def runs(self) -> dict[int, list[int]]:
        """Job id -> the attempts it was handed to a handler with."""
        seen: dict[int, list[int]] = {}
        for _, ids, attempts in self.calls:
            for job_id, attempt in zip(ids, attempts):
                seen.setdefault(job_id, []).append(attempt)
        return seen


class Indexer:
    """The setup most tests share: an app with one queue (`max_workers` `workers`, the queue's
    `timeout` `queue_timeout`) and the batch kind `index` on it, with `batch_options`
    (`max_size`, `max_wait`, the kind's own `timeout`, ...). Every call is recorded in `record`, then `body(ctx, jobs)` runs, if given;
    what it returns is the handler's return."""

    def __init__(
        self,
        body: Callable[[nj.BatchContext, list[nj.BatchJob[Any]]], Awaitable[Any]] | None = None,
        *,
        queue: str = "idx",
        workers: int = 1,
        queue_timeout: float | None = 30,
        **batch_options: Any,
    ) -> None:
        self.app = nj.App()
        self.app.queue(queue, max_workers=workers, timeout=queue_timeout)
        self.record = Record()

        @self.app.batch_job(queue=queue, **batch_options)
        async def index(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Any]]) -> Any:
            self.record.add(jobs)
            return None if body is None else await body(ctx, jobs)

        self.index = index

    def open(self, backend: Any, *, grace: float = 0, **options: Any) -> AsyncContextManager[nj.Runtime]:
        """`open_runtime` of this app on `backend` (no grace unless given)."""
        return nj.open_runtime(self.app, backend=backend, grace=grace, **options)


async def _wait_all(rt: nj.Runtime, ids: list[nj.JobId], timeout: float = 120) -> list[nj.Job]:
    for job_id in ids:
        assert (await rt.wait(job_id, timeout=timeout)).done, job_id
    return [await rt.get_job(job_id) for job_id in ids]


async def test_a_backlog_runs_in_full_batches_and_the_rest_after_max_wait(make_backend, autojump_clock) -> None:
    async def one_second(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Any]]) -> None:
        await trio.sleep(1)

    idx = Indexer(one_second, max_size=20, max_wait=0.5)
    record = idx.record
    async with idx.open(make_backend()) as rt:
        ids = await idx.index.enqueue_many([{"n": n} for n in range(45)])
        jobs = await _wait_all(rt, ids)
    assert record.sizes == [20, 20, 5]
    assert all(j.state is COMPLETED and j.attempt == 1 for j in jobs)
    (t1, _, _), (t2, _, _), (t3, _, _) = record.calls
    assert t2 - t1 == pytest.approx(1, abs=0.3)  # full: it ran as soon as the worker was free
    assert t3 - t2 == pytest.approx(1.5, abs=0.3)  # 5 of 20: it waited max_wait for more, then ran
    assert sorted(record.runs()) == sorted(ids)  # each job in exactly one batch


async def test_max_wait_runs_from_the_first_job_and_is_not_reset_by_later_ones(make_backend, autojump_clock) -> None:
    """Gitea's debounce: the timer starts with a batch's first job; jobs that keep coming join
    it but do not push it back, so at low load a job waits at most max_wait."""
    idx = Indexer(workers=2, max_size=100, max_wait=1.0)
    record = idx.record
    enqueued: dict[int, float] = {}
    async with idx.open(make_backend()) as rt:
        ids = []
        for n in range(12):
            job_id = await idx.index.enqueue(n=n)
            enqueued[job_id] = trio.current_time()
            ids.append(job_id)
            await trio.sleep(0.3)
        await _wait_all(rt, ids)
    assert len(record.calls) >= 3  # 3.6 s of arrivals at most 1 s apart: several batches, not one
    for started, batch_ids, _ in record.calls:
        first = min(enqueued[i] for i in batch_ids)
        assert started - first <= 1.0 + 0.5, (started, first)
    assert sorted(record.runs()) == sorted(ids)


async def test_returned_jobs_are_retried_on_their_own_attempts_and_the_others_complete(make_backend, autojump_clock) -> None:
    async def return_some(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Any]]) -> list[nj.BatchJob[Any]]:
        # odd jobs fail their first attempt; job 9 never succeeds
        return [j for j in jobs if (j.args["n"] % 2 and j.attempt == 1) or j.args["n"] == 9]

    idx = Indexer(return_some, workers=2, max_size=10, max_wait=0.1, max_attempts=3, retry=nj.RetryPolicy(base=1, jitter=0))
    record = idx.record
    async with idx.open(make_backend()) as rt:
        ids = await idx.index.enqueue_many([{"n": n} for n in range(10)])
        jobs = await _wait_all(rt, ids)
    by_n = {j.args["n"]: j for j in jobs}
    for n in (0, 2, 4, 6, 8):
        assert by_n[n].state is COMPLETED and by_n[n].attempt == 1 and by_n[n].errors == ()
    for n in (1, 3, 5, 7):
        assert by_n[n].state is COMPLETED and by_n[n].attempt == 2
        assert [e.message for e in by_n[n].errors] == ["the batch handler returned this job as not handled"]
    nine = by_n[9]
    assert nine.state is nj.JobState.DISCARDED and nine.attempt == 3 and len(nine.errors) == 3
    runs = record.runs()
    assert runs[by_n[9].id] == [1, 2, 3] and runs[by_n[1].id] == [1, 2] and runs[by_n[0].id] == [1]


async def test_a_handler_that_raises_fails_every_job_as_one_attempt_each(make_backend, autojump_clock) -> None:
    async def down_at_first(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Any]]) -> None:
        if jobs[0].attempt == 1:
            raise RuntimeError("the search engine is down")

    idx = Indexer(down_at_first, max_size=10, max_wait=0.1)
    record = idx.record
    async with idx.open(make_backend()) as rt:
        ids = await idx.index.enqueue_many([{"n": n} for n in range(6)])
        jobs = await _wait_all(rt, ids)
        stats = (await rt.stats())["idx"]
    assert record.sizes[0] == 6
    for job in jobs:
        assert job.state is COMPLETED and job.attempt == 2
        assert [e.message for e in job.errors] == ["RuntimeError: the search engine is down"]
    assert stats.failed_attempts == 6 and stats.completed == 6


async def test_a_return_value_that_is_not_jobs_of_the_batch_fails_every_job(make_backend, autojump_clock) -> None:
    calls = 0

    async def ids_not_jobs(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Any]]) -> Any:
        nonlocal calls
        calls += 1
        return [j.id for j in jobs] if calls == 1 else None  # ids, not the jobs: a mistake

    idx = Indexer(ids_not_jobs, max_size=10, max_wait=0.1)
    async with idx.open(make_backend()) as rt:
        ids = await idx.index.enqueue_many([{"n": n} for n in range(3)])
        jobs = await _wait_all(rt, ids)
    for job in jobs:
        assert job.state is COMPLETED and job.attempt == 2
        assert "not a job of this batch" in job.errors[0].message


async def test_a_timeout_cuts_the_batch_and_fails_every_job_as_one_attempt(make_backend, autojump_clock) -> None:
    ended: list[float] = []

    async def hang(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Any]]) -> None:
        start = trio.current_time()
        try:
            await trio.sleep(100)
        finally:
            ended.append(trio.current_time() - start)
            assert ctx.cancel_reason == "timeout"

    idx = Indexer(hang, max_size=10, max_wait=0, timeout=2, max_attempts=1)
    async with idx.open(make_backend()) as rt:
        ids = await idx.index.enqueue_many([{"n": n} for n in range(4)])
        jobs = await _wait_all(rt, ids)
    assert ended and all(t == pytest.approx(2, abs=0.3) for t in ended)
    assert sum(1 for _ in ended) <= 4
    for job in jobs:
        assert job.state is nj.JobState.DISCARDED and job.attempt == 1
        assert [e.message for e in job.errors] == ["timed out after 2 s"]


async def test_a_batch_child_failing_in_its_cleanup_fails_the_batchs_jobs_not_the_runtime(make_backend, autojump_clock) -> None:
    async def hang(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Any]]) -> None:
        async def loud() -> None:
            try:
                await trio.sleep_forever()
            finally:
                raise ValueError("cleanup failed")  # noqa: B012 - the case under test

        async with ctx.children() as kids:
            kids.spawn(trio.sleep_forever)
            kids.spawn(loud)

    idx = Indexer(hang, max_size=10, max_wait=0, timeout=2, max_attempts=1)
    async with idx.open(make_backend()) as rt:
        ids = await idx.index.enqueue_many([{"n": n} for n in range(3)])
        jobs = await _wait_all(rt, ids)
    for job in jobs:
        assert job.state is nj.JobState.DISCARDED and job.attempt == 1
        (error,) = job.errors
        assert error.message.startswith("timed out after 2 s; then, in the cleanup:") and "cleanup failed" in error.message


async def test_shutdown_while_collecting_gives_every_job_back(make_backend, autojump_clock) -> None:
    idx = Indexer(max_size=10, max_wait=30)
    record = idx.record
    backend = make_backend()
    async with idx.open(backend, grace=5) as rt:
        ids = await idx.index.enqueue_many([{"n": n} for n in range(3)])
        await trio.sleep(2)  # claimed, collecting: the batch is not full and max_wait is far
        assert (await rt.get_job(ids[0])).state is nj.JobState.RUNNING
        t0 = trio.current_time()
    assert trio.current_time() - t0 < 2  # collecting is not running: the grace does not wait for it
    assert record.calls == []
    for job_id in ids:
        job = await backend.get_job(job_id)
        assert job.state is nj.JobState.AVAILABLE and job.attempt == 0 and job.errors == ()
    async with idx.open(backend, grace=5) as rt:  # a restart runs them once
        jobs = await _wait_all(rt, ids)
    assert all(j.state is COMPLETED and j.attempt == 1 for j in jobs)
    assert record.runs() == {i: [1] for i in ids}


async def test_shutdown_mid_batch_interrupts_it_and_a_restart_runs_every_job_again(make_backend, autojump_clock) -> None:
    slow = True

    async def slow_at_first(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Any]]) -> None:
        if slow:
            await trio.sleep(100)

    idx = Indexer(slow_at_first, queue_timeout=None, max_size=10, max_wait=0)
    record = idx.record
    backend = make_backend()
    async with idx.open(backend, grace=1) as rt:
        ids = await idx.index.enqueue_many([{"n": n} for n in range(5)])
        while not record.calls:
            await trio.sleep(0.1)
    assert sorted(rt.interrupted) == sorted(ids)
    for job_id in ids:
        job = await backend.get_job(job_id)
        assert job.state is nj.JobState.AVAILABLE and job.attempt == 0 and job.errors == ()
    slow = False
    async with idx.open(backend, grace=1) as rt:
        jobs = await _wait_all(rt, ids)
    assert all(j.state is COMPLETED and j.attempt == 1 for j in jobs)
    assert all(attempts == [1, 1] for attempts in record.runs().values())  # at least once: twice here


async def test_cancel_reaches_only_its_job_and_does_not_cut_the_batch(make_backend, autojump_clock) -> None:
    flags: dict[int, bool] = {}
    batch_started = trio.Event()

    async def note_cancels(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Any]]) -> None:
        batch_started.set()
        await trio.sleep(5)
        assert ctx.cancel_reason is None
        flags.update({j.id: j.cancel_requested for j in jobs})

    idx = Indexer(note_cancels, max_size=10, max_wait=0)
    async with idx.open(make_backend()) as rt:
        ids = await idx.index.enqueue_many([{"n": n} for n in range(3)])
        await batch_started.wait()
        assert await rt.cancel(ids[1]) is nj.JobState.RUNNING
        jobs = await _wait_all(rt, ids)
    assert [j.state for j in jobs] == [COMPLETED, nj.JobState.CANCELLED, COMPLETED]
    assert flags == {ids[0]: False, ids[1]: True, ids[2]: False}


async def test_cancelling_every_job_of_a_batch_cuts_it(make_backend, autojump_clock) -> None:
    reasons: list[str | None] = []
    batch_started = trio.Event()

    async def hang(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Any]]) -> None:
        batch_started.set()
        try:
            await trio.sleep(100)
        finally:
            reasons.append(ctx.cancel_reason)

    idx = Indexer(hang, max_size=10, max_wait=0)
    async with idx.open(make_backend()) as rt:
        ids = await idx.index.enqueue_many([{"n": n} for n in range(2)])
        await batch_started.wait()
        t0 = trio.current_time()
        for job_id in ids:
            await rt.cancel(job_id)
        jobs = await _wait_all(rt, ids)
        assert trio.current_time() - t0 < 50
    assert [j.state for j in jobs] == [nj.JobState.CANCELLED] * 2
    assert reasons == ["cancel"]


async def test_batch_and_plain_kinds_share_a_queue(make_backend, autojump_clock) -> None:
    async def half_a_second(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Any]]) -> None:
        await trio.sleep(0.5)

    idx = Indexer(half_a_second, queue="mixed", workers=3, max_size=8, max_wait=0.2)
    record = idx.record
    plain_runs: dict[int, int] = {}

    @idx.app.job(queue="mixed")
    async def notify(ctx: nj.JobContext, n: int) -> None:
        plain_runs[ctx.id] = plain_runs.get(ctx.id, 0) + 1
        await trio.sleep(0.1)

    async with idx.open(make_backend()) as rt:
        ids: list[nj.JobId] = []
        for n in range(30):
            ids.append(await idx.index.enqueue(n=n))
            ids.append(await notify.enqueue(n=n))
        jobs = await _wait_all(rt, ids)
    assert all(j.state is COMPLETED and j.attempt == 1 for j in jobs)
    assert record.runs() == {j.id: [1] for j in jobs if j.kind == "index"}
    assert plain_runs == {j.id: 1 for j in jobs if j.kind == "notify"}
    assert max(record.sizes) <= 8


async def test_typed_args_are_checked_at_enqueue(make_backend, autojump_clock) -> None:
    app = nj.App()
    app.queue("idx", max_workers=1, timeout=30)
    seen: list[Any] = []

    @app.batch_job(queue="idx", max_size=5, max_wait=0)
    async def index(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Doc]]) -> None:
        seen.extend(j.args["doc_id"] for j in jobs)

    async with nj.open_runtime(app, backend=make_backend(), grace=0) as rt:
        with pytest.raises(nj.ArgsError, match="doc_id"):
            await index.enqueue(doc_id="1")
        with pytest.raises(nj.ArgsError, match="doc_id"):
            await index.enqueue(title="no id")
        await _wait_all(rt, [await index.enqueue(doc_id=7)])
    assert seen == [7]


async def test_a_stored_row_that_cannot_be_decoded_is_discarded_alone(make_backend, damage, autojump_clock) -> None:
    idx = Indexer(max_size=10, max_wait=0.5)
    record = idx.record
    backend = make_backend()
    async with nj.open_runtime(idx.app, backend=backend, queues=[]):
        ids = await idx.index.enqueue_many([{"n": n} for n in range(3)])
    damage.write(backend, ids[1], "args = ?", ("{not json",))
    async with idx.open(backend) as rt:
        jobs = await _wait_all(rt, ids)
    assert [j.state for j in jobs] == [COMPLETED, nj.JobState.DISCARDED, COMPLETED]
    assert "job args could not be decoded" in jobs[1].errors[-1].message
    assert record.runs() == {ids[0]: [1], ids[2]: [1]}  # the others ran, in one batch
    assert record.sizes == [2]


async def test_two_runtimes_on_one_store_never_put_a_job_in_two_batches(store, autojump_clock) -> None:
    """Two processes' batches share the backlog: each job is claimed into one batch, once."""
    async def half_a_second(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Any]]) -> None:
        await trio.sleep(0.5)

    idx = Indexer(half_a_second, workers=2, max_size=10, max_wait=0.2)
    record = idx.record
    async with idx.open(store.open()) as one, idx.open(store.open()):
        ids = await idx.index.enqueue_many([{"n": n} for n in range(120)])
        jobs = await _wait_all(one, ids)
    assert all(j.state is COMPLETED and j.attempt == 1 for j in jobs)
    assert record.runs() == {i: [1] for i in ids}
    assert max(record.sizes) <= 10


async def test_a_job_cancelled_while_its_batch_collects_is_left_out(make_backend, autojump_clock) -> None:
    idx = Indexer(max_size=10, max_wait=5)
    record = idx.record
    async with idx.open(make_backend()) as rt:
        ids = await idx.index.enqueue_many([{"n": n} for n in range(3)])
        await trio.sleep(1)  # claimed, collecting until max_wait
        assert await rt.cancel(ids[0]) is nj.JobState.RUNNING
        jobs = await _wait_all(rt, ids)
    assert [j.state for j in jobs] == [nj.JobState.CANCELLED, COMPLETED, COMPLETED]
    assert record.runs() == {ids[1]: [1], ids[2]: [1]}
