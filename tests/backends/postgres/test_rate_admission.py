"""The rate steps of `claim_picked` against `rules.admit_rated`, pick by pick.

The function restates the rule in SQL (migration 0018): each rate key weighed at its
`rate_time` (the claim's time, or the key's latest recorded start when that is later: a claim
whose time was later committed first), `rate_slot` per candidate counting the claim's own
starts, the record written as `rate_log` writes it, and each started job's `attempted_at` at
its key's `rate_time`. For random records (some with starts after the claim's time) and random
picks over a few keys, limits and windows (several rates within a key too), it starts the same
jobs, reports the same next slot and leaves the same records as the Python rule. Times are on
a half-second grid, so every comparison is exact. Each case is written, claimed and rolled back
in one transaction on one connection (no other claim: the wait for the keys' locks is 0)."""

from __future__ import annotations

import random

import psycopg
import pytest

from nursery_jobs.rules import Candidate, admit_rated, rate_log, rate_slot, rate_time
from tests import pgutil

NOW = 1000.0
KEYS = (None, "r1", "r2", "r3")
PERS = (1.0, 2.5, 5.0, 10.0)


def _record(rng: random.Random) -> tuple[list[float], int, float]:
    """A key's record: ascending starts on the grid, some maybe after NOW, with its cap and per."""
    starts = sorted(NOW + 0.5 * rng.randint(-24, 4) for _ in range(rng.randint(0, 4)))
    return starts, max(len(starts), rng.randint(1, 4)), rng.choice(PERS)


def _case(rng: random.Random) -> tuple[list[Candidate], dict[str, tuple[list[float], int, float]], int]:
    records = {k: _record(rng) for k in KEYS[1:] if rng.random() < 0.7}
    uniform = rng.random() < 0.5
    rates = {k: (rng.randint(1, 3), rng.choice(PERS)) for k in KEYS[1:]}
    candidates: list[Candidate] = []
    for _ in range(rng.randint(1, 10)):
        key = rng.choice(KEYS)
        if key is None:
            candidates.append((None, None, None, None, None))
        else:
            limit, per = rates[key] if uniform else (rng.randint(1, 3), rng.choice(PERS))
            candidates.append((None, None, key, limit, per))
    return candidates, records, rng.randint(1, 8)


@pytest.mark.parametrize("seed", range(4))
def test_claim_picked_weighs_rates_as_transitions_admit_rated_does(pg_url: str, seed: int) -> None:
    schema = pgutil.new_schema(pg_url)
    rng = random.Random(seed)
    insert = (
        f'INSERT INTO "{schema}".jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at,'
        " rate_key, rate_limit, rate_per) VALUES ('k', 'q', '{{}}', 'available', 3, 0, %s, 0, %s, %s, %s) RETURNING id"
    )
    record = f'INSERT INTO "{schema}".rate_keys (key, starts, cap, per, last) VALUES (%s, %s, %s, %s, %s)'
    claim = (
        f'SELECT id, run_at FROM "{schema}".claim_picked(%s::bigint[], %s::text[], %s::int[], %s::text[],'
        " %s::int[], %s::float8[], 'q', %s, NULL::int, %s)"
    )
    with psycopg.connect(pg_url) as conn:
        for _ in range(60):
            candidates, records, want = _case(rng)
            for key, (starts, cap, per) in records.items():
                conn.execute(record, (key, starts, cap, per, starts[-1] if starts else NOW - 100))
            ids = [conn.execute(insert, (float(i), rkey, limit, per)).fetchone()[0]  # type: ignore[index]
                   for i, (_, _, rkey, limit, per) in enumerate(candidates)]  # fmt: skip
            n = len(ids)
            rows = conn.execute(
                claim, (ids, [None] * n, [1] * n, [c[2] for c in candidates], [c[3] or 1 for c in candidates],
                        [c[4] for c in candidates], want, NOW),
            ).fetchall()  # fmt: skip
            starts_of = {k: r[0] for k, r in records.items()}
            verdict = admit_rated(candidates, {}, starts_of, want=want, now=NOW)
            case = (candidates, records, want)
            assert sorted(r[0] for r in rows if r[0] is not None) == [ids[i] for i in verdict.started], case
            assert [r[1] for r in rows if r[0] is None] == ([] if verdict.rate_next is None else [verdict.rate_next]), case
            got = {
                k: (list(s), c, p, last)
                for k, s, c, p, last in conn.execute(f'SELECT key, starts, cap, per, last FROM "{schema}".rate_keys')
            }
            for key in KEYS[1:]:
                old, cap, per = records.get(key, ([], 1, 0.0))
                added = verdict.rate_started.get(key, 0)
                if not added:
                    assert (key in got) == (key in records), case
                    if key in got:
                        assert got[key][:3] == (old, cap, per), case
                    continue
                most, longest = verdict.rate_sized[key]
                grown = max(cap, most), max(per, longest)
                assert got[key] == (rate_log(old, added, NOW, *grown), *grown, rate_time(old, NOW)), case
            attempted = dict(conn.execute(f'SELECT id, attempted_at FROM "{schema}".jobs WHERE state = %s', ("running",)))
            for i in verdict.started:
                rkey = candidates[i][2]
                assert attempted[ids[i]] == (NOW if rkey is None else rate_time(starts_of.get(rkey, []), NOW)), case
            conn.rollback()


def test_rate_slot_in_sql_is_transitions_rate_slot(pg_url: str) -> None:
    """The SQL function (inlined into the claim's scan and `claim_picked`) on random records,
    some with starts after the time asked about, as `rules.rate_slot`."""
    schema = pgutil.new_schema(pg_url)
    rng = random.Random(7)
    cases = []
    for _ in range(400):
        starts = sorted(NOW + 0.5 * rng.randint(-24, 4) for _ in range(rng.randint(0, 5)))
        cases.append((starts, rng.randint(1, 4), rng.choice(PERS), rng.randint(0, 4)))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for starts, limit, per, added in cases:
            (got,) = conn.execute(f'SELECT "{schema}".rate_slot(%s::float8[], %s, %s, %s, %s)',
                                  (starts, limit, per, NOW, added)).fetchone()  # type: ignore[misc]  # fmt: skip
            assert got == rate_slot(starts, limit, per, NOW, added), (starts, limit, per, added)
