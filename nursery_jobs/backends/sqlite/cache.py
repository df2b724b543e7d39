"""The SQLite backend's cache store: a table in the jobs' file, read and written mostly on the
Trio thread.

A cache call must cost microseconds, and a hop to a worker thread (the SQLite backend's way
with every call, so the loop never blocks on the file) costs more than the call: 60-400 us on
the benchmark machine, against 25 us for a read of a 500-byte entry by its key and 35-70 us for
an upsert in WAL mode. So the store keeps two connections of its own to the file:

- the *loop's* connection, used only on the Trio thread, with ``busy_timeout = 0``: a read (WAL:
  readers never wait for the writer) and a write (``BEGIN IMMEDIATE``, then the upsert) run in
  place and return at once, or fail at once with "database is locked" when another connection
  holds the file's write lock. It never checkpoints (``wal_autocheckpoint = 0``): a checkpoint
  copies pages and syncs the file, which must not happen on the loop;
- the *thread's* connection, for what the first could not do at once: a call that met the
  lock runs again there, on a worker thread under the backend's own limiter, waiting up to the
  backend's `busy_timeout` per try and retrying until its `outage_timeout`, as every call of the
  backend does. Purges run there, and every `CHECKPOINT_EVERY` writes of the loop's connection
  one runs there followed by a passive checkpoint, so the WAL the loop's writes leave is copied
  back off the loop.

Both use ``synchronous = NORMAL`` whatever the backend's own setting: in WAL mode a commit
then waits for no fsync, and a power loss can lose the last commits but never corrupt the file,
which is right for a cache (the jobs keep the backend's setting on its own connections). Writes
take the file's write lock (``BEGIN IMMEDIATE``), so a process never sees half an entry, and
several processes share one cache; one computation per key is kept within a process only
(`nursery_jobs.cache`), not across processes.

The table is created by the store when first used (``CREATE TABLE IF NOT EXISTS``; an older file
gains it without a schema version change), and the connections are closed with the backend.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any, Callable, TypeVar

import trio

from ...errors import BackendUnavailable, ConfigError
from ...infra.threads import run_sync_io
from ..protocol import CacheEntry

__all__ = ["CHECKPOINT_EVERY", "SqliteCacheStore"]

log = logging.getLogger("nursery_jobs")

T = TypeVar("T")

CHECKPOINT_EVERY = 1_000
"""Writes of the loop's connection between two passive checkpoints made on a worker thread."""

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS nj_cache (key TEXT PRIMARY KEY, value TEXT NOT NULL, is_error INTEGER NOT NULL,"
    " fresh_until REAL NOT NULL, expires_at REAL NOT NULL) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS nj_cache_expiry ON nj_cache (expires_at)",
)
_GET = "SELECT value, is_error, fresh_until, expires_at FROM nj_cache WHERE key = ? AND expires_at > ?"
_SET = (
    "INSERT INTO nj_cache (key, value, is_error, fresh_until, expires_at) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value, is_error = excluded.is_error,"
    " fresh_until = excluded.fresh_until, expires_at = excluded.expires_at"
)
_DELETE = "DELETE FROM nj_cache WHERE key = ?"
_PURGE = (
    "DELETE FROM nj_cache WHERE key IN (SELECT key FROM nj_cache WHERE expires_at <= ? ORDER BY expires_at LIMIT ?)"
)


def _locked(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


def _entry(row: Any) -> CacheEntry | None:
    if row is None:
        return None
    value, is_error, fresh_until, expires_at = row
    if not (isinstance(value, str) and isinstance(fresh_until, (int, float)) and isinstance(expires_at, (int, float))):
        return None  # a row someone else wrote with other types: a miss, never a crash
    return CacheEntry(value, bool(is_error), float(fresh_until), float(expires_at))


def _write(conn: sqlite3.Connection, statement: str, params: tuple[Any, ...]) -> int:
    conn.execute("BEGIN IMMEDIATE")
    try:
        count = conn.execute(statement, params).rowcount
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return count


class SqliteCacheStore:
    """Cache entries in the SQLite file, shared by the processes that open it (`CacheStore`)."""

    shared = True
    never_yields = False

    def __init__(
        self,
        path: str,
        *,
        clock: Callable[[], float],
        limiter: trio.CapacityLimiter,
        busy_timeout: float,
        outage_timeout: float,
        blocking: bool,
        backend_open: Callable[[], bool],
        in_transaction: Callable[[], bool],
    ) -> None:
        """Built by `SqliteBackend.cache_store` with its file, clock, thread limiter and bounds;
        `blocking`: its deterministic mode (every call on the Trio thread); `backend_open` and
        `in_transaction` say whether the backend is open and whether this task is inside its
        `transaction()` block (which holds the file's write lock)."""
        self.path = path
        self.url = f"sqlite:///{path}"
        self._clock = clock
        self._limiter = limiter
        self._busy_timeout = busy_timeout
        self._outage_timeout = outage_timeout
        self._blocking = blocking
        self._backend_open = backend_open
        self._in_transaction = in_transaction
        self._loop_conn: sqlite3.Connection | None = None
        self._thread_conn: sqlite3.Connection | None = None
        self._thread_lock = trio.Lock()
        self._opening = trio.Lock()
        self._writes = 0

    def __repr__(self) -> str:
        return f"<SqliteCacheStore {self.path!r}>"

    def now(self) -> float:
        return self._clock()

    # -- connections --

    def _connect(self) -> tuple[sqlite3.Connection, sqlite3.Connection]:
        """Both connections, and the table (on a worker thread: creating it takes the lock)."""
        try:
            thread_conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout
            )
            thread_conn.execute("PRAGMA synchronous=NORMAL")
            _write_script(thread_conn)
            loop_conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=0)
            loop_conn.execute("PRAGMA synchronous=NORMAL")
            loop_conn.execute("PRAGMA wal_autocheckpoint=0")
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"SQLite cache in {self.path!r} could not be opened: {exc}") from None
        return loop_conn, thread_conn

    async def _open(self) -> sqlite3.Connection:
        if not self._backend_open():
            raise BackendUnavailable("the SQLite backend is not open; use its cache inside open_runtime()")
        async with self._opening:
            if self._loop_conn is None:
                self._loop_conn, self._thread_conn = await self._io(self._connect)
        assert self._loop_conn is not None
        return self._loop_conn

    async def close(self) -> None:
        """Close both connections (the backend's `close` calls it); the store opens them again
        if used after the backend is opened again."""
        loop_conn, self._loop_conn = self._loop_conn, None
        if loop_conn is not None:
            loop_conn.close()
        async with self._thread_lock:
            thread_conn, self._thread_conn = self._thread_conn, None
            if thread_conn is not None:
                await self._io(thread_conn.close)

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        if self._blocking:
            await trio.lowlevel.checkpoint()
            return fn(*args)
        return await run_sync_io(fn, *args, limiter=self._limiter)

    async def _on_thread(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(conn)`` on the thread's connection, retried while the file is locked, for up to
        `outage_timeout` (its waits for the connection included)."""
        deadline = trio.current_time() + self._outage_timeout
        delay = 0.05
        cause = "the calls ahead of this one on the cache's connection met the same lock"
        while True:
            with trio.move_on_at(deadline) as waited:
                await self._thread_lock.acquire()
            if waited.cancelled_caught:
                break
            try:
                conn = self._thread_conn
                if conn is None:
                    raise BackendUnavailable("the SQLite cache was closed with its backend")
                try:
                    return await self._io(fn, conn)
                except sqlite3.OperationalError as exc:
                    if not _locked(exc):
                        raise BackendUnavailable(f"SQLite cache in {self.path!r} failed: {exc}") from exc
                    cause = str(exc)
                except sqlite3.DatabaseError as exc:
                    raise BackendUnavailable(f"SQLite cache in {self.path!r} failed: {exc}") from exc
            finally:
                self._thread_lock.release()
            if trio.current_time() + delay > deadline:
                break
            await trio.sleep(delay)
            delay = min(delay * 2, 2.0)
        raise BackendUnavailable(
            f"SQLite cache in {self.path!r} unavailable: another connection held the file's write lock for over "
            f"{self._outage_timeout:g} s ({cause}); check for long transactions or a backup in progress"
        )

    def _check_not_in_transaction(self) -> None:
        if self._in_transaction():
            raise ConfigError(
                "inside `async with rt.transaction()` on SQLite, a cache write would wait for the transaction's own "
                "write lock (SQLite has one writer): write to the cache after the block"
            )

    # -- CacheStore --

    async def get(self, key: str) -> CacheEntry | None:
        conn = self._loop_conn or await self._open()
        await trio.lowlevel.checkpoint_if_cancelled()
        now = self._clock()
        try:
            return _entry(conn.execute(_GET, (key, now)).fetchone())
        except sqlite3.OperationalError as exc:
            if not _locked(exc):
                raise BackendUnavailable(f"SQLite cache in {self.path!r} failed: {exc}") from exc
        except sqlite3.DatabaseError as exc:
            raise BackendUnavailable(f"SQLite cache in {self.path!r} failed: {exc}") from exc
        return await self._on_thread(lambda c: _entry(c.execute(_GET, (key, now)).fetchone()))

    async def _write(self, statement: str, params: tuple[Any, ...]) -> None:
        self._check_not_in_transaction()
        conn = self._loop_conn or await self._open()
        await trio.lowlevel.checkpoint_if_cancelled()
        self._writes += 1
        if self._writes % CHECKPOINT_EVERY:
            try:
                _write(conn, statement, params)
                return
            except sqlite3.OperationalError as exc:
                if not _locked(exc):
                    raise BackendUnavailable(f"SQLite cache in {self.path!r} failed: {exc}") from exc
            except sqlite3.DatabaseError as exc:
                raise BackendUnavailable(f"SQLite cache in {self.path!r} failed: {exc}") from exc

            def write(c: sqlite3.Connection) -> None:
                _write(c, statement, params)

        else:

            def write(c: sqlite3.Connection) -> None:
                _write(c, statement, params)
                c.execute("PRAGMA wal_checkpoint(PASSIVE)")

        await self._on_thread(write)

    async def set(self, key: str, entry: CacheEntry) -> None:
        await self._write(_SET, (key, entry.value, int(entry.is_error), entry.fresh_until, entry.expires_at))

    async def delete(self, key: str) -> None:
        await self._write(_DELETE, (key,))

    async def purge(self, limit: int) -> int:
        self._check_not_in_transaction()
        if self._loop_conn is None:
            await self._open()
        now = self._clock()
        return await self._on_thread(lambda c: _write(c, _PURGE, (now, limit)))


def _write_script(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        for statement in _SCHEMA:
            conn.execute(statement)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
