"""The live PostgreSQL schema in one readable file (`nursery_jobs/backends/pg_schema.sql`), held
to what the migrations make.

Three schemas must be one catalog: a fresh `migrate`; an upgrade one migration at a time from
version 1, each step a `migrate` of its own (`pgutil.migrate_to`: what a schema made by the first
release and upgraded by every later one went through); and pg_schema.sql applied. Each is read
with `pg_dump` (every object's definition, and the rows the migrations write, the `migrations`
table's aside), its name replaced by `{schema}`, and compared object by object, so a failure
names the objects that differ. Planted differences (an index a migration adds, a function the
file changes) check that the comparison sees them either way.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import nursery_jobs
from nursery_jobs.backends.postgres import migrate
from tests import pgutil

PACKAGE = Path(nursery_jobs.__file__).parent
_FOUND = sorted(PACKAGE.rglob("pg_schema.sql"))
assert len(_FOUND) == 1, f"expected one pg_schema.sql beside the migrations, found {_FOUND}"
SCHEMA_FILE = _FOUND[0]
SHOWN = SCHEMA_FILE.relative_to(PACKAGE.parent).as_posix()


_HEADER = re.compile(
    r"^--\n-- (?:Data for )?Name: (?P<name>.*?); Type: (?P<type>.*?); Schema: .*?; Owner: .*?\n--\n", re.M
)


def _pg_dump() -> str:
    found = shutil.which("pg_dump") or next(
        (str(p) for p in sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_dump"), reverse=True)), None
    )
    assert found, "pg_dump not found: install the PostgreSQL client of the server's version"
    return found


def catalog(url: str, schema: str) -> dict[str, str]:
    """Every object of `schema` as pg_dump writes it (and every table's rows but the migrations
    table's), keyed by type and name, the schema's name replaced by `{schema}`."""
    done = subprocess.run(
        [_pg_dump(), "--no-owner", "-n", schema, f"--exclude-table-data={schema}.migrations", url],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    text = re.sub(rf"\b{re.escape(schema)}\b", "{schema}", done.stdout)
    heads = list(_HEADER.finditer(text))
    objects: dict[str, str] = {}
    for head, after in zip(heads, heads[1:] + [None]):
        body = text[head.end() : after.start() if after else len(text)]
        lines = [line for line in body.splitlines() if not line.startswith(("SET ", "SELECT pg_catalog.set_config", "--", "\\restrict ", "\\unrestrict "))]
        key = f"{head['type']} {head['name']}"
        assert key not in objects, f"two objects {key!r} in the dump"
        objects[key] = "\n".join(lines).strip()
    assert objects, f"pg_dump found nothing in {schema!r}"
    return objects


def differences(want: dict[str, str], got: dict[str, str], want_is: str, got_is: str) -> list[str]:
    """What differs between two catalogs, an object a line (and the diff of a changed one)."""
    out = []
    for key in sorted(want.keys() | got.keys()):
        if key not in got:
            out.append(f"{key}: in {want_is}, missing from {got_is}")
        elif key not in want:
            out.append(f"{key}: in {got_is}, not in {want_is}")
        elif want[key] != got[key]:
            diff = difflib.unified_diff(want[key].splitlines(), got[key].splitlines(), want_is, got_is, lineterm="", n=1)
            out.append(f"{key}: differs\n    " + "\n    ".join(diff))
    return out


def file_mismatch(migrated: dict[str, str], readable: dict[str, str]) -> str | None:
    """The failure message when pg_schema.sql's catalog is not the migrations' (None: it is)."""
    found = differences(migrated, readable, "the migrations", "pg_schema.sql")
    if not found:
        return None
    return (
        f"{SHOWN} is not the live schema:\n  " + "\n  ".join(found) + f"\nupdate {SHOWN} to match the migrations: "
        "each object once, as it is after the last migration (a replaced function in full, a new column last in its table)"
    )


def apply_file(url: str, schema: str, text: str) -> None:
    """pg_schema.sql (or `text`) into a new schema, formatted as `migrate` formats a migration."""
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        conn.execute(sql.SQL(text).format(schema=sql.Identifier(schema), schema_text=sql.Literal(schema)))


def _name(kind: str) -> str:
    return f"live_{kind}_{os.getpid()}"


@pytest.fixture(scope="module")
def catalogs(pg_url: str) -> Iterator[dict[str, dict[str, str]]]:
    fresh, steps, readable = _name("fresh"), _name("steps"), _name("file")
    migrate(pg_url, fresh)
    for version, _ in pgutil.migrations():
        pgutil.migrate_to(pg_url, steps, version)
    apply_file(pg_url, readable, SCHEMA_FILE.read_text())
    try:
        yield {kind: catalog(pg_url, schema) for kind, schema in (("fresh", fresh), ("steps", steps), ("file", readable))}
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for schema in (fresh, steps, readable):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def test_an_upgrade_one_migration_at_a_time_makes_what_a_fresh_migrate_makes(catalogs) -> None:
    found = differences(catalogs["fresh"], catalogs["steps"], "a fresh migrate", "the upgrade one migration at a time")
    assert not found, (
        "an upgrade through every migration, one `migrate` at a time from version 1, does not make what a "
        "fresh `migrate` makes:\n  " + "\n  ".join(found)
    )


def test_pg_schema_sql_is_the_schema_the_migrations_make(catalogs) -> None:
    assert (message := file_mismatch(catalogs["fresh"], catalogs["file"])) is None, message


def test_pg_schema_sql_makes_each_object_once() -> None:
    text = SCHEMA_FILE.read_text()
    code = "\n".join(line.split("--", 1)[0] for line in text.splitlines() if not line.lstrip().startswith("--"))
    assert not re.search(r"\b(DROP|ALTER|OR\s+REPLACE)\b", code), (
        f"{SHOWN} holds the live schema, each object made once as it is now: no DROP, ALTER or CREATE OR REPLACE"
    )
    made = re.findall(r"\bCREATE\s+(?:UNIQUE\s+)?(TABLE|INDEX|SEQUENCE|FUNCTION|VIEW)\s+(?:\{schema\}\.)?(\w+)", code)
    assert len(made) == len(set(made)), f"{SHOWN} makes these more than once: {sorted({m for m in made if made.count(m) > 1})}"
    assert len(made) > 20, made  # the pattern still finds what the file makes


def test_a_migration_the_file_lacks_and_a_change_the_migrations_lack_are_both_named(pg_url: str, catalogs) -> None:
    # A new migration adds an index, and pg_schema.sql is not updated (the file's catalog stands
    # for itself as the fresh migrate's, which the test above holds it to).
    ahead = _name("ahead")
    migrate(pg_url, ahead)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE INDEX jobs_planted ON {}.jobs (kind)").format(sql.Identifier(ahead)))
    # pg_schema.sql changes a function that no migration changed.
    text = SCHEMA_FILE.read_text()
    changed = text.replace("WHEN p_added >= p_limit THEN", "WHEN p_added > p_limit THEN", 1)
    assert changed != text
    edited = _name("edited")
    apply_file(pg_url, edited, changed)
    try:
        message = file_mismatch(catalog(pg_url, ahead), catalogs["fresh"])
        assert message == (
            f"{SHOWN} is not the live schema:\n  INDEX jobs_planted: in the migrations, missing from pg_schema.sql\n"
            f"update {SHOWN} to match the migrations: each object once, as it is after the last migration "
            "(a replaced function in full, a new column last in its table)"
        ), message
        message = file_mismatch(catalogs["file"], catalog(pg_url, edited))
        assert message is not None
        found = message.splitlines()[1:-1]
        assert found[0] == "  FUNCTION rate_slot(double precision[], integer, double precision, double precision, integer): differs"
        assert "-        WHEN p_added >= p_limit THEN" in message and "+        WHEN p_added > p_limit THEN" in message
        assert not [line for line in found if not line.startswith("    ")][1:], message  # that object alone
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for schema in (ahead, edited):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
