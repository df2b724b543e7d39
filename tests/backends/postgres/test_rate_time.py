"""Two claims of one rate key whose times disagree with the order they take the key's lock in.

A claim's time is read by its client before its statement waits for the key's lock, so the
claim whose time is later can take the lock first and commit. Replayed here deterministically,
each backend with a clock of its own: by hand (the later time's claim simply runs first), and
by the server's locks (a claim waits for the lock another transaction holds). The time a key
is weighed at is taken once the lock is held (`rules.rate_time`, migration 0018): never
before the key's latest recorded start, and moved on by the wait for the lock. The starts the
database recorded (`attempted_at`, and the key's record) are then in time order and hold the
rate."""

from __future__ import annotations

import psycopg
import trio

from nursery_jobs.backends import NewJob
from nursery_jobs.backends.postgres import PostgresBackend
from tests import pgutil

T0 = 1_000_000.0
LIMIT, PER = 2, 1.0


def rated(key: str) -> NewJob:
    return NewJob("k", "q", "{}", 0, None, 3, None, None, None, key, LIMIT, PER)


def _backend(pg_url: str, schema: str, clock: list[float]) -> PostgresBackend:
    backend = PostgresBackend(pg_url, schema=schema, poll_interval=None, clock=lambda: clock[0])
    backend.check_budget(1)
    return backend


def _recorded(pg_url: str, schema: str, key: str) -> tuple[list[float], list[float]]:
    """The started jobs' `attempted_at`, ascending, and the key's record as stored."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        attempted = [r[0] for r in conn.execute(
            f'SELECT attempted_at FROM "{schema}".jobs WHERE attempted_at IS NOT NULL ORDER BY attempted_at')]  # fmt: skip
        row = conn.execute(f'SELECT starts FROM "{schema}".rate_keys WHERE key = %s', (key,)).fetchone()
    return attempted, list(row[0]) if row else []


def _hold_the_rate(starts: list[float]) -> bool:
    return all(starts[i] + PER <= starts[i + LIMIT] for i in range(len(starts) - LIMIT))


async def test_a_claim_with_an_earlier_time_that_commits_after_a_later_one_counts_its_starts(pg_url: str) -> None:
    """Two starts at t0 + 1.15; a claim at t0 + 2.15 starts one and trims the record to its
    window, where those two have just left it; then a claim whose time is t0 + 2.10 (read
    before the other committed) comes. Weighed at its own time it would see one start where
    its window holds three, and start one more: three starts within a second. Weighed at the
    key's latest start (t0 + 2.15), it starts one there, and refuses the next."""
    schema = pgutil.new_schema(pg_url)
    ca, cb = [T0 + 1.15], [T0 + 2.15]
    a, b = _backend(pg_url, schema, ca), _backend(pg_url, schema, cb)
    await a.open()
    await b.open()
    try:
        ids = [r.id for r in await a.insert_many([rated("api") for _ in range(5)])]
        assert [j.id for j in (await a.claim("q", 2)).jobs] == ids[:2]
        assert [j.id for j in (await b.claim("q", 1)).jobs] == ids[2:3]
        ca[0] = T0 + 2.10
        late = await a.claim("q", 3)
    finally:
        await a.close()
        await b.close()
    attempted, record = _recorded(pg_url, schema, "api")
    assert [j.id for j in late.jobs] == ids[3:4] and late.next_due == T0 + 2.15 + PER
    assert attempted == [T0 + 1.15, T0 + 1.15, T0 + 2.15, T0 + 2.15], attempted
    assert _hold_the_rate(attempted) and record == sorted(record) == [T0 + 2.15, T0 + 2.15]


async def test_a_claim_that_waited_for_the_keys_lock_counts_its_start_from_the_end_of_the_wait(pg_url: str) -> None:
    """Another transaction claims a job of the key at t0 + 2.15 (`claim_picked_parking`, as the
    claim statement calls it) and holds the key's lock; a claim whose time is t0 + 2.10 waits
    for it, seen waiting by the server, for at least HOLD seconds before the other commits.
    Its start is counted after the wait: in time order after the other's, and at least HOLD
    after its own time."""
    hold = 0.3
    schema = pgutil.new_schema(pg_url)
    clock = [T0 + 2.10]
    a = _backend(pg_url, schema, clock)
    await a.open()
    other = psycopg.connect(pg_url)  # a transaction, not autocommit: it holds the lock to its commit
    try:
        ids = [r.id for r in await a.insert_many([rated("api") for _ in range(3)])]
        other.execute(
            f'SELECT count(*) FROM "{schema}".claim_picked_parking(%s::bigint[], %s::text[], %s::int[], %s::text[],'
            " %s::int[], %s::float8[], 'q', 1, NULL::int, %s)",
            ([ids[0]], [None], [1], ["api"], [LIMIT], [PER], T0 + 2.15),
        )
        waiting = (
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND classid = (hashtext('nursery_jobs rate_lock ' || %s)::bigint & 4294967295)::oid"
            " AND objid = (hashtext('rate api')::bigint & 4294967295)::oid"
        )
        result = None

        async def claim() -> None:
            nonlocal result
            result = await a.claim("q", 2)

        with psycopg.connect(pg_url, autocommit=True) as watcher, trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(claim)
                while watcher.execute(waiting, (schema,)).fetchone() != (1,):
                    await trio.sleep(0.01)
                await trio.sleep(hold)
                other.commit()
    finally:
        other.close()
        await a.close()
    assert result is not None and [j.id for j in result.jobs] == ids[1:2]
    attempted, record = _recorded(pg_url, schema, "api")
    assert attempted[0] == T0 + 2.15 and attempted[1] >= T0 + 2.10 + hold, attempted
    assert record == sorted(record) == attempted
