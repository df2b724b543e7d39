"""The insert statements: one job, a batch, a COPY batch's ids, a job with a unique key, and a
bounded queue's enqueue lock and pending count."""

from __future__ import annotations

from ....infra.pg import sql  # psycopg only through infra: import order
from ....jobs import JobState
from ....rules import PENDING

__all__ = ["STATEMENTS"]

_WAITING = ", ".join(f"'{s.value}'" for s in PENDING if s is not JobState.AVAILABLE)
"""The pending states but `available`: the ones `jobs_waiting` holds (migration 0002)."""


STATEMENTS: dict[str, sql.SQL] = {
    "insert_many": sql.SQL(
        "WITH ins AS ("
        " INSERT INTO {s}.jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at,"
        "  concurrency_key, max_concurrent, rate_key, rate_limit, rate_per)"
        " SELECT k, q, a, st, m, p, r, %s::float8, ck, mc, rk, rl, rp"
        " FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::int[], %s::int[], %s::float8[],"
        "  %s::text[], %s::int[], %s::text[], %s::int[], %s::float8[])"
        "  WITH ORDINALITY AS t(k, q, a, st, m, p, r, ck, mc, rk, rl, rp, ord) ORDER BY ord"
        " RETURNING id, queue),"
        " notes AS (SELECT count(*) AS n FROM (SELECT DISTINCT queue FROM ins) d,"
        "  LATERAL (SELECT pg_notify(%s, d.queue)) x)"
        " SELECT id, (SELECT n FROM notes) FROM ins"
    ),
    "insert_single": sql.SQL(
        "WITH ins AS ("
        " INSERT INTO {s}.jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at,"
        "  concurrency_key, max_concurrent, rate_key, rate_limit, rate_per)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " RETURNING id)"
        " SELECT id, pg_notify(%s, %s) FROM ins"
    ),
    # The NOTIFYs of a COPY batch (sent at its commit), and its ids: the ends of the run when the
    # ids are consecutive (the list is computed only when they are not).
    "reserve_ids": sql.SQL(
        "WITH n AS (SELECT count(pg_notify(%s, queue)) FROM unnest(%s::text[]) AS queue),"
        " ids AS (SELECT nextval({seq}) AS id FROM n, generate_series(1, %s))"
        " SELECT lo, hi, CASE WHEN hi - lo + 1 = k THEN NULL"
        "  ELSE (SELECT string_agg(id::text, ',' ORDER BY id) FROM ids) END"
        " FROM (SELECT min(id) AS lo, max(id) AS hi, count(*) AS k FROM ids) r"
    ),
    # Columns in the order `_copy_text` writes them.
    "copy_in": sql.SQL(
        "COPY {s}.jobs (id, args, run_at, kind, queue, state, max_attempts, priority, created_at,"
        " concurrency_key, max_concurrent, rate_key, rate_limit, rate_per) FROM STDIN"
    ),
    "insert_one": sql.SQL(
        "WITH ins AS ("
        " INSERT INTO {s}.jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at, unique_key,"
        "  concurrency_key, max_concurrent, rate_key, rate_limit, rate_per)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL"
        "  AND state NOT IN ('completed', 'discarded', 'cancelled') DO NOTHING"
        " RETURNING id)"
        " SELECT id, (SELECT count(*) FROM (SELECT pg_notify(%s, %s)) x) FROM ins"
    ),
    # A bounded queue's enqueue lock (one per queue, taken in the order given: sorted), held to
    # the end of the transaction, so its enqueues count and insert one at a time.
    "lock_queue": sql.SQL(
        "SELECT count(pg_advisory_xact_lock(hashtext('nursery_jobs max_length ' || {schema_text}), hashtext(q)))"
        " FROM unnest(%s::text[]) AS u(q)"
    ),
    # Pending jobs (`rules.PENDING`) of a queue, each part up to a limit, through the three
    # partial indexes that hold them: `jobs_available` (unparked), `jobs_parked_queue` (parked,
    # migration 0012) and `jobs_waiting` (the other pending states).
    "count_pending": sql.SQL(
        "SELECT (SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE queue = %(queue)s AND state = 'available'"
        " AND NOT parked LIMIT %(limit)s) a)"
        " + (SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE queue = %(queue)s AND state = 'available'"
        " AND parked LIMIT %(limit)s) p)"
        f" + (SELECT count(*) FROM (SELECT 1 FROM {{s}}.jobs WHERE queue = %(queue)s AND state IN ({_WAITING})"
        " LIMIT %(limit)s) w)"
    ),
    "find_unique": sql.SQL(
        "SELECT id FROM {s}.jobs WHERE unique_key = %s AND state NOT IN ('completed', 'discarded', 'cancelled')"
    ),
}
