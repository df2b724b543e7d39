"""The rescuer's repair of parked jobs (`repair_parked`, migration 0015) does bounded work per
pass, whatever the rate backlog: with 1,000 or 20,000 jobs parked for their rate (in 3 keys,
half of them with a concurrency key too), one pass reads the same handful of index entries; and
a backlog of 2,500 (queue, rate key) groups with no wake time (rows written by hand) is walked
1,000 groups a pass, each group woken once. Counted in index entries and rows, not timed: the
server's per-transaction counters (`pg_stat_get_xact_tuples_returned`) over every relation of
the schema, read inside the transaction that ran the pass."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests import pgutil


def _fill(conn: psycopg.Connection[Any], schema: str, parked: int, keys: int) -> None:
    t = f'"{schema}".jobs'
    conn.execute(
        f"INSERT INTO {t} (kind, queue, args, state, max_attempts, priority, run_at, created_at, rate_key, rate_limit,"
        " rate_per, parked, rate_wait, concurrency_key, max_concurrent)"
        " SELECT 'k', 'q', '{}', 'available', 5, 0, 0, 0, 'r' || (g %% %s), 1, 60, true, true,"
        "  CASE WHEN g %% 2 = 0 THEN 'c' || (g %% 7) END, CASE WHEN g %% 2 = 0 THEN 1 END FROM generate_series(1, %s) g",
        (keys, parked),
    )
    # finished rows, as a busy table keeps
    conn.execute(
        f"INSERT INTO {t} (kind, queue, args, state, max_attempts, priority, run_at, created_at, finalized_at)"
        " SELECT 'k', 'q', '{}', 'completed', 5, 0, 0, 0, 0 FROM generate_series(1, %s)",
        (5 * parked,),
    )
    conn.execute(f"ANALYZE {t}")


def _pass(conn: psycopg.Connection[Any], schema: str) -> tuple[int, int]:
    """(queues returned, index entries and rows read) of one repair pass."""
    count = (
        "SELECT sum(pg_stat_get_xact_tuples_returned(c.oid))::int FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'i')"
    )
    with conn.transaction():  # (counts not yet reported to the server carry over: take the difference)
        (before,) = conn.execute(count, (schema,)).fetchone()  # type: ignore[misc]
        rows = conn.execute(f'SELECT queue FROM "{schema}".repair_parked()').fetchall()
        (after,) = conn.execute(count, (schema,)).fetchone()  # type: ignore[misc]
    return len(rows), after - before


@pytest.mark.parametrize("parked", [1_000, 20_000])
def test_a_repair_pass_reads_no_more_with_a_larger_rate_backlog(pg_url: str, parked: int) -> None:
    schema = pgutil.new_schema(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        _fill(conn, schema, parked, 3)
        conn.execute(f"INSERT INTO \"{schema}\".rate_wakes VALUES ('q', 'r0', 1e12), ('q', 'r1', 1e12), ('q', 'r2', 1e12)")
        repaired, read = _pass(conn, schema)
    assert repaired == 0  # every key has its wake time: nothing to repair
    assert read <= 20, read  # a probe per step and per group (3 keys), not the backlog (2.5 reads a job before)


def test_a_repair_pass_walks_at_most_1000_rate_keys_and_the_next_goes_on(pg_url: str) -> None:
    schema = pgutil.new_schema(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        _fill(conn, schema, 5_000, 2_500)  # two jobs in each key, and no key has a wake time
        passes = [_pass(conn, schema) for _ in range(5)]
        (woken,) = conn.execute(f'SELECT count(*) FROM "{schema}".rate_wakes').fetchone()  # type: ignore[misc]
    assert [n for n, _ in passes] == [1_000, 1_000, 500, 0, 0]  # then the walk starts over: all woken
    assert woken == 2_500
    assert all(read <= 2_100 for _, read in passes), passes  # 2 probes a group at most, not the 5,000 jobs
