-- nursery_jobs schema, version 18: a claim weighs a rate key at a time taken once it holds the
-- key's lock, never before the key's latest recorded start (`transitions.rate_time`).
--
-- A claim's time (`p_now`) is read by its client before the claim waits for the key's lock. Two
-- claims of one key: the one that read the later time may take the lock first and write the
-- key's record trimmed to its own window; the other, weighed at its earlier time, then missed the
-- starts that claim trimmed (they were still in its window) and was admitted one start too many,
-- and appended its starts after later ones, out of the time order `rate_slot` reads the record
-- in (3 processes, `Rate(5, per=1)`: 6 starts of one key within 0.9886 s). Now:
--   - the claim's time for its rate keys is p_now moved on by the time it waited for their locks
--     (`lock_keys_waited`: 0 when no other claim held one, so a claim alone keeps p_now exactly);
--   - each key is weighed at the later of that and its latest recorded start, and its starts are
--     recorded then, in the key's record and in the started jobs' `attempted_at`.
-- So the record stays in time order, no start a claim still counts was trimmed before it, and a
-- start is counted no earlier than it could happen: after the commit of any claim it waited for.
--
-- `rate_slot`, `rate_record` and `claim_picked` are replaced with the same names, arguments and
-- results (CREATE OR REPLACE), and `lock_keys_waited` is new: a runtime of version 13 to 17
-- calls `claim_picked` (through `claim_picked_parking`), `rate_park`, `rate_release` and
-- `rate_slot` (in the claim's scan) as before, and is held to the same rule. (Measured on a
-- pre-filled, ANALYZEd table, claims alternated with version 17's: the same cost with no rate
-- key, 8 % less with rate keys, `rate_record` now keeping its plan.)

-- `transitions.rate_slot`: NULL if a job limited to p_limit starts per p_per seconds may start
-- at the key's `rate_time` (p_now, or its latest start if later), given its starts (ascending)
-- and p_added more made then by this claim; else when its next slot comes. One expression, so
-- that it is still inlined where it is called (the claim's scan, `claim_picked`).
CREATE OR REPLACE FUNCTION {schema}.rate_slot(
    p_starts double precision[], p_limit integer, p_per double precision, p_now double precision, p_added integer
) RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_added >= p_limit THEN greatest(p_now, p_starts[cardinality(p_starts)]) + p_per
        WHEN coalesce(cardinality(p_starts), 0) < p_limit - p_added THEN NULL
        WHEN p_starts[cardinality(p_starts) - (p_limit - p_added) + 1] + p_per
                > greatest(p_now, p_starts[cardinality(p_starts)])
            THEN p_starts[cardinality(p_starts) - (p_limit - p_added) + 1] + p_per
    END
$$;

-- `transitions.rate_log`: the records after a claim made p_added[i] starts of key p_keys[i], each
-- at the key's `rate_time`: the latest `cap` starts less than `per` seconds old then. PL/pgSQL
-- with one statement, so that its plan is kept by the session (as `lock_keys`, migration 0016):
-- as a LANGUAGE sql function it was planned again in every claim that started rate-keyed jobs.
CREATE OR REPLACE FUNCTION {schema}.rate_record(
    p_keys text[], p_added integer[], p_caps integer[], p_pers double precision[], p_now double precision
) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO {schema}.rate_keys AS r (key, starts, cap, per, last)
    SELECT u.k, (array_fill(p_now, ARRAY[u.n]))[greatest(1, u.n - u.c + 1):], u.c, u.p, p_now
    FROM unnest(p_keys, p_added, p_caps, p_pers) AS u(k, n, c, p) WHERE u.n > 0
    ON CONFLICT (key) DO UPDATE SET
        starts = (SELECT coalesce(array_agg(u.t ORDER BY u.o), ARRAY[]::double precision[])
            FROM unnest(r.starts || array_fill(greatest(p_now, r.starts[cardinality(r.starts)]),
                ARRAY[cardinality(EXCLUDED.starts)])) WITH ORDINALITY AS u(t, o)
            WHERE u.t + greatest(r.per, EXCLUDED.per) > greatest(p_now, r.starts[cardinality(r.starts)])
                AND u.o > cardinality(r.starts) + cardinality(EXCLUDED.starts) - greatest(r.cap, EXCLUDED.cap)),
        cap = greatest(r.cap, EXCLUDED.cap),
        per = greatest(r.per, EXCLUDED.per),
        last = greatest(p_now, r.starts[cardinality(r.starts)]);
END
$$;

-- `lock_keys` for rate keys, and how long the caller waited for them: each key, in the same hash
-- order, is tried first and waited for only when another transaction holds it, so a claim that
-- met no other one waited 0 and keeps its time exactly.
CREATE FUNCTION {schema}.lock_keys_waited(p_space integer, p_prefix text, p_keys text[], OUT keys text[],
    OUT waited double precision) LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    k record;
    t timestamptz;
BEGIN
    keys := ARRAY[]::text[];
    waited := 0;
    FOR k IN SELECT DISTINCT u.k, hashtext(p_prefix || u.k) AS h FROM unnest(p_keys) AS u(k)
        WHERE u.k IS NOT NULL ORDER BY 2, 1
    LOOP
        IF NOT pg_try_advisory_xact_lock(p_space, k.h) THEN
            t := clock_timestamp();
            PERFORM pg_advisory_xact_lock(p_space, k.h);
            waited := waited + extract(epoch FROM clock_timestamp() - t);
        END IF;
        keys := keys || k.k;
    END LOOP;
END
$$;

-- Migration 0015's claim_picked, its time moved on by the wait for the rate keys' locks (`rnow`),
-- each rate key weighed at its `rate_time` then (`rtimes`), which the started jobs of the key get
-- as their `attempted_at`.
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
    i integer;
    rkeys text[];              -- rate: the locked rate keys
    radded integer[];          -- rate: starts this claim made per rate key
    rcaps integer[];           -- rate: the largest limit of the jobs it weighed, per key
    rpers double precision[];  -- rate: the longest window, per key
    rnext double precision;    -- rate: the earliest slot of a candidate refused for its rate
    rnow double precision;     -- rate: p_now once the rate keys' locks are held
    rtimes double precision[]; -- rate: the time each key is weighed at (`rate_time`), per key
    rlate boolean := false;    -- rate: a key's latest start is after rnow
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
    IF coalesce(cardinality(array_remove(p_rkeys, NULL)), 0) = 0 THEN
        rkeys := ARRAY[]::text[];  -- no rate key (the lean claim passes none): no lock, no wait
        rnow := p_now;
    ELSE
        SELECT l.keys, p_now + l.waited INTO rkeys, rnow FROM {schema}.lock_keys_waited(rspace, 'rate ', p_rkeys) l;
    END IF;
    radded := array_fill(0, ARRAY[cardinality(rkeys)]);
    rcaps := array_fill(1, ARRAY[cardinality(rkeys)]);
    rpers := array_fill(0::double precision, ARRAY[cardinality(rkeys)]);
    rtimes := array_fill(rnow, ARRAY[cardinality(rkeys)]);
    IF p_max_running IS NOT NULL THEN
        -- Through the rescuer's two indexes of running rows (migration 0004).
        room := least(room, p_max_running
            - (SELECT count(*)::integer FROM {schema}.jobs j
                WHERE j.state = 'running' AND j.heartbeat_at IS NOT NULL AND j.queue = p_queue)
            - (SELECT count(*)::integer FROM {schema}.jobs j
                WHERE j.state = 'running' AND j.heartbeat_at IS NULL AND j.queue = p_queue));
    END IF;
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
            IF st[cardinality(st)] > rnow THEN
                rtimes[ri] := st[cardinality(st)];
                rlate := true;
            END IF;
            slot := {schema}.rate_slot(st, p_rlimits[n], p_rpers[n], rnow, radded[ri]);
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
        PERFORM {schema}.rate_record(rkeys, radded, rcaps, rpers, rnow);
    END IF;
    -- A rate-keyed start is recorded in the job at the time its key counted it (when that is not
    -- p_now: a lookup per row only then).
    IF rlate OR rnow > p_now THEN
        RETURN QUERY UPDATE {schema}.jobs j SET state = 'running', attempt = j.attempt + 1,
            attempted_at = CASE WHEN j.rate_key IS NULL THEN p_now
                ELSE coalesce(rtimes[array_position(rkeys, j.rate_key)], p_now) END,
            heartbeat_at = p_now
            WHERE j.id = ANY(picked)
            RETURNING j.id, j.kind, j.queue, j.args, j.attempt, j.max_attempts, j.priority, j.run_at;
    ELSE
        RETURN QUERY UPDATE {schema}.jobs j SET state = 'running', attempt = j.attempt + 1, attempted_at = p_now,
            heartbeat_at = p_now
            WHERE j.id = ANY(picked)
            RETURNING j.id, j.kind, j.queue, j.args, j.attempt, j.max_attempts, j.priority, j.run_at;
    END IF;
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
