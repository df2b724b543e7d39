"""Round trips per operation on PostgreSQL: the counts the speed claims rest on (one enqueue is
one round trip with its NOTIFY; a batch is one statement or one COPY transaction; a claim and an
outcome batch are one statement each). Counted at the bridge: every time psycopg waits for the
server is one `TrioConnection.wait`."""

from __future__ import annotations

import psycopg
import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import NewJob, Outcome, OutcomeKind
from nursery_jobs.backends.postgres import PostgresBackend
from tests import pgutil


@pytest.fixture
async def backend(pg_url):
    b = PostgresBackend(pg_url, schema=pgutil.new_schema(pg_url))
    b.check_budget(1)
    await b.open()
    yield b
    await b.close()


def _jobs(n: int, queue: str = "q") -> list[NewJob]:
    return [NewJob("k", queue, '{"n": %d}' % i, 0, None, 3) for i in range(n)]


async def _trips(waits: list[int], call) -> int:
    await trio.sleep(0)
    before = waits[0]
    await call()
    return waits[0] - before


async def test_one_enqueue_is_one_round_trip(backend, waits):
    await backend.insert_many(_jobs(1))  # the pool's first connection: not counted
    assert await _trips(waits, lambda: backend.insert_many(_jobs(1))) == 1


async def test_a_small_batch_is_one_round_trip_and_a_large_one_a_few(backend, waits):
    await backend.insert_many(_jobs(1))
    assert await _trips(waits, lambda: backend.insert_many(_jobs(20))) == 1
    # COPY: begin, reserve the ids (+ NOTIFY), the COPY and its data, commit -- 7 waits when
    # written, not one per job
    trips = await _trips(waits, lambda: backend.insert_many(_jobs(2000)))
    assert trips <= 10, trips


async def test_a_claim_and_an_outcome_batch_are_one_round_trip_each(backend, waits):
    await backend.claim("q", 1)  # the first claim opens its connection (synchronous_commit off)
    await backend.insert_many(_jobs(50))
    result = None

    async def claim():
        nonlocal result
        result = await backend.claim("q", 50)

    assert await _trips(waits, claim) == 1
    assert result is not None and len(result.jobs) == 50
    outcomes = [Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in result.jobs]
    assert await _trips(waits, lambda: backend.finish_many(outcomes)) == 1
    assert (await backend.stats())["q"].completed == 50


async def test_a_claim_of_keyed_jobs_is_one_round_trip_too(backend, waits):
    """Keyed jobs (and a queue's global limit) are claimed under the limits' locks by
    `claim_picked_parking`, which the claim statement calls itself (migrations 0013 and 0014)."""
    await backend.claim("q", 1)
    await backend.insert_many([NewJob("k", "q", "{}", 0, None, 3, None, f"key{i % 5}", 2) for i in range(20)])
    for max_running in (None, 100):
        result = None

        async def claim():
            nonlocal result
            result = await backend.claim("q", 4, max_running=max_running)

        assert await _trips(waits, claim) == 1
        assert result is not None and len(result.jobs) == 4


async def test_jobs_of_a_key_over_its_rate_that_claim_picked_parking_refuses_are_parked_by_it(backend, waits, pg_url):
    """Under a queue's global limit, five due jobs of a key allowed 1 start per 60 s, which has
    no record yet: the claim's scan sees the key open and picks all five, and
    `claim_picked_parking` starts one and refuses four for the rate under the key's lock, and
    parks them itself (migration 0014), with the key's wake time at its next slot, which the
    claim reports. The global limit has room left, so a pick cut short by a rate does not end
    the claim (migration 0015): it looks once more behind them and finds nothing -- two round
    trips; the next claim reads none of the parked jobs, in one round trip."""
    await backend.claim("q", 1)
    await backend.insert_many([NewJob("k", "q", "{}", 0, None, 3, None, None, None, "r", 1, 60.0) for _ in range(5)])
    results = []

    async def claim():
        results.append(await backend.claim("q", 10, max_running=100))

    assert await _trips(waits, claim) == 2
    with psycopg.connect(pg_url, autocommit=True) as conn:
        (parked,) = conn.execute(
            f'SELECT count(*) FROM "{backend.schema}".jobs WHERE state = %s AND parked AND rate_wait', ("available",)
        ).fetchone()  # type: ignore[misc]
        (wake,) = conn.execute(f'SELECT wake FROM "{backend.schema}".rate_wakes WHERE queue = %s AND key = %s', ("q", "r")).fetchone()  # type: ignore[misc]
    assert await _trips(waits, claim) == 1
    first, second = results
    assert len(first.jobs) == 1 and parked == 4 and first.next_due == wake
    assert second.jobs == [] and second.next_due == wake


async def test_a_cancel_is_one_round_trip(backend, waits):
    (job,) = await backend.insert_many(_jobs(1))
    assert await _trips(waits, lambda: backend.cancel(job.id)) == 1
    assert (await backend.get_job(job.id)).state is nj.JobState.CANCELLED
