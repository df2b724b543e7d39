"""The backend's state, and its one way to call the database.

SQLite calls block, and the Trio loop must not: each call runs on a worker thread through infra's
`run_sync_io` under this backend's own limiter, one call at a time on the one connection
(serialised by a `trio.Lock`), and is never abandoned (`SqliteBase._call`). A call is short:
SQLite's `busy_timeout` bounds how long it waits for another process's write lock, and a call
that met the lock is retried with backoff for up to `outage_timeout`. Every write is one short
transaction (`_tx`: ``BEGIN IMMEDIATE`` around the body, SQLite's write lock taken at once), so a
process killed at any moment leaves the file consistent and loses nothing that was committed.

Clock: Unix time by default; tests pass `clock=trio.current_time` so `MockClock` drives it. A
subclass that sets `_blocking_io = True` (the test suites' deterministic SQLite) makes every call
on the Trio thread itself, which a service must never do but which lets MockClock's autojump see
a database call as work; that mode has no wake-up sockets (it runs in one process).
"""

from __future__ import annotations

import contextvars
import logging
import sqlite3
import time
from typing import Any, Callable, ClassVar, Sequence

import trio

from ...errors import BackendUnavailable, ConfigError
from ...infra.threads import from_io_thread, run_sync_io
from ...infra.wake import Wake, WakeRegistry
from ..protocol import BackendEvent, CancelRequested, JobFinalized, JobsAvailable, Listener, OutboxPublished
from .cache import SqliteCacheStore
from .schema import SCHEMA, SCHEMA_VERSION, upgrade

__all__ = ["IDS_PER_STATEMENT", "SqliteBase", "current_transaction"]

log = logging.getLogger("nursery_jobs")

IDS_PER_STATEMENT = 500
"""Ids per `IN (...)` list: under SQLite's oldest variable limit (999)."""

current_transaction: contextvars.ContextVar[SqliteBase | None] = contextvars.ContextVar(
    "nursery_jobs.sqlite_transaction", default=None
)
"""The backend whose `transaction()` block this task is in: a write on the backend's own
connection there would wait for the block's own write lock."""


class SqliteBase:
    """The backend's settings and state, and the calls every concern of it makes: `_call` (a
    function on the connection, on its thread, retried while the file is locked), `_tx` (the body
    in one write transaction) and `_emit` (events here and to the other processes)."""

    _blocking_io: ClassVar[bool] = False
    """Every database call blocks the Trio thread: set only by a test subclass that runs the
    runtime under `MockClock(autojump_threshold=0)`, never by a service."""

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "FULL",
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 10.0,
        outage_timeout: float = 30.0,
        wake: bool = True,
    ) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        self._synchronous = synchronous
        self._clock = clock
        self._wall_offset: float | None = None
        self._busy_timeout = busy_timeout
        self.outage_timeout = outage_timeout
        self._conn: sqlite3.Connection | None = None
        self._lock = trio.Lock()
        self._limiter = trio.CapacityLimiter(1)
        self._listeners: list[Listener] = []
        self._wake = WakeRegistry(path) if wake and not self._blocking_io else None
        self._workers: int | None = None
        """The most queue workers a runtime on this backend has (`check_budget`); None: unknown."""
        self._tx_conn: sqlite3.Connection | None = None
        """The file's transaction connection (`transaction()`), opened at its first use."""
        self._tx_lock = trio.Lock()
        self._tx_limiter = trio.CapacityLimiter(1)
        self.acquire_timeout = busy_timeout
        """The longest wait for the transaction connection (one transaction at a time)."""
        self._cache: SqliteCacheStore | None = None

    def __repr__(self) -> str:
        return f"<SqliteBackend {self.path!r}>"

    def now(self) -> float:
        return self._clock()

    def _now_locked(self) -> float:
        """`now()` read by a call on its own thread, inside a transaction that holds the write
        lock. The default clock is read there; any other (a test's virtual clock, which only
        the Trio thread may read) through the Trio thread."""
        if self._clock is time.time or self._blocking_io:
            return self._clock()
        return from_io_thread(self._clock)

    def wall_offset(self) -> float:
        if self._wall_offset is None:
            self._wall_offset = 0.0 if self._clock is time.time else self._clock() - time.time()
        return self._wall_offset

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def _emit(self, events: Sequence[BackendEvent]) -> None:
        """Deliver the events of this instance's own write, here and to the other processes."""
        self._deliver(events)
        if self._wake is not None and events:
            self._wake.send(
                Wake(
                    tuple(e.queue for e in events if type(e) is JobsAvailable),
                    tuple(e.job_id for e in events if type(e) is JobFinalized),
                    tuple(e.job_id for e in events if type(e) is CancelRequested),
                    any(type(e) is OutboxPublished for e in events),
                )
            )

    def _deliver(self, events: Sequence[BackendEvent]) -> None:
        for event in events:
            for listener in tuple(self._listeners):
                listener(event)

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._blocking_io:
            # Deterministic tests only: the call blocks the Trio thread, so under MockClock's
            # autojump a database call never looks like "every task is waiting".
            await trio.lowlevel.checkpoint()
            return fn(*args)
        return await run_sync_io(fn, *args, limiter=self._limiter)

    async def open(self) -> None:
        if self._conn is None:
            self._conn = await self._io(self._connect)

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout)
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open SQLite database {self.path!r}: {exc}") from None
        # Several processes may open a new file at the same moment: switching it to WAL and
        # creating the schema can then meet "database is locked" without SQLite's busy handler
        # being consulted, so retry (bounded by busy_timeout). Runs on a worker thread.
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"PRAGMA synchronous={self._synchronous}")
                conn.executescript(SCHEMA)
                conn.execute(
                    "INSERT OR IGNORE INTO nj_meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
                upgrade(conn)
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    conn.close()
                    raise ConfigError(f"cannot prepare SQLite database {self.path!r}: {exc}") from None
                time.sleep(0.02)
        (version,) = conn.execute("SELECT value FROM nj_meta WHERE key = 'schema_version'").fetchone()
        if int(version) != SCHEMA_VERSION:
            conn.close()
            raise ConfigError(
                f"SQLite database {self.path!r} has schema version {version}, this nursery_jobs needs "
                f"{SCHEMA_VERSION}; use a matching nursery_jobs version or a new file"
            )
        return conn

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the connection. Every call starts with `BEGIN IMMEDIATE` (or is a
        read), so "database is locked" means nothing was written: another connection held the
        write lock past `busy_timeout` (an operator's shell, a backup). Such a call is retried
        with backoff for up to `outage_timeout` from its start, its waits for the connection
        included, then `BackendUnavailable` says so: a call ends within `outage_timeout` plus the
        one `busy_timeout` of an attempt begun before that, however many wait; any other
        SQLite error is a `BackendUnavailable` at once, naming the cause. A write from inside
        this backend's own `transaction()` block is a `ConfigError`: it would wait for the
        block's own write lock."""
        if fn == self._tx and current_transaction.get() is self:
            raise ConfigError(
                "inside `async with rt.transaction()` on SQLite, this call would wait for the transaction's own "
                "write lock (SQLite has one writer): enqueue with kind.enqueue_tx(conn, ...), and make other "
                "changes (cancel, plain enqueue) after the block"
            )
        if self._conn is None:
            await self.open()
        deadline = trio.current_time() + self.outage_timeout
        delay = 0.05
        lock = self._lock
        while True:
            try:
                if lock.locked():
                    # The wait for the connection counts against the deadline too: behind other
                    # calls that each wait `busy_timeout` for the file, a call would otherwise
                    # give up only after a `busy_timeout` per call ahead of it.
                    with trio.move_on_at(deadline) as waited:
                        await lock.acquire()
                    if waited.cancelled_caught:
                        raise self._unavailable("the calls ahead of this one on its connection met the same lock")
                else:
                    await lock.acquire()
                try:
                    return await self._io(fn, *args)
                finally:
                    lock.release()
            except sqlite3.OperationalError as exc:
                locked = "locked" in str(exc) or "busy" in str(exc)
                if not locked or trio.current_time() + delay > deadline:
                    raise self._unavailable(str(exc), locked) from exc
                log.warning(
                    "SQLite database %r is locked (%s); retrying in %.2f s",
                    self.path,
                    exc,
                    delay,
                    extra={"event": "backend_retry", "backend": self.url, "retry_in": delay},
                )
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)
            except sqlite3.DatabaseError as exc:
                raise BackendUnavailable(f"SQLite database {self.path!r} failed: {exc}") from exc

    def _unavailable(self, cause: str, locked: bool = True) -> BackendUnavailable:
        what = f"another connection held its write lock for over {self.outage_timeout:g} s" if locked else "an SQLite error"
        return BackendUnavailable(
            f"SQLite database {self.path!r} unavailable: {what} ({cause}); check for long "
            "transactions, a backup in progress, or the disk"
        )

    def _tx(self, body: Callable[[sqlite3.Connection], Any]) -> Any:
        conn = self._conn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = body(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # a failed COMMIT leaves it open too
                conn.execute("ROLLBACK")
            raise
        return result
