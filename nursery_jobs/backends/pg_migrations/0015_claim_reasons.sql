-- nursery_jobs schema, version 15: a claim under a queue's global limit tells a full queue from
-- a pick the keys cut short; a key's rate record is sized for every rate weighed against it;
-- the rescuer's repair of rate-parked jobs does bounded work per pass; `jobs_pending_rate` goes.
--
-- 1. Room. Under `global_max_workers` every picked job goes to `claim_picked`, and the claim
--    took "fewer started than picked" to mean the queue was full, so it did not look again: a
--    pick that a concurrency key (several of one key in one pick) or a rate refused in part
--    ended the claim, and the queue's unlimited jobs behind waited for the key's next slot or a
--    poll (3 of 5 startable jobs in one claim, against 5 on SQLite and memory). `claim_picked`
--    now says why it stopped: its row with a NULL id (which carried, and still carries, the
--    earliest slot of a job refused for its rate in `run_at`) comes whenever the queue has a
--    global limit, with the room left under it after its own starts in `attempt`. The claim
--    counts the queue as full only when that is 0; otherwise it looks again. (A runtime of
--    version 13 or 14 reads the NULL row's `run_at` only, through min(): a row whose `run_at`
--    is NULL changes nothing for it.)
-- 2. Mixed rates. Jobs of one rate key may carry different rates (two kinds sharing a key);
--    each is admitted by its own rate over the key's recorded starts, and the record keeps the
--    latest `cap` starts less than `per` old. `cap` and `per` were the largest limit and window
--    of the jobs that *started*: a job refused in the same claim with a larger limit or window
--    than those could find, in the record written after the claim, fewer starts than the ones
--    that refused it, so `rate_park`'s recheck left it unparked (or armed a later wake) and the
--    next claim started it over its own rate. Now `cap` and `per` grow with every job weighed
--    against the key's rate, started or refused (`transitions.Admission.rate_sized`), on every
--    backend: `claim_picked` sizes the records it writes for the jobs it weighed, and
--    `rate_park` the records of the keys whose jobs it parks, so the recheck sees what the
--    claim saw, and a later start of a smaller rate does not trim what a parked job counts.
-- 3. The repair (`repair_parked`, the rescuer's pass) read every rate-parked job on each pass:
--    its steps for parked jobs with no concurrency key and for each concurrency key filtered
--    them out of `jobs_parked_queue` and `jobs_parked` (20,000 rate-parked jobs: 50,006 index
--    entries read by one pass), and its walk over the (queue, rate key) groups had no bound.
--    Now `jobs_parked` leaves rate-parked jobs out, the step for unkeyed parked jobs probes that
--    index before it updates, and the walk stops after 1,000 groups, one index probe each; the
--    next pass goes on from where this one stopped (`repair_cursor`). The same 20,000: 8 reads.
-- 4. `jobs_pending_rate` (migration 0010) was read by the claim's next-slot pass, which
--    migration 0014 removed: no statement reads it, and every insert of a rate-keyed job and
--    every claim and outcome of one writes it (the row enters or leaves its predicate, so no
--    update of it is HOT). Dropped; the jobs parked for their rate have `jobs_rate_parked`.
DROP INDEX IF EXISTS {schema}.jobs_pending_rate;

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

-- Migration 0014's rate_park, which also sizes each key's record for the jobs it parks
-- (`transitions.Admission.rate_sized`): a key's `cap` and `per` grow to the largest limit and
-- window of its parked jobs, so a later start of a job with a smaller rate does not trim the
-- starts their windows count. Same arguments and result.
CREATE OR REPLACE FUNCTION {schema}.rate_park(p_ids bigint[], p_queue text, p_now double precision)
RETURNS double precision LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    w double precision;
    ck text[];
    n integer[];
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'nursery_jobs claims need READ COMMITTED, not %', current_setting('transaction_isolation');
    END IF;
    PERFORM {schema}.rate_lock(p_ids);
    WITH c AS (
        SELECT j.id, j.rate_key, coalesce(j.rate_limit, 1) AS lim, j.rate_per AS per,
            {schema}.rate_slot(k.starts, coalesce(j.rate_limit, 1), j.rate_per, p_now, 0) AS slot,
            EXISTS (SELECT 1 FROM {schema}.rate_wakes x
                WHERE x.queue = p_queue AND x.key = j.rate_key AND x.wake <= p_now) AS waits
        FROM {schema}.jobs j LEFT JOIN {schema}.rate_keys k ON k.key = j.rate_key
        WHERE j.id = ANY(p_ids) AND j.queue = p_queue AND j.state IN ('available', 'scheduled', 'retryable')
            AND NOT j.parked AND j.run_at <= p_now AND j.rate_key IS NOT NULL AND j.rate_per IS NOT NULL
        FOR UPDATE OF j SKIP LOCKED
    ), p AS (
        UPDATE {schema}.jobs j SET state = 'available', parked = true, rate_wait = true
        FROM c WHERE j.id = c.id AND (c.slot IS NOT NULL OR c.waits)
        RETURNING c.rate_key, coalesce(c.slot, p_now) AS slot, j.concurrency_key, c.lim, c.per
    ), a AS (
        INSERT INTO {schema}.rate_wakes AS r (queue, key, wake)
        SELECT p_queue, p.rate_key, min(p.slot) FROM p GROUP BY p.rate_key
        ON CONFLICT (queue, key) DO UPDATE SET wake = least(r.wake, EXCLUDED.wake)
        RETURNING r.wake
    ), g AS (
        UPDATE {schema}.rate_keys r SET cap = greatest(r.cap, m.lim), per = greatest(r.per, m.per)
        FROM (SELECT p.rate_key, max(p.lim) AS lim, max(p.per) AS per FROM p GROUP BY p.rate_key) m
        WHERE r.key = m.rate_key AND (r.cap < m.lim OR r.per < m.per)
    ), b AS (
        SELECT p.concurrency_key AS k, count(*)::integer AS n FROM p WHERE p.concurrency_key IS NOT NULL
        GROUP BY p.concurrency_key
    )
    SELECT (SELECT min(a.wake) FROM a), (SELECT array_agg(b.k ORDER BY b.k) FROM b), (SELECT array_agg(b.n ORDER BY b.k) FROM b)
        INTO w, ck, n;
    IF ck IS NOT NULL THEN
        PERFORM {schema}.unpark_keys(ck, n);
    END IF;
    RETURN w;
END
$$;

-- The repair's bounded walk (3. above). `jobs_parked` now leaves out the jobs parked for their
-- rate (a rate flag with no rate key means nothing, so such a row stays in): the repair's
-- steps for jobs with no concurrency key and for each concurrency key, and `unpark_keys`, read
-- no entry of a rate backlog any more. (DROP and CREATE INDEX, not CONCURRENTLY: writes wait
-- while it builds, from a scan of the table; the index holds parked rows only. Run it in a
-- quiet moment on a large table, as migration 0011.)
DROP INDEX {schema}.jobs_parked;
CREATE INDEX jobs_parked ON {schema}.jobs (concurrency_key, priority DESC, run_at, id)
    WHERE state = 'available' AND parked AND (NOT rate_wait OR rate_key IS NULL);

-- Where the repair's walk over the (queue, rate key) groups of `jobs_rate_parked` stopped:
-- the next pass goes on after it (NULL: from the start). One row.
CREATE TABLE {schema}.repair_cursor (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    queue text,
    key text
);
INSERT INTO {schema}.repair_cursor DEFAULT VALUES;

-- Migration 0014's repair_parked, with bounded work per pass. Returns the queue of each job
-- unparked or key woken, as before.
--   - Parked with no concurrency key and not waiting for a rate (`jobs_parked`'s NULL
--     entries): nothing limits them, they come back (at most 1,000 a pass). A rate flag with no rate key (a row
--     written by something else) counts as no rate wait, here and below, and is cleared.
--   - Each concurrency key with parked jobs not waiting for a rate (one probe of `jobs_parked`
--     per key): its best one comes back if the key has a free slot.
--   - At most 1,000 (queue, rate key) groups of `jobs_rate_parked`, after the cursor (a loose
--     scan: one index probe per group, however many jobs wait in it): a group with no wake time
--     wakes now. The walk goes on from there at the next pass, and starts over once it has
--     reached the end, so a backlog of any size costs a pass at most 1,000 probes there, and a
--     group written by hand is found within (groups / 1,000) passes.
CREATE OR REPLACE FUNCTION {schema}.repair_parked() RETURNS TABLE (queue text) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    k text;
    head record;
    fq text;
    fk text;
    qs text[];
    ks text[];
BEGIN
    -- A probe in `jobs_parked`'s order first (a plan that reads that index and no other: the
    -- planner cannot know that the parked rows with no key are rate-parked ones, and would
    -- filter them all out of `jobs_parked_queue`); the update only when there is one, at most
    -- 1,000 a pass.
    PERFORM 1 FROM {schema}.jobs j WHERE j.concurrency_key IS NULL AND j.state = 'available' AND j.parked
        AND (NOT j.rate_wait OR j.rate_key IS NULL) ORDER BY j.concurrency_key, j.priority DESC, j.run_at, j.id LIMIT 1;
    IF FOUND THEN
        RETURN QUERY UPDATE {schema}.jobs j SET parked = false, rate_wait = false
            WHERE j.id = ANY(ARRAY(SELECT u.id FROM {schema}.jobs u WHERE u.concurrency_key IS NULL
                AND u.state = 'available' AND u.parked AND (NOT u.rate_wait OR u.rate_key IS NULL) LIMIT 1000))
                AND j.concurrency_key IS NULL AND j.state = 'available' AND j.parked
            RETURNING j.queue;
    END IF;
    SELECT min(j.concurrency_key) INTO k FROM {schema}.jobs j
        WHERE j.state = 'available' AND j.parked AND (NOT j.rate_wait OR j.rate_key IS NULL);
    WHILE k IS NOT NULL LOOP
        SELECT j.id, j.queue, coalesce(j.max_concurrent, 1) AS most INTO head FROM {schema}.jobs j
            WHERE j.concurrency_key = k AND j.state = 'available' AND j.parked AND (NOT j.rate_wait OR j.rate_key IS NULL)
            ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1;
        IF head.id IS NOT NULL
            AND (SELECT count(*) FROM {schema}.jobs r WHERE r.state = 'running' AND r.concurrency_key = k) < head.most
        THEN
            UPDATE {schema}.jobs j SET parked = false, rate_wait = false
                WHERE j.id = head.id AND j.state = 'available' AND j.parked;
            IF FOUND THEN
                queue := head.queue;
                RETURN NEXT;
            END IF;
        END IF;
        SELECT min(j.concurrency_key) INTO k FROM {schema}.jobs j
            WHERE j.state = 'available' AND j.parked AND (NOT j.rate_wait OR j.rate_key IS NULL) AND j.concurrency_key > k;
    END LOOP;
    -- FOR UPDATE: concurrent passes take their turns here instead of walking the same groups.
    SELECT c.queue, c.key INTO fq, fk FROM {schema}.repair_cursor c FOR UPDATE;
    WITH RECURSIVE t AS (
        (SELECT j.queue AS q, j.rate_key AS rk FROM {schema}.jobs j
            WHERE j.state = 'available' AND j.parked AND j.rate_wait AND j.rate_key IS NOT NULL
                AND (j.queue, j.rate_key) > (coalesce(fq, ''), coalesce(fk, ''))
            ORDER BY j.queue, j.rate_key LIMIT 1)
        UNION ALL
        SELECT n.q, n.rk FROM t CROSS JOIN LATERAL (SELECT j.queue AS q, j.rate_key AS rk FROM {schema}.jobs j
            WHERE j.state = 'available' AND j.parked AND j.rate_wait AND j.rate_key IS NOT NULL
                AND (j.queue, j.rate_key) > (t.q, t.rk)
            ORDER BY j.queue, j.rate_key LIMIT 1) n
    )
    SELECT array_agg(w.q ORDER BY w.q, w.rk), array_agg(w.rk ORDER BY w.q, w.rk) INTO qs, ks
        FROM (SELECT t.q, t.rk FROM t LIMIT 1000) w;
    IF coalesce(cardinality(qs), 0) < 1000 THEN
        qs := coalesce(qs, ARRAY[]::text[]);
        ks := coalesce(ks, ARRAY[]::text[]);
        UPDATE {schema}.repair_cursor c SET queue = NULL, key = NULL WHERE c.queue IS NOT NULL;  -- the end: start over
    ELSE
        UPDATE {schema}.repair_cursor c SET queue = qs[1000], key = ks[1000];
    END IF;
    -- (ON CONFLICT alone, one probe of the primary key a group: a NOT EXISTS here was planned
    -- as an anti-join reading all of `rate_wakes`.)
    RETURN QUERY INSERT INTO {schema}.rate_wakes AS r (queue, key, wake)
        SELECT u.q, u.k, 0 FROM unnest(qs, ks) AS u(q, k)
        ON CONFLICT (queue, key) DO NOTHING
        RETURNING r.queue;
END
$$;
