"""Shared by the PostgreSQL benchmarks: a throwaway database, fresh schemas, the result table.

The server is the machine's local PostgreSQL (127.0.0.1:5432, trust auth) or the admin URL in
``NJ_BENCH_PG_URL`` (falling back to the test suite's ``NJ_TEST_PG_URL``). Every script creates
its own database named after its process id and drops it on the way out, so two runs (or a run
and the test suite) never share tables.

Sync code only: nothing here starts tasks or threads (the spawn lint allows raw Trio only under
``benchmarks/baselines/``).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import psycopg
from psycopg import sql

try:  # the shared report helpers, re-exported for the PostgreSQL scripts
    from .report import load_average, median_ratio, percentile, render_table
except ImportError:  # run as a script: benchmarks/ is sys.path[0]
    from report import load_average, median_ratio, percentile, render_table  # type: ignore[no-redef]

__all__ = [
    "ADMIN_URL",
    "ServerCpu",
    "PgUnavailable",
    "backend_url",
    "fresh_schema",
    "load_average",
    "median_ratio",
    "percentile",
    "render_table",
    "throwaway_database",
    "truncate",
]

ADMIN_URL = os.environ.get(
    "NJ_BENCH_PG_URL", os.environ.get("NJ_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
)


class PgUnavailable(RuntimeError):
    """The server cannot be reached: the scripts print this and exit 2."""


def _admin() -> psycopg.Connection:
    try:
        return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        raise PgUnavailable(f"PostgreSQL not reachable at {ADMIN_URL}: {' '.join(str(exc).split())}") from None


@contextmanager
def throwaway_database(tag: str) -> Iterator[str]:
    """A new empty database for the duration of the block; yields its URL, drops it after."""
    name = f"nj_bench_{tag}_{os.getpid()}"
    with _admin() as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    base, _, _ = ADMIN_URL.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with _admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def fresh_schema(url: str, schema: str) -> None:
    """Drop `schema` if it exists and create it again with the runtime's own migrations, so a
    raw baseline works on exactly the table and indexes the runtime uses."""
    from nursery_jobs.backends.postgres import migrate

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    migrate(url, schema)


def truncate(url: str, *schemas: str) -> None:
    """Empty the jobs tables (identity restarted) and refresh the planner's statistics, so every
    round starts from the same table."""
    with psycopg.connect(url, autocommit=True) as conn:
        for schema in schemas:
            conn.execute(sql.SQL("TRUNCATE {}.jobs RESTART IDENTITY").format(sql.Identifier(schema)))
            conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(sql.Identifier(schema)))


class ServerCpu:
    """CPU time the PostgreSQL backends serving one database used between `start()` and `stop()`.

    Read from ``/proc/<pid>/stat`` of every backend connected to the database (the server runs
    on this machine); backends that connect in between count from zero, backends that leave in
    between are missed (none do while a benchmark side runs). ``seconds`` is None when /proc
    cannot be read (another host, another user).
    """

    _TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def __init__(self, url: str) -> None:
        self.url = url
        self._before: dict[int, float] | None = None
        self.seconds: float | None = None

    def _sample(self) -> dict[int, float] | None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            me = conn.info.backend_pid
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> %s", (me,)
            ).fetchall()]  # fmt: skip
        out: dict[int, float] = {}
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except FileNotFoundError:
                continue
            except OSError:
                return None
            out[pid] = (int(fields[11]) + int(fields[12])) / self._TICK
        return out

    def start(self) -> None:
        self._before = self._sample()

    def stop(self) -> float | None:
        after = self._sample()
        if self._before is None or after is None:
            self.seconds = None
        else:
            self.seconds = sum(t - self._before.get(pid, 0.0) for pid, t in after.items())
        return self.seconds


def backend_url(url: str, schema: str, **options: object) -> str:
    """The runtime's backend URL for `schema` in the database at `url`."""
    extra = "".join(f"&{k}={v}" for k, v in options.items())
    return f"{url}?schema={schema}{extra}"
