-- nursery_jobs schema, version 4: indexes that keep every hot statement's plan safe whatever the
-- planner's statistics say.
--
-- A statement the runtime prepares runs on a generic plan, made from the table's statistics at
-- the time. Autovacuum analyzes the jobs table when it happens to: if no row was `running` then,
-- the planner believes `state = 'running'` matches almost nothing. The outcome and heartbeat
-- statements find their rows by id *and* `state = 'running'`, and with the old `jobs_running`
-- index (heartbeat_at) WHERE state = 'running', that predicate let the planner loop the whole
-- outcome list against every running row: 11 s for 4,000 outcomes with 8,000 rows running,
-- against 20 ms by primary key. The rescuer's index now also requires a heartbeat, which the
-- rescuer's own condition (`heartbeat_at < $1`) implies and the outcome statement's does not:
-- those statements can only find their rows by primary key, the plan that is right at any size.
-- A running row without a heartbeat (written by hand: the runtime always sets one) has an index
-- of its own, normally empty, so the rescuer finds it without scanning the table.
-- (CREATE INDEX, not CONCURRENTLY: inserts wait while they build; running rows are few.)
DROP INDEX {schema}.jobs_running;
CREATE INDEX jobs_running ON {schema}.jobs (heartbeat_at) WHERE state = 'running' AND heartbeat_at IS NOT NULL;
CREATE INDEX jobs_running_unbeaten ON {schema}.jobs (id) WHERE state = 'running' AND heartbeat_at IS NULL;
