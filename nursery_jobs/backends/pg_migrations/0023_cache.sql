-- nursery_jobs schema, version 23: the cache (rt.cache, nj.cached; docs/cache.md).
--
-- UNLOGGED: a cache write skips the WAL, which made upserts of 500-byte values about 8.7x
-- faster than into a logged table on a 2-vCPU machine (11,700 against 1,350 a second, the
-- logged one waiting for a WAL flush per commit), with reads unchanged. The price, acceptable
-- for a cache and said in docs/cache.md: after a server crash the tables come back empty, and
-- standbys do not have them (a read there fails), so only a primary serves the cache.
--
-- Times are seconds on the runtime's clock, as every time in the schema. An entry is fresh
-- until `fresh_until`, stale (served while one process refreshes it) until `expires_at`, and
-- then no read returns it; retention deletes expired rows in batches by `cache_expiry`.
CREATE UNLOGGED TABLE {schema}.cache (
    key text PRIMARY KEY,
    value text NOT NULL,
    is_error boolean NOT NULL,
    fresh_until double precision NOT NULL,
    expires_at double precision NOT NULL
);
CREATE INDEX cache_expiry ON {schema}.cache (expires_at);

-- A computation of a key in progress: its owner (a runtime's random id) until `until`, so one
-- process computes and the others wait for its NOTIFY. A row, not an advisory lock: an
-- advisory lock belongs to a connection, and the pool's connections are never held across a
-- computation, which is the service's own code.
CREATE UNLOGGED TABLE {schema}.cache_flights (
    key text PRIMARY KEY,
    owner text NOT NULL,
    until double precision NOT NULL
);

-- Take a key's flight, then read its entry. Two statements, each on its own snapshot (PL/pgSQL,
-- READ COMMITTED): a flight taken because the one before it had just ended (its fill deleted
-- the flight row and stored the entry in one transaction) reads that entry, and gives the
-- flight back instead of computing the key a second time.
CREATE FUNCTION {schema}.cache_lead(
    p_key text, p_owner text, p_until double precision, p_now double precision,
    OUT led boolean, OUT value text, OUT is_error boolean, OUT fresh_until double precision,
    OUT expires_at double precision
)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO {schema}.cache_flights AS f (key, owner, until) VALUES (p_key, p_owner, p_until)
    ON CONFLICT (key) DO UPDATE SET owner = excluded.owner, until = excluded.until
    WHERE f.until <= p_now OR f.owner = excluded.owner;
    led := FOUND;
    SELECT c.value, c.is_error, c.fresh_until, c.expires_at INTO value, is_error, fresh_until, expires_at
    FROM {schema}.cache c WHERE c.key = p_key AND c.expires_at > p_now;
    IF led AND fresh_until > p_now THEN
        DELETE FROM {schema}.cache_flights f WHERE f.key = p_key AND f.owner = p_owner;
        led := false;
    END IF;
END
$$;
