-- nursery_jobs schema, version 16: a keyed claim admits its candidates in one statement, and
-- its lock statements keep their plans.
--
-- Measured on a private cluster (pg_stat_statements, track_functions; benchmarks/RESULTS.md,
-- "Per-key concurrency", 2026-12-03): a claim of 32 jobs over 1,000 keys at a limit of 1 spent
-- 2.4 ms in the server against 1.2 ms for 32 unkeyed jobs, 1.9 ms of it in `claim_picked`. Of
-- that, 0.6 ms went to the two calls of `lock_keys` (0.06 ms of work between them): a
-- LANGUAGE sql function that is not inlined is parsed and planned again at the first call of
-- each transaction, and every claim is a transaction. Another 0.35 ms was the PL/pgSQL loop
-- over the candidates and the statement it leaves for the update.
--
-- 1. `lock_keys` is PL/pgSQL, with the same statement: its plan is kept by the session. The
--    locks, their spaces, hashes and order are unchanged.
-- 2. `claim_picked`, when no candidate has a rate and the candidates of each key carry one
--    limit (every job of a kind with `max_concurrent` set; the case that matters), takes the
--    same locks in the same order (the queue's, then the keys' in hash order) and then, in one
--    statement and so one new snapshot after them, counts each key's running rows once,
--    admits the candidates in claim order whose rank among their key's candidates is within
--    the key's free slots, the first `room` of those, and updates them. That is
--    `transitions.admit_rated` for this case: with one limit per key, the loop refuses a
--    key's candidates from the first one that finds it full, so the ones it starts are its
--    first (limit - running), and a refused one takes no room. Any other pick (a rate weighed,
--    limits that differ within a key) runs migration 0015's loop, unchanged. The rows are the
--    same either way (the NULL row with the room left under a global limit, 0015).
-- 3. `unpark_keys` looks for a parked job of its keys first (one probe of `jobs_parked` per
--    key), and updates only when there is one: an outcome batch of keyed jobs whose keys have
--    nothing parked (a backlog spread over many keys) no longer runs an UPDATE of the jobs
--    table, which opens every index of it. The probe is a statement of the function, so it
--    reads in the function's new snapshot, as the update does (`_UNPARK_FREED` in postgres.py).
--
-- Same names, arguments and rows (CREATE OR REPLACE): a runtime of version 13, 14 or 15 calls
-- the same functions and gets the same answers; nothing else changes in the schema.

CREATE OR REPLACE FUNCTION {schema}.lock_keys(p_space integer, p_prefix text, p_keys text[]) RETURNS text[]
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(k ORDER BY h, k), ARRAY[]::text[]) FROM (
        SELECT k, h, pg_advisory_xact_lock(p_space, h) FROM (
            SELECT DISTINCT u.k, hashtext(p_prefix || u.k) AS h FROM unnest(p_keys) AS u(k)
            WHERE u.k IS NOT NULL ORDER BY 2, 1
        ) sorted
    ) locked);
END
$$;

CREATE OR REPLACE FUNCTION {schema}.claim_picked(
    p_ids bigint[], p_keys text[], p_most integer[], p_rkeys text[], p_rlimits integer[],
    p_rpers double precision[], p_queue text, p_want integer, p_max_running integer, p_now double precision
) RETURNS TABLE (
    id bigint, kind text, queue text, args text, attempt integer, max_attempts integer, priority integer,
    run_at double precision
) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    space integer := hashtext('nursery_jobs claim_held ' || {schema_text});
    rspace integer := hashtext('nursery_jobs rate_lock ' || {schema_text});
    keys text[];
    counts integer[];
    picked bigint[] := ARRAY[]::bigint[];
    room integer := p_want;
    taken integer;
    i integer;
    rkeys text[];              -- rate: the locked rate keys
    radded integer[];          -- rate: starts this claim made per rate key
    rcaps integer[];           -- rate: the largest limit of the jobs it weighed, per key
    rpers double precision[];  -- rate: the longest window, per key
    rnext double precision;    -- rate: the earliest slot of a candidate refused for its rate
    slot double precision;
    st double precision[];
    ri integer;
BEGIN
    -- Each statement below must see what committed before it: READ COMMITTED's fresh snapshot
    -- per statement is what makes the counts exact after the locks.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'nursery_jobs claims need READ COMMITTED, not %', current_setting('transaction_isolation');
    END IF;
    IF p_max_running IS NOT NULL THEN
        PERFORM pg_advisory_xact_lock(space, hashtext('queue ' || p_queue));
    END IF;
    keys := {schema}.lock_keys(space, 'key ', p_keys);
    IF p_max_running IS NOT NULL THEN
        -- Through the rescuer's two indexes of running rows (migration 0004).
        room := least(room, p_max_running
            - (SELECT count(*)::integer FROM {schema}.jobs j
                WHERE j.state = 'running' AND j.heartbeat_at IS NOT NULL AND j.queue = p_queue)
            - (SELECT count(*)::integer FROM {schema}.jobs j
                WHERE j.state = 'running' AND j.heartbeat_at IS NULL AND j.queue = p_queue));
    END IF;
    IF NOT EXISTS (SELECT 1 FROM unnest(p_rkeys, p_rpers) AS u(k, per) WHERE u.k IS NOT NULL AND u.per IS NOT NULL)
        AND NOT EXISTS (SELECT 1 FROM unnest(p_keys, p_most) AS u(k, most) WHERE u.k IS NOT NULL
            GROUP BY u.k HAVING min(u.most) <> max(u.most))
    THEN
        -- In sets (2. above): no rate to weigh (so no rate lock to take), one limit per key.
        IF room <= 0 THEN
            RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, 0, NULL::integer, NULL::integer,
                NULL::double precision;
            RETURN;
        END IF;
        RETURN QUERY WITH c AS (
            SELECT u.id, u.k, u.most, u.o, row_number() OVER (PARTITION BY u.k ORDER BY u.o) AS rank
            FROM unnest(p_ids, p_keys, p_most) WITH ORDINALITY AS u(id, k, most, o)
        ), running AS (
            -- Each key's running rows, once per key (a probe of `jobs_running_key`).
            SELECT d.k, (SELECT count(*) FROM {schema}.jobs r WHERE r.state = 'running' AND r.concurrency_key = d.k) AS n
            FROM (SELECT DISTINCT c.k FROM c WHERE c.k IS NOT NULL) d
        ), admitted AS (
            SELECT c.id FROM c LEFT JOIN running ON running.k = c.k
            WHERE c.k IS NULL OR c.rank <= c.most - running.n
            ORDER BY c.o LIMIT room
        )
        UPDATE {schema}.jobs j SET state = 'running', attempt = j.attempt + 1, attempted_at = p_now,
            heartbeat_at = p_now
            WHERE j.id = ANY(ARRAY(SELECT admitted.id FROM admitted))
            RETURNING j.id, j.kind, j.queue, j.args, j.attempt, j.max_attempts, j.priority, j.run_at;
        GET DIAGNOSTICS taken = ROW_COUNT;
        IF p_max_running IS NOT NULL THEN
            RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, room - taken, NULL::integer,
                NULL::integer, NULL::double precision;
        END IF;
        RETURN;
    END IF;
    -- Migration 0015's loop, from here on unchanged.
    -- rate: the rate keys' locks, after the concurrency keys' (one order for every claimer).
    rkeys := {schema}.lock_keys(rspace, 'rate ', p_rkeys);
    radded := array_fill(0, ARRAY[cardinality(rkeys)]);
    rcaps := array_fill(1, ARRAY[cardinality(rkeys)]);
    rpers := array_fill(0::double precision, ARRAY[cardinality(rkeys)]);
    IF room <= 0 THEN
        -- The queue is full: the NULL row says so (no room left), and the claim stops.
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, 0, NULL::integer, NULL::integer,
            NULL::double precision;
        RETURN;
    END IF;
    SELECT coalesce(array_agg((SELECT count(*)::integer FROM {schema}.jobs r
            WHERE r.state = 'running' AND r.concurrency_key = u.k) ORDER BY u.o), ARRAY[]::integer[])
        INTO counts FROM unnest(keys) WITH ORDINALITY AS u(k, o);
    -- `transitions.admit_rated`: in claim order, a job starts if its key has a slot (counting
    -- the starts of this claim) and its rate key a start left in the window.
    FOR n IN 1 .. coalesce(cardinality(p_ids), 0) LOOP
        IF p_keys[n] IS NOT NULL THEN
            i := array_position(keys, p_keys[n]);
            CONTINUE WHEN counts[i] >= p_most[n];
        END IF;
        IF p_rkeys[n] IS NOT NULL AND p_rpers[n] IS NOT NULL THEN  -- rate
            ri := array_position(rkeys, p_rkeys[n]);
            -- Weighed against the key's rate: the record is sized for it, started or not.
            rcaps[ri] := greatest(rcaps[ri], p_rlimits[n]);
            rpers[ri] := greatest(rpers[ri], p_rpers[n]);
            -- Read first, then the rule on plain values: so `rate_slot` is inlined into a simple
            -- expression (with a sub-select for an argument it would run as a function call).
            SELECT k.starts INTO st FROM {schema}.rate_keys k WHERE k.key = p_rkeys[n];
            slot := {schema}.rate_slot(st, p_rlimits[n], p_rpers[n], p_now, radded[ri]);
            IF slot IS NOT NULL THEN
                rnext := least(rnext, slot);
                CONTINUE;
            END IF;
            radded[ri] := radded[ri] + 1;
        END IF;
        IF p_keys[n] IS NOT NULL THEN
            counts[i] := counts[i] + 1;
        END IF;
        picked := picked || p_ids[n];
        EXIT WHEN cardinality(picked) >= room;
    END LOOP;
    IF cardinality(rkeys) > 0 THEN
        -- rate: the records of the keys that started jobs, kept for every job weighed here (the
        -- ones refused are parked by `rate_park`, which sizes the records of the others).
        PERFORM {schema}.rate_record(rkeys, radded, rcaps, rpers, p_now);
    END IF;
    RETURN QUERY UPDATE {schema}.jobs j SET state = 'running', attempt = j.attempt + 1, attempted_at = p_now,
        heartbeat_at = p_now
        WHERE j.id = ANY(picked)
        RETURNING j.id, j.kind, j.queue, j.args, j.attempt, j.max_attempts, j.priority, j.run_at;
    -- One row with a NULL id: in `run_at` the earliest slot of a candidate refused for its rate,
    -- in `attempt` the room left under the queue's global limit after these starts (NULL: no
    -- global limit). A caller that finds room left looks again behind what the keys refused.
    IF rnext IS NOT NULL OR p_max_running IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text,
            CASE WHEN p_max_running IS NOT NULL THEN room - cardinality(picked) END, NULL::integer,
            NULL::integer, rnext;
    END IF;
END
$$;

-- Migration 0014's unpark_keys, which updates only when one of its keys has a parked job (3.).
CREATE OR REPLACE FUNCTION {schema}.unpark_keys(p_keys text[], p_counts integer[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM unnest(p_keys) AS u(k) WHERE EXISTS (SELECT 1 FROM {schema}.jobs r
        WHERE r.concurrency_key = u.k AND r.state = 'available' AND r.parked AND NOT r.rate_wait))
    THEN
        RETURN 0;
    END IF;
    UPDATE {schema}.jobs j SET parked = false
    WHERE j.id = ANY(ARRAY(
        SELECT p.id FROM unnest(p_keys, p_counts) AS u(k, c)
        CROSS JOIN LATERAL (SELECT r.id FROM {schema}.jobs r
            WHERE r.concurrency_key = u.k AND r.state = 'available' AND r.parked AND NOT r.rate_wait
            ORDER BY r.priority DESC, r.run_at, r.id LIMIT u.c FOR UPDATE SKIP LOCKED) p))
        AND j.state = 'available' AND j.parked AND NOT j.rate_wait;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;
