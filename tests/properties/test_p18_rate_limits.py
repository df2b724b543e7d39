"""P18 -- per-key rate limits: no window of `per` seconds ever holds more than a key's `limit`
starts, every attempt's start counted, and no claim leaves a job waiting that its rate allows
or sleeps past a slot.

How: a drawn program of protocol calls on one backend, on virtual time -- inserts of jobs with
rate keys (each key with its own rate; some jobs with a concurrency key too, some with no key,
some scheduled later), claims of drawn sizes, outcomes of every kind for drawn running jobs
(a retry due at once is one more start), cancels, and pauses of drawn lengths -- and after every
claim the starts seen so far (each claimed job's `attempted_at`) checked against the rule:

- the limit: per key, the sorted starts s satisfy s[i] + per <= s[i + limit] for every i, so
  no half-open window [t, t + per) holds more than `limit` of them;
- no job held back without cause: a claim that took fewer than it asked left no due job whose
  rate key had a slot open (and whose concurrency key, if any, had room);
- no oversleeping: then its `next_due` is no later than the earliest slot of a due job refused
  only for its rate (nor than the earliest later `run_at`), and it is in the future.

The check takes a `Store` as the other properties do (memory here; every durable backend through
`test_durable.py`).
"""

from __future__ import annotations

from typing import Any, Sequence

import pytest
import trio
import trio.testing
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import nursery_jobs as nj
from nursery_jobs.backends import ClaimResult, InsertResult, NewJob, Outcome, OutcomeKind

from .audit import PropertyFailed, expect
from .harness import MEMORY, Store, examples

Q = "q"
RATES = {"a": (1, 5.0), "b": (2, 3.0), "c": (3, 10.0)}
"""Each rate key's (limit, per): one rate per key, as a service declares it."""
SPECS = [("a", None), ("b", None), ("c", None), ("c", "x"), ("a", "x"), (None, None), (None, "x")]
"""(rate key, concurrency key) a job may carry; "x" allows one running job."""
PENDING = (nj.JobState.AVAILABLE, nj.JobState.SCHEDULED, nj.JobState.RETRYABLE)


def _slot(starts: list[float], key: str, now: float) -> float | None:
    """When the key's next start may be, if not now (the rule, restated from the starts seen)."""
    limit, per = RATES[key]
    s = sorted(starts)
    if len(s) < limit or s[-limit] + per <= now:
        return None
    return s[-limit] + per


def _check_windows(starts: dict[str, list[float]]) -> None:
    for key, seen in starts.items():
        limit, per = RATES[key]
        s = sorted(seen)
        for i in range(len(s) - limit):
            expect(
                s[i] + per <= s[i + limit],
                "P18",
                f"key {key!r} ({limit} per {per:g} s) started {limit + 1} jobs within {per:g} s: {s[i : i + limit + 1]}",
            )


def _check_claim(
    rows: list[tuple[nj.Job, str | None, str | None]],
    starts: dict[str, list[float]],
    asked: int,
    got: int,
    next_due: float | None,
    now: float,
) -> None:
    if got >= asked:
        return
    running_x = sum(1 for j, _, c in rows if c is not None and j.state is nj.JobState.RUNNING)
    latest = None  # the latest the claim may sleep until
    for job, rkey, ckey in rows:
        if job.state not in PENDING:
            continue
        if job.run_at > now:
            latest = job.run_at if latest is None else min(latest, job.run_at)
            continue
        if ckey is not None and running_x >= 1:
            continue  # its concurrency key is full: not the rate's to report
        slot = None if rkey is None else _slot(starts.get(rkey, []), rkey, now)
        expect(slot is not None, "P18", f"the claim took {got} of {asked} but left job {job.id} (rate key {rkey!r}) that could start")
        if slot is not None:
            latest = slot if latest is None else min(latest, slot)
    if latest is not None:
        expect(next_due is not None and now < next_due <= latest, "P18", f"next_due {next_due} at {now}: a slot or job comes at {latest}")


STEP = st.one_of(
    st.tuples(
        st.just("insert"),
        st.lists(st.tuples(st.sampled_from(SPECS), st.integers(0, 2), st.sampled_from([None, None, None, 4.0])), min_size=1, max_size=5),
    ),
    st.tuples(st.just("claim"), st.integers(1, 4)),
    st.tuples(st.just("finish"), st.integers(0, 50), st.sampled_from(list(OutcomeKind)), st.sampled_from([None, 2.0])),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 1.0, 2.5, 5.0])),
    st.tuples(st.just("sleep_to_next_due")),
)


def check(data: st.DataObject, store: Store = MEMORY) -> None:
    steps = data.draw(st.lists(STEP, min_size=1, max_size=30), label="steps")

    async def main() -> None:
        backend: Any = nj.MemoryBackend() if store.build is None else store.build()
        await backend.open()
        spec: dict[int, tuple[str | None, str | None]] = {}
        running: list[tuple[int, int]] = []
        starts: dict[str, list[float]] = {}
        next_due: float | None = None
        try:
            for step in steps:
                now = backend.now()
                if step[0] == "insert":
                    jobs = []
                    for (rkey, ckey), priority, delay in step[1]:
                        limit, per = RATES[rkey] if rkey is not None else (None, None)
                        jobs.append(
                            NewJob("w", Q, "{}", priority, None if delay is None else now + delay, 5, None,
                                   ckey, None if ckey is None else 1, rkey, limit, per)  # fmt: skip
                        )
                    for res, (sp, _, _) in zip(await backend.insert_many(jobs), step[1]):
                        spec[res.id] = sp
                elif step[0] == "claim":
                    result = await backend.claim(Q, step[1])
                    next_due = result.next_due
                    now = backend.now()
                    before = {k: list(v) for k, v in starts.items()}
                    for job in result.jobs:
                        running.append((job.id, job.attempt))
                        rkey = spec[job.id][0]
                        if rkey is not None:
                            attempted = (await backend.get_job(job.id)).attempted_at
                            assert attempted is not None
                            starts.setdefault(rkey, []).append(attempted)
                    _check_windows(starts)
                    rows = [(await backend.get_job(i), *spec[i]) for i in sorted(spec)]
                    _check_claim(rows, starts, step[1], len(result.jobs), next_due, now)
                    assert before is not None
                elif step[0] == "finish" and running:
                    job_id, attempt = running.pop(step[1] % len(running))
                    kind = step[2]
                    error = nj.JobError(attempt, now, "x") if kind in (OutcomeKind.RETRY, OutcomeKind.DISCARD) else None
                    run_at = None if step[3] is None or kind not in (OutcomeKind.RETRY, OutcomeKind.SNOOZE) else now + step[3]
                    await backend.finish_many([Outcome(job_id, attempt, kind, run_at, error)])
                elif step[0] == "cancel" and spec:
                    await backend.cancel(sorted(spec)[step[1] % len(spec)])
                elif step[0] == "advance":
                    await trio.sleep(step[1])
                elif step[0] == "sleep_to_next_due" and next_due is not None and next_due > now:
                    await trio.sleep_until(next_due)  # as the fetcher does
        finally:
            await backend.close()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


@settings(max_examples=examples(100), deadline=None)
@given(data=st.data())
def test_p18_rate_limits(data: st.DataObject) -> None:
    check(data)


class _OneStartTooMany(nj.MemoryBackend):
    """A planted fault: every job's rate is stored one start more generous than declared."""

    async def insert_many(self, jobs: Sequence[NewJob]) -> list[InsertResult]:
        return await super().insert_many([j._replace(rate_limit=j.rate_limit + 1) if j.rate_limit else j for j in jobs])


class _Oversleeps(nj.MemoryBackend):
    """A planted fault: a claim reports each next due time a second late."""

    async def claim(self, queue: str, limit: int, *, max_running: int | None = None) -> ClaimResult:
        got = await super().claim(queue, limit, max_running=max_running)
        return ClaimResult(got.jobs, None if got.next_due is None else got.next_due + 1.0)


@pytest.mark.parametrize("fault", [_OneStartTooMany, _Oversleeps], ids=["one-start-too-many", "oversleeps"])
def test_p18_turns_red_on_a_planted_fault(fault: type[nj.MemoryBackend]) -> None:
    """P18 is no toy: a backend that lets one start too many through, or sleeps past a slot,
    fails it (and the failure is P18's)."""

    @settings(max_examples=300, database=None, phases=[Phase.generate], deadline=None)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        check(data, store=Store("planted", fault))

    with pytest.raises(PropertyFailed) as failed:
        run()
    assert failed.value.prop == "P18"
