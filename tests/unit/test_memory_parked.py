"""The memory backend's parked entries stay bounded: a key that stays full while its jobs are
enqueued, passed over and cancelled keeps no more entries than about twice its live ones. And a
freed slot wakes only what it can start: an outcome batch of keyed jobs with nothing parked
behind their keys emits no wake-up, one with parked jobs one per queue they went back to (the
fetcher is woken by the completer after every batch anyway; a wake-up per keyed job cost a
drain of one-key-per-job jobs about 1 us a job, issue 11)."""

from __future__ import annotations

import nursery_jobs as nj
from nursery_jobs.backends import JobsAvailable, NewJob, Outcome, OutcomeKind


def keyed(key: str = "k", queue: str = "q") -> NewJob:
    return NewJob("work", queue, "{}", 0, None, 5, None, key, 1)


def parked_entries(backend: nj.MemoryBackend) -> int:
    return sum(len(heap) for heap in backend._parked.get("k", {}).values())


async def test_cancelled_jobs_of_a_full_key_do_not_pile_up_in_its_parked_entries(autojump_clock) -> None:
    backend = nj.MemoryBackend()
    await backend.open()
    try:
        await backend.insert_many([keyed()])
        (first,) = (await backend.claim("q", 10)).jobs  # the key is full from now on
        (waiting,) = await backend.insert_many([keyed()])
        most = 0
        for _ in range(200):
            (r,) = await backend.insert_many([keyed()])
            assert (await backend.claim("q", 10)).jobs == []  # parks it (and `waiting`, once)
            assert await backend.cancel(r.id) is nj.JobState.CANCELLED
            most = max(most, parked_entries(backend))
        await backend.finish_many([Outcome(first.id, first.attempt, OutcomeKind.COMPLETED)])
        after = [j.id for j in (await backend.claim("q", 10)).jobs]
    finally:
        await backend.close()
    assert most <= 4, most
    assert after == [waiting.id]  # the live parked job survived every compaction


async def test_a_batch_of_keyed_outcomes_wakes_a_queue_once_and_only_for_jobs_a_slot_let_back(autojump_clock) -> None:
    backend = nj.MemoryBackend()
    events: list[object] = []
    backend.add_listener(events.append)
    await backend.open()
    try:
        await backend.insert_many([keyed(f"k{i}") for i in range(32)])
        first = (await backend.claim("q", 32)).jobs
        events.clear()
        await backend.finish_many([Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in first])
        alone = [e for e in events if isinstance(e, JobsAvailable)]  # nothing waits behind these keys

        await backend.insert_many([keyed(f"k{i}") for i in range(8)])
        running = (await backend.claim("q", 32)).jobs
        behind = await backend.insert_many([keyed(f"k{i}", "q" if i < 4 else "other") for i in range(8)])
        assert (await backend.claim("q", 32)).jobs == [] and (await backend.claim("other", 32)).jobs == []  # parked
        events.clear()
        await backend.finish_many([Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in running])
        woken = [e for e in events if isinstance(e, JobsAvailable)]
        started = {q: [j.id for j in (await backend.claim(q, 32)).jobs] for q in ("q", "other")}
    finally:
        await backend.close()
    assert alone == []
    assert woken == [JobsAvailable("q"), JobsAvailable("other")]  # one each, "other" too: keys span queues
    assert started == {"q": [r.id for r in behind[:4]], "other": [r.id for r in behind[4:]]}
