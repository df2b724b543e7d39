-- nursery_jobs schema, version 17: a freed slot wakes the queue of the job it lets back.
--
-- Keys are not scoped to a queue: a key's jobs may be in several queues, and a slot freed by a
-- job of one queue may let back (unpark) the key's best parked job of another. The outcome,
-- rescue and cancel statements woke only the freeing job's queue (`pg_notify` on the jobs
-- channel, and the wake-up in the process that wrote them), so a fetcher of the other queue
-- whose claim came back short slept until its next poll (1 s) before claiming the job its slot
-- had let back. `unpark_keys_queues` unparks as `unpark_keys` always did and returns the queue
-- of each job it brought back; the statements of this version notify those queues and hand
-- them to the runtime. `unpark_keys` keeps its name, arguments and answer (the number of jobs
-- brought back), now counted from it, so a runtime of version 11 to 16 still gets the same
-- answer from the same rows. `rate_park` (migration 0015's; the claim calls it for jobs
-- passed over for their rate, and `claim_picked_parking` for picked ones it refuses), which
-- lets a key's next parked job back when the one it parks held the place a freed slot had
-- given it, notifies the queues of the jobs it let back itself: it runs inside the claim,
-- whose result has no room to report them: its payload is the queue marked '!', which every
-- process acts on, the writer's too (an older runtime takes it for a queue named '!...', which
-- nothing serves, so it does nothing).
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

CREATE OR REPLACE FUNCTION {schema}.unpark_keys(p_keys text[], p_counts integer[]) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT count(*)::integer FROM {schema}.unpark_keys_queues(p_keys, p_counts));
END
$$;

-- Migration 0015's rate_park, the unpark's queues notified. Same arguments and result.
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
        -- The jobs it let back may be other queues' (a key may span queues): each such queue
        -- is told at the commit, marked '!' (a wake-up the writing process has not delivered
        -- in-process: it comes from inside the claim, which cannot report it), so the
        -- writer's own process acts on it too.
        PERFORM pg_notify({schema_text} || '_jobs', '!' || u.queue)
            FROM (SELECT DISTINCT q.queue FROM {schema}.unpark_keys_queues(ck, n) AS q(queue)) u;
    END IF;
    RETURN w;
END
$$;
