"""The durable backends in their deterministic mode, for tests that run under virtual time.

Each call blocks the Trio thread instead of waiting on a worker thread or a socket, so under
`MockClock(autojump_threshold=0)` a database call is work, never "every task is waiting", and
the clock cannot jump while a query runs. A service must never run this way, which is why the
mode is a class attribute these test subclasses set, not an argument a service could pass.
The SQLite one has no wake-up sockets (its tests run in one process).
"""

from __future__ import annotations

from nursery_jobs.backends.postgres import PostgresBackend
from nursery_jobs.backends.sqlite import SqliteBackend

__all__ = ["DeterministicPostgres", "DeterministicSqlite"]


class DeterministicSqlite(SqliteBackend):
    _blocking_io = True


class DeterministicPostgres(PostgresBackend):
    _blocking_io = True
