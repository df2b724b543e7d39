-- nursery_jobs schema, version 13: a claim that meets limited jobs is one statement.
--
-- Since version 6 a claim that picked keyed or rate-keyed jobs (or any job under a queue's
-- global limit) made a second round trip, `claim_held`, in a transaction of its own: it read
-- each picked row three times by primary key (its concurrency key, its rate key, then the row
-- again under FOR UPDATE SKIP LOCKED, since the claim statement's locks had ended with its
-- commit), and a keyed claim cost about twice an unkeyed one. Now the claim statement calls
-- `claim_picked` itself, after its own writes, with the picked rows' keys and limits: the rows
-- are still locked by the calling statement (its scans lock what they pick, FOR UPDATE SKIP
-- LOCKED, to the commit), so nothing can have claimed, cancelled or changed them, and the
-- function reads no job row but the running counts.
--
-- Exactness is `claim_held`'s, step for step (migration 0006; the rate steps of 0010):
--   1. a transaction-level advisory lock per key (and one for the queue under a global limit),
--      in one order (the queue's, then the keys' sorted by hash, then the rate keys' in their
--      own space, sorted by hash), so two claimers never wait on each other in a circle;
--   2. only then the running counts (and each rate key's record), in new statements and so new
--      snapshots (READ COMMITTED, a VOLATILE function), which see every claim of those keys
--      committed before the locks were granted;
--   3. `transitions.admit_rated` on the candidates in claim order, and the update.
-- The locks are the very ones `claim_held` and `rate_lock` take (the same spaces and hashes), so
-- a runtime of the previous version, still calling `claim_held` during a rolling deploy, and
-- this one exclude each other. Holding the picked rows' locks while waiting for an advisory
-- lock cannot deadlock: no holder of these advisory locks ever waits for a job row's lock
-- (claims lock rows with SKIP LOCKED; an outcome waits for a row lock but takes no advisory
-- lock).
--
-- The caller guarantees: p_ids are due pending jobs of p_queue that its transaction holds
-- locked, in claim order (priority DESC, run_at, id), and p_keys[i], p_most[i] (the limit,
-- never NULL), p_rkeys[i], p_rlimits[i] (never NULL) and p_rpers[i] are job p_ids[i]'s. It
-- returns the claimed rows, and one row with a NULL id whose run_at is the earliest slot of a
-- candidate refused for its rate, when there is one.
-- The distinct keys of p_keys (NULLs left out), each locked for the rest of the transaction
-- (the advisory lock (p_space, hashtext(p_prefix || key)), as `claim_held` and `rate_lock` take
-- them), in hash order: every claimer takes its locks in this order.
CREATE FUNCTION {schema}.lock_keys(p_space integer, p_prefix text, p_keys text[]) RETURNS text[]
LANGUAGE sql VOLATILE AS $$
    SELECT coalesce(array_agg(k ORDER BY h, k), ARRAY[]::text[]) FROM (
        SELECT k, h, pg_advisory_xact_lock(p_space, h) FROM (
            SELECT DISTINCT u.k, hashtext(p_prefix || u.k) AS h FROM unnest(p_keys) AS u(k)
            WHERE u.k IS NOT NULL ORDER BY 2, 1
        ) sorted
    ) locked
$$;

CREATE FUNCTION {schema}.claim_picked(
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
    i integer;
    rkeys text[];              -- rate: the locked rate keys
    radded integer[];          -- rate: starts this claim made per rate key
    rcaps integer[];           -- rate: the largest limit of the jobs it started, per key
    rpers double precision[];  -- rate: the largest window, per key
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
    -- rate: the rate keys' locks, after the concurrency keys' (one order for every claimer).
    rkeys := {schema}.lock_keys(rspace, 'rate ', p_rkeys);
    radded := array_fill(0, ARRAY[cardinality(rkeys)]);
    rcaps := array_fill(1, ARRAY[cardinality(rkeys)]);
    rpers := array_fill(0::double precision, ARRAY[cardinality(rkeys)]);
    IF p_max_running IS NOT NULL THEN
        -- Through the rescuer's two indexes of running rows (migration 0004).
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
    -- `transitions.admit_rated`: in claim order, a job starts if its key has a slot (counting
    -- the starts of this claim) and its rate key a start left in the window.
    FOR n IN 1 .. coalesce(cardinality(p_ids), 0) LOOP
        IF p_keys[n] IS NOT NULL THEN
            i := array_position(keys, p_keys[n]);
            CONTINUE WHEN counts[i] >= p_most[n];
        END IF;
        IF p_rkeys[n] IS NOT NULL AND p_rpers[n] IS NOT NULL THEN  -- rate
            ri := array_position(rkeys, p_rkeys[n]);
            -- Read first, then the rule on plain values: so `rate_slot` is inlined into a simple
            -- expression (with a sub-select for an argument it would run as a function call).
            SELECT k.starts INTO st FROM {schema}.rate_keys k WHERE k.key = p_rkeys[n];
            slot := {schema}.rate_slot(st, p_rlimits[n], p_rpers[n], p_now, radded[ri]);
            IF slot IS NOT NULL THEN
                rnext := least(rnext, slot);
                CONTINUE;
            END IF;
            radded[ri] := radded[ri] + 1;
            rcaps[ri] := greatest(rcaps[ri], p_rlimits[n]);
            rpers[ri] := greatest(rpers[ri], p_rpers[n]);
        END IF;
        IF p_keys[n] IS NOT NULL THEN
            counts[i] := counts[i] + 1;
        END IF;
        picked := picked || p_ids[n];
        EXIT WHEN cardinality(picked) >= room;
    END LOOP;
    IF cardinality(rkeys) > 0 THEN
        PERFORM {schema}.rate_record(rkeys, radded, rcaps, rpers, p_now);  -- rate
    END IF;
    RETURN QUERY UPDATE {schema}.jobs j SET state = 'running', attempt = j.attempt + 1, attempted_at = p_now,
        heartbeat_at = p_now
        WHERE j.id = ANY(picked)
        RETURNING j.id, j.kind, j.queue, j.args, j.attempt, j.max_attempts, j.priority, j.run_at;
    IF rnext IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::integer, NULL::integer,
            NULL::integer, rnext;
    END IF;
END
$$;
