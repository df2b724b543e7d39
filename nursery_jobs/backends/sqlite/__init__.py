"""The SQLite backend: embedded and durable (``sqlite:///path/to/jobs.db``).

One file holds the jobs; WAL mode lets readers run beside the single writer, and every state
change is one short transaction, so a process killed at any moment leaves the file consistent and
loses nothing that was committed. Several processes may share a file: a claim is ``BEGIN
IMMEDIATE`` (SQLite's write lock) around an ``UPDATE ... RETURNING``, so two processes can never
claim the same job, and every state change a worker writes is conditional on the attempt it
claimed (the fencing token), so a late worker can never overwrite a job that moved on.

The backend is one class, `SqliteBackend`, made of one module per concern, each of which opens
with its design:

- `url`: the URL and its two options;
- `schema`: the tables and indexes, and the upgrade of an older file in place;
- `connection`: `SqliteBase`, the state every concern shares and its one way to call the
  database (on a thread, one call at a time, retried while another process holds the lock);
- `insert`, `claim`, `outcomes`: the hot path -- jobs in, jobs out, attempts ended;
- `parking`, `rates`: the jobs a claim passed over for a full key or for their rate, kept out of
  later claims' way until they may start;
- `repair`: rows the runtime cannot read, set aside or repaired;
- `maintenance`: the rescue of lost workers' jobs, retention;
- `reads`: one job, and the counts per queue and state;
- `transactions`: `rt.transaction()`, and enqueues in a caller's transaction;
- `coordination`: the outbox, schedules and locks;
- `backend`: `SqliteBackend` itself, its life and its wake-ups between processes.

Unlike PostgreSQL's, its statements stay inside the calls that send them: each call is a few
short statements read with the Python that decides between them (the job rules run here row by
row, not inside one statement).
"""

from __future__ import annotations

from .backend import SqliteBackend
from .schema import SCHEMA_VERSION
from .transactions import SqliteCursor, SqliteTransaction
from .url import parse_sqlite_url

__all__ = ["SCHEMA_VERSION", "SqliteBackend", "SqliteCursor", "SqliteTransaction", "parse_sqlite_url"]
