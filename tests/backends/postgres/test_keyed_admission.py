"""`claim_picked` against `rules.admit`, pick by pick.

The function restates the rule in SQL (migration 0015, under the locks `lock_keys` takes,
migration 0016): for random picks over a few keys, with one limit per key or limits that differ
within a key, some of each key already running, with and without a queue's global limit, it
starts the same jobs as `rules.admit` and reports the same room left. Each case is
written, claimed and rolled back in one transaction on one connection."""

from __future__ import annotations

import random

import psycopg
import pytest

from nursery_jobs.rules import admit
from tests import pgutil

KEYS = (None, "a", "b", "c")


def _case(rng: random.Random) -> tuple[list[tuple[str | None, int]], dict[str, int], int, int | None]:
    uniform = rng.random() < 0.5
    limits = {k: rng.randint(1, 3) for k in KEYS[1:]}
    candidates = []
    for _ in range(rng.randint(1, 12)):
        key = rng.choice(KEYS)
        candidates.append((key, limits[key] if uniform and key else rng.randint(1, 3)))
    running = {k: rng.randint(0, 3) for k in KEYS[1:] if rng.random() < 0.6}
    max_running = None if rng.random() < 0.5 else rng.randint(0, 12)
    return candidates, running, rng.randint(1, 8), max_running


@pytest.mark.parametrize("seed", range(4))
def test_claim_picked_starts_what_transitions_admit_starts(pg_url: str, seed: int) -> None:
    schema = pgutil.new_schema(pg_url)
    rng = random.Random(seed)
    insert = (
        f'INSERT INTO "{schema}".jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at,'
        " concurrency_key, max_concurrent, heartbeat_at) VALUES ('k', 'q', '{{}}', %s, 3, 0, %s, 0, %s, %s, %s) RETURNING id"
    )
    claim = (
        f'SELECT id, attempt FROM "{schema}".claim_picked(%s::bigint[], %s::text[], %s::int[], %s::text[],'
        " %s::int[], %s::float8[], 'q', %s, %s::int, 10.0)"
    )
    with psycopg.connect(pg_url) as conn:
        for _ in range(60):
            candidates, running, want, max_running = _case(rng)
            for key, n in running.items():
                for _ in range(n):
                    conn.execute(insert, ("running", 0.0, key, 1, 5.0))
            ids = [conn.execute(insert, ("available", float(i), key, most, None)).fetchone()[0]  # type: ignore[index]
                   for i, (key, most) in enumerate(candidates)]  # fmt: skip
            n = len(ids)
            rows = conn.execute(
                claim, (ids, [k for k, _ in candidates], [m for _, m in candidates], [None] * n, [1] * n, [None] * n,
                        want, max_running),
            ).fetchall()  # fmt: skip
            queue_running = sum(running.values())
            expected = admit(candidates, running, want=want, queue_running=queue_running, max_running=max_running)
            started = sorted(r[0] for r in rows if r[0] is not None)
            case = (candidates, running, want, max_running)
            assert started == [ids[i] for i in expected], case
            rooms = [r[1] for r in rows if r[0] is None]
            if max_running is None:
                assert rooms == [], case
            else:
                room = max(min(want, max_running - queue_running), 0)
                assert rooms == [room - len(expected)], case
            conn.rollback()
