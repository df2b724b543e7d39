"""P16 -- per-key and per-queue limits: no claim ever leaves more than a key's `max_concurrent`
(or the queue's `max_running`) jobs running, and no claim leaves a job waiting that it may start.

How: a drawn program of protocol calls on one backend -- inserts of keyed and unkeyed jobs (some
scheduled later, drawn priorities), claims of drawn sizes, outcomes of every kind for drawn
running jobs, cancels, rescues after drawn pauses -- and after every claim the rows as the
backend reports them (`get_job`) checked against the rule (`rules.admit`):

- the limits: per key, running jobs <= the key's limit; per queue, <= `max_running`;
- no job held back without cause: a claim that took fewer than it asked left no due job whose
  key (and queue) had room, and within a key it took the best jobs by claim order.

The check takes a `Store` as the other properties do (memory here; every durable backend through
`test_durable.py`).
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import nursery_jobs as nj
from nursery_jobs.backends import NewJob, Outcome, OutcomeKind

from .audit import expect
from .harness import MEMORY, Store, examples

Q = "q"
KEYS = ("a", "b", "c", None)
LIMITS = {"a": 1, "b": 2, "c": 1}


def _order(job: nj.Job) -> tuple[int, float, int]:
    return (-job.priority, job.run_at, job.id)


async def _rows(backend: nj.Backend, keys: dict[int, str | None]) -> list[tuple[nj.Job, str | None]]:
    return [(await backend.get_job(i), k) for i, k in sorted(keys.items())]


def _check(rows: list[tuple[nj.Job, str | None]], asked: int, got: list[int], max_running: int | None, now: float) -> None:
    running = [(j, k) for j, k in rows if j.state is nj.JobState.RUNNING]
    per_key: dict[str, int] = {}
    for _, k in running:
        if k is not None:
            per_key[k] = per_key.get(k, 0) + 1
    for k, n in per_key.items():
        expect(n <= LIMITS[k], "P16", f"key {k!r} has {n} jobs running, its limit is {LIMITS[k]}")
    if max_running is not None:
        expect(len(running) <= max_running, "P16", f"{len(running)} jobs running, max_running={max_running}")
    if len(got) >= asked or (max_running is not None and len(running) >= max_running):
        return
    pending = (nj.JobState.AVAILABLE, nj.JobState.SCHEDULED, nj.JobState.RETRYABLE)
    for job, k in rows:
        if job.state in pending and job.run_at <= now and (k is None or per_key.get(k, 0) < LIMITS[k]):
            expect(False, "P16", f"the claim took {len(got)} of {asked} but left job {job.id} (key {k!r}) that could start")
    claimed = {i for i in got}
    for job, k in rows:  # within a key, nothing better than a job just claimed was left behind
        if job.id in claimed and k is not None:
            for other, k2 in rows:
                if k2 == k and other.state in pending and other.run_at <= now and _order(other) < _order(job):
                    expect(False, "P16", f"key {k!r}: job {job.id} started before the better job {other.id}")


STEP = st.one_of(
    st.tuples(st.just("insert"), st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 2), st.sampled_from([None, None, 3.0])), min_size=1, max_size=4)),
    st.tuples(st.just("claim"), st.integers(1, 4)),
    st.tuples(st.just("finish"), st.integers(0, 50), st.sampled_from(list(OutcomeKind))),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("rescue"), st.integers(0, 50)),
    st.tuples(st.just("advance"), st.sampled_from([1.0, 5.0])),
)


def check(data: st.DataObject, store: Store = MEMORY) -> None:
    max_running = data.draw(st.sampled_from([None, None, 2, 3]), label="max_running")
    steps = data.draw(st.lists(STEP, min_size=1, max_size=25), label="steps")

    async def main() -> None:
        backend: Any = nj.MemoryBackend() if store.build is None else store.build()
        await backend.open()
        keys: dict[int, str | None] = {}
        running: list[tuple[int, int]] = []
        try:
            for step in steps:
                now = backend.now()
                if step[0] == "insert":
                    jobs = [
                        NewJob("w", Q, "{}", p, None if d is None else now + d, 3, None, k, None if k is None else LIMITS[k])
                        for k, p, d in step[1]
                    ]
                    for res, (k, _, _) in zip(await backend.insert_many(jobs), step[1]):
                        keys[res.id] = k
                elif step[0] == "claim":
                    got = (await backend.claim(Q, step[1], max_running=max_running)).jobs
                    running += [(j.id, j.attempt) for j in got]
                    _check(await _rows(backend, keys), step[1], [j.id for j in got], max_running, backend.now())
                elif step[0] == "finish" and running:
                    job_id, attempt = running.pop(step[1] % len(running))
                    kind = step[2]
                    error = nj.JobError(attempt, now, "x") if kind in (OutcomeKind.RETRY, OutcomeKind.DISCARD) else None
                    run_at = now + 2 if kind in (OutcomeKind.RETRY, OutcomeKind.SNOOZE) else None
                    await backend.finish_many([Outcome(job_id, attempt, kind, run_at, error)])
                elif step[0] == "cancel" and keys:
                    await backend.cancel(sorted(keys)[step[1] % len(keys)])
                elif step[0] == "rescue" and running:
                    lost = running.pop(step[1] % len(running))  # its worker died: no more heartbeats
                    await trio.sleep(10)
                    await backend.heartbeat(running)
                    await backend.rescue(backend.now() - 5)
                    assert lost[0] in keys
                elif step[0] == "advance":
                    await trio.sleep(step[1])
        finally:
            await backend.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@settings(max_examples=examples(100), deadline=None)
@given(data=st.data())
def test_p16_key_limits(data: st.DataObject) -> None:
    check(data)
