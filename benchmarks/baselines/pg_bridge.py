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
* ``infra`` -- ``nursery_jobs.infra.pg.PgPool.run``: what the runtime does (pool checkout, the
  thread hop, and the cancel-watcher task that turns a Trio cancellation into a server-side
  cancel).
* ``trio_asyncio`` -- psycopg's ``AsyncConnection`` on a trio-asyncio loop, each statement a
  ``trio_asyncio.aio_as_trio`` call.
* ``trio_native`` -- a prototype, not a recommendation yet: psycopg's ``AsyncConnection`` with its
  ``wait`` (the one place it blocks) replaced by ``trio.lowlevel.wait_readable`` /
  ``wait_writable``, so statements run on the Trio thread with no hop and no asyncio loop.

Import order: trio_asyncio is imported before psycopg here (psycopg binds
``asyncio.get_running_loop`` at import; the other order makes every async psycopg call under
trio-asyncio fail with "no running event loop"). Import this module before anything that
imports psycopg.
"""

from __future__ import annotations

import select
import sys
import time
from typing import Any, Awaitable, Callable, Sequence

_PSYCOPG_FIRST = "psycopg" in sys.modules and "trio_asyncio" not in sys.modules

import trio_asyncio  # noqa: E402  (must precede psycopg)

import psycopg  # noqa: E402
import trio  # noqa: E402
from psycopg import pq, sql  # noqa: E402

__all__ = ["VARIANTS", "CancelCheck", "check_cancel", "claim_sql", "complete_sql", "import_order_ok", "measure"]

VARIANTS = ("sync", "to_thread", "infra", "trio_asyncio", "trio_native")


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


# -- the Trio-native prototype ----------------------------------------------------------------------

_WAIT_R = int(psycopg.waiting.WAIT_R)
_WAIT_W = int(psycopg.waiting.WAIT_W)
_READY_R = psycopg.waiting.READY_R
_READY_W = psycopg.waiting.READY_W
_READY_NONE = psycopg.waiting.READY_NONE


def _poll(fileno: int, s: int) -> Any:
    rl, wl, _ = select.select([fileno] if s & _WAIT_R else [], [fileno] if s & _WAIT_W else [], [], 0)
    if rl and wl:
        return psycopg.waiting.READY_RW
    if rl:
        return _READY_R
    if wl:
        return _READY_W
    return _READY_NONE


async def _wait_fd(fileno: int, s: int) -> None:
    if s & _WAIT_R:
        await trio.lowlevel.wait_readable(fileno)
    else:
        await trio.lowlevel.wait_writable(fileno)


class TrioConnection(psycopg.AsyncConnection[Any]):
    """psycopg's AsyncConnection, waiting through Trio instead of asyncio (prototype).

    Every statement runs on the Trio thread: the generator psycopg drives is fed by
    ``trio.lowlevel.wait_readable`` / ``wait_writable``. On cancellation it sends the server a
    cancel request, keeps draining the statement (shielded, at most 5 s), and re-raises, so the
    connection is usable afterwards. Limits of the prototype: an ``RW`` wait whose socket is
    neither readable nor writable waits for readable only (fine for short statements on a local
    socket; a real version would wait for either); connecting goes through a thread.
    """

    @classmethod
    async def connect_trio(cls, conninfo: str) -> TrioConnection:
        def blocking() -> pq.abc.PGconn:
            pgconn = pq.PGconn.connect(conninfo.encode())
            if pgconn.status != pq.ConnStatus.OK:
                message = pgconn.get_error_message()
                pgconn.finish()
                raise psycopg.OperationalError(message)
            return pgconn

        pgconn = await trio.to_thread.run_sync(blocking)
        conn = cls(pgconn)
        await conn.set_autocommit(True)
        return conn

    async def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:  # type: ignore[override]
        fileno = self.pgconn.socket
        try:
            s = next(gen)
        except StopIteration as ex:
            await trio.lowlevel.checkpoint()
            return ex.value
        cancelled: BaseException | None = None
        drain_deadline = 0.0
        while True:
            ready = _poll(fileno, s)
            if not ready:
                if cancelled is None:
                    try:
                        await _wait_fd(fileno, s)
                    except trio.Cancelled as exc:
                        cancelled = exc
                        drain_deadline = trio.current_time() + 5.0
                        if self.pgconn.transaction_status == pq.TransactionStatus.ACTIVE:
                            cancel = self.pgconn.get_cancel()
                            with trio.CancelScope(shield=True):
                                await trio.to_thread.run_sync(cancel.cancel)
                        continue
                else:
                    # Cancelled already: let the statement finish (shielded), but not forever.
                    with trio.CancelScope(shield=True, deadline=drain_deadline) as drain:
                        await _wait_fd(fileno, s)
                    if drain.cancelled_caught:
                        self.pgconn.finish()  # the server did not stop it: the connection is lost
                        raise cancelled
                ready = _poll(fileno, s) or (_READY_R if s & _WAIT_R else _READY_W)
            try:
                s = gen.send(ready)
            except StopIteration as ex:
                if cancelled is not None:
                    raise cancelled
                return ex.value
            except psycopg.errors.QueryCanceled:
                if cancelled is not None:
                    raise cancelled from None
                raise


# -- the runs ---------------------------------------------------------------------------------------


def _loop_trips(claim: Callable[[int], list[tuple[Any, ...]]], complete: Callable[[list[int]], Any], k: int, trips: int) -> int:
    done = 0
    for _ in range(trips):
        rows = claim(k)
        complete([r[0] for r in rows])
        done += len(rows)
    return done


async def _trips(stmt: Callable[[Any, Any], Awaitable[list[tuple[Any, ...]]]], schema: str, k: int, trips: int) -> tuple[float, float, int]:
    claim, complete = claim_sql(schema), complete_sql(schema)
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
    if variant == "infra":
        from nursery_jobs.infra.pg import PgPool

        pool = PgPool(url, size=2)
        try:

            async def stmt(query: Any, params: Any) -> list[tuple[Any, ...]]:
                return await pool.run(lambda c: _sync_stmt(c, query, params))

            return await body(stmt)
        finally:
            await pool.close()
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
    if variant == "trio_native":
        tconn = await TrioConnection.connect_trio(url)
        try:

            async def stmt(query: Any, params: Any) -> list[tuple[Any, ...]]:
                return await _async_stmt(tconn, query, params)

            return await body(stmt)
        finally:
            await tconn.close()
    raise ValueError(f"unknown bridge variant {variant!r}")


def measure(variant: str, url: str, schema: str, k: int, trips: int) -> tuple[float, float]:
    """(wall, client CPU) seconds for `trips` claim+complete round trips of up to `k` rows
    through `variant`; client CPU is the whole process's, every thread. The table must hold at
    least ``k * trips`` claimable rows of queue ``bench``."""
    if variant == "sync":
        claim, complete = claim_sql(schema), complete_sql(schema)
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
