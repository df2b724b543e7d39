-- nursery_jobs schema, version 19: a fencing token for every acquisition of a named lock
-- (rt.lock, rt.try_lock; docs/locks.md).
--
-- The acquiring statement draws the next value in its RETURNING, once the lock's row is its
-- own, so an acquisition that follows another draws a larger value. One sequence for every
-- name (as etcd's revision): a token need only grow with every acquisition of its name, and a
-- sequence outlives the rows (a release deletes its row) and every process. An acquisition
-- that finds the lock held draws nothing. A runtime of version 17 acquires as before.
CREATE SEQUENCE {schema}.lock_fences AS bigint;
