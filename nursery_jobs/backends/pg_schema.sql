-- The nursery_jobs PostgreSQL schema as it is after the last migration: every table, index,
-- sequence and function once, in the order a reader meets them. {schema} is the validated,
-- quoted schema name, {schema_text} the same name as a string literal, as in the migrations.
--
-- This file is for reading; nothing applies it but its test. `nursery-jobs migrate` creates and
-- upgrades a schema from pg_migrations/, one file per version, and
-- tests/backends/postgres/test_live_schema.py holds this file to what they make: a migration that
-- changes an object changes it here too, in place, and the why stays in the migration's header.
-- Column order is the table's own (a column a migration adds comes last).


-- ---------------------------------------------------------------------------------------------
-- Versions
-- ---------------------------------------------------------------------------------------------

-- One row per migration applied; made by `migrate` itself before the first one, and read at
-- start-up (a runtime refuses a schema older or newer than the version it needs).
CREATE TABLE {schema}.migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);


-- ---------------------------------------------------------------------------------------------
-- Jobs
-- ---------------------------------------------------------------------------------------------

-- One row per job, from its enqueue until retention deletes it. Every update on a job's path
-- changes an indexed column, so none is HOT and the table makes dead rows as fast as it runs
-- jobs: it is vacuumed after 1,000 + 1 % of its rows are dead, not the server's 20 %.
CREATE TABLE {schema}.jobs (
    id bigserial PRIMARY KEY,
    kind text NOT NULL,
    queue text NOT NULL,
    args text NOT NULL,  -- the exact JSON text the runtime wrote (jsonb would change numbers)
    state text NOT NULL CHECK (state IN ('available', 'scheduled', 'running', 'retryable', 'completed', 'discarded', 'cancelled')),
    attempt integer NOT NULL DEFAULT 0,  -- the fencing token of a running attempt's outcome
    max_attempts integer NOT NULL,
    priority integer NOT NULL DEFAULT 0,
    run_at double precision NOT NULL,
    created_at double precision NOT NULL,
    attempted_at double precision,
    finalized_at double precision,
    heartbeat_at double precision,
    errors jsonb,
    failed_attempts integer NOT NULL DEFAULT 0,
    interrupted integer NOT NULL DEFAULT 0,
    unique_key text,
    cancel_requested boolean NOT NULL DEFAULT false,
    -- Concurrency limit: at most max_concurrent jobs of the key `running` at once.
    concurrency_key text,
    max_concurrent integer CHECK (max_concurrent IS NULL OR max_concurrent >= 1),
    -- Rate limit: at most rate_limit starts of the key in any rate_per seconds.
    rate_key text,
    rate_limit integer CHECK (rate_limit IS NULL OR rate_limit >= 1),
    rate_per double precision CHECK (rate_per IS NULL OR rate_per > 0),
    -- An `available` job out of claim order: its concurrency key is full (a freed slot brings
    -- it back) or, with rate_wait, its rate key is over its rate (its key's wake brings it back).
    parked boolean NOT NULL DEFAULT false,
    rate_wait boolean NOT NULL DEFAULT false
) WITH (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000
);

-- The claim walks available, unparked rows in claim order: finished, running, parked and
-- not-yet-due rows (most of the table) never slow it down.
CREATE INDEX jobs_available ON {schema}.jobs (queue, priority DESC, run_at, id)
    WHERE state = 'available' AND NOT parked;
-- Scheduled and retryable rows by due time: the claim reads only those that came due (and makes
-- the ones it does not take `available`), and "when is the next one due" is one probe.
CREATE INDEX jobs_waiting ON {schema}.jobs (queue, run_at, id)
    WHERE state IN ('scheduled', 'retryable');

-- A concurrency key's parked jobs in claim order: a freed slot brings back the best one. Jobs
-- parked for their rate stay out, so no unpark or repair reads a rate backlog.
CREATE INDEX jobs_parked ON {schema}.jobs (concurrency_key, priority DESC, run_at, id)
    WHERE state = 'available' AND parked AND (NOT rate_wait OR rate_key IS NULL);
-- A queue's parked jobs: a bounded enqueue counts them beside jobs_available's (`max_length`).
CREATE INDEX jobs_parked_queue ON {schema}.jobs (queue) WHERE state = 'available' AND parked;
-- A rate key's jobs parked for its rate, per queue, in claim order: `rate_release` brings back
-- as many as the key's window admits.
CREATE INDEX jobs_rate_parked ON {schema}.jobs (queue, rate_key, priority DESC, run_at, id)
    WHERE state = 'available' AND parked AND rate_wait;

-- The rescuer's scan of running rows by heartbeat. It requires a heartbeat so that the outcome
-- and heartbeat statements, which do not, can only reach their rows by primary key, whatever
-- the statistics say; a running row without one (written by hand) has the next index.
CREATE INDEX jobs_running ON {schema}.jobs (heartbeat_at) WHERE state = 'running' AND heartbeat_at IS NOT NULL;
CREATE INDEX jobs_running_unbeaten ON {schema}.jobs (id) WHERE state = 'running' AND heartbeat_at IS NULL;
-- A concurrency key's running count, read under the key's lock by every keyed claim.
CREATE INDEX jobs_running_key ON {schema}.jobs (concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;

-- Retention deletes by (state, age).
CREATE INDEX jobs_finalized ON {schema}.jobs (state, finalized_at) WHERE finalized_at IS NOT NULL;
-- While a job with a unique key is not final, no other job may hold that key: enforced by the
-- database, so concurrent enqueues from many processes cannot both insert.
CREATE UNIQUE INDEX jobs_unique ON {schema}.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state NOT IN ('completed', 'discarded', 'cancelled');


-- ---------------------------------------------------------------------------------------------
-- Rate limits and the repair of parked jobs
-- ---------------------------------------------------------------------------------------------

-- Each rate key's latest starts, ascending, at most `cap` of them (the largest limit weighed
-- against the key), none older than `per` (its longest window): a sliding log, exact for any
-- window. `last` is its latest start; retention drops a key idle longer than its window.
CREATE TABLE {schema}.rate_keys (
    key text PRIMARY KEY,
    starts double precision[] NOT NULL,
    cap integer NOT NULL,
    per double precision NOT NULL,
    last double precision NOT NULL
);

-- Per queue, each rate key with jobs parked for its rate: when the next ones may start. A claim
-- of the queue that finds a wake come calls `rate_release`.
CREATE TABLE {schema}.rate_wakes (
    queue text NOT NULL,
    key text NOT NULL,
    wake double precision NOT NULL,
    PRIMARY KEY (queue, key)
);

-- Where `repair_parked`'s bounded walk over the (queue, rate key) groups stopped (NULL: at the
-- start). Always one row.
CREATE TABLE {schema}.repair_cursor (
    one boolean PRIMARY KEY DEFAULT true CHECK (one),
    queue text,
    key text
);
INSERT INTO {schema}.repair_cursor DEFAULT VALUES;


-- ---------------------------------------------------------------------------------------------
-- Periodic schedules, locks, the outbox
-- ---------------------------------------------------------------------------------------------

-- One row per schedule name (@app.periodic): the last tick enqueued and its job. Every process's
-- scheduler advances it with a conditional upsert in the tick's insert transaction, so exactly
-- one enqueues each tick. No foreign key to jobs: retention deletes old jobs.
CREATE TABLE {schema}.schedules (
    name text PRIMARY KEY,
    last_tick double precision NOT NULL,
    last_job_id bigint
);

-- Named locks (rt.lock, rt.try_lock): the holder's token and its expiry on the backend's clock.
-- A row, not a session advisory lock, which belongs to a pooled connection: a row with an expiry
-- frees itself after a crash and can be renewed and checked from any connection.
CREATE TABLE {schema}.locks (
    name text PRIMARY KEY,
    owner text NOT NULL,
    expires_at double precision NOT NULL
);
-- The fencing tokens: every acquisition draws the next value once the row is its own. One
-- sequence for every name; it outlives the rows (a release deletes its row) and every process.
CREATE SEQUENCE {schema}.lock_fences AS bigint;

-- The transactional outbox (`nj.publish`): an event is a row of the publisher's transaction.
-- The relay of every process claims a topic's rows oldest first (FOR UPDATE SKIP LOCKED),
-- inserts their jobs and deletes them in one transaction.
CREATE TABLE {schema}.outbox (
    id bigserial PRIMARY KEY,
    topic text NOT NULL,
    payload text NOT NULL,  -- JSON text, as job args
    created_at float8 NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
CREATE INDEX outbox_topic ON {schema}.outbox (topic, id);


-- ---------------------------------------------------------------------------------------------
-- The claim under limits
-- ---------------------------------------------------------------------------------------------
--
-- The claim statement (the backend's `claim` and `claim_lean`) scans and locks the due jobs
-- itself and claims those with no limit; the ones with a concurrency key, a rate key or a queue's
-- global limit it hands, still locked, to `claim_picked_parking` (the lean claim: `claim_picked`),
-- which decides under the keys' advisory locks in new snapshots (READ COMMITTED), so the counts
-- it reads see every claim of those keys committed before the locks were granted. The locks are
-- taken in one order by every claimer (the queue's, the concurrency keys' by hash, the rate keys'
-- by hash), so none waits on another in a circle. Their lock spaces are fixed strings, one named
-- after a function long gone: every runtime a schema serves must take the same locks.

-- The claim statement's call: `claim_picked`, then the parking of the candidates it left over
-- their rate (`rate_park`), same arguments and rows.
CREATE FUNCTION {schema}.claim_picked_parking(
    p_ids bigint[], p_keys text[], p_most integer[], p_rkeys text[], p_rlimits integer[],
    p_rpers double precision[], p_queue text, p_want integer, p_max_running integer, p_now double precision
) RETURNS TABLE (
    id bigint, kind text, queue text, args text, attempt integer, max_attempts integer, priority integer,
    run_at double precision
) LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN QUERY SELECT * FROM {schema}.claim_picked(
        p_ids, p_keys, p_most, p_rkeys, p_rlimits, p_rpers, p_queue, p_want, p_max_running, p_now);
    IF EXISTS (SELECT 1 FROM unnest(p_rkeys) AS u(k) WHERE u.k IS NOT NULL) THEN
        PERFORM {schema}.rate_park(p_ids, p_queue, p_now);
    END IF;
END
$$;

-- `transitions.admit_rated` on the picked jobs p_ids (due, locked by the calling statement, in
-- claim order; p_keys, p_most, p_rkeys, p_rlimits, p_rpers their limits): starts what the keys,
-- the rates and the queue's global limit admit, records the rate keys' starts, and returns the
-- started rows and one row with a NULL id: in `run_at` the earliest slot of a job refused for
-- its rate, in `attempt` the room left under the global limit (NULL: none).
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

-- The distinct keys of p_keys, each locked for the rest of the transaction (the advisory lock
-- (p_space, hashtext(p_prefix || key))), in hash order. PL/pgSQL so that its plan is kept.
CREATE FUNCTION {schema}.lock_keys(p_space integer, p_prefix text, p_keys text[]) RETURNS text[]
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

-- `lock_keys` for rate keys, and how long the caller waited for them (0 when no other
-- transaction held one): a claim weighs its rate keys at its time moved on by that wait.
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

-- `transitions.rate_slot`: NULL if a job limited to p_limit starts per p_per seconds may start
-- at the key's `rate_time`, given its starts and p_added more made by this claim; else when its
-- next slot comes. One expression, so that it is inlined where it is called (the claim's scan).
CREATE FUNCTION {schema}.rate_slot(
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

-- `transitions.rate_log`: the rate keys' records after a claim made p_added[i] starts of key
-- p_keys[i], each at the key's `rate_time`. PL/pgSQL so that its plan is kept.
CREATE FUNCTION {schema}.rate_record(
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

-- ---------------------------------------------------------------------------------------------
-- Parking and bringing back
-- ---------------------------------------------------------------------------------------------

-- Parks the jobs p_ids a claim passed over for their rate that are still over it under their
-- keys' locks (or whose key's wake has come: their turn comes with the parked ones), arms the
-- keys' wake times, sizes their records for the parked jobs' rates, and lets a concurrency key's
-- next parked job back for each parked job that held its slot's place. Returns the earliest
-- wake it armed (NULL: it parked none).
CREATE FUNCTION {schema}.rate_park(p_ids bigint[], p_queue text, p_now double precision)
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

-- The rate keys of the jobs p_ids, each locked for the rest of the transaction, in hash order
-- (the lock `claim_picked` takes for a rate key).
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

-- `transitions.rate_release`, for every rate key of p_queue whose wake time has come: under the
-- key's lock, its parked jobs come back in claim order while its window admits them, and the
-- wake moves to the next slot (or goes). Returns how many came back and the queue's next wake.
CREATE FUNCTION {schema}.rate_release(p_queue text, p_now double precision)
RETURNS TABLE (released integer, next_wake double precision) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    space integer := hashtext('nursery_jobs rate_lock ' || {schema_text});
    k record;
    c record;
    st double precision[];
    slot double precision;
    back integer;
    ids bigint[];
    total integer := 0;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'nursery_jobs claims need READ COMMITTED, not %', current_setting('transaction_isolation');
    END IF;
    FOR k IN SELECT x.key, hashtext('rate ' || x.key) AS h FROM {schema}.rate_wakes x
        WHERE x.queue = p_queue AND x.wake <= p_now ORDER BY 2, 1
    LOOP
        PERFORM pg_advisory_xact_lock(space, k.h);
        -- In a new snapshot, after the lock: a release that ran meanwhile moved the wake on.
        CONTINUE WHEN NOT EXISTS (SELECT 1 FROM {schema}.rate_wakes x
            WHERE x.queue = p_queue AND x.key = k.key AND x.wake <= p_now);
        SELECT r.starts INTO st FROM {schema}.rate_keys r WHERE r.key = k.key;
        back := 0;
        slot := NULL;
        ids := ARRAY[]::bigint[];
        FOR c IN SELECT j.id, coalesce(j.rate_limit, 1) AS lim, j.rate_per AS per FROM {schema}.jobs j
            WHERE j.queue = p_queue AND j.rate_key = k.key AND j.state = 'available' AND j.parked AND j.rate_wait
            ORDER BY j.priority DESC, j.run_at, j.id FOR UPDATE SKIP LOCKED
        LOOP
            slot := {schema}.rate_slot(st, c.lim, c.per, p_now, back);
            EXIT WHEN slot IS NOT NULL;
            ids := ids || c.id;
            back := back + 1;
        END LOOP;
        UPDATE {schema}.jobs j SET parked = false, rate_wait = false WHERE j.id = ANY(ids);
        IF slot IS NULL THEN
            DELETE FROM {schema}.rate_wakes x WHERE x.queue = p_queue AND x.key = k.key;
        ELSE
            UPDATE {schema}.rate_wakes x SET wake = slot WHERE x.queue = p_queue AND x.key = k.key;
        END IF;
        total := total + cardinality(ids);
    END LOOP;
    released := total;
    next_wake := (SELECT min(x.wake) FROM {schema}.rate_wakes x WHERE x.queue = p_queue);
    RETURN NEXT;
END
$$;

-- For each key p_keys[i], its best p_counts[i] jobs parked for its slot (not for a rate) come
-- back into claim order; returns the queue of each. Called by the outcome, rescue and cancel
-- statements for the slots their rows free, in their own snapshot, taken after the calling
-- statement wrote those rows: so it sees every job a claim parked while it held them.
CREATE FUNCTION {schema}.unpark_keys_queues(p_keys text[], p_counts integer[]) RETURNS SETOF text
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    -- Migration 0014's unpark: each key's best p_counts[i] parked jobs that wait for its slot
    -- (not for a rate), rows locked by another statement skipped; in its own snapshot, taken
    -- after the calling statement wrote the rows that left `running`.
    RETURN QUERY UPDATE {schema}.jobs j SET parked = false
    WHERE j.id = ANY(ARRAY(
        SELECT p.id FROM unnest(p_keys, p_counts) AS u(k, c)
        CROSS JOIN LATERAL (SELECT r.id FROM {schema}.jobs r
            WHERE r.concurrency_key = u.k AND r.state = 'available' AND r.parked AND NOT r.rate_wait
            ORDER BY r.priority DESC, r.run_at, r.id LIMIT u.c FOR UPDATE SKIP LOCKED) p))
        AND j.state = 'available' AND j.parked AND NOT j.rate_wait
    RETURNING j.queue;
END
$$;

-- `unpark_keys_queues` for a caller that cannot report the queues (`rate_park`, inside a
-- claim): it notifies them itself, marked '!' (which every process acts on), and returns how
-- many jobs came back.
CREATE FUNCTION {schema}.unpark_keys(p_keys text[], p_counts integer[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n integer;
BEGIN
    WITH back AS (SELECT q.queue FROM {schema}.unpark_keys_queues(p_keys, p_counts) AS q(queue)),
    told AS (SELECT pg_notify({schema_text} || '_jobs', '!' || d.queue) FROM (SELECT DISTINCT queue FROM back) d)
    SELECT (SELECT count(*)::integer FROM back) INTO n FROM (SELECT count(*) FROM told) t;
    RETURN n;
END
$$;

-- The rescuer's pass: what nothing else would bring back (a key left parked with a free slot, a
-- job parked with no key, a rate-parked group with no wake time), at bounded work per pass (the
-- rate groups from `repair_cursor`, 1,000 a pass). Returns the queue of each job brought back
-- or key woken.
CREATE FUNCTION {schema}.repair_parked() RETURNS TABLE (queue text) LANGUAGE plpgsql VOLATILE AS $$
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


-- ---------------------------------------------------------------------------------------------
-- The cache (rt.cache): UNLOGGED, so a server crash empties it and standbys do not have it
-- ---------------------------------------------------------------------------------------------

-- Entries: fresh until `fresh_until`, served stale until `expires_at`, then read by nobody;
-- retention deletes expired rows in batches by `cache_expiry`.
CREATE UNLOGGED TABLE {schema}.cache (
    key text PRIMARY KEY,
    value text NOT NULL,
    is_error boolean NOT NULL,
    fresh_until double precision NOT NULL,
    expires_at double precision NOT NULL
);
CREATE INDEX cache_expiry ON {schema}.cache (expires_at);

-- A computation of a key in progress: its owner (a runtime's random id) until `until`, so one
-- process computes and the others wait for its NOTIFY. A row, not an advisory lock: an
-- advisory lock belongs to a connection, and the pool's connections are never held across a
-- computation, which is the service's own code.
CREATE UNLOGGED TABLE {schema}.cache_flights (
    key text PRIMARY KEY,
    owner text NOT NULL,
    until double precision NOT NULL
);

-- Take a key's flight, then read its entry. Two statements, each on its own snapshot (PL/pgSQL,
-- READ COMMITTED): a flight taken because the one before it had just ended (its fill deleted
-- the flight row and stored the entry in one transaction) reads that entry, and gives the
-- flight back instead of computing the key a second time.
CREATE FUNCTION {schema}.cache_lead(
    p_key text, p_owner text, p_until double precision, p_now double precision,
    OUT led boolean, OUT value text, OUT is_error boolean, OUT fresh_until double precision,
    OUT expires_at double precision
)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO {schema}.cache_flights AS f (key, owner, until) VALUES (p_key, p_owner, p_until)
    ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, until = excluded.until
    WHERE f.until <= p_now OR f.owner = excluded.owner;
    led := FOUND;
    SELECT c.value, c.is_error, c.fresh_until, c.expires_at INTO value, is_error, fresh_until, expires_at
    FROM {schema}.cache c WHERE c.key = p_key AND c.expires_at > p_now;
    IF led AND fresh_until > p_now THEN
        DELETE FROM {schema}.cache_flights f WHERE f.key = p_key AND f.owner = p_owner;
        led := false;
    END IF;
END
$$;
