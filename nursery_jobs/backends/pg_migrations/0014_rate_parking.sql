-- nursery_jobs schema, version 14: a job refused for its rate is parked until its key's next
-- slot, so claims stop reading a key's backlog while the key is over its rate.
--
-- Since version 10 the claim's scan filtered out every due job whose rate key was over its
-- rate inside its index scan of `jobs_available`, one `rate_keys` probe per row, on every
-- claim: the claim's read-ahead bound never counted those rows, so a key over its rate with a
-- large backlog first in claim order made every claim of the queue read the whole backlog
-- (20,000 jobs: 55-60 ms a claim, against 4-7 ms; the jobs behind drained at a third of the
-- speed), and the claim's next-slot report read it once more. Now the scan reads such a job
-- with its verdict as a column, within its bound, and the claim hands the ids it passed over
-- for their rate to `rate_park`, which under the keys' locks parks those still over their
-- rate (`parked`, as a full concurrency key's, and `rate_wait`, which says why) and keeps
-- the key's wake time in the queue (`rate_wakes`) at the earliest of their slots. A claim
-- that finds a wake time of its queue come calls `rate_release`, which brings back the key's
-- best parked jobs, as many as its window admits now and no more (`transitions.rate_release`,
-- restated below), and moves the wake to the next slot of the first one kept, or drops it.
-- So each parked job is written twice (parked, back), never once per window, and a window
-- wakes at most its limit. Which jobs start is still decided by the claim's function alone,
-- under the key's lock: bringing a job back is always safe. A job the claim picked (its key open
-- in the statement's snapshot) that it refuses for its rate under the key's lock (several of one
-- key in one pick) is parked there and then, through `rate_park`: the claim statement of this
-- version calls `claim_picked_parking` (below), migration 0013's `claim_picked` with that step.
-- `claim_picked` itself stays as it was: a runtime of version 13, still claiming during a
-- rolling deploy, never calls `rate_release`, so jobs it parked (with a wake time armed, which
-- the repair leaves alone) would wait for a claim of this version; unparked, its refused jobs
-- stay in claim order as before, and it reports their next slot to its fetcher.
--
-- Order within a key: while a key's wake time has come and its jobs are not back yet, the
-- claim's scan treats the key as over its rate, so a job of the key enqueued later cannot
-- start before the parked ones; the ones brought back are weighed with it in claim order.
--
-- No job is parked for ever: parking and the wake it arms are one transaction, and so are a
-- release and the wake it moves or drops. A parked row without a wake time (written by hand,
-- or left by a release that skipped a row locked by a rolled-back cancel) is repaired by the
-- rescuer's pass (`repair_parked`): its key wakes in its queue at once. The concurrency keys'
-- unparking (`unpark_keys`, `repair_parked`) leaves jobs waiting for their rate alone, so a
-- slot a job leaving `running` frees is never spent on one of them.
--
-- (ADD COLUMN with a constant default: no rewrite. CREATE INDEX, not CONCURRENTLY: the new
-- column is false in every row, and the partial index holds none of them.)
ALTER TABLE {schema}.jobs ADD COLUMN rate_wait boolean NOT NULL DEFAULT false;
-- A rate key's jobs parked for its rate, per queue, in claim order.
CREATE INDEX jobs_rate_parked ON {schema}.jobs (queue, rate_key, priority DESC, run_at, id)
    WHERE state = 'available' AND parked AND rate_wait;

-- Per queue, each rate key with jobs parked for its rate: when the next ones may start.
CREATE TABLE {schema}.rate_wakes (
    queue text NOT NULL,
    key text NOT NULL,
    wake double precision NOT NULL,
    PRIMARY KEY (queue, key)
);

-- Park the jobs p_ids (passed over by a claim of p_queue for their rate, as its snapshot saw
-- it) that are still due, unparked and over their rate under their keys' locks, or whose key's
-- wake time in the queue has come (their turn comes with the parked ones); the keys' wake times
-- kept at the earliest slot. A parked job with a concurrency key may have been the one its
-- key's freed slot brought back: that key's best parked job takes its place, one per job
-- (`unparks`; bringing a job back is always safe). Returns the earliest wake time it armed
-- (NULL: it parked none).
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
        SELECT j.id, j.rate_key, {schema}.rate_slot(k.starts, coalesce(j.rate_limit, 1), j.rate_per, p_now, 0) AS slot,
            EXISTS (SELECT 1 FROM {schema}.rate_wakes x
                WHERE x.queue = p_queue AND x.key = j.rate_key AND x.wake <= p_now) AS waits
        FROM {schema}.jobs j LEFT JOIN {schema}.rate_keys k ON k.key = j.rate_key
        WHERE j.id = ANY(p_ids) AND j.queue = p_queue AND j.state IN ('available', 'scheduled', 'retryable')
            AND NOT j.parked AND j.run_at <= p_now AND j.rate_key IS NOT NULL AND j.rate_per IS NOT NULL
        FOR UPDATE OF j SKIP LOCKED
    ), p AS (
        UPDATE {schema}.jobs j SET state = 'available', parked = true, rate_wait = true
        FROM c WHERE j.id = c.id AND (c.slot IS NOT NULL OR c.waits)
        RETURNING c.rate_key, coalesce(c.slot, p_now) AS slot, j.concurrency_key
    ), a AS (
        INSERT INTO {schema}.rate_wakes AS r (queue, key, wake)
        SELECT p_queue, p.rate_key, min(p.slot) FROM p GROUP BY p.rate_key
        ON CONFLICT (queue, key) DO UPDATE SET wake = least(r.wake, EXCLUDED.wake)
        RETURNING r.wake
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

-- `transitions.rate_release`, for every rate key of p_queue whose wake time has come: under
-- the key's lock (the lock space of `rate_lock`, keys in hash order), its parked jobs in claim
-- order come back while `rate_slot` admits each, counting those before it; the first one it
-- refuses stays, and its slot is the key's next wake (none left: the wake goes). Returns how
-- many came back, and the queue's earliest wake time after it.
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

-- Migration 0011's unpark_keys, leaving the jobs that wait for their rate.
CREATE OR REPLACE FUNCTION {schema}.unpark_keys(p_keys text[], p_counts integer[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n integer;
BEGIN
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

-- Migration 0012's repair_parked, leaving the jobs that wait for their rate to their own repair
-- (last): every (queue, rate key) with such jobs and no wake time (a loose scan of
-- `jobs_rate_parked`) wakes at once, so the next claim of the queue brings back what the
-- key's window admits. Returns the queue of each job unparked or key woken.
CREATE OR REPLACE FUNCTION {schema}.repair_parked() RETURNS TABLE (queue text) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    k text;
    head record;
BEGIN
    -- Waiting for a rate with no rate key (a row written by something else): the flag means
    -- nothing, and left set no branch below would bring the row back. It becomes a job parked
    -- for its concurrency key, or for none, which the branches below repair.
    UPDATE {schema}.jobs j SET rate_wait = false
        WHERE j.state = 'available' AND j.parked AND j.rate_wait AND j.rate_key IS NULL;
    -- Parked with no key: nothing limits them (a scan of `jobs_parked`'s NULL entries).
    RETURN QUERY UPDATE {schema}.jobs j SET parked = false
        WHERE j.concurrency_key IS NULL AND j.state = 'available' AND j.parked
            AND NOT (j.rate_wait AND j.rate_key IS NOT NULL)
        RETURNING j.queue;
    SELECT min(j.concurrency_key) INTO k FROM {schema}.jobs j WHERE j.state = 'available' AND j.parked AND NOT j.rate_wait;
    WHILE k IS NOT NULL LOOP
        SELECT j.id, j.queue, coalesce(j.max_concurrent, 1) AS most INTO head FROM {schema}.jobs j
            WHERE j.concurrency_key = k AND j.state = 'available' AND j.parked AND NOT j.rate_wait
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
            WHERE j.state = 'available' AND j.parked AND NOT j.rate_wait AND j.concurrency_key > k;
    END LOOP;
    RETURN QUERY WITH RECURSIVE t AS (
        (SELECT j.queue AS q, j.rate_key AS rk FROM {schema}.jobs j
            WHERE j.state = 'available' AND j.parked AND j.rate_wait AND j.rate_key IS NOT NULL
            ORDER BY j.queue, j.rate_key LIMIT 1)
        UNION ALL
        SELECT n.q, n.rk FROM t CROSS JOIN LATERAL (SELECT j.queue AS q, j.rate_key AS rk FROM {schema}.jobs j
            WHERE j.state = 'available' AND j.parked AND j.rate_wait AND j.rate_key IS NOT NULL
                AND (j.queue, j.rate_key) > (t.q, t.rk)
            ORDER BY j.queue, j.rate_key LIMIT 1) n
    )
    INSERT INTO {schema}.rate_wakes AS r (queue, key, wake)
    SELECT t.q, t.rk, 0 FROM t
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.rate_wakes x WHERE x.queue = t.q AND x.key = t.rk)
    ON CONFLICT (queue, key) DO NOTHING
    RETURNING r.queue;
END
$$;

-- Migration 0013's claim_picked, then the parking of the candidates it left over their rate
-- (`rate_park`, above), with the same arguments and rows. A new function, not a replacement:
-- only the claims of this version, which call `rate_release`, may park (see the top). The
-- admission rule stays in claim_picked alone; `rate_park` picks, among the candidates still
-- available, those whose rate key has no start left now, after claim_picked recorded this
-- claim's starts, and takes no lock claim_picked does not hold already. Without it, the
-- refused jobs stay in claim order and every claim picks them again.
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
