"""The file's schema, and its upgrade in place.

The runtime creates its tables itself when it opens a file (there is no migrate command for an
embedded database): `SCHEMA` is a script of ``CREATE ... IF NOT EXISTS``, safe to run on every
open, by several processes at once. A file made by an older version is brought to
`SCHEMA_VERSION` in one write transaction (`upgrade`); one made by a newer version is refused.

Every index over job states is partial, and SQLite uses a partial index only for a query whose
terms contain its condition word for word: the conditions are written once here (`IS_PENDING`,
`IS_FINAL`, `NOT_FINAL`) and every statement that must use an index says them the same way.
"""

from __future__ import annotations

import sqlite3

__all__ = ["IS_FINAL", "IS_PENDING", "NOT_FINAL", "SCHEMA", "SCHEMA_VERSION", "upgrade"]

SCHEMA_VERSION = 6
"""2 added the concurrency key and its limit (`_UPGRADE_2`), 3 the rate key and its rate
(`_UPGRADE_3`), 4 the parked flag of a full key's jobs (`_UPGRADE_4`), 5 the flag of a job
parked for its rate and each key's wake time (`_UPGRADE_5`, `nj_rate_wake`), 6 the partial
indexes' conditions written without lists of three states (`_UPGRADE_6`, `IS_PENDING`): an
older file is upgraded in place when opened."""

IS_PENDING = "(state = 'available' OR state = 'scheduled' OR state = 'retryable')"
"""A pending row, as the partial indexes over pending rows say it (and so every statement that
reads them, word for word: SQLite uses a partial index only for a query whose terms contain its
condition). Not ``state IN (...)``: SQLite evaluates a partial index's condition for the old and
the new row of every write that changes `state`, and a constant list of more than two values
builds a temporary b-tree each time (``OpenEphemeral``: a page cache allocated and freed), eight
per job written with the indexes of schema 5. That made every outcome, claim and parking write
cost about four times its work, and far more once the allocator returned each freed cache to the
system (a write behind a parked backlog: 14-20 ms of CPU per outcome batch instead of 2 ms)."""
IS_FINAL = "(state = 'completed' OR state = 'discarded' OR state = 'cancelled')"
NOT_FINAL = "state <> 'completed' AND state <> 'discarded' AND state <> 'cancelled'"
"""A job that is not final yet, as the unique keys' index says it (the upsert's conflict target
repeats it exactly, as SQLite requires)."""

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS nj_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nj_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    queue TEXT NOT NULL,
    args TEXT NOT NULL,
    state TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    run_at REAL NOT NULL,
    created_at REAL NOT NULL,
    attempted_at REAL,
    finalized_at REAL,
    heartbeat_at REAL,
    errors TEXT,
    failed_attempts INTEGER NOT NULL DEFAULT 0,
    interrupted INTEGER NOT NULL DEFAULT 0,
    unique_key TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    concurrency_key TEXT,
    max_concurrent INTEGER,
    rate_key TEXT,
    rate_limit INTEGER,
    rate_per REAL,
    parked INTEGER NOT NULL DEFAULT 0,
    rate_wait INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS nj_jobs_due ON nj_jobs (queue, run_at) WHERE {IS_PENDING};
CREATE INDEX IF NOT EXISTS nj_jobs_running ON nj_jobs (heartbeat_at) WHERE state = 'running';
-- Retention finds old final rows without a scan (and deletes them in batches).
CREATE INDEX IF NOT EXISTS nj_jobs_finalized ON nj_jobs (state, finalized_at) WHERE {IS_FINAL};
-- While a job with a unique key is not final, no other job may hold that key.
CREATE UNIQUE INDEX IF NOT EXISTS nj_jobs_unique ON nj_jobs (unique_key) WHERE unique_key IS NOT NULL AND {NOT_FINAL};
-- The outbox: events published with the service's rows, deleted as the relay makes their jobs
-- (created on a file of an older version too: IF NOT EXISTS, no schema version change).
CREATE TABLE IF NOT EXISTS nj_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS nj_outbox_topic ON nj_outbox (topic, id);
-- Periodic schedules: each one's last enqueued tick (Unix time) and that tick's job.
CREATE TABLE IF NOT EXISTS nj_schedules (name TEXT PRIMARY KEY, last_tick REAL NOT NULL, last_job_id INTEGER);
-- Named locks (rt.lock): the holder's token and its expiry on the backend's clock.
CREATE TABLE IF NOT EXISTS nj_locks (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at REAL NOT NULL);
-- The last fencing token an acquisition of a lock drew, for every name: one row, never deleted
-- (created on a file of an older version too: IF NOT EXISTS, no schema version change).
CREATE TABLE IF NOT EXISTS nj_lock_fence (id INTEGER PRIMARY KEY CHECK (id = 0), last INTEGER NOT NULL);
-- Rate keys: each one's latest starts (a JSON array, ascending, at most `cap`), the largest
-- limit and window its jobs carried, and its latest start; retention drops idle keys.
CREATE TABLE IF NOT EXISTS nj_rate (
    key TEXT PRIMARY KEY, starts TEXT NOT NULL, cap INTEGER NOT NULL, per REAL NOT NULL, last REAL NOT NULL
);
-- Rate keys with jobs parked for their rate, per queue: when the claim brings the next ones back.
CREATE TABLE IF NOT EXISTS nj_rate_wake (queue TEXT NOT NULL, key TEXT NOT NULL, wake REAL NOT NULL, PRIMARY KEY (queue, key));
"""

_UPGRADE_2 = (
    "ALTER TABLE nj_jobs ADD COLUMN concurrency_key TEXT",
    "ALTER TABLE nj_jobs ADD COLUMN max_concurrent INTEGER",
)
_UPGRADE_3 = (
    "ALTER TABLE nj_jobs ADD COLUMN rate_key TEXT",
    "ALTER TABLE nj_jobs ADD COLUMN rate_limit INTEGER",
    "ALTER TABLE nj_jobs ADD COLUMN rate_per REAL",
)
_UPGRADE_4 = ("ALTER TABLE nj_jobs ADD COLUMN parked INTEGER NOT NULL DEFAULT 0", "DROP INDEX IF EXISTS nj_jobs_claim")
_UPGRADE_5 = ("ALTER TABLE nj_jobs ADD COLUMN rate_wait INTEGER NOT NULL DEFAULT 0",)
_UPGRADE_6 = (
    # The same indexes, their conditions written as `IS_PENDING` and the like (`_KEY_INDEXES`
    # creates the claim's again); the unique keys' index is dropped and made again in the
    # upgrade's one transaction, so no duplicate can slip in between.
    "DROP INDEX IF EXISTS nj_jobs_due",
    "DROP INDEX IF EXISTS nj_jobs_finalized",
    "DROP INDEX IF EXISTS nj_jobs_unique",
    "DROP INDEX IF EXISTS nj_jobs_claimable",
    f"CREATE INDEX nj_jobs_due ON nj_jobs (queue, run_at) WHERE {IS_PENDING}",
    f"CREATE INDEX nj_jobs_finalized ON nj_jobs (state, finalized_at) WHERE {IS_FINAL}",
    f"CREATE UNIQUE INDEX nj_jobs_unique ON nj_jobs (unique_key) WHERE unique_key IS NOT NULL AND {NOT_FINAL}",
)
_KEY_INDEXES = (
    # The running jobs of a concurrency key, counted by every claim that meets the key.
    "CREATE INDEX IF NOT EXISTS nj_jobs_running_key ON nj_jobs (concurrency_key)"
    " WHERE state = 'running' AND concurrency_key IS NOT NULL",
    # Claim order, over claimable rows that are not parked only, so claim cost grows neither
    # with finished rows nor with the backlog of full keys.
    "CREATE INDEX IF NOT EXISTS nj_jobs_claimable ON nj_jobs (queue, priority DESC, run_at, id)"
    f" WHERE {IS_PENDING} AND parked = 0",
    # A key's parked jobs in claim order: its best one comes back when a slot frees.
    "CREATE INDEX IF NOT EXISTS nj_jobs_parked ON nj_jobs (concurrency_key, priority DESC, run_at, id)"
    " WHERE state = 'available' AND parked = 1",
    # A rate key's jobs parked for its rate, per queue, in claim order: the best ones come back
    # at the key's wake time.
    "CREATE INDEX IF NOT EXISTS nj_jobs_rate_parked ON nj_jobs (queue, rate_key, priority DESC, run_at, id)"
    " WHERE state = 'available' AND parked = 1 AND rate_wait = 1",
)


def upgrade(conn: sqlite3.Connection) -> None:
    """Bring an older file to this version, in one write transaction (another process may
    be opening the same file): the two columns of the concurrency key (from 1), the three of
    the rate key (from 1 or 2), the parked flag (from 1, 2 or 3), the rate's parked flag
    (from 1 to 4; `nj_rate_wake` is created by the schema script), the indexes over states
    made again with their conditions as `IS_PENDING` says them (from 1 to 5), then the
    indexes that use the new columns."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        (version,) = conn.execute("SELECT value FROM nj_meta WHERE key = 'schema_version'").fetchone()
        if version == "1":
            for statement in _UPGRADE_2:
                conn.execute(statement)
        if version in ("1", "2"):
            for statement in _UPGRADE_3:
                conn.execute(statement)
        if version in ("1", "2", "3"):
            for statement in _UPGRADE_4:
                conn.execute(statement)
        if version in ("1", "2", "3", "4"):
            for statement in _UPGRADE_5:
                conn.execute(statement)
        if version in ("1", "2", "3", "4", "5"):
            for statement in _UPGRADE_6:
                conn.execute(statement)
            conn.execute("UPDATE nj_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
        if version in ("1", "2", "3", "4", "5", str(SCHEMA_VERSION)):
            for statement in _KEY_INDEXES:
                conn.execute(statement)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
