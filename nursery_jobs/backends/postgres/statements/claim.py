"""The claim statements: the full claim, the one under a global limit, the lean one, and the two
round trips a claim adds for rate keys (`rate_park`, `rate_release`).

**Where the due jobs come from.** Two places (migration 0002): `available` rows (always due) in
claim order from `jobs_available`, and scheduled/retryable rows that came due from `jobs_waiting`
(queue, run_at), up to `_PROMOTE_AT_ONCE` of them, oldest first: neither scan reads a row that is
not due. The best `limit` of both are claimed; the due waiting rows not claimed become `available`
in the same statement, so the next claim finds them in claim order. Claim order (priority, then
run_at, then id) is exact among due jobs unless more than `_PROMOTE_AT_ONCE` waiting rows came
due at once: then the rest join at the next claims. Both scans lock with SKIP LOCKED; rows locked
and not updated are free again at the statement's end. The next due time is the first not-due
waiting row's, from `jobs_waiting` too (an `available` row is due: only a host whose clock runs
behind the writer's can see one ahead of its time, and its next poll or wake-up finds it).

**Rows by id, never by a join.** The two UPDATEs take their rows by `id = ANY(ARRAY(...))`, a
lookup in the primary key: as `id IN (SELECT ...)`, a generic plan made while the table was empty
(analyzed after a drain, or on a fresh deploy) joined the picked ids against a full scan of the
primary key, ~0.3 s per claim once 10,000 jobs had arrived.

**Concurrency keys** (migration 0006). Both scans pass over a keyed job whose key is at its limit
as this statement's snapshot sees it (`_KEY_FREE`, a probe of `jobs_running_key`), so a busy key
holds back nothing behind it; keyed jobs picked are not claimed by the statement's own update but
by `claim_picked_parking` (migration 0014, after 0013's `claim_picked`), called at its end, which
decides under the keys' locks (`rules.admit_rated`, restated in SQL there): a claim is one round
trip with limits or without. Under a queue's global limit (`claim_limited`) every job picked goes
to it, and it counts the queue's running jobs under the queue's lock.

**Parked jobs** (migration 0011). `jobs_available` leaves parked rows out, and the scan of
available rows reads them with their `_KEY_FREE` as a column, counting the free ones (a window
whose run condition stops the index scan after `limit` free rows), and reads at most
`PARK_AT_ONCE` rows more than `limit`. That bound is a LIMIT under the window, not a bound on the
window's row number, because the planner prices a scan for the rows its LIMIT lets through and a
run condition is no LIMIT to it: priced for every available row, the generic plan of a table
whose available rows were a tenth of it was a bitmap scan of all of them and a sort on disk,
~100 ms a claim. The keyed rows the scan passed over are parked, each only if the statement holds
share locks (SKIP LOCKED) on at least its limit of its key's running rows: a row leaving `running`
waits for those locks, then unparks in a snapshot of its own (`outcomes.UNPARK_FREED`). The last
row carries how many were parked: the claim looks again behind them.

**Rate keys** (migration 0014). The scan reads a rate-keyed row with its verdict as a column
(`_RATE_OPEN`, so the window's bound counts it), and the last row carries the ids it passed over
for their rate, for `rate_park`, and the queue's earliest rate wake time, which the claim passes
to `rate_release` once it has come: one round trip more for each, and only when there is
something to park or a wake time has come. A picked job that `claim_picked_parking` refuses for
its rate (under the key's lock, several of one key in one pick) is parked by it, through
`rate_park`, in the same statement; its slot comes back in the last row with the others'.

**The lean claim** (`claim_lean`), for a queue with no global limit whose due jobs need none of
the full claim's other CTEs: the lean prefix of the first `limit` available rows in claim order
(rows with no rate key, and no concurrency key or one whose key has room as the statement's
snapshot sees it, `_KEY_FREE`), through `jobs_available` as the full claim reads it. Its plain
rows are claimed by its own update; its keyed ones go to `claim_picked`, which decides under the
keys' locks in a snapshot of its own, as the full claim's keyed picks do, so the lean start can
never put a key over its limit. It claims nothing when a scheduled or retryable job has come due
(the full claim promotes it, and it may come first) or a rate wake time has come, and its last
row says whether the full claim must run for the rest (those, a row behind the prefix that is not
lean, or a keyed job `claim_picked` did not start). One difference from the full statement, by
design: a claim that fills its limit reads no row behind it, where the full scan reads on to the
next startable row, parking the keyed rows it passes over and reporting a rate-keyed one's next
slot; those are parked (or reported) by the next claim, which a fetcher whose claim filled its
room makes as soon as a slot frees. Nothing starts out of order or early
(tests/backends/postgres/test_lean_claim_differential.py).
"""

from __future__ import annotations

from ....infra.pg import sql  # psycopg only through infra: import order
from ....rules import PARK_AT_ONCE

__all__ = ["STATEMENTS"]

_PROMOTE_AT_ONCE = 1000
"""A claim looks at (and makes `available`) at most this many scheduled/retryable jobs that
came due, oldest first (see the claim statement)."""

_CLAIM_ORDER = "priority DESC, run_at, id"
"""Claim order: every due job starts by priority (highest first), then run_at, then enqueue
order (its id)."""

_KEY_FREE = (
    "(SELECT count(*) FROM {{s}}.jobs r WHERE r.state = 'running' AND r.concurrency_key = {t}.concurrency_key)"
    " < coalesce({t}.max_concurrent, 1)"
)
"""A keyed job's key is below the job's limit, as the statement's snapshot sees it: the claim's
scan passes over the others and parks them (a hint, read without the key's lock:
`claim_picked_parking` decides what starts, and the park takes its own locks)."""

_RATE_FREE = (
    "NOT EXISTS (SELECT 1 FROM {{s}}.rate_keys k WHERE k.key = {t}.rate_key"
    " AND {{s}}.rate_slot(k.starts, coalesce({t}.rate_limit, 1), {t}.rate_per, %(now)s, 0) IS NOT NULL)"
)
"""A rate-keyed job's key has a slot open now, as the statement's snapshot sees it (migration
0010): the claim's scan passes over the others (a hint, read without the key's lock:
`claim_picked_parking` decides)."""

_RATE_OPEN = (
    "(" + _RATE_FREE + " AND NOT EXISTS (SELECT 1 FROM {{s}}.rate_wakes x WHERE x.queue = %(queue)s"
    " AND x.key = {t}.rate_key AND x.wake <= %(now)s))"
)
"""`_RATE_FREE`, and the key's wake time in the queue has not come with its parked jobs still
parked (migration 0014): a job of the key enqueued after them must not start before them. The
claim's scan reads the others and passes them over; the claim hands them to `rate_park`."""


def _claim_sql(*, limited: bool) -> str:
    """The claim statement (see the module's docstring): without a global limit
    the picked jobs with no key are claimed by the statement's own update and the others by
    `claim_picked_parking`; with one, every picked job goes to it."""
    held = "true" if limited else "concurrency_key IS NOT NULL OR rate_key IS NOT NULL"
    cols = "id, priority, run_at, concurrency_key, max_concurrent, rate_key, rate_limit, rate_per"
    return (
        "WITH due AS (SELECT " + cols + ""
        "  FROM {s}.jobs WHERE queue = %(queue)s"
        "  AND state IN ('scheduled', 'retryable') AND run_at <= %(now)s"
        "  ORDER BY run_at, id LIMIT " + str(_PROMOTE_AT_ONCE) + " FOR UPDATE SKIP LOCKED),"
        " scan AS (SELECT * FROM (SELECT " + cols + ", kfree, rfree, kfree AND rfree AS free,"
        "   count(*) FILTER (WHERE kfree AND rfree) OVER w AS n"
        "  FROM (SELECT " + cols + ","
        "    (a.concurrency_key IS NULL OR " + _KEY_FREE.format(t="a") + ") AS kfree,"
        "    (a.rate_key IS NULL OR " + _RATE_OPEN.format(t="a") + ") AS rfree"
        "   FROM {s}.jobs a WHERE queue = %(queue)s AND state = 'available' AND NOT parked AND run_at <= %(now)s"
        "   ORDER BY " + _CLAIM_ORDER + " LIMIT %(limit)s + " + str(PARK_AT_ONCE) + " FOR UPDATE SKIP LOCKED) o"
        "  WINDOW w AS (ROWS UNBOUNDED PRECEDING)) c WHERE n <= %(limit)s),"
        " passed AS (SELECT id, concurrency_key, coalesce(max_concurrent, 1) AS most FROM scan WHERE NOT kfree),"
        # Each passed key's running rows this statement holds, as one object: a lookup per passed
        # row, never a join of the two lists, whose plan follows their estimated sizes (a nested
        # loop of one over the other when the statistics say few rows are available).
        " full_keys AS (SELECT jsonb_object_agg(concurrency_key, n) AS held FROM (SELECT concurrency_key, count(*) AS n"
        "   FROM (SELECT r.concurrency_key FROM {s}.jobs r"
        "   WHERE r.state = 'running' AND r.concurrency_key = ANY(ARRAY(SELECT DISTINCT concurrency_key FROM passed))"
        "   FOR SHARE OF r SKIP LOCKED) k GROUP BY concurrency_key) f),"
        " parked AS (UPDATE {s}.jobs SET parked = true, rate_wait = false WHERE id = ANY(ARRAY(SELECT p.id FROM passed p"
        "   WHERE ((SELECT held FROM full_keys) ->> p.concurrency_key)::bigint >= p.most)) RETURNING 1),"
        " pick AS (SELECT * FROM (SELECT " + cols + " FROM scan WHERE free UNION ALL"
        "  SELECT " + cols + " FROM due d"
        "   WHERE (d.concurrency_key IS NULL OR " + _KEY_FREE.format(t="d") + ")"
        "   AND (d.rate_key IS NULL OR " + _RATE_OPEN.format(t="d") + ")) c"
        "  ORDER BY " + _CLAIM_ORDER + " LIMIT %(limit)s),"
        " direct AS (SELECT id FROM pick WHERE NOT (" + held + ")),"
        " promoted AS (UPDATE {s}.jobs SET state = 'available'"
        "  WHERE id = ANY(ARRAY(SELECT id FROM due EXCEPT SELECT id FROM direct)) RETURNING 1),"
        " claimed AS ("
        " UPDATE {s}.jobs SET state = 'running', attempt = attempt + 1, attempted_at = %(now)s,"
        "  heartbeat_at = %(now)s"
        " WHERE id = ANY(ARRAY(SELECT id FROM direct))"
        " RETURNING id, kind, queue, args, attempt, max_attempts, priority, run_at),"
        # The picked jobs under a limit, in claim order, with their keys and limits.
        " hold AS (SELECT array_agg(id ORDER BY " + _CLAIM_ORDER + ") AS ids,"
        "  array_agg(concurrency_key ORDER BY " + _CLAIM_ORDER + ") AS keys,"
        "  array_agg(coalesce(max_concurrent, 1) ORDER BY " + _CLAIM_ORDER + ") AS most,"
        "  array_agg(rate_key ORDER BY " + _CLAIM_ORDER + ") AS rkeys,"
        "  array_agg(coalesce(rate_limit, 1) ORDER BY " + _CLAIM_ORDER + ") AS rlimits,"
        "  array_agg(rate_per ORDER BY " + _CLAIM_ORDER + ") AS rpers"
        "  FROM pick WHERE " + held + "),"
        # ... claimed by `claim_picked_parking` (migration 0014: 0013's `claim_picked`, which a
        # runtime of version 13 still calls, with the parking of what it refuses for its rate)
        # under the limits' locks, in this statement and after every write above: the one-time
        # filter's counts run those writes to completion first, so the function, whose
        # statements each take a new snapshot that sees them, never updates a row a CTE has
        # still to write. The picked rows stay locked
        # by this statement's scans until the commit: nobody else can claim or change them.
        " held AS (SELECT * FROM {s}.claim_picked_parking((SELECT ids FROM hold), (SELECT keys FROM hold),"
        "   (SELECT most FROM hold), (SELECT rkeys FROM hold), (SELECT rlimits FROM hold), (SELECT rpers FROM hold),"
        "   %(queue)s::text, (%(limit)s - (SELECT count(*) FROM claimed))::int, "
        + ("%(max_running)s::int" if limited else "NULL::int")
        + ", %(now)s::float8)"
        "  WHERE (SELECT ids FROM hold) IS NOT NULL AND (SELECT count(*) FROM promoted) >= 0"
        "   AND (SELECT count(*) FROM parked) >= 0 AND (SELECT count(*) FROM claimed) >= 0)"
        " SELECT id, kind, queue, args, attempt, max_attempts, priority, run_at, NULL::int, NULL::int, NULL::bigint,"
        "  NULL::float8, NULL::bigint[], NULL::float8, NULL::int, NULL::int FROM claimed"
        " UNION ALL"
        " SELECT id, kind, queue, args, attempt, max_attempts, priority, run_at, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
        "  NULL FROM held WHERE id IS NOT NULL"
        " UNION ALL"
        " SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
        "  (SELECT min(run_at) FROM {s}.jobs WHERE queue = %(queue)s"
        "   AND state IN ('scheduled', 'retryable') AND run_at > %(now)s),"
        "  coalesce(cardinality((SELECT ids FROM hold)), 0), (SELECT count(*) FROM held WHERE id IS NOT NULL)::int,"
        "  (SELECT count(*) FROM parked), (SELECT min(run_at) FROM held WHERE id IS NULL),"
        # The jobs the scan passed over for their rate, for `rate_park` (migration 0014), and
        # the queue's earliest rate wake time, for `rate_release` once it has come.
        "  ARRAY(SELECT id FROM scan WHERE NOT rfree UNION ALL SELECT id FROM due d"
        "   WHERE d.rate_key IS NOT NULL AND NOT " + _RATE_OPEN.format(t="d") + "),"
        "  (SELECT min(wake) FROM {s}.rate_wakes WHERE queue = %(queue)s),"
        # The room `claim_picked` left under the queue's global limit (migration 0015; NULL: not
        # called, or no global limit): 0 is a full queue, more is a pick the keys cut short.
        "  (SELECT min(attempt) FROM held WHERE id IS NULL),"
        # How many picked jobs have a rate key: a claim with none, whose keyed picks all
        # started, is one the lean statement would have made (`claim`).
        "  (SELECT count(*) FROM pick WHERE rate_key IS NOT NULL)::int"
    )


def _claim_lean_sql() -> str:
    """The lean claim (see the module's docstring)."""
    cols = "id, priority, run_at, concurrency_key, max_concurrent"
    return (
        # The queue's earliest waiting row and rate wake time: due ones are the full claim's work.
        "WITH w AS (SELECT (SELECT min(run_at) FROM {s}.jobs WHERE queue = %(queue)s"
        "   AND state IN ('scheduled', 'retryable')) AS waiting,"
        "  (SELECT min(wake) FROM {s}.rate_wakes WHERE queue = %(queue)s) AS wake),"
        # The first `limit` available rows in claim order, each with whether it and every row
        # before it is lean (no rate key, and no concurrency key or one whose key has room as
        # this snapshot sees it): the lean prefix. Not read at all (a one-time filter) when the
        # full claim has to run first.
        " scan AS (SELECT " + cols + ", concurrency_key IS NULL AS plain,"
        "  bool_and(lean) OVER (ROWS UNBOUNDED PRECEDING) AS lead"
        "  FROM (SELECT " + cols + ","
        "    rate_key IS NULL AND (concurrency_key IS NULL OR " + _KEY_FREE.format(t="a") + ") AS lean"
        "   FROM {s}.jobs a WHERE queue = %(queue)s AND state = 'available' AND NOT parked AND run_at <= %(now)s"
        "   AND NOT EXISTS (SELECT 1 FROM w WHERE waiting <= %(now)s OR wake <= %(now)s)"
        "   ORDER BY " + _CLAIM_ORDER + " LIMIT %(limit)s FOR UPDATE SKIP LOCKED) o),"
        " claimed AS ("
        " UPDATE {s}.jobs SET state = 'running', attempt = attempt + 1, attempted_at = %(now)s,"
        "  heartbeat_at = %(now)s"
        " WHERE id = ANY(ARRAY(SELECT id FROM scan WHERE lead AND plain))"
        " RETURNING id, kind, queue, args, attempt, max_attempts, priority, run_at),"
        # The keyed rows of the prefix, in claim order, go to `claim_picked` (migration 0015),
        # which admits them under their keys' locks (`rules.admit`), after `claimed` is
        # written (the one-time filter's count runs it first), as the full claim hands it its
        # keyed picks. No rate key is among them: no rate is weighed and nothing is parked.
        " hold AS (SELECT array_agg(id ORDER BY " + _CLAIM_ORDER + ") AS ids,"
        "  array_agg(concurrency_key ORDER BY " + _CLAIM_ORDER + ") AS keys,"
        "  array_agg(coalesce(max_concurrent, 1) ORDER BY " + _CLAIM_ORDER + ") AS most"
        "  FROM scan WHERE lead AND NOT plain),"
        " held AS (SELECT * FROM {s}.claim_picked((SELECT ids FROM hold), (SELECT keys FROM hold),"
        "   (SELECT most FROM hold), NULL::text[], NULL::int[], NULL::float8[], %(queue)s::text,"
        "   (%(limit)s - (SELECT count(*) FROM claimed))::int, NULL::int, %(now)s::float8)"
        "  WHERE (SELECT ids FROM hold) IS NOT NULL AND (SELECT count(*) FROM claimed) >= 0)"
        " SELECT id, kind, queue, args, attempt, max_attempts, priority, run_at,"
        "  NULL::float8, NULL::boolean FROM claimed"
        " UNION ALL"
        " SELECT id, kind, queue, args, attempt, max_attempts, priority, run_at, NULL, NULL"
        "  FROM held WHERE id IS NOT NULL"
        " UNION ALL"
        # The last row: the next waiting job's time, the earliest rate wake time, and whether
        # the full claim must run for the rest (a due waiting row or wake time, a row in the
        # prefix read that is not lean, or a keyed one `claim_picked` did not start: a key
        # filled by another claim, or several of one key in the prefix).
        " SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, (SELECT waiting FROM w), (SELECT wake FROM w),"
        "  coalesce((SELECT waiting <= %(now)s OR wake <= %(now)s FROM w), false)"
        "   OR EXISTS (SELECT 1 FROM scan WHERE NOT lead)"
        "   OR coalesce(cardinality((SELECT ids FROM hold)), 0) > (SELECT count(*) FROM held WHERE id IS NOT NULL)"
    )


STATEMENTS: dict[str, sql.SQL] = {
    "claim": sql.SQL(_claim_sql(limited=False)),
    # Under a queue's global limit: every job picked goes to `claim_picked_parking`, which counts the
    # queue's running jobs under the queue's lock.
    "claim_limited": sql.SQL(_claim_sql(limited=True)),
    "claim_lean": sql.SQL(_claim_lean_sql()),
    # Jobs a claim passed over for their rate, parked under their keys' locks; and a queue's
    # rate keys whose wake time came, brought back as far as their windows admit (migration 0014).
    "rate_park": sql.SQL("SELECT {s}.rate_park(%(ids)s::bigint[], %(queue)s::text, %(now)s::float8)"),
    "rate_release": sql.SQL("SELECT released, next_wake FROM {s}.rate_release(%(queue)s::text, %(now)s::float8)"),
}
