-- nursery_jobs schema, version 5: the jobs table is vacuumed after a fixed number of dead rows,
-- not after a fifth of the table, and keeps one index fewer.
--
-- Every row of a job queue is updated at least twice (claimed, then its outcome) and deleted by
-- retention, so the table makes dead row versions as fast as it runs jobs. The server's
-- default waits for 50 + 20 % of the table's rows to be dead before vacuuming it: with a day of
-- finished jobs kept, that is hours of dead versions, which the heap and every index grow to
-- hold and which the statements step over. Here a vacuum is due after 1,000 + 1 % of the rows
-- are dead, and an analyze after 1,000 + 2 % have changed; autovacuum's own pace (its naptime,
-- one minute by default, a server setting) then sets how often it runs on a busy queue.
--
-- No fillfactor: free space on a page only helps HOT updates (a new row version on the same
-- page, with no new index entries), and PostgreSQL makes those only when no indexed column
-- changes. Every update on a job's path (claim, heartbeat, outcome, rescue) changes `state` or
-- `heartbeat_at`, which indexes hold, so none is HOT (only a rare cancel request of a running
-- job could be), and a lower fillfactor would only make the table larger.
--
-- `jobs_due` (queue, run_at) over every pending row goes: since version 2 the claim reads
-- `available` rows from `jobs_available` and scheduled/retryable ones from `jobs_waiting`
-- (queue, run_at, id), which also answers "when is the next one due". It only cost: one more
-- index entry per job, dead once the job is claimed and never cleared by a scan (nothing reads
-- its old entries), and a wrong plan on a table never analyzed, where the planner, pricing
-- indexes by size alone, read a whole backlog of available rows through it and sorted it.
-- (Storage parameters and a DROP INDEX: no rewrite, a brief lock.)
ALTER TABLE {schema}.jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000
);
DROP INDEX {schema}.jobs_due;
