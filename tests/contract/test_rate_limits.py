"""`claim` under per-key rate limits, called directly: a job whose rate key has had its
`rate_limit` starts in the last `rate_per` seconds is not claimed (no attempt, no write) and
holds back nothing else; the claim's `next_due` is the exact time the key's next slot frees;
every attempt's start counts; keys are independent; a job may carry both limits
(protocol.py's `claim` docstring, `rules.admit_rated`, docs/rate_limits.md)."""

from __future__ import annotations

import trio

import nursery_jobs as nj
from nursery_jobs.backends import NewJob, Outcome, OutcomeKind

from .common import Q, new, opened


def rated(
    key: str | None,
    limit: int = 2,
    per: float = 10.0,
    *,
    priority: int = 0,
    queue: str = Q,
    ckey: str | None = None,
    max_concurrent: int = 1,
) -> NewJob:
    return new(priority=priority, queue=queue)._replace(
        rate_key=key,
        rate_limit=None if key is None else limit,
        rate_per=None if key is None else per,
        concurrency_key=ckey,
        max_concurrent=None if ckey is None else max_concurrent,
    )


async def claim_ids(backend: nj.Backend, limit: int = 10, queue: str = Q) -> tuple[list[int], float | None]:
    result = await backend.claim(queue, limit)
    return [j.id for j in result.jobs], result.next_due


async def test_a_key_over_its_rate_is_not_claimed_until_its_slot_and_spends_no_attempt(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        a, b, c = [r.id for r in await backend.insert_many([rated("k") for _ in range(3)])]
        t0 = backend.now()
        first, _ = await claim_ids(backend)
        again, due = await claim_ids(backend)
        held = await backend.get_job(c)
        await trio.sleep_until(t0 + 9.5)
        early, _ = await claim_ids(backend)
        await trio.sleep_until(t0 + 10)
        late, after = await claim_ids(backend)
    assert first == [a, b] and again == [] and early == []
    assert due == t0 + 10  # the first start leaves the window then
    assert (held.state, held.attempt, held.attempted_at) == (nj.JobState.AVAILABLE, 0, None)
    assert late == [c] and after is None


async def test_next_due_is_the_exact_time_of_each_next_slot(make_backend, autojump_clock) -> None:
    """Starts at t0, t0 and t0+3 under 3 per 10 s: the next slots come at t0+10 (two) and
    t0+13 (one), and each claim reports the next one."""
    async with opened(make_backend) as backend:
        ids = [r.id for r in await backend.insert_many([rated("k", 3) for _ in range(2)])]
        t0 = backend.now()
        got = [await claim_ids(backend)]
        await trio.sleep_until(t0 + 3)
        ids += [r.id for r in await backend.insert_many([rated("k", 3) for _ in range(4)])]
        got.append(await claim_ids(backend))
        got.append(await claim_ids(backend))
        await trio.sleep_until(got[-1][1] or 0)
        got.append(await claim_ids(backend))
        await trio.sleep_until(got[-1][1] or 0)
        got.append(await claim_ids(backend))
    assert got == [
        (ids[:2], None),
        ([ids[2]], t0 + 10),
        ([], t0 + 10),
        (ids[3:5], t0 + 13),
        ([ids[5]], None),  # nothing waits any more
    ]


async def test_a_key_over_its_rate_holds_back_no_other_key_no_unlimited_job_and_no_other_queue(
    make_backend, autojump_clock
) -> None:
    """The busy key's jobs come first in claim order (higher priority): each claim of one job
    passes over them to the next job it may start."""
    async with opened(make_backend) as backend:
        busy = [r.id for r in await backend.insert_many([rated("busy", 1, priority=5) for _ in range(20)])]
        other = [r.id for r in await backend.insert_many([rated("other", 1), rated(None), rated("busy", 1, queue="q2")])]
        got = [(await claim_ids(backend, 1))[0] for _ in range(4)]
        q2, _ = await claim_ids(backend, 1, queue="q2")
    assert got == [[busy[0]], [other[0]], [other[1]], []]
    assert q2 == []  # the key is shared across queues: its one start per 10 s was made in q


async def test_keys_are_independent_and_one_key_shares_its_rate_across_queues(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        jobs = [rated("a", 1), rated("a", 1), rated("b", 1), rated("b", 1), rated("a", 1, queue="q2")]
        a1, a2, b1, b2, a3 = [r.id for r in await backend.insert_many(jobs)]
        t0 = backend.now()
        first, due = await claim_ids(backend)
        other_queue, due2 = await claim_ids(backend, queue="q2")
        await trio.sleep_until(t0 + 10)
        second, _ = await claim_ids(backend)
        third, _ = await claim_ids(backend, queue="q2")
    assert sorted(first) == [a1, b1] and due == t0 + 10
    assert other_queue == [] and due2 == t0 + 10
    assert sorted(second) == [a2, b2] and third == []  # q's claim came first at t0+10: a's slot went to a2


async def test_every_attempts_start_counts(make_backend, autojump_clock) -> None:
    """A retry due at once is one more request to the key's endpoint: it waits for a slot."""
    async with opened(make_backend) as backend:
        (job_id,) = [r.id for r in await backend.insert_many([rated("k", 1)])]
        t0 = backend.now()
        (job,) = (await backend.claim(Q, 10)).jobs
        await trio.sleep(1)
        await backend.finish_many([Outcome(job.id, job.attempt, OutcomeKind.RETRY, None)])
        refused, due = await claim_ids(backend)
        await trio.sleep_until(t0 + 10)
        (again,) = (await backend.claim(Q, 10)).jobs
        await backend.finish_many([Outcome(again.id, again.attempt, OutcomeKind.INTERRUPTED)])
        given_back, due_after = await claim_ids(backend)  # a start given back still happened
    assert refused == [] and due == t0 + 10
    assert (again.id, again.attempt) == (job_id, 2)
    assert given_back == [] and due_after == t0 + 20


async def test_a_job_with_both_limits_starts_only_when_both_admit_it(make_backend, autojump_clock) -> None:
    """Concurrency 1 and 2 starts per 10 s on one key: the second job waits for the first to
    finish, the third for the rate, though the key has nothing running then."""
    async with opened(make_backend) as backend:
        a, b, c = [r.id for r in await backend.insert_many([rated("k", 2, ckey="k") for _ in range(3)])]
        t0 = backend.now()
        (first,) = (await backend.claim(Q, 10)).jobs
        by_key, due_key = await claim_ids(backend)
        await trio.sleep(1)
        await backend.finish_many([Outcome(first.id, first.attempt, OutcomeKind.COMPLETED)])
        (second,) = (await backend.claim(Q, 10)).jobs
        await backend.finish_many([Outcome(second.id, second.attempt, OutcomeKind.COMPLETED)])
        by_rate, due_rate = await claim_ids(backend)
        await trio.sleep_until(t0 + 10)
        third, _ = await claim_ids(backend)
    assert (first.id, by_key, due_key) == (a, [], None)
    assert (second.id, by_rate, due_rate) == (b, [], t0 + 10)
    assert third == [c]


async def test_a_keys_jobs_start_in_claim_order_after_waiting_for_their_slots(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        ids = [r.id for r in await backend.insert_many([rated("k", 1, priority=p) for p in (0, 5, 0, 5, 1)])]
        order: list[int] = []
        for _ in ids:
            got, due = await claim_ids(backend)
            if not got:
                assert due is not None
                await trio.sleep_until(due)
                got, due = await claim_ids(backend)
            order += got
    assert order == [ids[1], ids[3], ids[4], ids[0], ids[2]]


async def test_next_due_is_the_earlier_of_a_later_job_and_a_slot(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        t0 = backend.now()
        await backend.insert_many([rated("k", 1), rated("k", 1), new(delay=4, now=t0), new(delay=30, now=t0)])
        _, first = await claim_ids(backend)
        await trio.sleep_until(t0 + 4)
        _, second = await claim_ids(backend)
    assert first == t0 + 4 and second == t0 + 10


async def test_concurrent_claims_never_exceed_a_rate(store, autojump_clock) -> None:
    """Three instances on one store, as three processes, claim one key's backlog at once:
    each window holds at most the rate, and every job starts in the end."""
    backends = [store.open() for _ in range(3)]
    for backend in backends:
        await backend.open()
    try:
        ids = {r.id for r in await backends[0].insert_many([rated("k", 3, 5.0) for _ in range(12)])}
        starts: list[float] = []

        async def claimer(backend: nj.Backend) -> None:
            while len(starts) < len(ids):
                result = await backend.claim(Q, 2)
                starts.extend(backend.now() for _ in result.jobs)
                await trio.sleep(0.5)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for backend in backends:
                    nursery.start_soon(claimer, backend)
    finally:
        for backend in backends:
            await backend.close()
    starts.sort()
    assert len(starts) == 12
    assert all(starts[i] + 5.0 <= starts[i + 3] for i in range(len(starts) - 3)), starts


async def test_a_large_batch_stores_each_jobs_rate(make_backend, autojump_clock) -> None:
    """60 jobs in one `insert_many` (PostgreSQL's COPY path from 50 on), over 3 keys of 4 per
    10 s and unlimited jobs: one claim takes 4 of each key and every unlimited job."""
    async with opened(make_backend) as backend:
        jobs = [rated(f"k{i % 3}" if i % 4 else None, 4) for i in range(60)]
        results = await backend.insert_many(jobs)
        t0 = backend.now()
        got = (await backend.claim(Q, 100)).jobs
        keys = {r.id: j.rate_key for r, j in zip(results, jobs)}
        _, due = await claim_ids(backend)
    per_key: dict[str | None, int] = {}
    for job in got:
        per_key[keys[job.id]] = per_key.get(keys[job.id], 0) + 1
    assert per_key == {"k0": 4, "k1": 4, "k2": 4, None: 15}
    assert due == t0 + 10


async def test_a_rate_under_the_queues_global_limit(make_backend, autojump_clock) -> None:
    """`max_running` 2 and 3 starts per 10 s: the queue's limit stops the first claim at 2, the
    rate the second at 1, though the queue then has room for 2."""
    async with opened(make_backend) as backend:
        ids = [r.id for r in await backend.insert_many([rated("k", 3) for _ in range(5)])]
        t0 = backend.now()
        first = (await backend.claim(Q, 10, max_running=2)).jobs
        await backend.finish_many([Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in first])
        second = await backend.claim(Q, 10, max_running=2)
    assert [j.id for j in first] == ids[:2]
    assert [j.id for j in second.jobs] == [ids[2]] and second.next_due == t0 + 10


async def test_a_rate_backlog_longer_than_one_claim_reads_holds_back_no_unlimited_job(make_backend, autojump_clock) -> None:
    """1,200 due jobs of a key at 1 start per 60 s ahead of unlimited ones: more than a claim
    of 10 reads at once on a backend that parks (1,000 beyond its limit). The jobs refused for
    their rate are parked, so the unlimited jobs start within the next claims, none of the
    refused ones spends an attempt, and a claim after that finds nothing and reports the slot."""
    async with opened(make_backend) as backend:
        slow = [r.id for r in await backend.insert_many([rated("slow", 1, 60.0, priority=5) for _ in range(1_200)])]
        free = [r.id for r in await backend.insert_many([rated(None) for _ in range(3)])]
        t0 = backend.now()
        got: list[int] = []
        for _ in range(3):
            ids, _ = await claim_ids(backend, 10)
            got += ids
        last, due = await claim_ids(backend, 10)
        rows = [await backend.get_job(i) for i in slow[1::199]]
    assert got == [slow[0], *free]
    assert last == [] and due == t0 + 60
    assert all((r.state, r.attempt) == (nj.JobState.AVAILABLE, 0) for r in rows)


async def test_a_parked_rate_backlog_comes_back_one_window_at_a_time_in_claim_order(make_backend, autojump_clock) -> None:
    """30 jobs of a key at 3 per 10 s, with priorities: after the first claim the rest wait
    parked; at each slot exactly the window's 3 come back and start, best first, and the
    claim in between starts none and reports the slot."""
    async with opened(make_backend) as backend:
        jobs = [rated("k", 3, 10.0, priority=n % 4) for n in range(30)]
        ids = [r.id for r in await backend.insert_many(jobs)]
        order = sorted(range(30), key=lambda n: (-(n % 4), n))
        t0 = backend.now()
        windows: list[list[int]] = []
        dues: list[float | None] = []
        for w in range(10):
            await trio.sleep_until(t0 + 10 * w)
            got, _ = await claim_ids(backend, 10)
            windows.append(got)
            again, due = await claim_ids(backend, 10)
            assert again == []
            dues.append(due)
    assert windows == [[ids[n] for n in order[3 * w : 3 * w + 3]] for w in range(10)]
    assert dues[:9] == [t0 + 10 * (w + 1) for w in range(9)]


async def test_a_concurrency_keys_freed_slot_is_not_spent_on_a_job_waiting_for_its_rate(make_backend, autojump_clock) -> None:
    """Concurrency key c's best waiting job also waits for its rate (key r, over its rate), the
    next one only for c's slot: when c's running job ends, the freed slot goes to the second
    (within the claims that follow, with no rescue pass), and the first starts at r's slot."""
    async with opened(make_backend) as backend:
        first, waits, runs, behind = [
            r.id
            for r in await backend.insert_many(
                [rated("r", 1, 60.0), rated("r", 1, 60.0, ckey="c"), rated(None, ckey="c"), rated(None, ckey="c")]
            )
        ]
        t0 = backend.now()
        started = []
        for _ in range(2):  # the second claim parks what the first refused (the rate's record was new)
            started += (await backend.claim(Q, 10)).jobs
        running = {j.id: j for j in started}
        await backend.finish_many([Outcome(runs, running[runs].attempt, OutcomeKind.COMPLETED)])
        freed = []
        for _ in range(2):
            freed += (await backend.claim(Q, 10)).jobs
        await backend.finish_many([Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in freed])
        early, due = await claim_ids(backend)
        await trio.sleep_until(t0 + 60)
        late, _ = await claim_ids(backend)
    assert sorted(running) == [first, runs]
    assert [j.id for j in freed] == [behind]
    assert early == [] and due == t0 + 60
    assert late == [waits]


async def test_jobs_of_one_key_with_different_rates_are_each_held_to_their_own(make_backend, autojump_clock) -> None:
    """Three kinds share key k: a at 2 per 100 s, c at 1 per 1 s, j at 3 per 100 s. a starts at
    t0 and t0+5; at t0+6 one claim starts c (its own window holds no start) and refuses j: its
    window (t0-94, t0+6] holds a's two starts and c's. The record written after that claim keeps
    all three for j, so j stays refused (parked, no attempt) until t0+100, when a's first start
    leaves its window, and every claim in between reports that slot."""
    async with opened(make_backend) as backend:
        t0 = backend.now()
        first = [r.id for r in await backend.insert_many([rated("k", 2, 100.0)])]
        got = [await claim_ids(backend)]
        await trio.sleep_until(t0 + 5)
        second = [r.id for r in await backend.insert_many([rated("k", 2, 100.0)])]
        got.append(await claim_ids(backend))
        await trio.sleep_until(t0 + 6)
        c, j = [r.id for r in await backend.insert_many([rated("k", 1, 1.0), rated("k", 3, 100.0)])]
        mixed = await claim_ids(backend)
        again = await claim_ids(backend)
        await trio.sleep_until(t0 + 50)
        later = await claim_ids(backend)
        held = await backend.get_job(j)
        await trio.sleep_until(t0 + 100)
        slot, _ = await claim_ids(backend)
    assert [ids for ids, _ in got] == [first, second]
    assert mixed == ([c], t0 + 100)
    assert again == ([], t0 + 100) and later == ([], t0 + 100)
    assert (held.state, held.attempt) == (nj.JobState.AVAILABLE, 0)
    assert slot == [j]


async def test_a_key_that_only_refused_a_job_keeps_the_starts_its_window_counts(make_backend, autojump_clock) -> None:
    """a at 2 per 100 s starts at t0 and t0+5; j, 2 per 1,000 s, is refused at t0+6 (its
    window holds both) by a claim that starts nothing of the key. At t0+150 a starts again,
    and the record written then still keeps the start at t0+5 for j's longer window: at t0+1000
    j is refused again (t0+5 and t0+150 are in its window) until t0+1005."""
    async with opened(make_backend) as backend:
        t0 = backend.now()
        a = [r.id for r in await backend.insert_many([rated("k", 2, 100.0)])]
        await claim_ids(backend)  # one start at t0 ...
        await trio.sleep_until(t0 + 5)
        a += [r.id for r in await backend.insert_many([rated("k", 2, 100.0)])]
        a += (await claim_ids(backend))[0]  # ... the other at t0+5
        await trio.sleep_until(t0 + 6)
        (j,) = [r.id for r in await backend.insert_many([rated("k", 2, 1000.0)])]
        refused = await claim_ids(backend)
        await trio.sleep_until(t0 + 150)
        (a3,) = [r.id for r in await backend.insert_many([rated("k", 2, 100.0)])]
        third = await claim_ids(backend)
        await trio.sleep_until(t0 + 1000)
        late = await claim_ids(backend)
        await trio.sleep_until(t0 + 1005)
        slot, _ = await claim_ids(backend)
    assert a == [1, 2, 2] and refused == ([], t0 + 1000)
    assert third[0] == [a3]
    assert late == ([], t0 + 1005)
    assert slot == [j]
