"""Transactions: `rt.transaction()`, and enqueues in a caller's own transaction.

SQLite has one writer, so a transaction that enqueues jobs beside the service's rows holds the
file's write lock for its whole block. `transaction()` lends the file's transaction connection (a
second connection, opened at first use) inside ``BEGIN IMMEDIATE``, one block at a time in a
process; its statements run on a thread of their own limiter (`SqliteTransaction`), and the jobs
it inserted are announced once it committed. A write on the backend's own connection from inside
the block would wait for the block's own lock: it is refused (`current_transaction`). `insert_tx`
also takes a caller's own `sqlite3.Connection` to the same file, in the caller's transaction.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Iterable, Mapping, Sequence

import trio

from ...errors import BackendUnavailable, ConfigError
from ...infra.threads import run_callers_io, run_sync_io
from ..protocol import BackendEvent, Bounds, InsertResult, NewJob
from .connection import current_transaction
from .insert import Inserts, inserted_events

__all__ = ["SqliteCursor", "SqliteTransaction", "Transactions"]


class SqliteCursor:
    """The rows of one statement of a `SqliteTransaction`, read on its thread with the
    statement (so reading them never blocks the Trio loop)."""

    __slots__ = ("_rows", "lastrowid", "rowcount")

    def __init__(self, rows: list[Any], rowcount: int, lastrowid: int | None) -> None:
        self._rows = rows
        self.rowcount = rowcount
        self.lastrowid = lastrowid

    async def fetchone(self) -> Any:
        await trio.lowlevel.checkpoint()
        return self._rows.pop(0) if self._rows else None

    async def fetchall(self) -> list[Any]:
        await trio.lowlevel.checkpoint()
        rows, self._rows = self._rows, []
        return rows


class SqliteTransaction:
    """What `rt.transaction()` lends on SQLite: the file's transaction connection inside
    ``BEGIN IMMEDIATE``. ``await tx.execute(sql, params)`` runs one statement on a worker
    thread (as the backend runs its own) and returns a `SqliteCursor` whose rows are already
    read; `executemany` likewise. Pass it to `kind.enqueue_tx(tx, ...)`."""

    __slots__ = ("_conn", "backend", "inserted", "open")

    def __init__(self, backend: Transactions, conn: sqlite3.Connection) -> None:
        self.backend = backend
        self._conn = conn
        self.open = True
        self.inserted: list[BackendEvent] = []
        """The events of the jobs inserted in it, emitted once it committed."""

    def __repr__(self) -> str:
        return f"<SqliteTransaction {self.backend.path!r} open={self.open}>"

    def _check_open(self) -> None:
        if not self.open:
            raise ConfigError("this SQLite transaction has ended; use it inside its `async with rt.transaction()` block")

    async def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> SqliteCursor:
        self._check_open()

        def run() -> SqliteCursor:
            cur = self._conn.execute(sql, params)
            return SqliteCursor(cur.fetchall(), cur.rowcount, cur.lastrowid)

        result: SqliteCursor = await self.backend._tx_io(run)
        return result

    async def executemany(self, sql: str, seq: Iterable[Sequence[Any] | Mapping[str, Any]]) -> SqliteCursor:
        self._check_open()

        def run() -> SqliteCursor:
            cur = self._conn.executemany(sql, seq)
            return SqliteCursor([], cur.rowcount, cur.lastrowid)

        result: SqliteCursor = await self.backend._tx_io(run)
        return result


class Transactions(Inserts):
    """`transaction`, `insert_tx`, and the caller's own connection checked and used."""

    async def _tx_io(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A call on the transaction connection: a thread of its own limiter (one at a time), or
        inline in the deterministic tests' mode."""
        if self._blocking_io:
            await trio.lowlevel.checkpoint()
            return fn(*args)
        return await run_sync_io(fn, *args, limiter=self._tx_limiter)

    def _connect_tx(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout)
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        return conn

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[SqliteTransaction]:
        """The file's transaction connection in ``BEGIN IMMEDIATE`` for the block (see
        `TransactionalEnqueue`). One transaction at a time in a process (SQLite has one writer
        anyway): the next waits at most `acquire_timeout` for it. ``BEGIN IMMEDIATE`` takes the
        file's write lock at once, so no statement of the block can fail later for want of it;
        while the block runs, other connections' writes (this process's runtime too) wait for
        it, so keep it short. The commit emits the inserted jobs' wake-ups, here and to the
        other processes; a block that raises or is cancelled is rolled back (shielded: a local
        file operation)."""
        if current_transaction.get() is self:
            raise ConfigError(
                "rt.transaction() inside another on the same SQLite file: SQLite has one writer, the inner one "
                "would wait for the outer; enqueue in the outer transaction"
            )
        with trio.move_on_after(self.acquire_timeout) as waited:
            await self._tx_lock.acquire()
        if waited.cancelled_caught:
            raise BackendUnavailable(
                f"the SQLite transaction connection of {self.path!r} was busy for {self.acquire_timeout:g} s: another "
                "rt.transaction() of this process held it; keep transactions short (no network calls inside)"
            )
        try:
            if self._conn is None:
                await self.open()
            if self._tx_conn is None:
                self._tx_conn = await self._tx_io(self._connect_tx)
            conn = self._tx_conn
            try:
                await self._tx_io(conn.execute, "BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise BackendUnavailable(
                    f"SQLite database {self.path!r}: cannot begin a transaction ({exc}); another connection held "
                    f"the write lock for over {self._busy_timeout:g} s: check for long transactions or a backup"
                ) from exc
            tx = SqliteTransaction(self, conn)
            token = current_transaction.set(self)
            try:
                yield tx
                tx.open = False
                await self._tx_io(conn.execute, "COMMIT")
            except BaseException:
                tx.open = False
                with trio.CancelScope(shield=True):
                    if conn.in_transaction:  # a failed COMMIT leaves it open too
                        await self._tx_io(conn.execute, "ROLLBACK")
                raise
            finally:
                current_transaction.reset(token)
            self._emit(tx.inserted)
        finally:
            self._tx_lock.release()

    async def insert_tx(self, conn: Any, jobs: Sequence[NewJob], bounds: Bounds | None = None) -> list[InsertResult]:
        now = self.now()
        if isinstance(conn, SqliteTransaction) and conn.backend is self:
            conn._check_open()
            results: list[InsertResult] = await self._tx_io(self._insert_rows, conn._conn, jobs, now, bounds)
            conn.inserted += inserted_events(jobs, results, now)
            return results
        if not isinstance(conn, sqlite3.Connection):
            raise ConfigError(
                "enqueue_tx on the SQLite backend takes the transaction rt.transaction() lends, or a "
                f"sqlite3.Connection of your own to {self.path!r}, not {type(conn).__name__}"
            )

        def insert() -> list[InsertResult]:
            self._check_same_file(conn)
            added: list[InsertResult] = self._in_callers_transaction(conn, lambda c: self._insert_rows(c, jobs, now, bounds))
            return added

        if self._blocking_io:
            return insert()
        try:
            inserted: list[InsertResult] = await run_callers_io(insert)
            return inserted
        except sqlite3.ProgrammingError as exc:
            if "thread" not in str(exc):
                raise
            # Made without check_same_thread=False: usable only on the thread that made it,
            # this one, where the caller runs its own statements on it too.
            return insert()

    def _check_same_file(self, conn: sqlite3.Connection) -> None:
        main = next((row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main"), "")
        try:
            same = bool(main) and os.path.samefile(main, self.path)
        except OSError:
            same = False
        if not same:
            raise ConfigError(
                f"enqueue_tx got a sqlite3 connection to {main or 'an in-memory database'!r}, but this runtime's "
                f"jobs are in {self.path!r}; connect to that file, or use `async with rt.transaction() as conn:`"
            )

    @staticmethod
    def _in_callers_transaction(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], Any]) -> Any:
        """`body` in the caller's transaction on `conn`: the one open; if none is, one the
        caller's `commit()` ends (Python's default, implicit transactions); on an autocommit
        connection one of its own, committed at once (the jobs are then committed as `enqueue`
        commits them)."""
        if conn.in_transaction:
            return body(conn)
        conn.execute("BEGIN IMMEDIATE")
        if conn.isolation_level is not None and getattr(conn, "autocommit", None) is not True:
            return body(conn)
        try:
            result = body(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result
