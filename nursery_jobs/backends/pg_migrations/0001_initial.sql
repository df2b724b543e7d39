-- nursery_jobs schema, version 1. {schema} is replaced by the validated, quoted schema name.
CREATE TABLE {schema}.jobs (
    id bigserial PRIMARY KEY,
    kind text NOT NULL,
    queue text NOT NULL,
    args jsonb NOT NULL,
    state text NOT NULL CHECK (state IN ('available', 'scheduled', 'running', 'retryable', 'completed', 'discarded', 'cancelled')),
    attempt integer NOT NULL DEFAULT 0,
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
    cancel_requested boolean NOT NULL DEFAULT false
);

-- The claim walks this index in claim order and sees only claimable rows, so finished and
-- running rows (most of the table) never slow it down.
CREATE INDEX jobs_claim ON {schema}.jobs (queue, priority DESC, run_at, id)
    WHERE state IN ('available', 'scheduled', 'retryable');
-- "When is the next scheduled job of this queue due": one index probe.
CREATE INDEX jobs_due ON {schema}.jobs (queue, run_at)
    WHERE state IN ('available', 'scheduled', 'retryable');
-- The rescuer's scan: running rows only.
CREATE INDEX jobs_running ON {schema}.jobs (heartbeat_at) WHERE state = 'running';
-- Retention deletes by (state, age).
CREATE INDEX jobs_finalized ON {schema}.jobs (state, finalized_at) WHERE finalized_at IS NOT NULL;
-- While a job with a unique key is not final, no other job may hold that key: enforced by the
-- database, so concurrent enqueues from many processes cannot both insert.
CREATE UNIQUE INDEX jobs_unique ON {schema}.jobs (unique_key)
    WHERE unique_key IS NOT NULL AND state NOT IN ('completed', 'discarded', 'cancelled');
