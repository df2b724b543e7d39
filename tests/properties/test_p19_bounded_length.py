"""P19 -- bounded queues: an insert with `bounds` is accepted exactly when it fits, and a refused
one changes nothing.

How: a drawn program of protocol calls on one backend -- bounded inserts of batches (some jobs
scheduled later, some with unique keys drawn from a small set, so that some deduplicate),
claims, outcomes of every kind for drawn running jobs (retries and snoozes bring jobs back to
waiting), cancels, rescues after drawn pauses -- and around every bounded insert the rows as
the backend reports them (`get_job`), checked against the rule (`rules.check_room`):

- the insert is accepted if and only if the queue's waiting jobs (`rules.PENDING`) before
  it, plus the jobs of the batch that are new (a unique key not held by a job that is not final,
  counted once per batch), are at most `max_length`;
- a refused insert (`QueueFull`) left every row as it was and made none;
- an accepted one made exactly the new jobs.

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
from nursery_jobs.rules import PENDING

from .audit import expect
from .harness import MEMORY, Store, examples

Q = "q"
KEYS = (None, None, "u1", "u2", "u3")

STEP = st.one_of(
    st.tuples(
        st.just("insert"),
        st.lists(st.tuples(st.sampled_from(KEYS), st.sampled_from([None, None, 3.0])), min_size=1, max_size=4),
    ),
    st.tuples(st.just("claim"), st.integers(1, 3)),
    st.tuples(st.just("finish"), st.integers(0, 50), st.sampled_from(list(OutcomeKind))),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("rescue"), st.integers(0, 50)),
    st.tuples(st.just("advance"), st.sampled_from([1.0, 5.0])),
)


async def _rows(backend: nj.Backend, ids: list[int]) -> dict[int, tuple[nj.JobState, str | None]]:
    out = {}
    for i in ids:
        job = await backend.get_job(i)
        out[i] = (job.state, job.unique_key)
    return out


def check(data: st.DataObject, store: Store = MEMORY) -> None:
    max_length = data.draw(st.integers(1, 5), label="max_length")
    steps = data.draw(st.lists(STEP, min_size=1, max_size=25), label="steps")

    async def main() -> None:
        backend: Any = nj.MemoryBackend() if store.build is None else store.build()
        await backend.open()
        ids: list[int] = []
        running: list[tuple[int, int]] = []
        try:
            for step in steps:
                now = backend.now()
                if step[0] == "insert":
                    before = await _rows(backend, ids)
                    waiting = sum(1 for state, _ in before.values() if state in PENDING)
                    held = {key for state, key in before.values() if key is not None and not state.final}
                    new_keys = {k for k, _ in step[1] if k is not None and k not in held}
                    new = sum(1 for k, _ in step[1] if k is None) + len(new_keys)
                    jobs = [NewJob("w", Q, "{}", 0, None if d is None else now + d, 3, k) for k, d in step[1]]
                    fits = waiting + new <= max_length
                    try:
                        results = await backend.insert_many(jobs, {Q: max_length})
                    except nj.QueueFull:
                        expect(not fits, "P19", f"refused {new} new jobs with {waiting} waiting, max_length {max_length}")
                        after = await _rows(backend, ids)
                        expect(after == before, "P19", "a refused insert changed rows")
                        stats = (await backend.stats()).get(Q)
                        total = 0 if stats is None else sum(
                            getattr(stats, s) for s in ("available", "scheduled", "running", "retryable", "completed", "discarded", "cancelled")
                        )  # fmt: skip
                        expect(total == len(ids), "P19", f"a refused insert left {total - len(ids)} rows")
                        continue
                    expect(fits, "P19", f"accepted {new} new jobs with {waiting} waiting, max_length {max_length}")
                    made = sorted({r.id for r in results if not r.existing})
                    expect(len(made) == new, "P19", f"accepted an insert that made {len(made)} jobs, not {new}")
                    ids += made
                elif step[0] == "claim":
                    got = (await backend.claim(Q, step[1])).jobs
                    running += [(j.id, j.attempt) for j in got]
                elif step[0] == "finish" and running:
                    job_id, attempt = running.pop(step[1] % len(running))
                    kind = step[2]
                    error = nj.JobError(attempt, now, "x") if kind in (OutcomeKind.RETRY, OutcomeKind.DISCARD) else None
                    run_at = now + 2 if kind in (OutcomeKind.RETRY, OutcomeKind.SNOOZE) else None
                    await backend.finish_many([Outcome(job_id, attempt, kind, run_at, error)])
                elif step[0] == "cancel" and ids:
                    await backend.cancel(ids[step[1] % len(ids)])
                elif step[0] == "rescue" and running:
                    running.pop(step[1] % len(running))  # its worker died: no more heartbeats
                    await trio.sleep(10)
                    await backend.heartbeat(running)
                    await backend.rescue(backend.now() - 5)
                elif step[0] == "advance":
                    await trio.sleep(step[1])
        finally:
            await backend.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@settings(max_examples=examples(100), deadline=None)
@given(data=st.data())
def test_p19_bounded_length(data: st.DataObject) -> None:
    check(data)
