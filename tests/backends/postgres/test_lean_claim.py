"""The lean claim (`claim_lean`): a queue whose claims have been plain starts each claim with
the short statement, which claims the plain prefix of the claim order and defers to the full
claim statement whenever that one has work to do first. The claim's result must be the full
statement's on every case: a scheduled job come due (which may outrank the available ones), a
keyed or rate-keyed job in the prefix, a rate wake time come. Each case here forces the lean
start (`_lean[queue] = 0`) and checks the jobs, their order, the next due time and the round
trips (counted at the bridge: conftest.py). The conformance and contract suites
pass with every claim started lean (RESULTS.md, h-pg1w)."""

from __future__ import annotations

import psycopg
import pytest

from nursery_jobs.backends import NewJob, Outcome, OutcomeKind
from nursery_jobs.backends.postgres import _LEAN_PAUSE, PostgresBackend
from tests import pgutil

T0 = 1_000_000.0


@pytest.fixture
async def backend(pg_url):
    clock = [T0]
    b = PostgresBackend(pg_url, schema=pgutil.new_schema(pg_url), poll_interval=None, clock=lambda: clock[0])
    b.check_budget(1)
    b.test_clock = clock  # type: ignore[attr-defined]
    await b.open()
    yield b
    await b.close()


def job(priority: int = 0, *, run_at: float | None = None, key: str | None = None, rate: str | None = None) -> NewJob:
    return NewJob("k", "q", "{}", priority, run_at, 3, None, key, 1 if key else None, rate, 1 if rate else None, 60.0 if rate else None)


async def ids(backend: PostgresBackend, jobs: list[NewJob]) -> list[int]:
    return [r.id for r in await backend.insert_many(jobs)]


async def claim(backend: PostgresBackend, waits: list[int], limit: int) -> tuple[list[int], float | None, int]:
    """The claimed ids in order, the next due time, and the round trips the claim took."""
    before = waits[0]
    result = await backend.claim("q", limit)
    return [j.id for j in result.jobs], result.next_due, waits[0] - before


async def test_a_plain_queue_turns_lean_after_a_plain_claim_and_stays_one_round_trip(backend, waits) -> None:
    await backend.claim("q", 1)  # opens the connection; an empty claim shows nothing
    assert "q" not in backend._lean
    first = await ids(backend, [job() for _ in range(6)])
    assert (await claim(backend, waits, 2))[::2] == (first[:2], 1)
    assert backend._lean["q"] == 0  # plain jobs claimed: the next claim starts lean
    later = await ids(backend, [job(run_at=T0 + 30)])
    assert await claim(backend, waits, 3) == (first[2:5], T0 + 30, 1)
    assert await claim(backend, waits, 3) == (first[5:], T0 + 30, 1)
    assert backend._lean["q"] == 0
    backend.test_clock[0] = T0 + 31
    assert (await claim(backend, waits, 3))[0] == later  # come due: the full claim promotes and claims it


async def test_a_due_scheduled_job_that_outranks_the_available_ones_comes_first(backend, waits) -> None:
    await backend.claim("q", 1)
    backend._lean["q"] = 0
    plain = await ids(backend, [job(), job()])
    (due,) = await ids(backend, [job(5, run_at=T0 + 10)])
    backend.test_clock[0] = T0 + 11
    # The lean statement claims nothing while a waiting job is due: the full one runs.
    assert await claim(backend, waits, 1) == ([due], None, 2)
    assert backend._lean["q"] == _LEAN_PAUSE
    assert await claim(backend, waits, 5) == (plain, None, 1)  # the full statement directly


async def test_two_jobs_of_one_key_in_the_prefix_the_second_parked_by_the_full_statement(backend, waits, pg_url) -> None:
    await backend.claim("q", 1)
    backend._lean["q"] = 0
    a, k2, k, b, c = await ids(backend, [job(9), job(8, key="x"), job(7, key="x"), job(1), job(0)])
    # The lean statement claims `a` and hands k2 and k (x looks free to its snapshot) to
    # `claim_picked`, which starts k2 and refuses k (x is full now); the full statement, behind
    # them, passes over and parks k and claims b: as one full claim does, in two round trips.
    assert await claim(backend, waits, 3) == ([a, k2, b], None, 2)
    assert backend._lean["q"] == _LEAN_PAUSE  # the next claims run the full statement directly
    assert await claim(backend, waits, 3) == ([c], None, 1)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        (parked,) = conn.execute(f'SELECT parked FROM "{backend.schema}".jobs WHERE id = %s', (k,)).fetchone()  # type: ignore[misc]
    assert parked  # passed over for its full key, by the full statement, as without the lean start


async def test_a_keyed_queue_whose_keys_have_room_claims_lean_in_one_round_trip(backend, waits) -> None:
    await backend.claim("q", 1)
    first = await ids(backend, [job(key=f"k{i % 4}") for i in range(12)])
    assert await claim(backend, waits, 4) == (first[:4], None, 1)
    assert backend._lean["q"] == 0  # every keyed pick started, none with a rate: lean next
    # k0..k3 are full: the lean statement finds the next row's key full and defers to the full
    # one, which parks the eight jobs behind the full keys and looks again behind them.
    assert await claim(backend, waits, 4) == ([], None, 3)
    assert backend._lean["q"] == _LEAN_PAUSE
    await backend.finish_many([Outcome(i, 1, OutcomeKind.COMPLETED) for i in first[:4]])
    backend._lean["q"] = 0
    # The four keys' slots freed: each key's next job, in claim order, lean and in one trip.
    assert await claim(backend, waits, 4) == (first[4:8], None, 1)
    assert backend._lean["q"] == 0


async def test_a_full_key_ends_the_lean_prefix_and_its_job_is_parked(backend, waits, pg_url) -> None:
    await backend.claim("q", 1)
    x1, x2, p = await ids(backend, [job(5, key="x"), job(4, key="x"), job(0)])
    assert (await claim(backend, waits, 1))[0] == [x1]
    backend._lean["q"] = 0
    # x is full: the lean statement's prefix stops at x2 (not lean) and claims nothing; the
    # full statement parks x2 and claims p, and looks again behind what it parked.
    assert await claim(backend, waits, 2) == ([p], None, 3)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        (parked,) = conn.execute(f'SELECT parked FROM "{backend.schema}".jobs WHERE id = %s', (x2,)).fetchone()  # type: ignore[misc]
    assert parked


async def test_the_pause_counts_full_claims_and_a_plain_one_ends_it(backend, waits) -> None:
    await backend.claim("q", 1)
    backend._lean["q"] = 2
    first = await ids(backend, [job(), job(), job()])
    assert await claim(backend, waits, 1) == (first[:1], None, 1)
    assert backend._lean["q"] == 1
    assert await claim(backend, waits, 1) == (first[1:2], None, 1)
    assert backend._lean["q"] == 0  # plain, with the pause over
    assert await claim(backend, waits, 1) == (first[2:], None, 1)


async def test_a_rate_wake_time_that_came_sends_the_claim_to_the_full_statement(backend, waits, pg_url) -> None:
    await backend.claim("q", 1)
    r1, r2 = await ids(backend, [job(rate="r"), job(rate="r")])
    got, due, _ = await claim(backend, waits, 2)  # r1 starts; r2 is parked with the key's wake time
    assert got == [r1] and due is not None and due > T0
    with psycopg.connect(pg_url, autocommit=True) as conn:
        (wake,) = conn.execute(f'SELECT wake FROM "{backend.schema}".rate_wakes WHERE queue = %s', ("q",)).fetchone()  # type: ignore[misc]
    plain = await ids(backend, [job(-1)])
    backend._lean["q"] = 0
    # Before the wake time: the lean statement claims the plain job and reports the wake time.
    assert await claim(backend, waits, 1) == (plain, wake, 1)
    assert backend._lean["q"] == 0
    # Once it came: the full claim and `rate_release` bring r2 back and claim it.
    backend.test_clock[0] = wake + 0.001
    (got, _, trips) = await claim(backend, waits, 2)
    assert got == [r2] and trips >= 3
