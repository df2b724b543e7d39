"""`PgPool`: a bounded pool of autocommit `TrioConnection`s, each round trip bounded client-side."""

from __future__ import annotations

import select
from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable, Mapping, TypeVar

import psycopg
import trio
from psycopg.conninfo import make_conninfo

from ..redact import redact_exception
from .connect import connect, connection_params
from .connection import _ACTIVE, _IDLE, DRAIN_TIMEOUT, TrioConnection

__all__ = ["ROUND_TRIP_MARGIN", "ConnectFailed", "PgPool", "RoundTripTimeout"]

T = TypeVar("T")

ROUND_TRIP_MARGIN = 5.0
"""`PgPool.run` bound: the server's `statement_timeout` plus this margin (see `PgPool`)."""


class ConnectFailed(psycopg.OperationalError):
    """No connection could be opened: nothing was sent, so any call may be retried."""


class RoundTripTimeout(psycopg.OperationalError):
    """A pooled call outlived the pool's client-side bound (statement_timeout + margin): the
    server or the network stopped answering. The connection was closed and discarded. The
    statement may or may not have taken effect, like a connection lost mid-call."""


class PgPool:
    """At most `size` connections to `conninfo`, each used by one call at a time.

    No round trip waits forever: `run` (and a session switch at checkout) is bounded
    client-side by `round_trip_bound` = `statement_timeout` + `round_trip_margin` (default
    `ROUND_TRIP_MARGIN`) -- a server
    that answers at all stops the statement at `statement_timeout`. Past the bound the call is
    cancelled (a cancel request, then at most `DRAIN_TIMEOUT` to learn how the statement ended),
    its connection closed, and `RoundTripTimeout` raised: at worst the call returns after
    `round_trip_bound + DRAIN_TIMEOUT`. The conninfo's own parameters are kept; the pool adds
    its statement timeout and TCP keepalives (see `connection_params`)."""

    def __init__(
        self,
        conninfo: str,
        *,
        size: int,
        acquire_timeout: float = 10.0,
        connect_timeout: float = 10.0,
        statement_timeout: float = 30.0,
        round_trip_margin: float | None = None,
        blocking: bool = False,
        session: Mapping[str, str] | None = None,
        prepare_threshold: int | None = 5,
    ) -> None:
        self.conninfo = conninfo
        self._prepare_threshold = prepare_threshold
        self.size = size
        self.blocking = blocking
        """Every wait blocks the Trio thread: for deterministic tests only (see the module doc)."""
        self._acquire_timeout = acquire_timeout
        self._connect_timeout = connect_timeout
        self._statement_timeout = statement_timeout
        self.round_trip_bound = statement_timeout + (ROUND_TRIP_MARGIN if round_trip_margin is None else round_trip_margin)
        """Client-side bound of one `run` (see the class doc)."""
        self._params = connection_params(
            conninfo, connect_timeout=connect_timeout, statement_timeout=statement_timeout, session=session
        )
        self._slots = trio.Semaphore(size)
        self._idle: list[TrioConnection] = []
        self._closed = False
        self.checked_out = 0
        self._pids: dict[TrioConnection, int] = {}
        self._pid_set: frozenset[int] = frozenset()
        self._async_commit: set[TrioConnection] = set()

    @property
    def backend_pids(self) -> frozenset[int]:
        """Server pids of this pool's open connections: the listener drops their NOTIFY echoes."""
        return self._pid_set

    async def _open(self, durable: bool) -> TrioConnection:
        try:
            conn = await connect(
                make_conninfo("", **self._params),
                autocommit=True,
                blocking=self.blocking,
                prepare_threshold=self._prepare_threshold,
            )
        except psycopg.OperationalError as exc:
            raise ConnectFailed(str(redact_exception(exc, self.conninfo))) from exc
        self._pids[conn] = conn.pgconn.backend_pid
        self._pid_set = frozenset(self._pids.values())
        if not durable:
            # A SET, not a startup option: RESET must find the server's own setting later.
            try:
                await self._bounded_switch(conn, durable)
            except BaseException:
                self._drop(conn)
                raise
        return conn

    async def _bounded_switch(self, conn: TrioConnection, durable: bool) -> None:
        """`_switch` within `round_trip_bound`; past it (or if it fails) the connection is
        dropped and `ConnectFailed` raised: the caller's own statement was not sent yet, so the
        call may be retried."""
        with trio.move_on_after(self.round_trip_bound) as scope:
            try:
                await self._switch(conn, durable)
            except psycopg.OperationalError as exc:
                raise ConnectFailed(f"connection lost before the statement was sent: {exc}") from exc
        if scope.cancelled_caught:
            raise ConnectFailed(f"the server did not answer a session SET within {self.round_trip_bound:g} s")

    def _drop(self, conn: TrioConnection) -> None:
        if self._pids.pop(conn, None) is not None:
            self._pid_set = frozenset(self._pids.values())
        self._async_commit.discard(conn)
        conn.close_now()

    async def _checkout(self, durable: bool) -> TrioConnection:
        if self._closed:
            raise psycopg.OperationalError("the pool is closed")
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            with trio.fail_after(self._acquire_timeout):
                await self._slots.acquire()
        try:
            conn = self._take_idle(durable)
            if conn is None:
                conn = await self._open(durable)
            elif (conn in self._async_commit) == durable:
                try:
                    await self._bounded_switch(conn, durable)
                except BaseException:
                    self._drop(conn)
                    raise
        except BaseException:
            self._slots.release()
            raise
        self.checked_out += 1
        return conn

    def _take_idle(self, durable: bool) -> TrioConnection | None:
        """The most recently used idle connection in the mode asked for (its socket and backend
        are warm). None of that mode: a new one is opened while the pool has room; only a full
        pool hands out one of the other mode (to be switched)."""
        idle = self._idle
        for i in range(len(idle) - 1, -1, -1):
            conn = idle[i]
            if (conn not in self._async_commit) == durable:
                del idle[i]
                if _looks_alive(conn):
                    return conn
                self._drop(conn)  # the server ended it while idle (restart, pg_terminate_backend)
        while idle and len(self._pids) >= self.size:
            conn = idle.pop()
            if _looks_alive(conn):
                return conn
            self._drop(conn)
        return None

    async def _switch(self, conn: TrioConnection, durable: bool) -> None:
        # Back to durable: RESET, i.e. whatever the server, database or role configures.
        await conn.execute("RESET synchronous_commit" if durable else "SET synchronous_commit = off")
        if durable:
            self._async_commit.discard(conn)
        else:
            self._async_commit.add(conn)

    async def _checkin(self, conn: TrioConnection) -> None:
        try:
            self.checked_out -= 1
            if conn.closed or self._closed:
                self._drop(conn)
            elif conn.pgconn.transaction_status != _IDLE:
                await self._clean(conn)
            else:
                self._idle.append(conn)
        finally:
            self._slots.release()

    async def _clean(self, conn: TrioConnection) -> None:
        """Roll back a transaction left open (shielded, bounded); drop the connection if it
        is busy, broken, or the rollback fails."""
        if conn.pgconn.transaction_status == _ACTIVE:  # a statement still in flight
            self._drop(conn)
            return
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + DRAIN_TIMEOUT
            try:
                await conn.rollback()
            except psycopg.Error:
                pass
        if scope.cancelled_caught or conn.closed or conn.pgconn.transaction_status != _IDLE:
            self._drop(conn)
        else:
            self._idle.append(conn)

    @asynccontextmanager
    async def connection(self, *, durable: bool = True) -> AsyncIterator[TrioConnection]:
        """A pooled connection for the block (autocommit; rolled back if left in a transaction)."""
        conn = await self._checkout(durable)
        try:
            yield conn
        finally:
            await self._checkin(conn)

    async def run(self, fn: Callable[[TrioConnection], Awaitable[T]], *, durable: bool = True) -> T:
        """``await fn(conn)`` with a pooled connection; cancellable (see the module doc).

        `durable=False`: the session has ``synchronous_commit = off``, so a commit does not wait
        for the WAL flush; a server crash may lose the last few milliseconds of such writes.
        Only for writes whose loss is harmless (a lost claim makes its job claimable again).

        Bounded by `round_trip_bound` (see the class doc): past it, `RoundTripTimeout`.
        """
        conn = await self._checkout(durable)
        try:
            with trio.move_on_after(self.round_trip_bound):
                return await fn(conn)
            # Only our own deadline lands here (a result that arrived in the drain is returned
            # above). The connection is presumed dead: never pooled again.
            if not conn.closed:
                conn.close_now()
            raise RoundTripTimeout(
                f"no answer from PostgreSQL within {self.round_trip_bound:g} s "
                f"(statement_timeout {self._statement_timeout:g} s + margin); connection discarded"
            )
        finally:
            await self._checkin(conn)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            self._drop(conn)


def _looks_alive(conn: TrioConnection) -> bool:
    """An idle connection has nothing to read; if its socket is readable, the server sent a
    goodbye (or closed it): one poll with no wait, cheaper than a round trip."""
    if conn.closed:
        return False
    try:
        readable, _, _ = select.select([conn.pgconn.socket], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable
