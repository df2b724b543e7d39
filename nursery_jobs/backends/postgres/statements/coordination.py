"""The schedule, lock and outbox statements."""

from __future__ import annotations

from ....infra.pg import sql  # psycopg only through infra: import order

__all__ = ["STATEMENTS"]


STATEMENTS: dict[str, sql.SQL] = {
    # Periodic schedules (migration 0008): the tick is taken only if later than the stored one;
    # a concurrent upsert of the same tick waits for the row lock and then finds it taken.
    "advance_tick": sql.SQL(
        "INSERT INTO {s}.schedules AS sch (name, last_tick) VALUES (%s, %s) ON CONFLICT (name) DO UPDATE"
        " SET last_tick = EXCLUDED.last_tick, last_job_id = NULL WHERE sch.last_tick < EXCLUDED.last_tick"
        " RETURNING name"
    ),
    # Locks (migration 0008): a row per held lock, taken when free, expired or already ours. The
    # fencing token (migration 0019) is drawn in RETURNING, once the row is ours: an acquisition
    # that follows another (which it waited for, or whose row it found gone) draws a larger one.
    "acquire_lock": sql.SQL(
        "INSERT INTO {s}.locks AS l (name, owner, expires_at) VALUES (%s, %s, %s) ON CONFLICT (name) DO UPDATE"
        " SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at"
        " WHERE l.owner = EXCLUDED.owner OR l.expires_at <= %s RETURNING nextval({fences})"
    ),
    "renew_lock": sql.SQL(
        "UPDATE {s}.locks SET expires_at = %s WHERE name = %s AND owner = %s AND expires_at > %s RETURNING name"
    ),
    "release_lock": sql.SQL("DELETE FROM {s}.locks WHERE name = %s AND owner = %s"),
    "tick_job": sql.SQL("UPDATE {s}.schedules SET last_job_id = %s WHERE name = %s"),
    "schedule_states": sql.SQL("SELECT name, last_tick, last_job_id FROM {s}.schedules WHERE name = ANY(%s)"),
    # The outbox (migration 0009): one statement per publish, its NOTIFY sent at the commit.
    "publish": sql.SQL(
        "WITH ins AS (INSERT INTO {s}.outbox (topic, payload, created_at)"
        " SELECT t, p, %s::float8 FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS u(t, p, ord) ORDER BY ord"
        " RETURNING 1)"
        " SELECT (SELECT count(*) FROM ins), pg_notify(%s, 'o:')"
    ),
    # Claims rows, never a range after a remembered id: a row whose transaction commits after a
    # later row's is claimed by the next pass, not skipped.
    "relay_claim": sql.SQL(
        "SELECT id, topic, payload FROM {s}.outbox WHERE topic = ANY(%s::text[])"
        " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
    ),
    "relay_delete": sql.SQL("DELETE FROM {s}.outbox WHERE id = ANY(%s::bigint[])"),
}
