"""P17 -- batches lose no job and complete none twice: every job of a batch kind reaches a final
state, a job is handed to at most one batch per attempt, a job completes only if a batch handled
it, and one that completed was handled exactly once; its attempt count is the number of batch
runs of it that were not interrupted.

How: a drawn program on one backend -- a batch kind (drawn `max_size`, `max_wait`, workers, a
plain kind beside it in the same queue or not), bursts of jobs with drawn scripts (returned as
not handled for their first f attempts; a job whose first attempt makes its whole batch raise,
or overrun the timeout), pauses, cancels of drawn jobs, and a shutdown with a drawn grace that
cuts batches while they collect or run, then a restart on the same store -- and, after
everything is final, the batch calls the handler saw checked against the jobs' rows.

The check takes a `Store` as the other properties do (memory here; every durable backend
through `test_durable.py`).
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import nursery_jobs as nj

from .audit import expect
from .harness import MEMORY, Store, examples

Q = "q"
MAX_ATTEMPTS = 4
TIMEOUT = 3.0

JOB = st.fixed_dictionaries(
    {"fail": st.integers(0, 2), "boom": st.sampled_from([False] * 6 + [True]), "slow": st.sampled_from([False] * 8 + [True])}
)
STEP = st.one_of(
    st.tuples(st.just("burst"), st.lists(JOB, min_size=1, max_size=6)),
    st.tuples(st.just("plain"), st.integers(1, 3)),
    st.tuples(st.just("sleep"), st.sampled_from([0.0, 0.05, 0.3, 1.0, 4.0])),
    st.tuples(st.just("cancel"), st.integers(0, 100)),
    st.tuples(st.just("restart"), st.sampled_from([0.0, 0.5, 5.0])),
)


def check(data: st.DataObject, store: Store = MEMORY) -> None:
    max_size = data.draw(st.integers(1, 5), label="max_size")
    max_wait = data.draw(st.sampled_from([0.0, 0.5, 2.0]), label="max_wait")
    workers = data.draw(st.integers(1, 3), label="workers")
    steps = data.draw(st.lists(STEP, min_size=1, max_size=12), label="steps")

    app = nj.App()
    app.queue(Q, max_workers=workers, timeout=30)
    calls: list[tuple[list[tuple[int, int]], str]] = []
    """Each batch call: its (job id, attempt) pairs, and how it ended for the batch as a whole
    ("returned", "raised", "cut:<reason>"); the returned jobs are in `unhandled`."""
    unhandled: dict[int, set[tuple[int, int]]] = {}
    running: set[tuple[int, int]] = set()

    @app.batch_job(queue=Q, max_size=max_size, max_wait=max_wait, timeout=TIMEOUT, max_attempts=MAX_ATTEMPTS,
                   retry=nj.RetryPolicy(base=0.5, jitter=0))  # fmt: skip
    async def batch(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> list[nj.BatchJob]:
        pairs = [(j.id, j.attempt) for j in jobs]
        expect(len(jobs) <= max_size, "P17", f"a batch of {len(jobs)} jobs, max_size={max_size}")
        for pair in pairs:
            expect(pair not in running, "P17", f"job {pair[0]} attempt {pair[1]} is in two batches at once")
        expect(len(set(pairs)) == len(pairs), "P17", f"a job twice in one batch: {pairs}")
        running.update(pairs)
        index = len(calls)
        calls.append((pairs, "running"))
        try:
            first = [j.args for j in jobs if j.attempt == 1]
            if any(s["slow"] for s in first):
                await trio.sleep(TIMEOUT * 2)
            await trio.sleep(0.1)
            if any(s["boom"] for s in first):
                calls[index] = (pairs, "raised")
                raise RuntimeError("boom")
            back = [j for j in jobs if j.attempt <= j.args["fail"]]
            unhandled[index] = {(j.id, j.attempt) for j in back}
            calls[index] = (pairs, "returned")
            return back
        finally:
            running.difference_update(pairs)
            if calls[index][1] == "running":
                calls[index] = (pairs, f"cut:{ctx.cancel_reason}")

    @app.job(queue=Q)
    async def plain(ctx: nj.JobContext, n: int) -> None:
        await trio.sleep(0.2)

    async def main() -> None:
        backend: Any = nj.MemoryBackend() if store.build is None else store.build()
        ids: list[int] = []
        plain_ids: list[int] = []
        cancelled: set[int] = set()
        rest = list(steps)
        grace = 5.0
        try:
            while True:
                async with nj.open_runtime(app, backend=backend, grace=grace) as rt:
                    while rest:
                        step = rest.pop(0)
                        if step[0] == "burst":
                            ids += await batch.enqueue_many(step[1])  # each job's args are its script
                        elif step[0] == "plain":
                            plain_ids += await plain.enqueue_many([{"n": n} for n in range(step[1])])
                        elif step[0] == "sleep":
                            await trio.sleep(step[1])
                        elif step[0] == "cancel" and ids:
                            job_id = ids[step[1] % len(ids)]
                            if await rt.cancel(job_id) is not nj.JobState.COMPLETED:
                                cancelled.add(job_id)
                        elif step[0] == "restart":
                            grace = step[1]
                            break
                    else:
                        for job_id in ids + plain_ids:
                            receipt = await rt.wait(job_id, timeout=10_000)
                            expect(receipt.done, "P17", f"job {job_id} is not final after the drain: {receipt.state}")
                        rows = {i: await rt.get_job(i) for i in ids + plain_ids}
                        break
                    continue
                break
        finally:
            await backend.close()

        handed: dict[tuple[int, int], int] = {}
        handled: dict[int, int] = {}
        counted: dict[int, int] = {}
        for index, (pairs, how) in enumerate(calls):
            for pair in pairs:
                handed[pair] = handed.get(pair, 0) + 1
                job_id = pair[0]
                if how != "cut:shutdown":
                    counted[job_id] = counted.get(job_id, 0) + 1
                if how == "returned" and pair not in unhandled[index]:
                    handled[job_id] = handled.get(job_id, 0) + 1
        interrupted_pairs = {p for pairs, how in calls if how == "cut:shutdown" for p in pairs}
        for pair, n in handed.items():
            # a job's attempt number is given back only by an interruption (shutdown)
            expect(n == 1 or pair in interrupted_pairs, "P17", f"job {pair[0]} was handed to {n} batches in attempt {pair[1]}")
        for job_id in ids:
            job = rows[job_id]
            expect(job.state.final, "P17", f"job {job_id} ended {job.state.value}: dropped")
            n = handled.get(job_id, 0)
            expect(n <= 1, "P17", f"job {job_id} was handled by {n} batches")
            if job.state is nj.JobState.COMPLETED:
                expect(n == 1, "P17", f"job {job_id} completed but no batch handled it")
            elif job.state is not nj.JobState.CANCELLED:
                expect(n == 0, "P17", f"job {job_id} ended {job.state.value} though a batch handled it")
            if job_id not in cancelled:
                expect(
                    job.attempt == counted.get(job_id, 0),
                    "P17",
                    f"job {job_id}: attempt {job.attempt}, but {counted.get(job_id, 0)} batch runs of it were not interrupted",
                )
            if job.state is nj.JobState.DISCARDED:
                expect(job.attempt == MAX_ATTEMPTS, "P17", f"job {job_id} discarded after {job.attempt} attempts")
        for job_id in plain_ids:
            expect(rows[job_id].state is nj.JobState.COMPLETED, "P17", f"plain job {job_id} ended {rows[job_id].state.value}")

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@settings(max_examples=examples(60), deadline=None)
@given(data=st.data())
def test_p17_batches(data: st.DataObject) -> None:
    check(data)
