"""Claim cost stays flat as a queue fills with jobs that are not due yet (scheduled for later,
or retryable in backoff), at the same or a higher priority than the due ones: EXPLAIN (ANALYZE,
BUFFERS) of the backend's own claim statement (`backend._q["claim"]`, not a copy), with ~1k
and with ~100k such rows."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from nursery_jobs.backends.postgres import PostgresBackend
from tests import pgutil

NOW = 1_000_000.0


def _fill(conn: psycopg.Connection[Any], schema: str, future: int, due: int) -> None:
    t = f'"{schema}".jobs'
    cols = "(kind, queue, args, state, max_attempts, priority, run_at, created_at)"
    # not due: scheduled for later and retryable in backoff, at priority 0 and 5
    conn.execute(
        f"INSERT INTO {t} {cols} SELECT 'k', 'q', '{{}}', CASE WHEN g %% 4 = 0 THEN 'retryable' ELSE 'scheduled' END,"
        " 25, CASE WHEN g %% 2 = 0 THEN 5 ELSE 0 END, %s + g, 0 FROM generate_series(1, %s) g",
        (NOW + 60, future),
    )
    # finished rows, as a busy table keeps
    conn.execute(
        f"INSERT INTO {t} {cols} SELECT 'k', 'q', '{{}}', 'completed', 25, 0, g, 0 FROM generate_series(1, %s) g",
        (future,),
    )
    # due: a few available, a few scheduled that came due, at priority 0
    conn.execute(
        f"INSERT INTO {t} {cols} SELECT 'k', 'q', '{{}}', CASE WHEN g %% 2 = 0 THEN 'available' ELSE 'scheduled' END,"
        " 25, 0, %s - 100 + g, 0 FROM generate_series(1, %s) g",
        (NOW, due),
    )
    conn.execute(f"ANALYZE {t}")


def _walk(node: dict[str, Any]) -> tuple[int, int]:
    """(shared buffers touched, rows returned by scans or filtered out) over the plan tree."""
    buffers = int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))
    rows = 0
    if "Scan" in node.get("Node Type", ""):
        rows = int(node.get("Actual Rows", 0)) * max(1, int(node.get("Actual Loops", 1)))
        rows += int(node.get("Rows Removed by Filter", 0)) + int(node.get("Rows Removed by Index Recheck", 0))
    for child in node.get("Plans", []):
        _, r = _walk(child)
        rows += r
    return buffers, rows


def claim_cost(pg_url: str, future: int, due: int, limit: int = 100) -> tuple[int, int, int, float]:
    """(buffers, rows scanned, jobs claimed, execution ms) of one claim, rolled back."""
    backend = PostgresBackend(pg_url, schema=pgutil.new_schema(pg_url))
    q = backend._q["claim"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        _fill(conn, backend.schema, future, due)
        params = {"now": NOW, "queue": "q", "limit": limit}
        results = []
        for _ in range(4):  # the first warms the plan and the cache
            with conn.transaction(force_rollback=True):
                row = conn.execute(b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + q, params).fetchone()
                assert row is not None
                plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
                top = plan[0]["Plan"]
                buffers = int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))
                _, rows = _walk(top)
                claimed = conn.execute(
                    f'SELECT count(*) FROM "{backend.schema}".jobs WHERE state = \'running\''
                ).fetchone()
                results.append((buffers, rows, int(claimed[0]) if claimed else 0, float(plan[0]["Execution Time"])))
        conn.execute(f'DROP SCHEMA "{backend.schema}" CASCADE')
    return min(results[1:], key=lambda r: r[3])


@pytest.mark.parametrize("due", [20, 0])
def test_claim_cost_stays_flat_with_100k_jobs_not_yet_due(pg_url, due):
    """Measured on the dev machine with version 1's claim (jobs_claim over all pending rows):
    20 due: 215 buffers / 1.2 ms at 1k, 931 / 9.0 ms at 100k. With version 2's: flat."""
    small = claim_cost(pg_url, 1_000, due)
    large = claim_cost(pg_url, 100_000, due)
    print(f"claim ({due} due) at 1k not-due rows: {small}; at 100k: {large}")
    assert small[2] == large[2] == due  # every due job claimed, none of the others
    # Buffers are the measure: an index scan skips entries outside its range without
    # reporting them as filtered rows.
    assert large[0] <= 2 * small[0] + 50, (small, large)


async def test_due_waiting_jobs_are_claimed_in_claim_order_and_the_rest_promoted(pg_url):
    from nursery_jobs.backends import NewJob

    now = [NOW]
    backend = PostgresBackend(pg_url, schema=pgutil.new_schema(pg_url), clock=lambda: now[0])
    backend.check_budget(1)
    await backend.open()
    try:

        def job(priority: int, run_at: float | None) -> NewJob:
            return NewJob("k", "q", "{}", priority, run_at, 3)

        low_now = (await backend.insert_many([job(0, None)]))[0].id
        high_later = (await backend.insert_many([job(5, NOW + 10)]))[0].id
        low_later = (await backend.insert_many([job(0, NOW + 5)]))[0].id
        never = (await backend.insert_many([job(9, NOW + 1000)]))[0].id
        now[0] = NOW + 20
        first = await backend.claim("q", 1)
        assert [j.id for j in first.jobs] == [high_later]  # a due scheduled job, higher priority
        # the other due scheduled job was promoted; the not-due one was not
        assert (await backend.get_job(low_later)).state.value == "available"
        assert (await backend.get_job(never)).state.value == "scheduled"
        assert first.next_due == NOW + 1000
        second = await backend.claim("q", 5)
        assert [j.id for j in second.jobs] == [low_now, low_later]  # then run_at order
    finally:
        await backend.close()


async def test_a_version_1_schema_is_refused_then_upgraded_by_migrate(pg_url):
    import nursery_jobs as nj
    from nursery_jobs.backends.postgres import LATEST_VERSION, migrate

    assert LATEST_VERSION == 21
    schema = pgutil.new_schema(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:  # back to what version 1 left
        conn.execute(f'DELETE FROM "{schema}".migrations WHERE version >= 2')
        conn.execute(f'DROP TABLE "{schema}".cache, "{schema}".cache_flights')  # back before version 21
        conn.execute(f'DROP FUNCTION "{schema}".cache_lead')
        conn.execute(f'DROP SEQUENCE "{schema}".lock_fences')  # back before version 19
        conn.execute(f'DROP TABLE "{schema}".repair_cursor')  # back before version 15
        conn.execute(f'DROP TABLE "{schema}".rate_wakes')  # back before version 14
        conn.execute(f'DROP FUNCTION "{schema}".rate_park, "{schema}".rate_release, "{schema}".claim_picked_parking')
        conn.execute(f'ALTER TABLE "{schema}".jobs DROP COLUMN rate_wait')
        conn.execute(f'DROP FUNCTION "{schema}".claim_picked, "{schema}".lock_keys')  # back before version 13
        conn.execute(f'DROP TABLE "{schema}".rate_keys')  # back before version 10
        conn.execute(f'DROP FUNCTION "{schema}".rate_slot, "{schema}".rate_lock, "{schema}".rate_record')
        conn.execute(f'ALTER TABLE "{schema}".jobs DROP COLUMN rate_key, DROP COLUMN rate_limit, DROP COLUMN rate_per')
        conn.execute(f'DROP TABLE "{schema}".outbox')  # back before version 9
        conn.execute(f'DROP TABLE "{schema}".schedules, "{schema}".locks')  # back before version 8
        conn.execute(f'DROP FUNCTION "{schema}".claim_held')  # back before version 6 too
        conn.execute(f'DROP INDEX "{schema}".jobs_running_key')
        conn.execute(f'ALTER TABLE "{schema}".jobs DROP COLUMN concurrency_key, DROP COLUMN max_concurrent')
        conn.execute(f'ALTER TABLE "{schema}".jobs ALTER COLUMN args TYPE jsonb USING args::jsonb')
        conn.execute(f'DROP INDEX "{schema}".jobs_running_unbeaten')
        conn.execute(f'DROP INDEX "{schema}".jobs_running')
        conn.execute(f'CREATE INDEX jobs_running ON "{schema}".jobs (heartbeat_at) WHERE state = \'running\'')
        conn.execute(f'INSERT INTO "{schema}".jobs (kind, queue, args, state, max_attempts, run_at, created_at)'
                     """ VALUES ('k', 'q', '{"n": 1e16, "z": -0.0}', 'available', 1, 0, 0)""")  # fmt: skip
        conn.execute(f'CREATE INDEX jobs_due ON "{schema}".jobs (queue, run_at)'
                     " WHERE state IN ('available', 'scheduled', 'retryable')")  # fmt: skip
        conn.execute(f'ALTER TABLE "{schema}".jobs RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold,'
                     ' autovacuum_analyze_scale_factor, autovacuum_analyze_threshold)')  # fmt: skip
        conn.execute(f'DROP INDEX "{schema}".jobs_available')
        conn.execute(f'DROP INDEX "{schema}".jobs_waiting')
        conn.execute(f'DROP FUNCTION "{schema}".unpark_keys_queues')  # back before version 17
        conn.execute(f'DROP FUNCTION "{schema}".unpark_keys, "{schema}".repair_parked')  # back before version 11
        conn.execute(f'ALTER TABLE "{schema}".jobs DROP COLUMN parked')
        conn.execute(
            f'CREATE INDEX jobs_claim ON "{schema}".jobs (queue, priority DESC, run_at, id)'
            " WHERE state IN ('available', 'scheduled', 'retryable')"
        )
    with pytest.raises(nj.ConfigError, match="is at version 1, this nursery_jobs needs 21"):
        async with nj.open_runtime(nj.App(), backend=PostgresBackend(pg_url, schema=schema), queues=[]):
            pass
    assert migrate(pg_url, schema) == ["0002_claim_due_only.sql", "0003_args_as_text.sql", "0004_plans_that_hold.sql", "0005_less_bloat.sql",
                                       "0006_concurrency_keys.sql", "0008_schedules_and_locks.sql", "0009_outbox.sql",
                                       "0010_rate_limits.sql", "0011_parked_keys.sql", "0012_parked_counted.sql",
                                       "0013_claim_in_one_statement.sql", "0014_rate_parking.sql",
                                       "0015_claim_reasons.sql", "0016_lock_keys_planned_once.sql", "0017_unpark_wakes_its_queue.sql",
                                       "0019_lock_fencing_tokens.sql", "0021_cache.sql"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        names = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,))}
        (args_type,) = conn.execute(
            "SELECT data_type FROM information_schema.columns WHERE table_schema = %s AND table_name = 'jobs'"
            " AND column_name = 'args'",
            (schema,),
        ).fetchone()
    assert {"jobs_available", "jobs_waiting"} <= names and not {"jobs_claim", "jobs_due"} & names
    assert args_type == "text"
    async with nj.open_runtime(nj.App(), backend=PostgresBackend(pg_url, schema=schema), queues=[]) as rt:
        # a row written by version 1 reads as jsonb normalised it (what jsonb kept is all there is)
        assert (await rt.get_job(1)).args == {"n": 10000000000000000, "z": 0}
