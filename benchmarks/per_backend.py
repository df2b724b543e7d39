"""What the benchmarks that run one measurement on each backend in turn (PostgreSQL, SQLite,
memory) share: a jobs table pre-filled with the same rows on every backend, the options that
pick the backends and the rounds, and the loop that gives each backend its own store.

A script describes its backlog once, as rows of the jobs table (`columns` names them; the
PostgreSQL ``<schema>.jobs`` and SQLite ``nj_jobs`` tables have the same columns), and
`backlog` writes those rows to the backend asked for: PostgreSQL by ``COPY`` into a fresh
schema, SQLite by ``executemany`` into a fresh file, each then ``ANALYZE``d so the planner knows
the table; memory by ``insert_many`` (the rows' ``state``, ``run_at`` and ``created_at`` are
the memory backend's own: due now, in the rows' order).

Sync code only, like pg_common.py: the runtimes it starts are `nj.run` calls.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TypeVar

import attrs
import psycopg
from psycopg import sql

import nursery_jobs as nj
from nursery_jobs.backends import NewJob

try:  # imported as `benchmarks.per_backend`
    from .pg_common import backend_url, fresh_schema, throwaway_database
except ImportError:  # run as a script: benchmarks/ is sys.path[0]
    from pg_common import backend_url, fresh_schema, throwaway_database  # type: ignore[no-redef]

__all__ = [
    "BACKENDS",
    "JOB_COLUMNS",
    "add_backend_options",
    "backlog",
    "fresh_store",
    "measure_each_backend",
    "sizes_from",
]

BACKENDS = ("postgres", "sqlite", "memory")
JOB_COLUMNS = ("kind", "queue", "args", "state", "max_attempts", "priority", "run_at", "created_at")
"""The columns every pre-filled row gives; a script adds key or rate columns after them."""

Row = Sequence[Any]
S = TypeVar("S")


# -- the store of one backend --


async def _nothing(rt: nj.Runtime) -> None:
    return None


def fresh_store(backend: str, target: str, schema: str) -> Any:
    """An empty store for `backend` at `target` (a database URL for PostgreSQL, a file path for
    SQLite; unused for memory), as the runtime's `backend` argument. PostgreSQL: `schema`
    dropped and migrated again; SQLite: the file and its WAL removed (the runtime creates the
    schema when it opens it)."""
    if backend == "postgres":
        fresh_schema(target, schema)
        return backend_url(target, schema)
    if backend == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            Path(target + suffix).unlink(missing_ok=True)
        return f"sqlite:///{target}"
    return "memory://"


def backlog(
    backend: str, target: str, schema: str, columns: Sequence[str], rows: Iterable[Row], *, analyze: Sequence[str] = ()
) -> Any:
    """A fresh store holding `rows` (values in the order of `columns`, oldest first); returns
    what the runtime's `backend` argument takes. `analyze` names more PostgreSQL tables of the
    schema to ``VACUUM ANALYZE`` after the jobs table (``outbox``)."""
    if backend == "postgres":
        where = fresh_store(backend, target, schema)
        with psycopg.connect(target, autocommit=True) as conn:
            copy_sql = sql.SQL("COPY {}.jobs ({}) FROM STDIN").format(
                sql.Identifier(schema), sql.SQL(", ").join(map(sql.Identifier, columns))
            )
            with conn.cursor().copy(copy_sql) as copy:
                for row in rows:
                    copy.write_row(row)
            for table in ("jobs", *analyze):
                conn.execute(sql.SQL("VACUUM ANALYZE {}.{}").format(sql.Identifier(schema), sql.Identifier(table)))
        return where
    if backend == "sqlite":
        where = fresh_store(backend, target, schema)
        nj.run(_nothing, app=nj.App(), backend=where, queues=[])  # creates the schema
        conn2 = sqlite3.connect(target)
        try:
            with conn2:
                conn2.executemany(
                    f"INSERT INTO nj_jobs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", rows
                )
            conn2.execute("ANALYZE")
        finally:
            conn2.close()
        return where
    memory = nj.MemoryBackend()
    jobs = [_new_job(dict(zip(columns, row))) for row in rows]
    nj.run(lambda rt: memory.insert_many(jobs), app=nj.App(), backend=memory, queues=[])
    return memory


def _new_job(row: dict[str, Any]) -> NewJob:
    if row.get("state", "available") != "available":
        raise ValueError(f"the memory backend's insert_many makes available jobs only, not {row['state']!r}")
    return NewJob(
        row["kind"], row["queue"], row["args"], row["priority"], None, row["max_attempts"],
        concurrency_key=row.get("concurrency_key"), max_concurrent=row.get("max_concurrent"),
        rate_key=row.get("rate_key"), rate_limit=row.get("rate_limit"), rate_per=row.get("rate_per"),
    )  # fmt: skip


# -- the command line and the loop --


def add_backend_options(parser: argparse.ArgumentParser, rounds_help: str) -> None:
    """``--smoke``, ``--backends`` and ``--rounds``."""
    parser.add_argument(
        "--smoke", "--quick", dest="smoke", action="store_true",
        help="tiny sizes, one round: only proves the script runs (--quick: its older name)",
    )
    parser.add_argument("--backends", default=None, help="comma-separated subset of postgres,sqlite,memory")
    parser.add_argument("--rounds", type=int, default=None, help=rounds_help)


def sizes_from(args: argparse.Namespace, full: S, smoke: S) -> S:
    """The sizes the options ask for: `smoke` with ``--smoke``, with ``backends`` and
    ``rounds`` replaced when given."""
    s: Any = smoke if args.smoke else full
    if args.backends:
        s = attrs.evolve(s, backends=tuple(b.strip() for b in args.backends.split(",")))
    if args.rounds:
        s = attrs.evolve(s, rounds=args.rounds)
    result: S = s
    return result


def measure_each_backend(
    backends: Sequence[str], tag: str, measure: Callable[[str, str], list[list[str]]]
) -> list[list[str]]:
    """The rows `measure(backend, target)` returns for each backend in turn: PostgreSQL in a
    throwaway database named after `tag` (its URL the target), SQLite and memory in a temporary
    folder (the target ``<folder>/jobs.db``). Raises PgUnavailable when PostgreSQL is asked for
    and cannot be reached."""
    rows: list[list[str]] = []
    for backend in backends:
        if backend == "postgres":
            with throwaway_database(tag) as url:
                rows += measure(backend, url)
        else:
            with tempfile.TemporaryDirectory() as folder:
                rows += measure(backend, str(Path(folder) / "jobs.db"))
    return rows
