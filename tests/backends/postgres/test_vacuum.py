"""Migration 0005: the jobs table's per-table autovacuum settings, one index fewer, and why it
sets no fillfactor.

- `nursery-jobs migrate` brings a version-4 schema to version 5, which sets the thresholds on
  the jobs table (and only those: the server's other settings stay the operator's) and drops
  `jobs_due`, which no statement reads any more (tests/backends/postgres/test_plans.py checks the
  plans without it).
- No update the runtime makes is HOT: a claim, a heartbeat, a retry, an outcome and a rescue
  each change an indexed column (`state`, `heartbeat_at`), so free space left on each page by a
  lower fillfactor could never be used. A plain update of an unindexed column on the same table
  is HOT, which shows the count would see one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import psycopg
import trio

from nursery_jobs.backends import NewJob, Outcome, OutcomeKind
from nursery_jobs.jobs import JobState
from nursery_jobs.backends.postgres import LATEST_VERSION, PostgresBackend, schema_version
from tests import pgutil

FINAL = (JobState.COMPLETED, JobState.DISCARDED, JobState.CANCELLED)
EXPECTED = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_analyze_threshold": "1000",
}


def _reloptions(conn: psycopg.Connection[Any], schema: str) -> dict[str, str]:
    row = conn.execute("SELECT reloptions FROM pg_class WHERE oid = %s::regclass", (f'"{schema}".jobs',)).fetchone()
    assert row is not None
    return dict(opt.split("=", 1) for opt in (row[0] or []))


def test_migrate_sets_the_jobs_tables_autovacuum_thresholds_on_a_version_4_schema(pg_url: str) -> None:
    schema = pgutil.new_schema(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert LATEST_VERSION == 21
        assert _reloptions(conn, schema) == EXPECTED  # a new schema has them
        # back to what version 4 left: no storage parameters
        conn.execute(f'DELETE FROM "{schema}".migrations WHERE version >= 5')
        conn.execute(f'DROP TABLE "{schema}".cache, "{schema}".cache_flights')  # back before version 21
        conn.execute(f'DROP FUNCTION "{schema}".cache_lead')
        conn.execute(f'DROP SEQUENCE "{schema}".lock_fences')  # back before version 19
        conn.execute(f'DROP TABLE "{schema}".repair_cursor')  # back before version 15
        conn.execute(f'DROP TABLE "{schema}".rate_wakes')  # back before version 14
        conn.execute(f'DROP FUNCTION "{schema}".rate_park, "{schema}".rate_release, "{schema}".claim_picked_parking')
        conn.execute(f'ALTER TABLE "{schema}".jobs DROP COLUMN rate_wait')
        conn.execute(f'DROP FUNCTION "{schema}".claim_picked, "{schema}".lock_keys')  # back before version 13
        conn.execute(f'DROP FUNCTION "{schema}".unpark_keys_queues')  # back before version 17
        conn.execute(f'DROP FUNCTION "{schema}".unpark_keys, "{schema}".repair_parked')  # back before version 11
        conn.execute(f'ALTER TABLE "{schema}".jobs DROP COLUMN parked')  # (and the indexes that use it)
        conn.execute(
            f'CREATE INDEX jobs_available ON "{schema}".jobs (queue, priority DESC, run_at, id) WHERE state = \'available\''
        )
        conn.execute(f'DROP TABLE "{schema}".rate_keys')  # back before version 10
        conn.execute(f'DROP FUNCTION "{schema}".rate_slot, "{schema}".rate_lock, "{schema}".rate_record')
        conn.execute(f'ALTER TABLE "{schema}".jobs DROP COLUMN rate_key, DROP COLUMN rate_limit, DROP COLUMN rate_per')
        conn.execute(f'DROP TABLE "{schema}".outbox')  # back before version 9
        conn.execute(f'DROP TABLE "{schema}".schedules, "{schema}".locks')  # back before version 8 too
        conn.execute(f'DROP FUNCTION "{schema}".claim_held')  # back before version 6 too
        conn.execute(f'DROP INDEX "{schema}".jobs_running_key')
        conn.execute(f'ALTER TABLE "{schema}".jobs DROP COLUMN concurrency_key, DROP COLUMN max_concurrent')
        conn.execute(f'ALTER TABLE "{schema}".jobs RESET ({", ".join(EXPECTED)})')
        conn.execute(
            f'CREATE INDEX jobs_due ON "{schema}".jobs (queue, run_at)'
            " WHERE state IN ('available', 'scheduled', 'retryable')"
        )
        assert _reloptions(conn, schema) == {}
    done = subprocess.run(
        [sys.executable, "-m", "nursery_jobs.cli", "migrate", "--database-url", pg_url, "--schema", schema],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"schema '{schema}': applied 0005_less_bloat.sql, 0006_concurrency_keys.sql, 0008_schedules_and_locks.sql, 0009_outbox.sql, 0010_rate_limits.sql, 0011_parked_keys.sql, 0012_parked_counted.sql, 0013_claim_in_one_statement.sql, 0014_rate_parking.sql, 0015_claim_reasons.sql, 0016_lock_keys_planned_once.sql, 0017_unpark_wakes_its_queue.sql, 0019_lock_fencing_tokens.sql, 0021_cache.sql\n"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        assert _reloptions(conn, schema) == EXPECTED
        assert schema_version(conn, schema) == 21
        indexes = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = 'jobs'", (schema,))}
        assert indexes == {"jobs_pkey", "jobs_available", "jobs_waiting", "jobs_running", "jobs_running_unbeaten",
                           "jobs_finalized", "jobs_unique", "jobs_running_key", "jobs_parked", "jobs_parked_queue",
                           "jobs_rate_parked"}  # fmt: skip
        (fillfactor,) = conn.execute(
            "SELECT count(*) FROM pg_class c, unnest(c.reloptions) o WHERE c.oid = %s::regclass AND o LIKE 'fillfactor%%'",
            (f'"{schema}".jobs',),
        ).fetchone()  # type: ignore[misc]
        assert fillfactor == 0


def _updates(conn: psycopg.Connection[Any], schema: str) -> tuple[int, int]:
    row = conn.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = %s AND relname = 'jobs'",
        (schema,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _wait_for_updates(conn: psycopg.Connection[Any], schema: str, at_least: int) -> tuple[int, int]:
    """The table's (updates, HOT updates) once the server's statistics count `at_least` updates:
    a session reports its counts when it goes idle or ends, so they can lag a little."""
    deadline = time.monotonic() + 30
    while True:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        got = _updates(conn, schema)
        if got[0] >= at_least or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


async def test_no_update_the_runtime_makes_is_hot_so_a_fillfactor_would_not_help(pg_url: str) -> None:
    schema = pgutil.new_schema(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # Room on every page, so only the indexed columns could stop an update from being HOT.
        conn.execute(f'ALTER TABLE "{schema}".jobs SET (fillfactor = 50)')
    backend = PostgresBackend(pg_url, schema=schema)
    await backend.open()
    try:
        await backend.insert_many([NewJob("noop", "q", "{}", 0, None, 25) for _ in range(20)])
        first = await backend.claim("q", 20)  # 20 claims
        assert len(first.jobs) == 20
        await backend.heartbeat([(j.id, j.attempt) for j in first.jobs])  # 20 heartbeats
        retry, done, lost = first.jobs[:5], first.jobs[5:15], first.jobs[15:]
        await backend.finish_many(
            [Outcome(j.id, j.attempt, OutcomeKind.RETRY, run_at=backend.now()) for j in retry]
            + [Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in done]
        )  # 15 outcomes
        again = await backend.claim("q", 20)  # the 5 retries, claimed again
        assert len(again.jobs) == 5
        await backend.finish_many([Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in again.jobs])  # 5
        rescued = await backend.rescue(backend.now() + 3600)  # the 5 whose worker was "lost"
        assert rescued == sorted(j.id for j in lost)
    finally:
        await backend.close()  # its sessions end, and report their counts
    with psycopg.connect(pg_url, autocommit=True) as conn:
        updates, hot = _wait_for_updates(conn, schema, 70)
        assert updates >= 70, (updates, hot)
        assert hot == 0, f"{hot} of the runtime's {updates} updates were HOT"
        # The control: an update of a column no index holds is HOT on the same table.
        (row_id,) = conn.execute(f'SELECT min(id) FROM "{schema}".jobs').fetchone()  # type: ignore[misc]
        conn.execute(f'UPDATE "{schema}".jobs SET args = %s WHERE id = %s', ('{"x": 1}', row_id))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        updates_after, hot_after = _wait_for_updates(conn, schema, updates + 1)
        assert (updates_after, hot_after) == (updates + 1, 1)
    _ = trio  # the module runs under pytest-trio


def _claim_search_buffers(url: str, schema: str, queue: str) -> int:
    """Buffers the claim's searches read (every scan but the primary-key lookups of its
    updates), on its generic plan, for a claim of 10 jobs (rolled back)."""
    from tests.backends.postgres.test_plans import _walk, explain_generic

    with psycopg.connect(url, autocommit=True) as conn:
        plan = explain_generic(conn, "claim", schema, {"now": 1e12, "queue": queue, "limit": 10})
    return sum(
        n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0)
        for n in _walk(plan["Plan"])
        if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"] and n.get("Index Name") != "jobs_pkey"
    )


async def test_the_claims_extra_cost_is_the_dead_entries_a_vacuum_removes(pg_url: str) -> None:
    """30,000 jobs through a queue in batches of 500 (enqueued, claimed, completed, deleted by
    retention) with autovacuum off on the table: 90,000 dead row versions. Each claimed row
    leaves a dead entry in `jobs_available`, where the claim starts; a claim that passes it marks
    it so that later ones do not read its row, but still reads its index page, until a vacuum
    removes the entry (measured here: 7 buffers at the start, ~195 after 30,000 jobs). That is
    why the jobs table is vacuumed after a fixed number of dead rows (migration 0005), and this
    checks the claim pays for nothing else: once vacuumed, it costs what it did at the start."""
    schema = pgutil.new_schema(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'ALTER TABLE "{schema}".jobs SET (autovacuum_enabled = false)')
    backend = PostgresBackend(pg_url, schema=schema)
    await backend.open()
    costs = []
    try:
        for round_ in range(61):
            await backend.insert_many([NewJob("noop", "default", "{}", 0, None, 25) for _ in range(500)])
            if round_ in (0, 60):  # with 500 available: what a claim finds at the start and at the end
                costs.append(_claim_search_buffers(pg_url, schema, "default"))
            if round_ == 60:
                with psycopg.connect(pg_url, autocommit=True) as conn:
                    conn.execute(f'VACUUM "{schema}".jobs')
                costs.append(_claim_search_buffers(pg_url, schema, "default"))
            claimed = await backend.claim("default", 500)
            assert len(claimed.jobs) == 500
            await backend.finish_many([Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in claimed.jobs])
            while await backend.delete_finished({s: backend.now() + 1 for s in FINAL}, 1000):
                pass
    finally:
        await backend.close()
    first, unvacuumed, vacuumed = costs
    print(f"claim search buffers: {first} at the start, {unvacuumed} after 30,000 jobs, {vacuumed} once vacuumed")
    assert unvacuumed > 2 * first  # the dead entries do cost until a vacuum (else this test shows nothing)
    assert vacuumed <= max(1.5 * first, first + 10), f"claim search buffers {first} -> {unvacuumed} -> vacuumed {vacuumed}"
