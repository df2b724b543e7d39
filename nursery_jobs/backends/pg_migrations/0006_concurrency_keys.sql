-- nursery_jobs schema, version 6: per-key concurrency limits and the queue's global limit.
--
-- A job may carry a concurrency key and its limit: it starts only while fewer than
-- `max_concurrent` jobs with that key are `running`. The slot is the running row itself: a job
-- frees it by leaving `running` (an outcome, a cancel, a shutdown's give-back, a rescue), in the
-- statement that moves it, so no lease can outlive a crash and nothing else needs freeing.
--
-- Exact under concurrent claimers (many processes, READ COMMITTED): the claim statement takes
-- the due jobs with no key itself, and hands the keyed ones (and, under a queue's global limit,
-- every one) to `claim_held` below, which
--   1. takes a transaction-level advisory lock per key (and one for the queue under a global
--      limit), in one order (the queue's, then the keys' sorted by hash), so two claimers never
--      wait on each other in a circle;
--   2. only then reads the running counts, in a new statement and so a new snapshot, which sees
--      every claim of those keys committed before the locks were granted (a claim of the key
--      holds its lock until it commits);
--   3. applies `transitions.admit` to the candidates in claim order and claims what it admits,
--      each row with the number of candidates it found taken or gone meanwhile (`lost`: the
--      caller looks again for those, not for the ones the limits refused; a lone row with a
--      NULL id carries it when nothing was claimed).
-- A job leaving `running` needs no lock: a claimer that does not see it leave yet admits less,
-- never more. Keys that collide in the 32-bit hash only share a lock, never a count.
--
-- The claim's own scan passes over jobs whose key is at its limit (`jobs_running_key`, one
-- probe per keyed row it meets), so a busy key holds back neither other keys nor unkeyed jobs.
-- (ADD COLUMN with no default: no rewrite. CREATE INDEX, not CONCURRENTLY: running rows are few.)
ALTER TABLE {schema}.jobs
    ADD COLUMN concurrency_key text,
    ADD COLUMN max_concurrent integer CHECK (max_concurrent IS NULL OR max_concurrent >= 1);
CREATE INDEX jobs_running_key ON {schema}.jobs (concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;

CREATE FUNCTION {schema}.claim_held(
    p_ids bigint[], p_queue text, p_want integer, p_max_running integer, p_now double precision
) RETURNS TABLE (
    id bigint, kind text, queue text, args text, attempt integer, max_attempts integer, priority integer,
    run_at double precision, lost integer
) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    space integer := hashtext('nursery_jobs claim_held ' || {schema_text});
    c record;
    keys text[] := ARRAY[]::text[];
    counts integer[] := ARRAY[]::integer[];
    picked bigint[] := ARRAY[]::bigint[];
    room integer := p_want;
    seen integer := 0;
    gone integer := 0;
    i integer;
BEGIN
    -- Each statement below must see what committed before it: READ COMMITTED's fresh snapshot
    -- per statement is what makes the counts exact after the locks.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'nursery_jobs claims need READ COMMITTED, not %', current_setting('transaction_isolation');
    END IF;
    IF p_max_running IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(space, hashtext('queue ' || p_queue));
    END IF;
    -- One lock per key, taken in hash order (every claimer takes its keys in the same order,
    -- so none waits on another in a circle), then each key's running count in one read.
    SELECT array_agg(k ORDER BY h) INTO keys FROM (
        SELECT k, h, pg_advisory_xact_lock(space, h) FROM (
            SELECT DISTINCT j.concurrency_key AS k, hashtext('key ' || j.concurrency_key) AS h
            FROM {schema}.jobs j WHERE j.id = ANY(p_ids) AND j.concurrency_key IS NOT NULL ORDER BY 2, 1
        ) sorted
    ) locked;
    keys := coalesce(keys, ARRAY[]::text[]);
    IF p_max_running IS NOT NULL THEN
        -- Through the rescuer's two indexes of running rows (migration 0004): running rows are
        -- few, and no index of its own means no extra write per job.
        room := least(room, p_max_running
            - (SELECT count(*)::integer FROM {schema}.jobs j
                WHERE j.state = 'running' AND j.heartbeat_at IS NOT NULL AND j.queue = p_queue)
            - (SELECT count(*)::integer FROM {schema}.jobs j
                WHERE j.state = 'running' AND j.heartbeat_at IS NULL AND j.queue = p_queue));
    END IF;
    IF room <= 0 THEN
        RETURN;
    END IF;
    SELECT coalesce(array_agg((SELECT count(*)::integer FROM {schema}.jobs r
            WHERE r.state = 'running' AND r.concurrency_key = u.k) ORDER BY u.o), ARRAY[]::integer[])
        INTO counts FROM unnest(keys) WITH ORDINALITY AS u(k, o);
    FOR c IN SELECT j.id, j.concurrency_key, j.max_concurrent FROM {schema}.jobs j
        WHERE j.id = ANY(p_ids) AND j.queue = p_queue AND j.state IN ('available', 'scheduled', 'retryable')
            AND j.run_at <= p_now
        ORDER BY j.priority DESC, j.run_at, j.id FOR UPDATE SKIP LOCKED
    LOOP
        seen := seen + 1;
        IF c.concurrency_key IS NOT NULL THEN
            i := array_position(keys, c.concurrency_key);
            CONTINUE WHEN counts[i] >= coalesce(c.max_concurrent, 1);
            counts[i] := counts[i] + 1;
        END IF;
        picked := picked || c.id;
        EXIT WHEN cardinality(picked) >= room;
    END LOOP;
    IF cardinality(picked) < room THEN
        gone := cardinality(p_ids) - seen;  -- claimed, locked or ended by others since the pick
    END IF;
    RETURN QUERY UPDATE {schema}.jobs j SET state = 'running', attempt = j.attempt + 1, attempted_at = p_now,
        heartbeat_at = p_now
        WHERE j.id = ANY(picked)
        RETURNING j.id, j.kind, j.queue, j.args, j.attempt, j.max_attempts, j.priority, j.run_at, gone;
    IF cardinality(picked) = 0 AND gone > 0 THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::integer, NULL::integer,
            NULL::integer, NULL::double precision, gone;
    END IF;
END
$$;
