"""Transactions: `rt.transaction()`, and enqueues in a caller's own transaction.

A service stores its rows and the jobs they imply in one transaction, so neither exists without
the other. `transaction()` lends a pooled connection inside BEGIN ... COMMIT for the block; the
jobs inserted in it are announced to this process's runtime only once it committed. The pool must
not run dry for the workers: at most the connections the workers do not plan for are lent at once
(`_transaction_slots`), and each lent connection comes back to the pool as it left it (the
session reset, `_RESET`, in the COMMIT's or ROLLBACK's round trip), or is closed. `insert_tx`
takes the lent connection or a caller's own psycopg connection (sync or asyncio), checked to
reach the runtime's database.
"""

from __future__ import annotations

from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, AsyncIterator, Sequence

import trio

from ...errors import BackendError, BackendUnavailable, ConfigError
from ...infra.pg import DRAIN_TIMEOUT, TrioConnection, psycopg  # psycopg only through infra: import order
from ...infra.redact import redact_exception
from ..protocol import Bounds, InsertResult, NewJob, OutboxPublished
from .failures import FailureKind, failure_kind
from .insert import Inserts
from .sessions import TX_IDLE, AsyncioSession, Session, ThreadSession, TrioSession

__all__ = ["Transactions"]

_BEGIN = b"BEGIN; SET LOCAL plan_cache_mode = auto; SET LOCAL enable_seqscan = on; SET LOCAL jit = on"
_RESET = b"RESET ALL; RESET ROLE; UNLISTEN *; SELECT pg_advisory_unlock_all(); CLOSE ALL; DISCARD TEMP"
"""What a lent connection's session may keep of the service's code, undone before the pool has
it back: settings (`SET` outlives the commit: `synchronous_commit`, `search_path`, the planner's
settings, which the runtime's statements on the connection would run under), the role, LISTENs
(their notifications would pile up on a connection nobody reads), session advisory locks (held
until the connection closes: for ever, in a pool), cursors WITH HOLD, temporary tables. Settings
given at connect time (`POOL_SESSION`, the URL's `options`) are what RESET returns to. The
statements psycopg prepared for the service stay, within psycopg's own bound (`prepared_max`)."""
_COMMIT = b"COMMIT; " + _RESET
_ROLLBACK = b"ROLLBACK; " + _RESET
_INERROR = psycopg.pq.TransactionStatus.INERROR
_ACTIVE = psycopg.pq.TransactionStatus.ACTIVE


async def _end_failed(conn: TrioConnection) -> None:
    """Roll back a lent connection's transaction and reset its session (`_RESET`), shielded and
    bounded; close the connection when that cannot be done (a statement still in flight, no
    answer in time, an error), so the pool never has it back dirty."""
    if conn.closed:
        return
    if conn.pgconn.transaction_status == _ACTIVE:
        conn.close_now()
        return
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + DRAIN_TIMEOUT
        try:
            await conn.execute(_ROLLBACK, prepare=False)
        except psycopg.Error:
            pass
    if scope.cancelled_caught or conn.closed or conn.pgconn.transaction_status != TX_IDLE:
        conn.close_now()


class Transactions(Inserts):
    """`transaction`, `insert_tx`, and the session a caller's connection is used through."""

    def _transaction_slots(self) -> trio.Semaphore:
        """At most `pool_size - (workers + 2)` transactions open at once: the connections the
        workers do not plan for (`check_budget`), so open transactions can never take one a
        worker counts on."""
        if self._tx_slots is None:
            size = self.pool.size
            planned = (self._workers or 0) + 2
            if size - planned < 1:
                raise ConfigError(
                    f"no connection is left for rt.transaction(): pool_size {size} is all planned for "
                    f"{self._workers or 0} queue workers + 1 runtime + 1 listener; raise pool_size"
                )
            self._tx_limit = size - planned
            self._tx_slots = trio.Semaphore(size - planned)
        return self._tx_slots

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[TrioConnection]:
        """A pooled connection in a transaction for the block (see `TransactionalEnqueue`).

        The transaction runs the service's own statements too, so the connection behaves as
        psycopg's default one does: the pool's session settings for the runtime's statements
        (`POOL_SESSION`) are set back to PostgreSQL's defaults for it (`SET LOCAL`, in the
        BEGIN's round trip), and the service's statements are prepared at psycopg's default
        threshold (the runtime's own ask for it per call), so a script of several statements
        runs. What the block leaves on the session is undone before the pool has the connection
        back (`_RESET`, in the COMMIT's or ROLLBACK's round trip), and its psycopg settings are
        put back (`TrioConnection.take_back`; one whose autocommit or isolation was changed is
        closed). Waits at most `acquire_timeout` for a free transaction slot and as long again
        for a connection; BEGIN and COMMIT are each bounded like any pooled round trip
        (`PgPool.round_trip_bound`). A block that raises or is cancelled is rolled back
        (shielded, bounded by `DRAIN_TIMEOUT`), and the connection closed if that cannot be
        done."""
        slots = self._transaction_slots()
        try:
            slots.acquire_nowait()
        except trio.WouldBlock:
            with trio.move_on_after(self.acquire_timeout) as waited:
                await slots.acquire()
            if waited.cancelled_caught:
                raise BackendUnavailable(
                    f"no transaction slot free within {self.acquire_timeout:g} s: {self._tx_limit} "
                    f"transactions are open, as many as the pool of {self.pool.size} leaves beside its workers; "
                    "keep transactions short (no network calls inside), or raise pool_size"
                ) from None
        try:
            staged: list[tuple[Sequence[NewJob], list[float], list[InsertResult], float] | OutboxPublished] = []
            async with AsyncExitStack() as stack:
                try:
                    conn = await stack.enter_async_context(self.pool.connection())
                    with trio.move_on_after(self.pool.round_trip_bound) as began:
                        await conn.execute(_BEGIN, prepare=False)
                    if began.cancelled_caught:
                        conn.close_now()  # never pooled again
                        raise BackendUnavailable(
                            f"no answer to BEGIN from PostgreSQL within {self.pool.round_trip_bound:g} s; nothing "
                            "was written, and the connection was closed"
                        )
                except trio.TooSlowError:
                    raise BackendUnavailable(
                        f"no PostgreSQL connection free in the pool of {self.pool.size} within its wait bound; "
                        "raise pool_size or lower the number of concurrent callers"
                    ) from None
                except psycopg.Error as exc:
                    redact_exception(exc, self.conninfo)
                    raise BackendUnavailable(f"cannot begin a PostgreSQL transaction ({self._describe(exc)})") from exc
                self._lent[conn] = staged
                lent = conn.lend()
                try:
                    yield conn
                    if conn.pgconn.transaction_status == _INERROR:
                        raise BackendError(
                            "the transaction failed inside the block (a statement's error was caught there) "
                            "and was rolled back; let the error propagate, or use a savepoint "
                            "(`async with conn.transaction():`) around the statement that may fail"
                        )
                    try:
                        with trio.move_on_after(self.pool.round_trip_bound) as committed:
                            await conn.execute(_COMMIT, prepare=False)
                        if committed.cancelled_caught:
                            conn.close_now()
                            raise BackendUnavailable(
                                f"no answer to COMMIT from PostgreSQL within {self.pool.round_trip_bound:g} s: whether "
                                "the transaction committed is unknown; the connection was closed"
                            )
                    except psycopg.Error as exc:
                        redact_exception(exc, self.conninfo)
                        if failure_kind(exc) is FailureKind.LOST:
                            raise BackendUnavailable(
                                f"PostgreSQL connection lost during COMMIT ({self._describe(exc)}): whether the "
                                "transaction committed is unknown"
                            ) from exc
                        raise
                except BaseException:
                    await _end_failed(conn)
                    raise
                finally:
                    del self._lent[conn]
                    if not conn.closed and not conn.take_back(lent):
                        conn.close_now()  # its autocommit or isolation was changed: never pooled again
            for entry in staged:  # committed: tell this process's runtime
                if isinstance(entry, OutboxPublished):
                    self._emit([entry])
                else:
                    self._emit_inserted(*entry)
        finally:
            slots.release()

    async def insert_tx(self, conn: Any, jobs: Sequence[NewJob], bounds: Bounds | None = None) -> list[InsertResult]:
        now = self.now()
        run_ats = [now if j.run_at is None or j.run_at < now else j.run_at for j in jobs]
        staged = None
        if isinstance(conn, TrioConnection):  # only ever one of the pool's: lent, or no longer
            staged = self._lent.get(conn)
            if staged is None:
                raise ConfigError(
                    "enqueue_tx: this transaction has ended (its connection went back to the pool); "
                    "enqueue inside its `async with rt.transaction()` block"
                )
        session = self._session_for(conn)
        try:
            # In a caller's transaction the queue's lock would be held until the caller ends it,
            # stopping every other enqueue of the queue meanwhile: the check counts what has
            # committed (and this transaction's own jobs) without it (docs/queues.md). On an
            # autocommit connection the insert is a short transaction of its own: locked, exact.
            results = await self._insert(session, jobs, run_ats, now, bounds, serialize=session.idle())
        except psycopg.errors.UndefinedTable as exc:
            raise ConfigError(
                f"enqueue_tx: the connection reaches database {conn.info.dbname!r}, which has no nursery_jobs schema "
                f"{self.schema!r}; pass a connection to the runtime's database ({self.url})"
            ) from exc
        except psycopg.Error as exc:
            raise redact_exception(exc, self.conninfo)
        if staged is not None:
            staged.append((jobs, run_ats, results, now))
        return results

    def _session_for(self, conn: Any, what: str = "enqueue_tx") -> Session:
        if isinstance(conn, TrioConnection):
            session: Session = TrioSession(conn)
        elif isinstance(conn, psycopg.AsyncConnection):
            from ...infra.aio import loop_running

            if not loop_running():
                raise ConfigError(
                    f"{what} with an async psycopg connection needs a trio-asyncio loop: open one "
                    "with `async with trio_asyncio.open_loop():` around your code, or pass a sync Connection"
                )
            session = AsyncioSession(conn)
        elif isinstance(conn, psycopg.Connection):
            session = ThreadSession(conn)
        else:
            raise ConfigError(
                f"{what} on the PostgreSQL backend takes the connection rt.transaction() lends, or a psycopg "
                f"Connection or AsyncConnection of your own, not {type(conn).__name__}"
            )
        if self._dbname is not None and conn.info.dbname != self._dbname:
            raise ConfigError(
                f"{what} got a connection to database {conn.info.dbname!r}, but this runtime's jobs are in "
                f"{self._dbname!r} ({self.url}); use a connection to that database"
            )
        return session
