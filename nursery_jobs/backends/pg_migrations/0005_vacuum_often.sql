-- nursery_jobs schema, version 5: autovacuum visits the jobs table after a fixed number of dead
-- rows, not after a fifth of the table.
--
-- Every row of a job queue is updated at least twice (claimed, then its outcome) and deleted by
-- retention, so the table makes dead row versions as fast as it runs jobs. The server's
-- default waits for 50 + 20 % of the table's rows to be dead before vacuuming it: with a day of
-- finished jobs kept, that is hours of dead versions, which the claim then steps over (a claimed
-- row's old entry stays at the front of the `available` index until a vacuum removes it) and the
-- heap and indexes grow to hold. Here a vacuum is due after 1,000 + 1 % of the rows are dead,
-- and an analyze after 1,000 + 2 % have changed; autovacuum's own pace (its naptime, one minute
-- by default, a server setting) then sets how often it runs on a busy queue.
--
-- No fillfactor: free space on a page only helps HOT updates (a new row version on the same
-- page, with no new index entries), and PostgreSQL makes those only when no indexed column
-- changes. Every update the runtime makes changes `state`, which the partial indexes test, so
-- none is HOT and a lower fillfactor would only make the table larger.
-- (Storage parameters only: no rewrite, a brief lock.)
ALTER TABLE {schema}.jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000
);
