-- nursery_jobs schema, version 10: per-key rate limits (`@app.job(rate=nj.Rate(n, per=s),
-- rate_key=...)`).
--
-- A job may carry a rate key and its rate: it starts only while its key has had fewer than
-- `rate_limit` starts in the last `rate_per` seconds (every attempt's start counts). Each key's
-- record is its latest starts, ascending, at most `cap` of them (the largest limit its jobs
-- carried): a sliding log, exact for any window, with bounded storage. Retention drops a key
-- whose latest start is older than its window (`per`, the largest its jobs carried).
--
-- Exact under concurrent claimers: keyed jobs are not claimed by the claim statement but held
-- for `claim_held` (migration 0006, replaced below with its rate steps added), which after the
-- concurrency keys' locks takes one transaction-level advisory lock per rate key
-- (`rate_lock`: its own lock space, keys in hash order, so claimers never wait in a circle),
-- then reads each key's record in a new snapshot that sees every start committed before the
-- lock was granted, applies `rate_slot` (the rule of `transitions.rate_slot`) to each
-- candidate, counting the starts it makes itself, and writes the records (`rate_record`) in
-- the transaction that marks the jobs running. A candidate refused for its rate stays as it
-- is; the earliest slot of the refused ones comes back in the run_at of a row with a NULL id.
-- The claim statement's scan passes over jobs whose key is over its rate (a probe of
-- `rate_keys`), and reports the earliest slot of those (`jobs_pending_rate`) when it finds
-- fewer jobs than it was asked for, so the fetcher sleeps exactly until a slot frees.
-- (ADD COLUMN with no default: no rewrite. CREATE INDEX, not CONCURRENTLY: a new column is NULL
-- in every row, and the partial index holds none of them.)
ALTER TABLE {schema}.jobs
    ADD COLUMN rate_key text,
    ADD COLUMN rate_limit integer CHECK (rate_limit IS NULL OR rate_limit >= 1),
    ADD COLUMN rate_per double precision CHECK (rate_per IS NULL OR rate_per > 0);
CREATE INDEX jobs_pending_rate ON {schema}.jobs (queue, rate_key)
    WHERE rate_key IS NOT NULL AND state IN ('available', 'scheduled', 'retryable');

CREATE TABLE {schema}.rate_keys (
    key text PRIMARY KEY,
    starts double precision[] NOT NULL,
    cap integer NOT NULL,
    per double precision NOT NULL,
    last double precision NOT NULL
);

-- `transitions.rate_slot`: NULL if a job limited to p_limit starts per p_per seconds may start
-- at p_now, given its key's starts (ascending) and p_added more made at p_now by this claim;
-- else when its next slot comes (the p_limit-th latest start leaves the window).
CREATE FUNCTION {schema}.rate_slot(
    p_starts double precision[], p_limit integer, p_per double precision, p_now double precision, p_added integer
) RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_added >= p_limit THEN p_now + p_per
        WHEN coalesce(cardinality(p_starts), 0) < p_limit - p_added THEN NULL
        WHEN p_starts[cardinality(p_starts) - (p_limit - p_added) + 1] + p_per > p_now
            THEN p_starts[cardinality(p_starts) - (p_limit - p_added) + 1] + p_per
    END
$$;

-- The rate keys of the jobs p_ids, each locked for the rest of the transaction, in hash order.
CREATE FUNCTION {schema}.rate_lock(p_ids bigint[]) RETURNS text[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    space integer := hashtext('nursery_jobs rate_lock ' || {schema_text});
    k record;
    keys text[] := ARRAY[]::text[];
BEGIN
    FOR k IN SELECT DISTINCT j.rate_key AS key, hashtext('rate ' || j.rate_key) AS h
        FROM {schema}.jobs j WHERE j.id = ANY(p_ids) AND j.rate_key IS NOT NULL ORDER BY 2, 1
    LOOP
        PERFORM pg_advisory_xact_lock(space, k.h);
        keys := keys || k.key;
    END LOOP;
    RETURN keys;
END
$$;

-- `transitions.rate_log`: the records after a claim made p_added[i] starts of key p_keys[i] at
-- p_now: the latest `cap` starts less than `per` seconds old (the largest limit, and window, of
-- the key's jobs), so a record is no larger than the key's real traffic in a window.
CREATE FUNCTION {schema}.rate_record(
    p_keys text[], p_added integer[], p_caps integer[], p_pers double precision[], p_now double precision
) RETURNS void LANGUAGE sql VOLATILE AS $$
    INSERT INTO {schema}.rate_keys AS r (key, starts, cap, per, last)
    SELECT u.k, (array_fill(p_now, ARRAY[u.n]))[greatest(1, u.n - u.c + 1):], u.c, u.p, p_now
    FROM unnest(p_keys, p_added, p_caps, p_pers) AS u(k, n, c, p) WHERE u.n > 0
    ON CONFLICT (key) DO UPDATE SET
        starts = (SELECT coalesce(array_agg(u.t ORDER BY u.o), ARRAY[]::double precision[])
            FROM unnest(r.starts || EXCLUDED.starts) WITH ORDINALITY AS u(t, o)
            WHERE u.t + greatest(r.per, EXCLUDED.per) > p_now
                AND u.o > cardinality(r.starts) + cardinality(EXCLUDED.starts) - greatest(r.cap, EXCLUDED.cap)),
        cap = greatest(r.cap, EXCLUDED.cap),
        per = greatest(r.per, EXCLUDED.per),
        last = EXCLUDED.last
$$;

-- Migration 0006's claim_held, with the rate steps added (marked "rate"): same arguments and
-- rows, so the claim's calls do not change.
CREATE OR REPLACE FUNCTION {schema}.claim_held(
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
    -- One lock per key, taken in hash order (every claimer takes its keys in the same order,
    -- so none waits on another in a circle), then each key's running count in one read.
    SELECT array_agg(k ORDER BY h) INTO keys FROM (
        SELECT k, h, pg_advisory_xact_lock(space, h) FROM (
            SELECT DISTINCT j.concurrency_key AS k, hashtext('key ' || j.concurrency_key) AS h
            FROM {schema}.jobs j WHERE j.id = ANY(p_ids) AND j.concurrency_key IS NOT NULL ORDER BY 2, 1
        ) sorted
    ) locked;
    keys := coalesce(keys, ARRAY[]::text[]);
    -- rate: the rate keys' locks, after the concurrency keys' (one order for every claimer).
    rkeys := {schema}.rate_lock(p_ids);
    radded := array_fill(0, ARRAY[cardinality(rkeys)]);
    rcaps := array_fill(1, ARRAY[cardinality(rkeys)]);
    rpers := array_fill(0::double precision, ARRAY[cardinality(rkeys)]);
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
    FOR c IN SELECT j.id, j.concurrency_key, j.max_concurrent, j.rate_key, j.rate_limit, j.rate_per
        FROM {schema}.jobs j
        WHERE j.id = ANY(p_ids) AND j.queue = p_queue AND j.state IN ('available', 'scheduled', 'retryable')
            AND j.run_at <= p_now
        ORDER BY j.priority DESC, j.run_at, j.id FOR UPDATE SKIP LOCKED
    LOOP
        seen := seen + 1;
        IF c.concurrency_key IS NOT NULL THEN
            i := array_position(keys, c.concurrency_key);
            CONTINUE WHEN counts[i] >= coalesce(c.max_concurrent, 1);
        END IF;
        IF c.rate_key IS NOT NULL AND c.rate_per IS NOT NULL THEN  -- rate
            ri := array_position(rkeys, c.rate_key);
            -- Read first, then the rule on plain values: so `rate_slot` is inlined into a simple
            -- expression (with a sub-select for an argument it would run as a function call).
            SELECT k.starts INTO st FROM {schema}.rate_keys k WHERE k.key = c.rate_key;
            slot := {schema}.rate_slot(st, coalesce(c.rate_limit, 1), c.rate_per, p_now, radded[ri]);
            IF slot IS NOT NULL THEN
                rnext := least(rnext, slot);
                CONTINUE;
            END IF;
            radded[ri] := radded[ri] + 1;
            rcaps[ri] := greatest(rcaps[ri], coalesce(c.rate_limit, 1));
            rpers[ri] := greatest(rpers[ri], c.rate_per);
        END IF;
        IF c.concurrency_key IS NOT NULL THEN
            counts[i] := counts[i] + 1;
        END IF;
        picked := picked || c.id;
        EXIT WHEN cardinality(picked) >= room;
    END LOOP;
    IF cardinality(picked) < room THEN
        gone := cardinality(p_ids) - seen;  -- claimed, locked or ended by others since the pick
    END IF;
    IF cardinality(rkeys) > 0 THEN
        PERFORM {schema}.rate_record(rkeys, radded, rcaps, rpers, p_now);  -- rate
    END IF;
    RETURN QUERY UPDATE {schema}.jobs j SET state = 'running', attempt = j.attempt + 1, attempted_at = p_now,
        heartbeat_at = p_now
        WHERE j.id = ANY(picked)
        RETURNING j.id, j.kind, j.queue, j.args, j.attempt, j.max_attempts, j.priority, j.run_at, gone;
    IF (cardinality(picked) = 0 AND gone > 0) OR rnext IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, NULL::text, NULL::text, NULL::text, NULL::integer, NULL::integer,
            NULL::integer, rnext, gone;
    END IF;
END
$$;
