"""The PostgreSQL driver bridge: psycopg 3's sync API on Trio, and the one LISTEN connection.

Why threads and not trio-asyncio with psycopg's async API: measured here (benchmarks/RESULTS.md,
"bridge"), a round trip through a thread costs less than one through trio-asyncio, and at the
batch sizes the runtime uses the two are within noise. Both honour cancellation, but the thread
path does it without an asyncio loop per process. trio-asyncio stays the bridge for asyncio job
handlers (`infra.aio`).

Queries. Each call runs a plain function on a worker thread under the pool's limiter and is never
abandoned. Cancellation is honoured all the same: while the thread runs, a watcher task waits on
the caller's cancel scope; if the caller is cancelled it asks the server to cancel the running
statement (`cancel_safe`), the thread returns promptly with `QueryCanceled`, and the caller sees
`trio.Cancelled`. The connection is rolled back if it was left in a transaction, and discarded if
it is broken, so a cancelled call never hands a dirty connection to the next caller.

Pool. A bounded set of autocommit connections, opened lazily, checked out with a bounded wait.
psycopg_pool is not used: its sync pool runs maintenance threads outside the runtime's task tree,
and its async pool needs an asyncio loop.

Listener. One dedicated connection per process LISTENs; Trio waits for its socket to become
readable (no thread, no polling) and hands each notification to a callback. If the connection
drops, the listener reconnects with bounded exponential backoff and calls `on_reconnect`, so the
caller can look for work it may have missed while deaf (fetchers also poll, so nothing waits
longer than a poll interval meanwhile).
"""

from __future__ import annotations

import logging
import math
import select
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Sequence, TypeVar

import outcome

from . import aio as _aio  # noqa: F401  (trio_asyncio must be imported before psycopg)

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402
import trio

from .owner import open_owner

__all__ = ["ConnectFailed", "PgPool", "listen", "psycopg", "sql"]

log = logging.getLogger("nursery_jobs")

T = TypeVar("T")


class ConnectFailed(psycopg.OperationalError):
    """No connection could be opened: nothing was sent, so any call may be retried."""


class PgPool:
    """At most `size` connections to `conninfo`, each used by one call at a time."""

    def __init__(
        self,
        conninfo: str,
        *,
        size: int,
        acquire_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        statement_timeout: float = 30.0,
    ) -> None:
        self.conninfo = conninfo
        self.size = size
        self._acquire_timeout = acquire_timeout
        self._connect_timeout = connect_timeout
        self._statement_timeout = statement_timeout
        self._limiter = trio.CapacityLimiter(size)
        self._idle: list[psycopg.Connection[Any]] = []
        self._closed = False
        self.checked_out = 0
        self._pids: dict[psycopg.Connection[Any], int] = {}

    def _connect(self) -> psycopg.Connection[Any]:
        conn = self._connect_raw()
        self._pids[conn] = conn.info.backend_pid
        return conn

    @property
    def backend_pids(self) -> set[int]:
        """Server pids of this pool's open connections: the listener drops their NOTIFY echoes."""
        return set(self._pids.values())

    def _drop(self, conn: psycopg.Connection[Any]) -> None:
        self._pids.pop(conn, None)
        conn.close()

    def _connect_raw(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(
            self.conninfo,
            autocommit=True,
            connect_timeout=max(1, math.ceil(self._connect_timeout)),
            options=f"-c statement_timeout={int(self._statement_timeout * 1000)}",
        )
        return conn

    async def _open(self) -> psycopg.Connection[Any]:
        try:
            return await trio.to_thread.run_sync(self._connect, abandon_on_cancel=False)
        except psycopg.OperationalError as exc:
            raise ConnectFailed(str(exc)) from exc

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.Connection[Any]]:
        if self._closed:
            raise psycopg.OperationalError("the pool is closed")
        with trio.fail_after(self._acquire_timeout):
            await self._limiter.acquire()
        try:
            conn = None
            while self._idle:
                candidate = self._idle.pop()
                if _looks_alive(candidate):
                    conn = candidate
                    break
                self._drop(candidate)  # the server ended it while idle (restart, pg_terminate_backend)
            if conn is None:
                conn = await self._open()
            self.checked_out += 1
            try:
                yield conn
            finally:
                self.checked_out -= 1
                if conn.broken or conn.closed or self._closed:
                    self._drop(conn)
                else:
                    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        with trio.CancelScope(shield=True):
                            await trio.to_thread.run_sync(_rollback_or_close, conn, abandon_on_cancel=False)
                    if conn.closed:
                        self._drop(conn)
                    else:
                        self._idle.append(conn)
        finally:
            self._limiter.release()

    async def run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """``fn(conn)`` on a thread with a pooled connection; cancellable (see module doc)."""
        async with self.connection() as conn:
            return await call_cancellable(conn, fn)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            self._drop(conn)


def _looks_alive(conn: psycopg.Connection[Any]) -> bool:
    """An idle connection has nothing to read; if its socket is readable, the server sent a
    goodbye (or closed it): one `select` with no wait, cheaper than a round trip."""
    if conn.closed or conn.broken:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable


def _rollback_or_close(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.rollback()
    except psycopg.Error:
        conn.close()


async def call_cancellable(conn: psycopg.Connection[Any], fn: Callable[[psycopg.Connection[Any]], T]) -> T:
    """Run ``fn(conn)`` on a thread; if the caller is cancelled meanwhile, cancel the statement
    on the server, wait for the thread (it then returns promptly), and raise Cancelled."""
    finished = False

    async def cancel_on_cancellation() -> None:
        try:
            await trio.sleep_forever()
        finally:
            if not finished:
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await trio.to_thread.run_sync(_cancel_quietly, conn, abandon_on_cancel=False)

    async with open_owner("pg-call") as owner:
        owner.spawn(cancel_on_cancellation, name="cancel-watcher")
        with trio.CancelScope(shield=True):
            result = await outcome.acapture(_in_thread, fn, conn)
        finished = True
        owner.cancel_scope.cancel()
    # Reached only if the caller was not cancelled (leaving the owner raised Cancelled otherwise).
    value: T = result.unwrap()
    return value


async def _in_thread(fn: Callable[[psycopg.Connection[Any]], T], conn: psycopg.Connection[Any]) -> T:
    return await trio.to_thread.run_sync(fn, conn, abandon_on_cancel=False)


def _cancel_quietly(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.cancel_safe(timeout=5.0)
    except Exception:
        log.debug("could not cancel a running statement", exc_info=True)


async def listen(
    conninfo: str,
    channels: Sequence[str],
    on_notify: Callable[[str, str, int], None],
    on_reconnect: Callable[[], None],
    *,
    max_backoff: float = 5.0,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """LISTEN on `channels` until cancelled, calling ``on_notify(channel, payload, sender_pid)`` per
    notification. Reports started once the first LISTEN is in place (or the first attempt
    failed: start-up must not hang on an unreachable server; polling covers the gap)."""
    backoff = 0.1
    started = False
    while True:
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = await trio.to_thread.run_sync(_listen_connect, conninfo, channels, abandon_on_cancel=False)
            if not started:
                started = True
                task_status.started()
            else:
                log.warning("LISTEN connection re-established")
                on_reconnect()
            backoff = 0.1
            await _pump(conn, on_notify)
        except (psycopg.Error, OSError) as exc:
            log.warning("LISTEN connection lost (%s); retrying in %.1f s, polling meanwhile", exc, backoff)
            if not started:
                started = True
                task_status.started()
            await trio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)
        finally:
            if conn is not None:
                conn.close()


def _listen_connect(conninfo: str, channels: Sequence[str]) -> psycopg.Connection[Any]:
    conn = psycopg.connect(conninfo, autocommit=True, connect_timeout=10)
    for channel in channels:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    return conn


async def _pump(conn: psycopg.Connection[Any], on_notify: Callable[[str, str, int], None]) -> None:
    pgconn = conn.pgconn
    while True:
        await trio.lowlevel.wait_readable(conn.fileno())
        pgconn.consume_input()  # raises OperationalError when the server went away
        if pgconn.status != psycopg.pq.ConnStatus.OK:
            raise psycopg.OperationalError("LISTEN connection closed by the server")
        while (n := pgconn.notifies()) is not None:
            on_notify(n.relname.decode(), n.extra.decode(), n.be_pid)
