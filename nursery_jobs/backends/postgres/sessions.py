"""The connections the insert statements run on.

A job is stored by one code path (`Inserts._insert`) whichever connection carries it: one of the
pool's (`TrioSession`), the one `rt.transaction()` lent (also a `TrioSession`), or a caller's own
psycopg connection, sync (`ThreadSession`, each call on a thread of infra's) or asyncio
(`AsyncioSession`, through the trio-asyncio bridge, loaded only then). `Session` is what that code
needs of each: a row, the rows, a bare command, a COPY, and whether the connection is idle (then a
batch that must be atomic opens a transaction of its own; inside a caller's it takes a savepoint,
`atomic`).
"""

from __future__ import annotations

import contextlib
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol

from ...infra.pg import TrioConnection, psycopg  # psycopg only through infra: import order
from ...infra.threads import run_callers_io
from .connection import fetch_all, fetch_one

__all__ = ["AsyncioSession", "Session", "TX_IDLE", "ThreadSession", "TrioSession", "atomic"]

TX_IDLE = psycopg.pq.TransactionStatus.IDLE


class Session(Protocol):
    """A connection the insert statements run on: the pool's (`TrioSession`), or a caller's
    sync (`ThreadSession`, each call on a thread) or asyncio one (`AsyncioSession`)."""

    async def one(self, query: Any, params: Any) -> tuple[Any, ...] | None: ...

    async def all(self, query: Any, params: Any) -> list[tuple[Any, ...]]: ...

    async def command(self, statement: bytes) -> None:
        """A statement with no parameters, never prepared (BEGIN, SAVEPOINT, COMMIT)."""
        ...

    async def copy(self, statement: Any, text: str) -> None: ...

    def idle(self) -> bool:
        """Autocommit and in no transaction: each statement commits on its own."""
        ...


class TrioSession:
    __slots__ = ("conn",)

    def __init__(self, conn: TrioConnection) -> None:
        self.conn = conn

    async def one(self, query: Any, params: Any) -> tuple[Any, ...] | None:
        return await fetch_one(self.conn, query, params)

    async def all(self, query: Any, params: Any) -> list[tuple[Any, ...]]:
        return await fetch_all(self.conn, query, params)

    async def command(self, statement: bytes) -> None:
        await self.conn.execute(statement, prepare=False)

    async def copy(self, statement: Any, text: str) -> None:
        async with self.conn.cursor() as cur:
            async with cur.copy(statement) as copy:
                await copy.write(text)

    def idle(self) -> bool:
        return self.conn.autocommit and self.conn.pgconn.transaction_status == TX_IDLE


class ThreadSession:
    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    async def one(self, query: Any, params: Any) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = await run_callers_io(lambda: self.conn.execute(query, params).fetchone())
        return row

    async def all(self, query: Any, params: Any) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = await run_callers_io(lambda: self.conn.execute(query, params).fetchall())
        return rows

    async def command(self, statement: bytes) -> None:
        await run_callers_io(lambda: self.conn.execute(statement, prepare=False))

    async def copy(self, statement: Any, text: str) -> None:
        def write() -> None:
            with self.conn.cursor() as cur, cur.copy(statement) as copy:
                copy.write(text)

        await run_callers_io(write)

    def idle(self) -> bool:
        return self.conn.autocommit and self.conn.info.transaction_status == TX_IDLE


class AsyncioSession:
    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def one(self, query: Any, params: Any) -> tuple[Any, ...] | None:
        async def run() -> Any:
            return await (await self.conn.execute(query, params)).fetchone()

        return await _via_asyncio(run)  # type: ignore[no-any-return]

    async def all(self, query: Any, params: Any) -> list[tuple[Any, ...]]:
        async def run() -> Any:
            return await (await self.conn.execute(query, params)).fetchall()

        return await _via_asyncio(run)  # type: ignore[no-any-return]

    async def command(self, statement: bytes) -> None:
        async def run() -> None:
            await self.conn.execute(statement, prepare=False)

        await _via_asyncio(run)

    async def copy(self, statement: Any, text: str) -> None:
        async def run() -> None:
            async with self.conn.cursor() as cur:
                async with cur.copy(statement) as copy:
                    await copy.write(text)

        await _via_asyncio(run)

    def idle(self) -> bool:
        return self.conn.autocommit and self.conn.info.transaction_status == TX_IDLE


async def _via_asyncio(fn: Callable[[], Awaitable[Any]]) -> Any:
    from ...infra.aio import call_asyncio  # trio-asyncio only for a caller's asyncio connection

    return await call_asyncio(fn)


@asynccontextmanager
async def atomic(s: Session) -> AsyncIterator[None]:
    """The block's statements all or none: a transaction of its own on an autocommit session
    in no transaction, a savepoint inside the one open (so a failed batch leaves a caller's
    transaction usable). On a cancellation nothing more is sent: the pool rolls its own
    connection back at check-in, and a caller's transaction is the caller's to end."""
    own = s.idle()
    await s.command(b"BEGIN" if own else b"SAVEPOINT nursery_jobs_insert")
    try:
        yield
    except Exception:
        with contextlib.suppress(psycopg.Error):
            await s.command(b"ROLLBACK" if own else b"ROLLBACK TO SAVEPOINT nursery_jobs_insert")
        raise
    await s.command(b"COMMIT" if own else b"RELEASE SAVEPOINT nursery_jobs_insert")
