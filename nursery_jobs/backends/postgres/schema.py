"""The schema: created and upgraded by the migrations, checked at start-up.

The backend's tables live in a schema of their own (default ``nursery_jobs``), so several
services, or several environments of one, can share a database. The schema is made only by
`migrate` (the ``nursery-jobs migrate`` command): the numbered files of ``pg_migrations/``, each
applied once, in order, under an advisory lock so that several processes may run it at once. A
runtime never migrates: `PostgresBackend.open` reads the schema's version (`schema_version_async`)
and refuses to start on one older or newer than `LATEST_VERSION`, saying which command to run.
"""

from __future__ import annotations

import importlib.resources
from typing import Any

from ...infra.pg import TrioConnection, psycopg, sql  # psycopg only through infra: import order
from ...infra.redact import redact_exception
from .url import check_schema_name, conninfo_params

__all__ = ["LATEST_VERSION", "migrate", "schema_version", "schema_version_async"]


def _migrations() -> list[tuple[int, str, str]]:
    files = importlib.resources.files("nursery_jobs.backends") / "pg_migrations"
    out = []
    for entry in sorted(files.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            out.append((int(entry.name.split("_", 1)[0]), entry.name, entry.read_text()))
    return out


LATEST_VERSION = max(v for v, _, _ in _migrations())


def schema_version(conn: psycopg.Connection[Any], schema: str) -> int | None:
    """The applied version of `schema`, or None if it was never migrated."""
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f'"{check_schema_name(schema)}".migrations',)
    ).fetchone()
    if not row or not row[0]:
        return None
    got = conn.execute(
        sql.SQL("SELECT max(version) FROM {}.migrations").format(sql.Identifier(schema))
    ).fetchone()
    return int(got[0]) if got and got[0] is not None else None


async def schema_version_async(conn: TrioConnection, schema: str) -> int | None:
    """`schema_version` on the runtime's own (Trio) connection."""
    cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{check_schema_name(schema)}".migrations',))
    row = await cur.fetchone()
    if not row or not row[0]:
        return None
    cur = await conn.execute(sql.SQL("SELECT max(version) FROM {}.migrations").format(sql.Identifier(schema)))
    got = await cur.fetchone()
    return int(got[0]) if got and got[0] is not None else None


def migrate(conninfo: str, schema: str = "nursery_jobs") -> list[str]:
    """Create or upgrade `schema`; returns the names of the migrations applied. Safe to run
    from several processes at once (an advisory lock serialises them)."""
    check_schema_name(schema)
    conninfo_params(conninfo)
    try:
        return _migrate(conninfo, schema)
    except psycopg.Error as exc:
        raise redact_exception(exc, conninfo)  # libpq's messages can quote the URL back


def _migrate(conninfo: str, schema: str) -> list[str]:
    ident = sql.Identifier(schema)
    applied: list[str] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"nursery_jobs:{schema}",))
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {}.migrations"
                    " (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
                ).format(ident)
            )
            current = schema_version(conn, schema) or 0
            for version, name, text in _migrations():
                if version <= current:
                    continue
                conn.execute(sql.SQL(text).format(schema=ident, schema_text=sql.Literal(schema)))
                conn.execute(
                    sql.SQL("INSERT INTO {}.migrations (version, name) VALUES (%s, %s)").format(ident), (version, name)
                )
                applied.append(name)
    return applied
