-- nursery_jobs schema, version 11: a full key's backlog is parked, so claims stop reading it.
--
-- Since version 6 the claim's scan passed over every due job whose concurrency key was at its
-- limit, one probe each, on every claim: with a few busy keys and a large backlog each claim
-- read the whole backlog (20,000 jobs: 30-100 ms a claim, 20 jobs a second at one key, and
-- every other job of the queue waited behind those claims). Now a job the scan passes over
-- for its key is *parked* (`parked`), in the claim statement that passed over it, and leaves
-- `jobs_available`, the index the claim walks; a job of the key leaving `running` (an outcome,
-- a rescue; and a cancel of an unparked pending one) unparks the key's best parked job
-- (`unpark_keys`) in the same statement, so the key's next job is back in claim order as its
-- slot frees. A parked job is still `available` to every reader (state, stats, cancel): only
-- the claim's index leaves it out. Each parked job is written once more than before; a claim
-- then costs what it costs without the busy keys.
--
-- No key is parked for ever:
--   - A claim parks a job only if it holds a share lock on at least the job's limit of its
--     key's rows that are still `running` (FOR SHARE SKIP LOCKED: a row another statement is
--     writing, perhaps moving it out of `running`, is not counted, so the claim never waits
--     and never deadlocks). Each of those rows, leaving `running` later, unparks one job of
--     the key; its statement waits for the parking claim's commit (the row lock) and unparks
--     in a new snapshot (`unpark_keys` is VOLATILE), so it sees the job parked. A row that left
--     `running` before the lock is not counted, and then the job is not parked.
--   - What else could leave a key parked with a free slot (a row written by hand, an older
--     runtime against this schema) is repaired by the rescuer's pass (`repair_parked`): a key
--     whose parked jobs could start unparks its best one.
-- Order within a key holds: the best parked job comes back, and the claim weighs it against
-- the key's unparked jobs in claim order.
--
-- (ADD COLUMN with a constant default: no rewrite. jobs_available is rebuilt with the new
-- predicate; CREATE INDEX, not CONCURRENTLY: inserts wait while it builds, so run it in a quiet
-- moment on a large table.)
ALTER TABLE {schema}.jobs ADD COLUMN parked boolean NOT NULL DEFAULT false;
DROP INDEX {schema}.jobs_available;
CREATE INDEX jobs_available ON {schema}.jobs (queue, priority DESC, run_at, id)
    WHERE state = 'available' AND NOT parked;
-- A key's parked jobs in claim order: its best one is unparked when a slot frees.
CREATE INDEX jobs_parked ON {schema}.jobs (concurrency_key, priority DESC, run_at, id)
    WHERE state = 'available' AND parked;

-- Unpark, for each key p_keys[i], its best p_counts[i] parked jobs (rows locked by another
-- statement are skipped: a cancel ends them, a concurrent unpark brings them back). Runs in
-- its own snapshot, taken after the calling statement updated (and so locked) the rows that
-- left `running`: it sees every job a claim parked while it held those rows.
CREATE FUNCTION {schema}.unpark_keys(p_keys text[], p_counts integer[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n integer;
BEGIN
    UPDATE {schema}.jobs j SET parked = false
    WHERE j.id = ANY(ARRAY(
        SELECT p.id FROM unnest(p_keys, p_counts) AS u(k, c)
        CROSS JOIN LATERAL (SELECT r.id FROM {schema}.jobs r
            WHERE r.concurrency_key = u.k AND r.state = 'available' AND r.parked
            ORDER BY r.priority DESC, r.run_at, r.id LIMIT u.c FOR UPDATE SKIP LOCKED) p))
        AND j.state = 'available' AND j.parked;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- The rescuer's repair: every key with parked jobs (a loose scan of `jobs_parked`, a few probes
-- per key) whose running jobs are fewer than its best parked job's limit unparks that job.
-- Unparking is always safe (a claim that finds the key full parks the job again), so this
-- takes no lock. Returns the queue of each job it unparked.
CREATE FUNCTION {schema}.repair_parked() RETURNS TABLE (queue text) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    k text;
    head record;
BEGIN
    SELECT min(j.concurrency_key) INTO k FROM {schema}.jobs j WHERE j.state = 'available' AND j.parked;
    WHILE k IS NOT NULL LOOP
        SELECT j.id, j.queue, coalesce(j.max_concurrent, 1) AS most INTO head FROM {schema}.jobs j
            WHERE j.concurrency_key = k AND j.state = 'available' AND j.parked
            ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1;
        IF head.id IS NOT NULL
            AND (SELECT count(*) FROM {schema}.jobs r WHERE r.state = 'running' AND r.concurrency_key = k) < head.most
        THEN
            UPDATE {schema}.jobs j SET parked = false WHERE j.id = head.id AND j.state = 'available' AND j.parked;
            IF FOUND THEN
                queue := head.queue;
                RETURN NEXT;
            END IF;
        END IF;
        SELECT min(j.concurrency_key) INTO k FROM {schema}.jobs j
            WHERE j.state = 'available' AND j.parked AND j.concurrency_key > k;
    END LOOP;
END
$$;
