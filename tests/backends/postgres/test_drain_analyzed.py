"""A backlog drained at 32 workers on an analyzed table writes every outcome before the runtime
closes.

Production's shape, as a deploy or an outage leaves it: 10,000 jobs waiting, statistics
gathered (autovacuum's ANALYZE) while no row was `running`, and thousands of rows `running`
under another runtime that died (their heartbeat is recent, so nobody rescues them yet). With
those statistics the planner once looped each outcome batch against every running row through
the rescuer's index (16.8 s for 4,000 outcomes), the fetcher kept claiming past the unwritten
outcomes, and a clean shutdown ended with `not written: job ...` in the log and thousands of jobs
left `running`, to be rescued and run a second time. Here the runtime leaves the block as soon
as every handler has run: every outcome must be written by the time `open_runtime` returns.
"""

from __future__ import annotations

import logging
import time

import psycopg
import pytest
import trio
from psycopg import sql

import nursery_jobs as nj
from tests import pgutil

JOBS = 10_000
DEAD_RUNNING = 8_000
WORKERS = 32


def _prefill(url: str, schema: str) -> None:
    t = sql.SQL("{}.jobs").format(sql.Identifier(schema))
    cols = sql.SQL("(kind, queue, args, state, max_attempts, priority, run_at, created_at, finalized_at)")
    now = time.time()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {} {} SELECT 'noop', 'q', '{{}}', 'available', 25, 0, %s + g * 1e-6, %s, NULL"
                " FROM generate_series(1, %s) g"
            ).format(t, cols),
            (now - 60, now - 60, JOBS),
        )
        # The dead runtime's jobs, finished when the statistics were taken...
        conn.execute(
            sql.SQL(
                "INSERT INTO {} {} SELECT 'noop', 'elsewhere', '{{}}', 'completed', 25, 0, %s, %s, %s"
                " FROM generate_series(1, %s) g"
            ).format(t, cols),
            (now - 60, now - 60, now - 30, DEAD_RUNNING),
        )
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(t))
        # ... and `running` since: the statistics say no row is.
        conn.execute(
            sql.SQL(
                "UPDATE {} SET state = 'running', attempt = 1, attempted_at = %s, heartbeat_at = %s,"
                " finalized_at = NULL WHERE queue = 'elsewhere'"
            ).format(t),
            (now, now + 3600),  # a heartbeat the rescuer leaves alone for the whole test
        )


@pytest.mark.timeout(240)
async def test_a_drain_of_an_analyzed_backlog_writes_every_outcome(pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    schema = pgutil.new_schema(pg_url)
    try:
        await trio.to_thread.run_sync(_prefill, pg_url, schema)
        app = nj.App()
        app.queue("q", max_workers=WORKERS, timeout=None)
        ran = 0
        all_ran = trio.Event()

        @app.job(queue="q")
        async def noop(ctx: nj.JobContext) -> None:
            nonlocal ran
            ran += 1
            if ran == JOBS:
                all_ran.set()

        caplog.set_level(logging.WARNING, logger="nursery_jobs")
        with trio.fail_after(180):  # a bound for a loaded 2-core machine, not a speed claim
            async with nj.open_runtime(app, backend=f"{pg_url}?schema={schema}", queues=["q"]):
                await all_ran.wait()
            # open_runtime has returned: every outcome must be in the table now.

        def counts() -> dict[str, int]:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                rows = conn.execute(
                    sql.SQL("SELECT state, count(*) FROM {}.jobs WHERE queue = 'q' GROUP BY state").format(
                        sql.Identifier(schema)
                    )
                ).fetchall()
            return {state: int(n) for state, n in rows}

        by_state = await trio.to_thread.run_sync(counts)
        unwritten = [r.getMessage() for r in caplog.records if "not written" in r.getMessage()]
        assert not unwritten, unwritten[0][:500]
        assert by_state == {"completed": JOBS}, f"handlers ran {ran} times; rows by state: {by_state}"
        assert ran == JOBS
    finally:

        def drop() -> None:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))

        await trio.to_thread.run_sync(drop)
