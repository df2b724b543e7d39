"""The memory backend's parked entries stay bounded: a key that stays full while its jobs are
enqueued, passed over and cancelled keeps no more entries than about twice its live ones."""

from __future__ import annotations

import nursery_jobs as nj
from nursery_jobs.backends import NewJob, Outcome, OutcomeKind


def keyed() -> NewJob:
    return NewJob("work", "q", "{}", 0, None, 5, None, "k", 1)


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
