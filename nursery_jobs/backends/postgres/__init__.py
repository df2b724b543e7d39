"""The PostgreSQL backend (``postgresql://user@host/db?schema=nursery_jobs&pool_size=20``).

Many processes on many hosts share one database schema. The backend is one class,
`PostgresBackend`, made of one module per concern, each of which opens with its design:

- `url`: the URL, the library's options in it, and the name shown for the database;
- `failures`: what a psycopg error means, read from its SQLSTATE;
- `schema`: the migrations (``pg_migrations/*.sql``) and the schema's version;
- `connection`: the pooled sessions' settings, the statement helpers, and `PostgresBase`, the
  state every concern shares and its one way to call the database;
- `sessions`: the connections inserts run on (the pool's, or a caller's sync or asyncio one);
- `insert`, `claim`, `outcomes`: the hot path -- jobs in, jobs out, attempts ended;
- `maintenance`: the rescue of lost workers' jobs, the repair of parked keys, retention;
- `reads`: one job, and the counts per queue and state;
- `transactions`: `rt.transaction()`, and enqueues in a caller's transaction;
- `coordination`: schedules, locks and the outbox;
- `backend`: `PostgresBackend` itself, its life (open, close) and its wake-ups (LISTEN/NOTIFY);
- `statements/`: the SQL, by the same concerns.

Two rules hold in all of them. No transaction is held across user code or network I/O: every call
is one autocommit statement, or a short transaction with no I/O but the database's, on a pooled
connection returned at once. And every hot statement is shaped so that its one generic plan is
right whatever the statistics say (`POOL_SESSION`; tests/backends/postgres/test_plans.py). Times
are float seconds on the runtime's clock (Unix time; hosts are expected to run NTP).
"""

from __future__ import annotations

from .backend import PostgresBackend
from .claim import LEAN_PAUSE
from .connection import POOL_SESSION, int_array
from .insert import COPY_AT
from .outcomes import attempt_keys, outcomes_json
from .schema import LATEST_VERSION, migrate, schema_version
from .statements import QUERIES
from .url import check_schema_name, parse_postgres_url

__all__ = [
    "LATEST_VERSION",
    "POOL_SESSION",
    "PostgresBackend",
    "check_schema_name",
    "migrate",
    "parse_postgres_url",
    "schema_version",
]

# The names tests and benchmarks import from the module this package was.
_QUERIES = QUERIES
_LEAN_PAUSE = LEAN_PAUSE
_COPY_AT = COPY_AT
_int_array = int_array
_attempt_keys = attempt_keys
_outcomes_json = outcomes_json
