-- nursery_jobs schema, version 2: the claim no longer walks jobs that are not due yet.
-- jobs_claim (version 1) held scheduled and retryable rows too, sorted after the due rows of
-- each priority, so a claim that found fewer due jobs than it asked for (every empty claim and
-- poll) walked every not-yet-due row of its queue at that priority or above. Now the claim
-- walks `available` rows only (all due), and takes scheduled/retryable rows that came due from
-- an index on run_at, where not-yet-due rows sit after the range it reads; the rows it takes
-- there and does not claim are made `available` (promoted) in the same statement.
-- (CREATE INDEX, not CONCURRENTLY: inserts wait while it builds; run it in a quiet moment on a
-- large table.)
CREATE INDEX jobs_available ON {schema}.jobs (queue, priority DESC, run_at, id)
    WHERE state = 'available';
CREATE INDEX jobs_waiting ON {schema}.jobs (queue, run_at, id)
    WHERE state IN ('scheduled', 'retryable');
DROP INDEX {schema}.jobs_claim;
