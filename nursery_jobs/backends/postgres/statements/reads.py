"""The reads: one job by id, the counts per queue and state, and the repair of a job's errors."""

from __future__ import annotations

from ....infra.pg import sql  # psycopg only through infra: import order

__all__ = ["STATEMENTS"]


STATEMENTS: dict[str, sql.SQL] = {
    "repair_errors": sql.SQL("UPDATE {s}.jobs SET errors = %s::jsonb WHERE id = %s AND errors = %s::jsonb"),
    "get": sql.SQL(
        "SELECT id, kind, queue, args, state, attempt, max_attempts, priority, run_at, created_at,"
        " attempted_at, finalized_at, errors::text, unique_key FROM {s}.jobs WHERE id = %s"
    ),
    "stats": sql.SQL(
        "SELECT queue, state, count(*), sum(failed_attempts), sum(interrupted) FROM {s}.jobs GROUP BY queue, state"
    ),
}
