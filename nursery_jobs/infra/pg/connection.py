"""`TrioConnection`: psycopg's `AsyncConnection` waiting through Trio, and how a cancelled
statement is followed to its end (see the package docstring for the design)."""

from __future__ import annotations

import functools
import logging
import select
from typing import Any, Awaitable, Callable, NamedTuple

import psycopg
import trio
from psycopg import _queries, pq, waiting
from psycopg.abc import Params, Query
from psycopg.rows import tuple_row

from ..owner import open_owner

__all__ = ["DRAIN_TIMEOUT", "LentState", "TrioConnection"]

log = logging.getLogger("nursery_jobs")

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


_parse = functools.lru_cache(maxsize=_MAX_CACHED_CURSORS)(_queries._query2pg_nocache)
"""psycopg's own parse of a statement's placeholders, kept per (statement, encoding)."""


class _ParsedOnce(_queries.PostgresQuery):
    """psycopg's conversion of a statement and its parameters, with the statement's parse kept.

    psycopg keeps the parse (placeholders to ``$n``) only of statements up to
    ``MAX_CACHED_STATEMENT_LENGTH`` (4096) bytes, so that an ORM's ever-different long
    statements do not fill its cache, and parses a longer one again on every call: ~120 us of
    client CPU for the claim (5.4 kB), ~55 us for the outcome statement (4.3 kB), 2-3 us per job
    at the claims' size (RESULTS.md, issue 8, h-twoproc). A cached cursor runs one fixed
    statement (`cached_cursor`), so its parse is kept whatever its length; the parameters are
    dumped on every call as before."""

    __slots__ = ()

    def convert(self, query: Query, vars: Params | None) -> None:
        if vars is None or type(query) is not bytes or len(query) <= _queries.MAX_CACHED_STATEMENT_LENGTH:
            # psycopg's own cache keeps the parse of these: the small one here is for the rest
            super().convert(query, vars)
            return
        self.query, self._want_formats, self._order, self._parts = _parse(query, self._tx.encoding)
        self.dump(vars)


class _KeptParseCursor(psycopg.AsyncCursor[Any]):
    """The cursor `cached_cursor` keeps: psycopg's, converting its statement with `_ParsedOnce`."""

    __slots__ = ()
    _query_cls = _ParsedOnce


class LentState(NamedTuple):
    """What `TrioConnection.lend` keeps of the connection's psycopg settings, for `take_back`."""

    prepare_threshold: int | None
    prepared_max: int | None
    row_factory: Any
    transaction_settings: tuple[Any, ...]
    notice_handlers: tuple[Any, ...]
    notify_handlers: tuple[Any, ...]


class TrioConnection(psycopg.AsyncConnection[Any]):
    """psycopg's `AsyncConnection`, waiting through Trio (see the module doc). Open it with
    `infra.pg.connect` (`AsyncConnection.connect` would reach for asyncio); use it from one task at a
    time."""

    _blocking = False
    _epoll: Any = None

    def __init__(self, pgconn: pq.abc.PGconn, row_factory: Any = tuple_row) -> None:
        super().__init__(pgconn, row_factory)
        self.lock = _Lock()  # type: ignore[assignment]
        self._cursors: dict[object, psycopg.AsyncCursor[Any]] = {}

    def cached_cursor(self, key: object) -> psycopg.AsyncCursor[Any]:
        """A cursor kept for `key` (e.g. the statement it runs) and reused by later calls with the
        same key: creating a psycopg cursor per statement costs more than the round trip's own
        client work. For a fixed set of statements only; one caller at a time. Each keeps its
        statement's parse (`_ParsedOnce`)."""
        cur = self._cursors.get(key)
        if cur is None:
            if len(self._cursors) >= _MAX_CACHED_CURSORS:
                self._cursors.clear()
            # Tuples whatever the connection's row factory: code it was lent to may have set one.
            cur = self._cursors[key] = _KeptParseCursor(self, row_factory=tuple_row)
        return cur

    # -- lent to a service's code --

    def lend(self) -> LentState:
        """The psycopg settings to put back (`take_back`) when code this connection is lent to
        has changed them."""
        return LentState(
            self.prepare_threshold,
            self.prepared_max,
            self.row_factory,
            self._transaction_settings(),
            tuple(self._notice_handlers),
            tuple(self._notify_handlers),
        )

    def take_back(self, state: LentState) -> bool:
        """Put back what `lend` kept, and drop the notifications received meanwhile (the
        server-side session is the caller's to reset). False when the connection must not be
        used again: its autocommit or transaction characteristics were changed, which psycopg
        only lets change outside a transaction, so they are not set back here."""
        self.prepare_threshold = state.prepare_threshold
        self.prepared_max = state.prepared_max
        self.row_factory = state.row_factory
        self._notice_handlers[:] = state.notice_handlers
        self._notify_handlers[:] = state.notify_handlers
        backlog = getattr(self, "_notifies_backlog", None)  # notifications received outside notifies() (3.3 keeps them)
        if backlog:
            backlog.clear()
        return self._transaction_settings() == state.transaction_settings

    def _transaction_settings(self) -> tuple[Any, ...]:
        return (self.autocommit, self.isolation_level, self.read_only, self.deferrable)

    @property
    def blocking(self) -> bool:
        """Whether every wait blocks the Trio thread (deterministic tests only)."""
        return self._blocking

    @classmethod
    async def connect(cls, *args: Any, **kwargs: Any) -> TrioConnection:
        raise TypeError("open a TrioConnection with nursery_jobs.infra.pg.connect(): psycopg's would need asyncio")

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
        # The schedule point comes before the round trip, as in SQLite's deterministic mode: a
        # cancellation delivered at it finds nothing sent, so the testing kit's cut at a
        # checkpoint means "before this statement", however many round trips came before.
        await trio.lowlevel.checkpoint()
        return waiting.wait(gen, self.pgconn.socket, interval=_BLOCKING_POLL_INTERVAL)

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
                            log.debug(
                                "could not send a cancel request; waiting for the statement",
                                exc_info=True,
                                extra={"event": "pg_cancel_unsent"},
                            )
                    s = gen.send(await self._ready(s, fileno))
                    if pgconn.transaction_status != _ACTIVE:
                        asked = False  # that statement ended: one sent after it is cancelled too
            except StopIteration as ex:
                return ex.value
            except (psycopg.Error, OSError):
                pass  # stopped by the server, or failed anyway: no effect; a broken connection is dropped
        if scope.cancelled_caught:
            gen.close()
            log.warning(
                "a cancelled statement did not stop within %g s: closing its connection",
                DRAIN_TIMEOUT,
                extra={"event": "pg_cancel_timeout"},
            )
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
