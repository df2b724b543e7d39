-- nursery_jobs schema, version 12: a bounded queue's count reads only pending rows again, and
-- the repair finds a parked job with no concurrency key.
--
-- Since version 11 `jobs_available` leaves parked rows out, so no index held a queue's
-- available rows whole: the count of a bounded enqueue (`count_pending`, under the queue's
-- enqueue lock) read the table (a queue with 10 pending jobs and 1M final rows: 1M rows per
-- enqueue). It now counts the unparked ones through `jobs_available` and the parked ones
-- through `jobs_parked_queue`, each up to `max_length + 1`.
--
-- `repair_parked` walked the keys with min() and >, which pass over NULL: a job parked with no
-- key (written by hand, or damaged) stayed `available` and out of every claim for ever. No
-- claim parks such a job (a job with no key has no limit), so every one is unparked, and its
-- queue returned.
--
-- (CREATE INDEX, not CONCURRENTLY: it holds parked rows only, few, but inserts wait while it
-- reads the table, so run it in a quiet moment on a large table.)
CREATE INDEX jobs_parked_queue ON {schema}.jobs (queue) WHERE state = 'available' AND parked;

CREATE OR REPLACE FUNCTION {schema}.repair_parked() RETURNS TABLE (queue text) LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    k text;
    head record;
BEGIN
    -- Parked with no key: nothing limits them (a scan of `jobs_parked`'s NULL entries).
    RETURN QUERY UPDATE {schema}.jobs j SET parked = false
        WHERE j.concurrency_key IS NULL AND j.state = 'available' AND j.parked
        RETURNING j.queue;
    SELECT min(j.concurrency_key) INTO k FROM {schema}.jobs j WHERE j.state = 'available' AND j.parked;
    WHILE k IS NOT NULL LOOP
        SELECT j.id, j.queue, coalesce(j.max_concurrent, 1) AS most INTO head FROM {schema}.jobs j
            WHERE j.concurrency_key = k AND j.state = 'available' AND j.parked
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
            WHERE j.state = 'available' AND j.parked AND j.concurrency_key > k;
    END LOOP;
END
$$;
