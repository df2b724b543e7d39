-- nursery_jobs schema, version 17: a freed slot wakes the queue of the job it lets back.
--
-- Keys are not scoped to a queue: a key's jobs may be in several queues, and a slot freed by a
-- job of one queue may let back (unpark) the key's best parked job of another. The outcome,
-- rescue and cancel statements woke only the freeing job's queue (`pg_notify` on the jobs
-- channel, and the wake-up in the process that wrote them), so a fetcher of the other queue
-- whose claim came back short slept until its next poll (1 s) before claiming the job its slot
-- had let back. `unpark_keys_queues` unparks as `unpark_keys` always did and returns the queue
-- of each job it brought back; the statements of this version notify those queues and hand
-- them to the runtime.
--
-- `unpark_keys` keeps its name, arguments and answer (the number of jobs brought back), now
-- counted from it, and notifies the queues itself: its callers cannot report them. They are
-- `rate_park` (migration 0015's; the claim calls it for jobs passed over for their rate, and
-- `claim_picked_parking` for picked ones it refuses), which lets a key's next parked job back
-- when the one it parks held the place a freed slot had given it, from inside the claim, whose
-- result has no room for them; and the outcome statements of a runtime of version 11 to 16
-- still running while this is applied. The payload is the queue marked '!', which every
-- process acts on, the writer's too (a runtime of version 16 or older takes it for a queue
-- named '!...', which nothing serves, so it does nothing).
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
DECLARE
    n integer;
BEGIN
    WITH back AS (SELECT q.queue FROM {schema}.unpark_keys_queues(p_keys, p_counts) AS q(queue)),
    told AS (SELECT pg_notify({schema_text} || '_jobs', '!' || d.queue) FROM (SELECT DISTINCT queue FROM back) d)
    SELECT (SELECT count(*)::integer FROM back) INTO n FROM (SELECT count(*) FROM told) t;
    RETURN n;
END
$$;
