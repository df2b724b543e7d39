"""The PostgreSQL driver bridges, measured bare: how Trio code can talk to psycopg 3.

Raw Trio on purpose (each variant runs its own ``trio.run``), which is why this lives under
``benchmarks/baselines/``; ``benchmarks/bridge.py`` drives it and prints the table.

One *round trip* is what a fetcher and a completer do for one batch: a claim statement
(``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT k) RETURNING``) and then a
completion statement (``UPDATE ... WHERE id = ANY(...)``), each its own autocommit transaction,
each its own call through the bridge (as the runtime makes them), on one connection.

The variants:

* ``sync`` -- psycopg's sync API, no Trio at all: the ceiling.
* ``to_thread`` -- the sync API, each statement run by ``trio.to_thread.run_sync`` (not
  abandoned): the bare thread hop.
* ``threads`` -- the runtime's bridge until 2026-11-30 (``ThreadPool`` below, kept here as the
  baseline it now is): pool checkout, the thread hop under a limiter, and a cancel-watcher task
  per call that turns a Trio cancellation into a server-side cancel.
* ``trio_asyncio`` -- psycopg's ``AsyncConnection`` on a trio-asyncio loop, each statement a
  ``trio_asyncio.aio_as_trio`` call.
* ``infra`` -- ``nursery_jobs.infra.pg.PgPool.run``: the runtime's bridge now. psycopg's
  ``AsyncConnection`` whose waits are ``trio.lowlevel.wait_readable`` / ``wait_writable`` on the
  Trio thread (no thread hop, no asyncio loop), a new cursor per statement like every other
  variant here.
* ``infra_cached`` -- the same, with the statement on a cursor the connection keeps
  (``TrioConnection.cached_cursor``), which is how the PostgreSQL backend calls it.

Import order: trio_asyncio is imported before psycopg here (psycopg binds
``asyncio.get_running_loop`` at import; the other order makes every async psycopg call under
trio-asyncio fail with "no running event loop"). Import this module before anything that
imports psycopg.
"""

from __future__ import annotations

import select
import sys
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence, TypeVar

_PSYCOPG_FIRST = "psycopg" in sys.modules and "trio_asyncio" not in sys.modules

import trio_asyncio  # noqa: E402  (must precede psycopg)

import outcome  # noqa: E402
import psycopg  # noqa: E402
import trio  # noqa: E402
from psycopg import sql  # noqa: E402

__all__ = ["VARIANTS", "CancelCheck", "ThreadPool", "check_cancel", "claim_sql", "complete_sql", "import_order_ok", "measure"]

VARIANTS = ("sync", "to_thread", "threads", "trio_asyncio", "infra", "infra_cached")

T = TypeVar("T")


def import_order_ok() -> bool:
    return not _PSYCOPG_FIRST


def claim_sql(schema: str) -> sql.Composed:
    return sql.SQL(
        "UPDATE {s}.jobs SET state = 'running', attempt = attempt + 1, attempted_at = %(now)s, heartbeat_at = %(now)s"
        " WHERE id IN (SELECT id FROM {s}.jobs WHERE queue = %(queue)s"
        "  AND state IN ('available', 'scheduled', 'retryable') AND run_at <= %(now)s"
        "  ORDER BY priority DESC, run_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"
        " RETURNING id, kind, args::text, attempt"
    ).format(s=sql.Identifier(schema))


def complete_sql(schema: str) -> sql.Composed:
    return sql.SQL(
        "UPDATE {s}.jobs SET state = 'completed', finalized_at = %s, heartbeat_at = NULL WHERE id = ANY(%s)"
    ).format(s=sql.Identifier(schema))


# -- one statement, per variant ---------------------------------------------------------------------

Stmt = Callable[[Any, Any], Awaitable[list[tuple[Any, ...]]]]


def _sync_stmt(conn: psycopg.Connection[Any], query: Any, params: Any) -> list[tuple[Any, ...]]:
    cur = conn.execute(query, params)
    return cur.fetchall() if cur.description is not None else []


async def _async_stmt(conn: psycopg.AsyncConnection[Any], query: Any, params: Any) -> list[tuple[Any, ...]]:
    cur = await conn.execute(query, params)
    return await cur.fetchall() if cur.description is not None else []


async def _cached_stmt(conn: Any, query: Any, params: Any) -> list[tuple[Any, ...]]:
    cur = conn.cached_cursor(query)
    await cur.execute(query, params)
    return await cur.fetchall() if cur.description is not None else []


# -- the runtime's former bridge: sync psycopg on a thread per call ------------------------------------


class ThreadPool:
    """The thread bridge ``nursery_jobs.infra.pg`` used until 2026-11-30, as it was: sync
    connections, a `CapacityLimiter`, each call on a worker thread that is never abandoned, and
    a watcher task per call that sends a server-side cancel when the caller is cancelled."""

    def __init__(self, conninfo: str, *, size: int, acquire_timeout: float = 10.0) -> None:
        self.conninfo = conninfo
        self._acquire_timeout = acquire_timeout
        self._limiter = trio.CapacityLimiter(size)
        self._idle: list[psycopg.Connection[Any]] = []

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.Connection[Any]]:
        with trio.fail_after(self._acquire_timeout):
            await self._limiter.acquire()
        try:
            conn = None
            while self._idle:
                candidate = self._idle.pop()
                if _looks_alive(candidate):
                    conn = candidate
                    break
                candidate.close()
            if conn is None:
                conn = await trio.to_thread.run_sync(
                    lambda: psycopg.connect(self.conninfo, autocommit=True), abandon_on_cancel=False
                )
            try:
                yield conn
            finally:
                if conn.broken or conn.closed:
                    conn.close()
                else:
                    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        with trio.CancelScope(shield=True):
                            await trio.to_thread.run_sync(conn.rollback, abandon_on_cancel=False)
                    self._idle.append(conn)
        finally:
            self._limiter.release()

    async def run(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        async with self.connection() as conn:
            return await _call_cancellable(conn, fn)

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _looks_alive(conn: psycopg.Connection[Any]) -> bool:
    if conn.closed or conn.broken:
        return False
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return False
    return not readable


async def _call_cancellable(conn: psycopg.Connection[Any], fn: Callable[[psycopg.Connection[Any]], T]) -> T:
    finished = False

    async def cancel_on_cancellation() -> None:
        try:
            await trio.sleep_forever()
        finally:
            if not finished:
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    await trio.to_thread.run_sync(_cancel_quietly, conn, abandon_on_cancel=False)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_on_cancellation, name="cancel-watcher")
        with trio.CancelScope(shield=True):
            result = await outcome.acapture(trio.to_thread.run_sync, fn, conn)
        finished = True
        nursery.cancel_scope.cancel()
    value: T = result.unwrap()
    return value


def _cancel_quietly(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.cancel_safe(timeout=5.0)
    except Exception:
        pass


# -- the runs ---------------------------------------------------------------------------------------


def _loop_trips(claim: Callable[[int], list[tuple[Any, ...]]], complete: Callable[[list[int]], Any], k: int, trips: int) -> int:
    done = 0
    for _ in range(trips):
        rows = claim(k)
        complete([r[0] for r in rows])
        done += len(rows)
    return done


async def _trips(stmt: Callable[[Any, Any], Awaitable[list[tuple[Any, ...]]]], schema: str, k: int, trips: int) -> tuple[float, float, int]:
    claim, complete = claim_sql(schema).as_bytes(None), complete_sql(schema).as_bytes(None)
    await stmt("SELECT 1", None)
    cpu = time.process_time()
    started = time.perf_counter()
    done = 0
    for _ in range(trips):
        rows = await stmt(claim, {"now": time.time(), "queue": "bench", "limit": k})
        await stmt(complete, (time.time(), [r[0] for r in rows]))
        done += len(rows)
    return time.perf_counter() - started, time.process_time() - cpu, done


async def _with_stmt(variant: str, url: str, body: Callable[[Stmt], Awaitable[Any]]) -> Any:
    """Run `body(stmt)` with `stmt(query, params)` going through `variant`'s bridge."""
    if variant == "to_thread":
        with psycopg.connect(url, autocommit=True) as conn:

            async def stmt(query: Any, params: Any) -> list[tuple[Any, ...]]:
                return await trio.to_thread.run_sync(_sync_stmt, conn, query, params, abandon_on_cancel=False)

            return await body(stmt)
    if variant == "threads":
        tpool = ThreadPool(url, size=2)
        try:

            async def stmt(query: Any, params: Any) -> list[tuple[Any, ...]]:
                return await tpool.run(lambda c: _sync_stmt(c, query, params))

            return await body(stmt)
        finally:
            await tpool.close()
    if variant == "trio_asyncio":
        async with trio_asyncio.open_loop():
            aconn = await trio_asyncio.aio_as_trio(psycopg.AsyncConnection.connect)(url, autocommit=True)
            call = trio_asyncio.aio_as_trio(_async_stmt)
            try:

                async def stmt(query: Any, params: Any) -> list[tuple[Any, ...]]:
                    return await call(aconn, query, params)

                return await body(stmt)
            finally:
                await trio_asyncio.aio_as_trio(aconn.close)()
    if variant in ("infra", "infra_cached"):
        from nursery_jobs.infra.pg import PgPool

        pool = PgPool(url, size=2)
        one = _cached_stmt if variant == "infra_cached" else _async_stmt
        try:

            async def stmt(query: Any, params: Any) -> list[tuple[Any, ...]]:
                return await pool.run(lambda c: one(c, query, params))

            return await body(stmt)
        finally:
            await pool.close()
    raise ValueError(f"unknown bridge variant {variant!r}")


def measure(variant: str, url: str, schema: str, k: int, trips: int) -> tuple[float, float]:
    """(wall, client CPU) seconds for `trips` claim+complete round trips of up to `k` rows
    through `variant`; client CPU is the whole process's, every thread. The table must hold at
    least ``k * trips`` claimable rows of queue ``bench``."""
    if variant == "sync":
        claim, complete = claim_sql(schema).as_bytes(None), complete_sql(schema).as_bytes(None)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT 1")
            cpu = time.process_time()
            started = time.perf_counter()
            done = _loop_trips(
                lambda n: conn.execute(claim, {"now": time.time(), "queue": "bench", "limit": n}).fetchall(),
                lambda ids: conn.execute(complete, (time.time(), ids)),
                k,
                trips,
            )
            elapsed = time.perf_counter() - started
            cpu = time.process_time() - cpu
    else:
        elapsed, cpu, done = trio.run(_with_stmt, variant, url, lambda stmt: _trips(stmt, schema, k, trips))
    if done != k * trips:
        raise RuntimeError(f"{variant}: {done} rows claimed and completed, expected {k * trips}")
    return elapsed, cpu


class CancelCheck:
    """Whether a Trio cancellation of a running ``pg_sleep`` came back promptly, and whether
    the connection answered a query afterwards."""

    def __init__(self, variant: str, returned_after: float | None, usable: bool, detail: str) -> None:
        self.variant = variant
        self.returned_after = returned_after
        self.usable = usable
        self.detail = detail

    def prompt(self, bound: float) -> bool:
        return self.returned_after is not None and self.returned_after <= bound


def check_cancel(variant: str, url: str, sleep_s: float, cancel_after: float = 0.2) -> CancelCheck:
    """Cancel a ``SELECT pg_sleep(sleep_s)`` through `variant` after `cancel_after` seconds (a
    Trio ``move_on_after``); report when the call returned and whether the connection then
    answers ``SELECT 1`` (within 5 s)."""
    if variant == "sync":
        return CancelCheck(variant, None, True, "n/a: no Trio (the ceiling)")

    async def body(stmt: Stmt) -> CancelCheck:
        started = trio.current_time()
        error = ""
        with trio.move_on_after(cancel_after) as scope:
            try:
                await stmt(f"SELECT pg_sleep({float(sleep_s)})", None)
            except Exception as exc:  # the statement must not fail: report it
                error = f"; the call raised {type(exc).__name__}: {' '.join(str(exc).split())[:80]}"
        returned = trio.current_time() - started
        usable = False
        with trio.move_on_after(5):
            try:
                usable = (await stmt("SELECT 1", None)) == [(1,)]
            except Exception as exc:
                error += f"; SELECT 1 afterwards raised {type(exc).__name__}"
        how = "cancelled" if scope.cancelled_caught else "NOT cancelled (the sleep ran to its end)"
        return CancelCheck(variant, returned, usable, f"{how}, returned after {returned:.2f} s{error}")

    result: CancelCheck = trio.run(_with_stmt, variant, url, body)
    return result


def rows_per_s(seconds: Sequence[float], k: int, trips: int) -> list[float]:
    return [k * trips / s for s in seconds]
