-- nursery_jobs schema, version 16: `lock_keys` keeps its plan.
--
-- Measured on a private cluster (pg_stat_statements, track_functions; benchmarks/RESULTS.md,
-- "Per-key concurrency", 2026-12-03): `claim_picked`, which a keyed claim calls through
-- `claim_picked_parking`, called `lock_keys` twice per claim (the concurrency keys, then the rate
-- keys), and the two calls took 0.33-0.41 ms per claim for 0.07-0.09 ms of work in their
-- statement: a LANGUAGE sql function that is not inlined is parsed and planned again at its
-- first call in each transaction, and every claim is a transaction. As PL/pgSQL, with the same
-- statement, its plan is kept by the session: 0.12-0.16 ms for the two calls. The locks, their
-- spaces, hashes and order are unchanged.
--
-- Tried and measured in the same session, and left out (neither was measurably cheaper):
-- admitting a pick with no rate and one limit per key in one statement (each key's running rows
-- counted once, the candidates ranked within their key) instead of `claim_picked`'s loop (the
-- update of the admitted rows, the same either way, is most of the function's time, and the
-- loop over 32 candidates little of it); and an
-- `unpark_keys` that probes for a parked job before it updates, when its update of no row
-- costs 0.006 ms.
--
-- Same name, arguments and result (CREATE OR REPLACE): a runtime of version 13, 14 or 15 calls
-- it through the same `claim_picked` and gets the same answer; nothing else changes.

CREATE OR REPLACE FUNCTION {schema}.lock_keys(p_space integer, p_prefix text, p_keys text[]) RETURNS text[]
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (SELECT coalesce(array_agg(k ORDER BY h, k), ARRAY[]::text[]) FROM (
        SELECT k, h, pg_advisory_xact_lock(p_space, h) FROM (
            SELECT DISTINCT u.k, hashtext(p_prefix || u.k) AS h FROM unnest(p_keys) AS u(k)
            WHERE u.k IS NOT NULL ORDER BY 2, 1
        ) sorted
    ) locked);
END
$$;
