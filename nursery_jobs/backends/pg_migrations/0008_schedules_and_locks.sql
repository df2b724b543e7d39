-- nursery_jobs schema, version 8: periodic schedules (@app.periodic) and named locks (rt.lock).
-- (7 is a number reserved for another change.)
--
-- One row per schedule name: the last tick enqueued (Unix time, seconds) and that tick's job.
-- A scheduler in every process advances the row with a conditional upsert
-- (`last_tick < EXCLUDED.last_tick`) in the same transaction as the tick's insert, so of any
-- number of processes exactly one enqueues each tick, with no leader: a second upsert of the
-- same tick waits for the first's row lock, then finds the tick taken. The row is the state
-- that outlives every process: what "missed" means after a downtime, and what
-- `rt.periodic()` shows. No foreign key to jobs: retention deletes old jobs.
CREATE TABLE {schema}.schedules (
    name text PRIMARY KEY,
    last_tick double precision NOT NULL,
    last_job_id bigint
);

-- Named locks (rt.lock, rt.try_lock): the holder's token and its expiry, seconds on the
-- backend's clock. A row, not a session advisory lock: an advisory lock belongs to a pooled
-- connection, so it is held by whichever task uses that connection next, released when the
-- pool recycles it, and lost without notice when the connection drops; a row with an expiry
-- frees itself after a crash and can be renewed and checked from any connection.
CREATE TABLE {schema}.locks (
    name text PRIMARY KEY,
    owner text NOT NULL,
    expires_at double precision NOT NULL
);
