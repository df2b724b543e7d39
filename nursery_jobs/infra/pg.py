"""The PostgreSQL driver bridge: psycopg 3 on Trio's own I/O, a pool, and the one LISTEN connection.

The bridge. `TrioConnection` is psycopg's `AsyncConnection` with the one place where psycopg
blocks -- `wait()`, which drives psycopg's I/O generators -- done by Trio:
`trio.lowlevel.wait_readable` / `wait_writable` on the connection's socket, on the Trio thread,
with no worker thread and no asyncio loop. When psycopg asks for "readable or writable" (while it
sends a message larger than the socket buffer), one Trio wait covers both: on an epoll set
holding just that socket (on platforms without epoll, two waits in a small nursery). Connecting
is done the same way (libpq's `connect_start` / `connect_poll`, `connect_timeout` honoured), and
so is a server-side cancel request (libpq's non-blocking cancel connection).

Why this and not the two options the issue named (psycopg's sync API through the thread limiter,
or its async API through trio-asyncio): measured in benchmarks/RESULTS.md ("Bridge"), both cost
~1.4-1.8 ms of client CPU per claim + complete round trip and reach 0.41-0.47 of sync psycopg's
round-trip rate; this bridge reaches 0.90-0.96 of it at 1.2-1.35x its CPU (with the cursor kept
per statement, as the backend calls it), and honours cancellation as well. trio-asyncio stays the bridge for asyncio job handlers
(`infra.aio`).

What in `AsyncConnection` touches asyncio, and what replaces it here: `wait()` (above);
`connect()` (its DNS lookup and connect loop run on asyncio: replaced by `connect()` below);
`cancel_safe()` (replaced); the connection's `lock`, an `asyncio.Lock` (replaced by a Trio lock
that costs nothing uncontended). Everything else (cursors, COPY with the default writer,
transactions, pipelines) only awaits `wait()` and the lock. Tests run it under plain
`trio.run`, with no asyncio loop at all.

Cancellation. A call waits only in Trio waits, so a cancelled caller stops waiting at once,
and a cancelled caller never sends anything. If a statement was in flight, the bridge sends the
server a cancel request and follows the statement to its end (shielded, at most `DRAIN_TIMEOUT`
seconds): if the server stopped it, the call raises `Cancelled` and nothing happened; if it had
completed before the request arrived, the call returns its result (the caller's cancellation
then takes effect at its next checkpoint), so a call that took effect is never reported as
cancelled -- which keeps `enqueue` and `cancel` cancel-atomic. A statement psycopg sends after
one that ended (the execute after a prepare) gets a cancel request of its own. If the server
does not stop in time, the connection is closed. Either way no connection is handed to the next
caller dirty: the pool rolls back a transaction left open and discards a connection that is
closed, still busy (a COPY left half-way), or whose rollback failed.

Blocking mode (`blocking=True`), for deterministic tests only. `trio.testing.MockClock` with
`autojump_threshold=0` jumps virtual time whenever every task is blocked, and a task waiting for
a socket looks blocked: virtual time would jump while a query runs. In blocking mode every wait
is a blocking poll on the Trio thread (psycopg's own `waiting.wait`), followed by a Trio
checkpoint, and connecting blocks too: the loop never sees I/O as idleness. The price is that a
query cannot be cancelled while it runs (cancellation takes effect at the next checkpoint) and
the whole loop stalls for each round trip. The LISTEN connection connects and subscribes
blocking too, but waits for notifications with a Trio wait (it waits indefinitely). Never use
it in production.

Pool. A bounded set of autocommit connections, opened lazily, checked out without a wait while
one is free (a bounded wait otherwise), most recently used first. A connection that died while
idle is found by a zero-timeout poll of its socket at checkout and replaced. `run(fn,
durable=False)` asks for a session with `synchronous_commit = off`, for writes whose loss in a
server crash is harmless (claims, heartbeats). A connection keeps its mode; while the pool has
room each mode gets connections of its own, and only a full pool switches one (`SET
synchronous_commit = off`, or `RESET` back to whatever the server configures). psycopg_pool is
not used: its sync pool runs maintenance threads outside the runtime's task tree, and its async
pool needs an asyncio loop.

Bounds. No pooled round trip waits forever: `PgPool.run` is cut client-side at
`statement_timeout + ROUND_TRIP_MARGIN` (the server stops a statement at `statement_timeout`,
so only a silent connection -- a partition dropping packets, a frozen server -- gets there),
then cancelled as above (at most `DRAIN_TIMEOUT` more) and its connection closed:
`RoundTripTimeout`, an `OperationalError` like a lost connection. Pool and listener connections
get TCP keepalives and `tcp_user_timeout` (`KEEPALIVE_DEFAULTS`) unless the conninfo sets them,
and keep the conninfo's own `connect_timeout` and `options` (`connection_params`).

Listener. One dedicated connection per process LISTENs; Trio waits for its socket to become
readable (no thread, no polling) and hands each notification to a callback. If the connection
drops, the listener reconnects with bounded exponential backoff and calls `on_reconnect`, so the
caller can look for work it may have missed while deaf (fetchers also poll, so nothing waits
longer than a poll interval meanwhile). A connection that goes silent is found by a `SELECT 1`
after `ping_interval` idle seconds that must answer within `ping_timeout` (and by keepalives).
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import select
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence, TypeVar

from . import aio as _aio  # noqa: F401  (trio_asyncio must be imported before psycopg)

import psycopg  # noqa: E402
import trio  # noqa: E402
from psycopg import pq, sql, waiting  # noqa: E402
from psycopg.conninfo import conninfo_attempts, conninfo_to_dict, make_conninfo, timeout_from_conninfo  # noqa: E402
from psycopg.rows import tuple_row  # noqa: E402

from .._redact import redact, redact_exception  # noqa: E402
from .owner import open_owner  # noqa: E402

__all__ = [
    "DRAIN_TIMEOUT",
    "KEEPALIVE_DEFAULTS",
    "ConnectFailed",
    "PgPool",
    "RoundTripTimeout",
    "TrioConnection",
    "connect",
    "connection_params",
    "conninfo_to_dict",
    "listen",
    "psycopg",
    "sql",
]

log = logging.getLogger("nursery_jobs")

T = TypeVar("T")

DRAIN_TIMEOUT = 5.0
"""After a cancelled statement: how long the server gets to stop it before the connection is closed."""

_WAIT_R = int(waiting.WAIT_R)
_WAIT_W = int(waiting.WAIT_W)
_READY_R = int(waiting.READY_R)
_READY_W = int(waiting.READY_W)
_ACTIVE = pq.TransactionStatus.ACTIVE
_IDLE = pq.TransactionStatus.IDLE
_POLL_OK = pq.PollingStatus.OK
_POLL_READING = pq.PollingStatus.READING
_POLL_WRITING = pq.PollingStatus.WRITING
_POLL_FAILED = pq.PollingStatus.FAILED
_BAD = pq.ConnStatus.BAD
_PIPELINE_OFF = pq.PipelineStatus.OFF
_MAX_CACHED_CURSORS = 64
_BLOCKING_POLL_INTERVAL = 0.1  # blocking mode: how often a long wait looks for a closed socket / Ctrl-C
_EPOLL = getattr(select, "epoll", None)
_EPOLLIN = getattr(select, "EPOLLIN", 0)
_EPOLLOUT = getattr(select, "EPOLLOUT", 0)
_EPOLLERR_HUP = getattr(select, "EPOLLERR", 0) | getattr(select, "EPOLLHUP", 0)


KEEPALIVE_DEFAULTS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
"""libpq TCP settings the pool and the listener add unless the conninfo sets them: the kernel
declares a silent peer dead after ~25 s idle (10 s + 3 unanswered probes 5 s apart), or when sent
data stays unacknowledged for 30 s (`tcp_user_timeout`, ms). Ignored on Unix-domain sockets."""

ROUND_TRIP_MARGIN = 5.0
"""`PgPool.run` bound: the server's `statement_timeout` plus this margin (see `PgPool`)."""


class ConnectFailed(psycopg.OperationalError):
    """No connection could be opened: nothing was sent, so any call may be retried."""


class RoundTripTimeout(psycopg.OperationalError):
    """A pooled call outlived the pool's client-side bound (statement_timeout + margin): the
    server or the network stopped answering. The connection was closed and discarded. The
    statement may or may not have taken effect, like a connection lost mid-call."""


def connection_params(
    conninfo: str,
    *,
    connect_timeout: float | None = None,
    statement_timeout: float | None = None,
    session: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The connection parameters of `conninfo` merged with the pool's: the conninfo's own
    `connect_timeout` and keepalive settings win; `KEEPALIVE_DEFAULTS` fill in the rest; a
    `statement_timeout` (seconds) is appended to the conninfo's own `options` (``-c
    search_path=...`` and the like are kept; the appended setting wins over one given there, so
    the pool's client-side bound and the server's agree). The server counts whole milliseconds
    and reads 0 as "no limit", so a positive `statement_timeout` is sent as at least 1 ms, rounded
    up. `session` settings (``{"plan_cache_mode": "force_generic_plan"}``) are appended the same
    way. Raises `psycopg.ProgrammingError` for a malformed conninfo."""
    params = conninfo_to_dict(conninfo)
    if connect_timeout is not None and params.get("connect_timeout") in (None, ""):
        params["connect_timeout"] = max(1, math.ceil(connect_timeout))
    for key, value in KEEPALIVE_DEFAULTS.items():
        if params.get(key) in (None, ""):
            params[key] = value
    if statement_timeout is not None:
        # round() first: 1.1 s is 1100.0000000000002 ms in floats, and must not become 1101.
        ours = f"-c statement_timeout={max(1, math.ceil(round(statement_timeout * 1000, 6)))}"
        theirs = str(params.get("options") or "").strip()
        params["options"] = f"{theirs} {ours}" if theirs else ours
    for name, value in (session or {}).items():
        ours = f"-c {name}={value}"
        theirs = str(params.get("options") or "").strip()
        params["options"] = f"{theirs} {ours}" if theirs else ours
    return params


class _Lock:
    """The connection's lock (psycopg's is an `asyncio.Lock`). Free: taken without a checkpoint
    (the wait that follows is one); held: the caller parks, and the holder hands the lock to the
    first one parked when it leaves (first come, first served)."""

    __slots__ = ("_held", "_lot")

    def __init__(self) -> None:
        self._held = False
        self._lot = trio.lowlevel.ParkingLot()

    async def __aenter__(self) -> None:
        if not self._held:
            self._held = True
            return
        await self._lot.park()  # woken only by __aexit__, which handed the lock over

    async def __aexit__(self, *exc: object) -> None:
        if self._lot:
            self._lot.unpark()  # still held: now by the task just woken
        else:
            self._held = False


class TrioConnection(psycopg.AsyncConnection[Any]):
    """psycopg's `AsyncConnection`, waiting through Trio (see the module doc). Open it with
    `connect()` (or `TrioConnection.connect`); use it from one task at a time."""

    _blocking = False
    _epoll: Any = None

    def __init__(self, pgconn: pq.abc.PGconn, row_factory: Any = tuple_row) -> None:
        super().__init__(pgconn, row_factory)
        self.lock = _Lock()  # type: ignore[assignment]
        self._cursors: dict[object, psycopg.AsyncCursor[Any]] = {}

    def cached_cursor(self, key: object) -> psycopg.AsyncCursor[Any]:
        """A cursor kept for `key` (e.g. the statement it runs) and reused by later calls with the
        same key: creating a psycopg cursor per statement costs more than the round trip's own
        client work. For a fixed set of statements only; one caller at a time."""
        cur = self._cursors.get(key)
        if cur is None:
            if len(self._cursors) >= _MAX_CACHED_CURSORS:
                self._cursors.clear()
            cur = self._cursors[key] = self.cursor()
        return cur

    @property
    def blocking(self) -> bool:
        """Whether every wait blocks the Trio thread (deterministic tests only)."""
        return self._blocking

    @classmethod
    async def connect(  # type: ignore[override]
        cls, conninfo: str = "", *, autocommit: bool = False, blocking: bool = False, **kwargs: Any
    ) -> TrioConnection:
        """Like `AsyncConnection.connect`, with no asyncio: see `connect()`."""
        return await connect(conninfo, autocommit=autocommit, blocking=blocking, **kwargs)

    # -- waiting --

    async def wait(self, gen: Any, interval: float | None = None, timeout: float | None = None) -> Any:
        """Drive psycopg's generator `gen` to its end, waiting through Trio.

        `timeout` (used by psycopg's `notifies()`) raises psycopg's wait-timeout error; any other
        cancellation is handled as in the module doc.
        """
        if timeout is not None:
            with trio.move_on_after(timeout):
                return await self.wait(gen)
            raise _wait_timeout()
        if self._blocking:
            return await self._wait_blocking(gen)
        await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller sends nothing
        try:
            s = next(gen)
        except StopIteration as ex:
            # Done without waiting (COPY data buffered, a setting changed): still a schedule
            # point, so a long COPY cannot starve the other tasks.
            await trio.lowlevel.cancel_shielded_checkpoint()
            return ex.value
        fileno = self.pgconn.socket
        try:
            while True:
                s = gen.send(await self._ready(s, fileno))
        except StopIteration as ex:
            return ex.value
        except trio.Cancelled as cancelled:
            return await self._finish_after_cancel(gen, s, cancelled)

    async def _ready(self, s: int, fileno: int) -> int:
        """Wait for what psycopg's generator asked for (`s`: read, write, or either) and return
        the readiness to send it. (The caller sends it: a StopIteration cannot cross a
        coroutine, and a cancelled wait leaves the caller's `s` current.)"""
        if s == _WAIT_R:
            await trio.lowlevel.wait_readable(fileno)
            return _READY_R
        if s == _WAIT_W:
            await trio.lowlevel.wait_writable(fileno)
            return _READY_W
        return await self._wait_rw(fileno)

    async def _wait_blocking(self, gen: Any) -> Any:
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            result = waiting.wait(gen, self.pgconn.socket, interval=_BLOCKING_POLL_INTERVAL)
        finally:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return result

    async def _wait_rw(self, fileno: int) -> int:
        """Wait until the socket is readable or writable (psycopg asks for either while it sends
        a large message: the server may need to be read from before it accepts more)."""
        if _EPOLL is None:
            return await _wait_rw_with_tasks(fileno)
        ep = self._epoll
        if ep is None:
            # An epoll set holding just this socket: Trio waits for *it* to become readable,
            # which it does when the socket is readable or writable. One task, one wait.
            ep = self._epoll = _EPOLL()
            ep.register(fileno, _EPOLLIN | _EPOLLOUT)
        while True:
            ready = 0
            for _fd, events in ep.poll(0):
                if events & (_EPOLLIN | _EPOLLERR_HUP):
                    ready |= _READY_R
                if events & _EPOLLOUT:
                    ready |= _READY_W
            if ready:
                return ready
            await trio.lowlevel.wait_readable(ep.fileno())

    async def _finish_after_cancel(self, gen: Any, s: int, cancelled: trio.Cancelled) -> Any:
        """The caller was cancelled while `gen` waited in state `s`. If a statement is in
        flight, ask the server to cancel it and keep driving `gen` (shielded, at most
        `DRAIN_TIMEOUT`) to learn how it ended:

        - the server stopped it (`QueryCanceled`, or any error): it had no effect, so re-raise
          `Cancelled`;
        - it completed before the cancel request arrived: its effect stands, so its result is
          returned and the caller's cancellation takes effect at its next checkpoint (a wait
          starts with one, so nothing more is sent). Raising `Cancelled` here would report an
          insert or a cancel that happened as one that did not: the public API is cancel-atomic.

        A statement psycopg sends after one that ended (the execute that follows a prepare) is
        sent a cancel request of its own. If the server does not answer in time, the connection
        is closed (the pool never hands it out again) and `Cancelled` is raised."""
        pgconn = self.pgconn
        if pgconn.transaction_status != _ACTIVE:
            gen.close()  # nothing in flight (a LISTEN-style wait): nothing to stop
            raise cancelled
        if pgconn.pipeline_status != _PIPELINE_OFF:
            gen.close()
            self.close_now()  # results of a pipeline cannot be followed blindly
            raise cancelled
        fileno = pgconn.socket
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + DRAIN_TIMEOUT
            asked = False
            try:
                while True:
                    if not asked and pgconn.transaction_status == _ACTIVE:
                        asked = True
                        try:
                            await self._send_cancel()
                        except Exception:
                            log.debug("could not send a cancel request; waiting for the statement", exc_info=True)
                    s = gen.send(await self._ready(s, fileno))
                    if pgconn.transaction_status != _ACTIVE:
                        asked = False  # that statement ended: one sent after it is cancelled too
            except StopIteration as ex:
                return ex.value
            except (psycopg.Error, OSError):
                pass  # stopped by the server, or failed anyway: no effect; a broken connection is dropped
        if scope.cancelled_caught:
            gen.close()
            log.warning("a cancelled statement did not stop within %g s: closing its connection", DRAIN_TIMEOUT)
            self.close_now()
        raise cancelled

    async def _send_cancel(self) -> None:
        pgconn = self.pgconn
        if psycopg.capabilities.has_cancel_safe():
            cancel = pgconn.cancel_conn()
            try:
                cancel.start()
                while True:
                    status = cancel.poll()
                    if status == _POLL_OK:
                        return
                    if status == _POLL_READING:
                        await trio.lowlevel.wait_readable(cancel.socket)
                    elif status == _POLL_WRITING:
                        await trio.lowlevel.wait_writable(cancel.socket)
                    else:
                        raise psycopg.OperationalError(f"cancellation failed: {cancel.get_error_message()}")
            finally:
                cancel.finish()
        else:  # libpq < 17 has only the blocking cancel call
            await trio.to_thread.run_sync(pgconn.get_cancel().cancel, abandon_on_cancel=False)

    async def cancel_safe(self, *, timeout: float = 30.0) -> None:
        """Ask the server to cancel the statement running on this connection (a Trio wait)."""
        if self.closed:
            return
        with trio.fail_after(timeout):
            await self._send_cancel()

    # -- closing --

    def close_now(self) -> None:
        """Close at once (no I/O but libpq's goodbye message)."""
        self._closed = True
        self._cursors.clear()
        ep, self._epoll = self._epoll, None
        if ep is not None:
            ep.close()
        self.pgconn.finish()

    async def close(self) -> None:
        self.close_now()


async def _wait_rw_with_tasks(fileno: int) -> int:
    """`_wait_rw` where Trio's I/O has no epoll: two waits in a small nursery, first one wins."""
    r, w, _ = select.select([fileno], [fileno], [], 0)
    if r or w:
        return (_READY_R if r else 0) | (_READY_W if w else 0)
    ready = 0

    async def one(wait: Callable[[int], Awaitable[None]], flag: int, owner_scope: trio.CancelScope) -> None:
        nonlocal ready
        await wait(fileno)
        ready |= flag
        owner_scope.cancel()

    try:
        async with open_owner("pg-rw-wait") as owner:
            owner.spawn(one, trio.lowlevel.wait_readable, _READY_R, owner.cancel_scope, name="readable")
            owner.spawn(one, trio.lowlevel.wait_writable, _READY_W, owner.cancel_scope, name="writable")
    except BaseExceptionGroup as group:
        # The caller was cancelled: the children's Cancelled come back grouped. Re-raise one
        # bare, so the caller's `except trio.Cancelled` sees it.
        cancelled, rest = group.split(trio.Cancelled)
        if rest is not None or cancelled is None:
            raise
        raise _first_leaf(cancelled) from None
    return ready or _READY_R


def _first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _wait_timeout() -> Exception:
    cls: type[Exception] = getattr(psycopg.errors, "_WaitTimeout", psycopg.OperationalError)
    return cls("wait timeout expired")


# -- connecting --


async def connect(
    conninfo: str = "",
    *,
    autocommit: bool = False,
    blocking: bool = False,
    prepare_threshold: int | None = 5,
    **kwargs: Any,
) -> TrioConnection:
    """Open a `TrioConnection` without a thread and without asyncio (libpq's non-blocking
    connect, polled through Trio waits); `connect_timeout` (seconds, from `conninfo` or a keyword)
    bounds each attempt, as in psycopg. Host names are resolved on a Trio worker thread (the
    resolver blocks, and is not bounded by `connect_timeout`); IP addresses and socket paths need
    no lookup. With `blocking`, everything
    blocks the Trio thread instead (see the module doc). Raises `psycopg.ProgrammingError` for a
    malformed conninfo and `psycopg.OperationalError` when no attempt succeeds."""
    params = conninfo_to_dict(conninfo, **kwargs)
    timeout = timeout_from_conninfo(params)
    if blocking or not _needs_lookup(params):
        attempts = conninfo_attempts(params)
    else:
        # getaddrinfo blocks: on a worker thread, never abandoned (the library's rule), so a
        # caller cancelled during the lookup waits for the resolver's own timeout.
        attempts = await trio.to_thread.run_sync(conninfo_attempts, params)
    errors: list[psycopg.Error] = []
    pgconn = None
    for attempt in attempts:
        try:
            pgconn = await _connect_one(make_conninfo("", **attempt), timeout, blocking)
            break
        except psycopg.Error as exc:
            errors.append(exc)
    if pgconn is None:
        if len(errors) == 1:
            raise errors[0].with_traceback(None)
        raise type(errors[-1])(
            "\n".join([str(errors[-1]), "Multiple connection attempts failed. All failures were:"] + [f"- {e}" for e in errors])
        )
    conn = TrioConnection(pgconn)
    conn._blocking = blocking
    conn.prepare_threshold = prepare_threshold
    await conn.set_autocommit(autocommit)  # no I/O on a new connection
    return conn


def _needs_lookup(params: dict[str, Any]) -> bool:
    """Whether psycopg's `conninfo_attempts` would call the (blocking) resolver."""
    if params.get("hostaddr") or os.environ.get("PGHOSTADDR"):
        return False
    hosts = str(params.get("host") or os.environ.get("PGHOST") or "")
    for host in hosts.split(","):
        if not host or host.startswith("/") or host.startswith("@") or host[1:2] == ":":
            continue
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return True
    return False


async def _connect_one(conninfo: str, timeout: float, blocking: bool) -> pq.abc.PGconn:
    pgconn = pq.PGconn.connect_start(conninfo.encode())
    try:
        if blocking:
            _poll_connect_blocking(pgconn, time.monotonic() + timeout)
        else:
            with trio.move_on_after(timeout) as scope:
                while True:
                    status = _connect_poll(pgconn)
                    if status == _POLL_OK:
                        break
                    if status == _POLL_READING:
                        await trio.lowlevel.wait_readable(pgconn.socket)
                    else:
                        await trio.lowlevel.wait_writable(pgconn.socket)
            if scope.cancelled_caught:
                raise psycopg.errors.ConnectionTimeout("connection timeout expired")
    except BaseException:
        pgconn.finish()
        raise
    pgconn.nonblocking = 1
    return pgconn


def _connect_poll(pgconn: pq.abc.PGconn) -> int:
    if pgconn.status == _BAD:
        raise psycopg.OperationalError(f"connection is bad: {pgconn.get_error_message()}")
    status = pgconn.connect_poll()
    if status == _POLL_FAILED:
        raise psycopg.OperationalError(f"connection failed: {pgconn.get_error_message()}")
    if status not in (_POLL_OK, _POLL_READING, _POLL_WRITING):
        raise psycopg.InternalError(f"unexpected poll status: {status}")
    return int(status)


def _poll_connect_blocking(pgconn: pq.abc.PGconn, deadline: float) -> None:
    while (status := _connect_poll(pgconn)) != _POLL_OK:
        fd = pgconn.socket
        left = deadline - time.monotonic()
        if left <= 0:
            raise psycopg.errors.ConnectionTimeout("connection timeout expired")
        if status == _POLL_READING:
            select.select([fd], [], [], left)
        else:
            select.select([], [fd], [], left)


# -- the pool --


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


# -- the listener --


async def listen(
    conninfo: str,
    channels: Sequence[str],
    on_notify: Callable[[str, str, int], None],
    on_reconnect: Callable[[], None],
    *,
    max_backoff: float = 5.0,
    ping_interval: float | None = 30.0,
    ping_timeout: float = 10.0,
    blocking: bool = False,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """LISTEN on `channels` until cancelled, calling ``on_notify(channel, payload, sender_pid)`` per
    notification. Reports started once the first LISTEN is in place (or the first attempt
    failed: start-up must not hang on an unreachable server; polling covers the gap).

    Liveness: the connection gets TCP keepalives (`KEEPALIVE_DEFAULTS`, unless the conninfo sets
    them), and after `ping_interval` seconds without traffic it sends ``SELECT 1``; no answer
    within `ping_timeout` (plus at most `DRAIN_TIMEOUT` to cancel it) counts as a lost
    connection, so a silent partition cannot leave the listener deaf for long. `ping_interval`
    None: no pings (always so in blocking mode, where a ping would block the loop).
    `blocking`: connect and subscribe blocking (see the module doc); notifications are still
    awaited with a Trio wait."""
    given = conninfo
    params = connection_params(conninfo, connect_timeout=10)
    conninfo = make_conninfo("", **params)
    if blocking:
        ping_interval = None
    backoff = 0.1
    started = False
    while True:
        conn: TrioConnection | None = None
        try:
            conn = await connect(conninfo, autocommit=True, blocking=blocking)
            # Notifications that arrive while a ping runs are read by psycopg: through here.
            conn.add_notify_handler(lambda n: on_notify(n.channel, n.payload, n.pid))
            for channel in channels:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            if not started:
                started = True
                task_status.started()
            else:
                log.warning("LISTEN connection re-established")
                on_reconnect()
            backoff = 0.1
            await _pump(conn, on_notify, ping_interval, ping_timeout)
        except (psycopg.Error, OSError) as exc:
            log.warning(
                "LISTEN connection lost (%s); retrying in %.1f s, polling meanwhile",
                redact(" ".join(str(exc).split()), given, conninfo),
                backoff,
            )
            if not started:
                started = True
                task_status.started()
            await trio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)
        finally:
            if conn is not None:
                conn.close_now()


async def _pump(
    conn: TrioConnection,
    on_notify: Callable[[str, str, int], None],
    ping_interval: float | None,
    ping_timeout: float,
) -> None:
    pgconn = conn.pgconn
    fileno = pgconn.socket
    while True:
        with trio.move_on_after(math.inf if ping_interval is None else ping_interval) as idle:
            await trio.lowlevel.wait_readable(fileno)
        if idle.cancelled_caught:
            with trio.move_on_after(ping_timeout) as ping:
                await conn.execute("SELECT 1")
            if ping.cancelled_caught:
                raise psycopg.OperationalError(f"LISTEN connection did not answer a ping within {ping_timeout:g} s")
            continue
        pgconn.consume_input()  # raises OperationalError when the server went away
        if pgconn.status != pq.ConnStatus.OK:
            raise psycopg.OperationalError("LISTEN connection closed by the server")
        while (n := pgconn.notifies()) is not None:
            on_notify(n.relname.decode(), n.extra.decode(), n.be_pid)
