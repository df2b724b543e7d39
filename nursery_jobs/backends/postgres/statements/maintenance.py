"""The rescue, parked-key repair and retention statements."""

from __future__ import annotations

from ....infra.pg import sql  # psycopg only through infra: import order
from .outcomes import KEEP_ERRORS, UNPARK_FREED

__all__ = ["STATEMENTS"]


STATEMENTS: dict[str, sql.SQL] = {
    # The stale rows through the running rows' indexes (jobs_running, jobs_running_unbeaten),
    # then updated by `id = ANY(ARRAY(...))`, a lookup in the primary key, not by a join: as
    # `FROM stale WHERE j.id = stale.id`, with an `ORDER BY id` on the stale rows, a plan made
    # on an empty analyzed table walked the whole primary key for both, every minute, however
    # few rows were stale (0.07-0.16 s at 200,000 rows). SKIP LOCKED takes no lock it waits for, so
    # the order they are locked in does not matter.
    "rescue": sql.SQL(
        # A running row with no heartbeat (written by hand) is stale too, or it would run never.
        "WITH stale AS (SELECT id FROM {s}.jobs WHERE state = 'running'"
        "  AND (heartbeat_at < %(before)s OR heartbeat_at IS NULL)"
        "  FOR UPDATE SKIP LOCKED),"
        " upd AS (UPDATE {s}.jobs j SET"
        "  state = CASE WHEN j.cancel_requested THEN 'cancelled'"
        "   WHEN j.attempt >= j.max_attempts THEN 'discarded' ELSE 'available' END,"
        "  run_at = CASE WHEN j.cancel_requested OR j.attempt >= j.max_attempts THEN j.run_at ELSE %(now)s END,"
        "  finalized_at = CASE WHEN j.cancel_requested OR j.attempt >= j.max_attempts THEN %(now)s END,"
        "  errors = jsonb_path_query_array(coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object("
        "   'attempt', j.attempt, 'at', %(now)s, 'traceback', NULL, 'message',"
        "   coalesce('rescued: its worker stopped heartbeating at ' || to_char(j.heartbeat_at, 'FM999999999990.000')"
        "   || ' (worker lost)', 'rescued: its running row had no readable heartbeat (worker lost)'))), "
        + KEEP_ERRORS
        + "),"
        "  failed_attempts = j.failed_attempts + 1, heartbeat_at = NULL, parked = false"
        " WHERE j.id = ANY(ARRAY(SELECT id FROM stale))"
        " RETURNING j.id, j.queue, j.state, j.errors -> -1 ->> 'message' AS message, j.concurrency_key),"
        + UNPARK_FREED
        + " SELECT id, queue, state, message, concurrency_key FROM upd WHERE (SELECT count(*) FROM freed) >= 0"
        # Then one row with no id per queue a freed slot let a job back into.
        " UNION ALL SELECT NULL::bigint, f.queue, NULL::text, NULL::text, NULL::text FROM (SELECT DISTINCT queue FROM freed) f"
    ),
    # Keys the rescuer's pass finds parked with a free slot (migration 0011): a repair that is
    # normally a no-op.
    "repair_parked": sql.SQL("SELECT queue FROM {s}.repair_parked()"),
    # Per state, the oldest final rows through jobs_finalized (state, finalized_at), then deleted
    # by primary key: no plan can scan the table for them, whatever it holds.
    "delete_finished": sql.SQL(
        "WITH doomed AS (SELECT d.id FROM unnest(%(states)s::text[], %(befores)s::float8[]) AS c(state, before)"
        "  CROSS JOIN LATERAL (SELECT id FROM {s}.jobs WHERE state = c.state AND finalized_at < c.before"
        "   ORDER BY finalized_at LIMIT %(limit)s) d LIMIT %(limit)s),"
        " del AS (DELETE FROM {s}.jobs j WHERE j.id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1),"
        # Rate keys idle longer than their window (`rules.rate_idle`, migration 0010); the
        # condition is in the DELETE's own WHERE, so a record a claim updated meanwhile stays.
        " idle AS (DELETE FROM {s}.rate_keys r WHERE r.key = ANY(ARRAY(SELECT key FROM {s}.rate_keys"
        "  WHERE last + per <= %(now)s LIMIT %(limit)s)) AND r.last + r.per <= %(now)s)"
        " SELECT count(*) FROM del"
    ),
}
