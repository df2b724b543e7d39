-- nursery_jobs schema, version 9: the transactional outbox (`nj.publish`).
--
-- An event is a row written in the publisher's own transaction, so it exists if and only if
-- that transaction commits. The relay of every process claims rows of the topics its app
-- subscribes to (`FOR UPDATE SKIP LOCKED`, oldest first), inserts their jobs and deletes them
-- in one short transaction; it never reads "rows after the last id seen", which would skip a
-- row whose transaction committed after a later one's. `(topic, id)` serves that claim; the
-- payload is JSON text, as job args are (migration 0003: jsonb would change numbers).
-- (Versions 6 to 8 are other features' migrations.)
CREATE TABLE {schema}.outbox (
    id bigserial PRIMARY KEY,
    topic text NOT NULL,
    payload text NOT NULL,
    created_at float8 NOT NULL
);
CREATE INDEX outbox_topic ON {schema}.outbox (topic, id);
ALTER TABLE {schema}.outbox SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
