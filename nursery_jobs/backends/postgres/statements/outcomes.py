"""The outcome, cancel and heartbeat statements, and the fragment that unparks freed keys.

Each updates its rows by primary key from ids it carries, fenced by "id:attempt" keys, and joins
no list against the table; the comment above `STATEMENTS["finish"]` says why. The outcome
statement's new values are generated from the job rules (`rules.sql_case`).
"""

from __future__ import annotations

from ....infra.pg import sql  # psycopg only through infra: import order
from ....jobs import MAX_ERRORS_KEPT
from ....rules import sql_case

__all__ = ["KEEP_ERRORS", "STATEMENTS", "UNPARK_FREED"]

UNPARK_FREED = (
    " freed AS (SELECT q.queue FROM (SELECT array_agg(concurrency_key) AS ks, array_agg(n) AS ns"
    "  FROM (SELECT concurrency_key, count(*)::int AS n FROM upd WHERE concurrency_key IS NOT NULL"
    "   GROUP BY concurrency_key) f HAVING count(*) > 0) a, LATERAL {s}.unpark_keys_queues(a.ks, a.ns) AS q(queue))"
)
"""For the rows `upd` moved out of `running` (each freed its key's slot): each key's best
parked jobs, one per freed slot, go back into claim order (migration 0011; 0017's
`unpark_keys_queues`), after every row of `upd` is written (the aggregate reads them all before
the call) and so in a snapshot that sees any claim that parked a job while holding one of
those rows. One row per job brought back, with its queue: a key is not scoped to a queue, so
the statement wakes those queues too, not only the freeing jobs' own."""

KEEP_ERRORS = f"'$[last-{MAX_ERRORS_KEPT - 1} to last]'"
"""The jsonpath that keeps the last `MAX_ERRORS_KEPT` entries of a job's error list."""


STATEMENTS: dict[str, sql.SQL] = {
    # Rows by primary key, outcomes by key, and no join. The rows are found by `id = ANY(ids)`,
    # a lookup in the primary key, and each row's outcome is read from a jsonb object keyed by
    # "id:attempt" (`outcomes_json`; a binary search per row, and OFFSET 0 keeps the sub-select
    # from being inlined into each of the rules' references to the outcome, which would repeat
    # the lookup). The key carries the attempt, so it is the fencing token too: a row is
    # updated only if it is still `running` under the attempt the worker claimed, and two
    # outcomes of one job under different attempts stay apart. Why not a join: as
    # `FROM unnest(...) o WHERE j.id = o.id`, a generic plan made while the table was small or
    # had no row running (autovacuum analyzed it then) walked the whole primary key for
    # `running` rows and looped the outcome list against each, 7-13 s for 4,000 outcomes with
    # 8,000 rows running, until the next analyze; adding `j.id = ANY(ids)` to that join let the
    # plan loop the list against itself; finding the rows by a lateral probe and updating them
    # by ctid skipped a row updated meanwhile (an outcome lost); and a plan per call costs its
    # planning on every call. Against the join on fresh statistics this costs the same at one
    # outcome and 17 % more at 4,000 (30 against 26 ms). The new values come from the job rules
    # (`rules.sql_case`): the same table the other backends apply row by row.
    "finish": sql.SQL(
        "WITH upd AS ("
        " UPDATE {s}.jobs j SET (state, attempt, run_at, finalized_at, errors, failed_attempts, interrupted) ="
        " (SELECT " + sql_case("state") + ","
        "  j.attempt - " + sql_case("give_back") + ","
        "  " + sql_case("run_at") + ","
        "  CASE WHEN " + sql_case("final") + " THEN %(now)s END,"
        "  CASE WHEN o.error IS NULL THEN j.errors"
        "   ELSE jsonb_path_query_array(coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(o.error), "
        + KEEP_ERRORS
        + ") END,"
        "  j.failed_attempts + " + sql_case("failed") + ","
        "  j.interrupted + " + sql_case("interrupted") + ""
        "  FROM (SELECT v ->> 0 AS kind, (v ->> 1)::float8 AS run_at, v -> 2 AS error"
        "   FROM (SELECT %(outcomes)s::jsonb -> (j.id::text || ':' || j.attempt::text) AS v OFFSET 0) r) o),"
        "  heartbeat_at = NULL, parked = false"
        " WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state = 'running'"
        "  AND %(outcomes)s::jsonb ? (j.id::text || ':' || j.attempt::text)"
        " RETURNING j.id, j.queue, j.state, j.run_at, j.errors -> -1 ->> 'message' AS message, j.concurrency_key),"
        + UNPARK_FREED
        + ","
        # Other processes learn of the batch in the same statement (and so at its commit): one
        # NOTIFY per queue with jobs available again (a keyed job's end frees its key's slot),
        # and the finalized ids in payloads of at most 400 ids (NOTIFY payloads are limited to
        # 8000 bytes).
        " ready AS (SELECT count(*) AS n FROM (SELECT queue FROM upd"
        "  WHERE state = 'available' OR concurrency_key IS NOT NULL UNION SELECT queue FROM freed) a,"
        "  LATERAL (SELECT pg_notify(%(jobs_channel)s, a.queue)) x),"
        " done AS (SELECT count(*) AS n FROM (SELECT string_agg(id::text, ',') AS ids FROM"
        "  (SELECT id, (row_number() OVER (ORDER BY id) - 1) / 400 AS g FROM upd"
        "   WHERE state IN ('completed', 'discarded', 'cancelled')) f GROUP BY g) b,"
        "  LATERAL (SELECT pg_notify(%(events_channel)s, 'f:' || b.ids)) x)"
        # (The two counts are one-time filters: they make both NOTIFY sets run, once.)
        # Then one row with no id per queue a freed slot let a job back into.
        " SELECT id, queue, state, run_at, message, concurrency_key FROM upd"
        " WHERE (SELECT n FROM ready) >= 0 AND (SELECT n FROM done) >= 0"
        " UNION ALL SELECT NULL::bigint, f.queue, NULL::text, NULL::float8, NULL::text, NULL::text"
        "  FROM (SELECT DISTINCT queue FROM freed) f"
    ),
    "cancel": sql.SQL(
        # on_cancel (rules): a final job is left alone, a running one gets its request
        # (once: a second cancel changes nothing and tells nobody), a pending one ends now.
        # The update names its row by id, not only through `cur`: joined to `cur` alone, a plan
        # made on an empty analyzed table walked the whole primary key for it.
        "WITH cur AS (SELECT id, queue, state, cancel_requested, concurrency_key, parked FROM {s}.jobs"
        "  WHERE id = %(id)s FOR UPDATE),"
        " upd AS (UPDATE {s}.jobs j SET"
        "  state = CASE WHEN cur.state = 'running' THEN 'running' ELSE 'cancelled' END,"
        "  cancel_requested = CASE WHEN cur.state = 'running' THEN true ELSE j.cancel_requested END,"
        "  finalized_at = CASE WHEN cur.state = 'running' THEN NULL ELSE %(now)s END"
        "  FROM cur WHERE j.id = %(id)s AND j.id = cur.id AND cur.state NOT IN ('completed', 'discarded', 'cancelled')"
        "   AND NOT (cur.state = 'running' AND cur.cancel_requested)"
        "  RETURNING j.id, j.state, j.errors -> -1 ->> 'message' AS message),"
        # the wake-up rides in the same statement: one round trip, so a cancel either happened
        # with its NOTIFY or not at all (cancel-atomic)
        " n AS (SELECT pg_notify(%(channel)s, CASE WHEN upd.state = 'running' THEN 'c:' ELSE 'f:' END || upd.id)"
        "  FROM upd),"
        # A cancelled unparked job of a key may be the one a freed slot brought back: the key's
        # best parked job takes its place (migration 0011), and its queue is told (0017: it may
        # be another queue's). OFFSET 0: the job is filtered before the call, never after.
        " freed AS (SELECT u.queue, pg_notify(%(jobs_channel)s, u.queue) FROM (SELECT cur.concurrency_key"
        "  FROM cur JOIN upd ON upd.id = cur.id"
        "  WHERE cur.state = 'available' AND NOT cur.parked AND cur.concurrency_key IS NOT NULL OFFSET 0) c,"
        "  LATERAL {s}.unpark_keys_queues(ARRAY[c.concurrency_key], ARRAY[1]) AS u(queue))"
        " SELECT cur.state, coalesce(upd.state, cur.state), upd.message, (SELECT count(*) FROM n), upd.id IS NOT NULL,"
        "  (SELECT count(*) FROM freed), coalesce((SELECT min(queue) FROM freed), cur.queue)"
        " FROM cur LEFT JOIN upd ON upd.id = cur.id"
    ),
    # The outcome statement's shape (see there): rows by primary key, the attempt fenced by
    # "id:attempt" keys of a jsonb object (`attempt_keys`), and no list joined against the
    # table (as a join with `unnest(...)`: 4.5-11 s for 4,000 heartbeats on a plan made on a
    # small table).
    "heartbeat": sql.SQL(
        "UPDATE {s}.jobs j SET heartbeat_at = %s"
        " WHERE j.id = ANY(%s::bigint[]) AND j.state = 'running' AND %s::jsonb ? (j.id::text || ':' || j.attempt::text)"
        " RETURNING j.id, j.attempt, j.cancel_requested"
    ),
}
