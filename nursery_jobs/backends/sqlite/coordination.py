"""Coordination: the outbox, periodic schedules, named locks.

Each is a small table and one short write transaction per call. The outbox stores events with
the service's rows (`publish_tx`); SQLite has one writer, so the relay has nothing to skip: it
reads candidates without the write lock, routes them on the Trio thread (the app's filters never
hold the lock), and claims them by deleting them in one short transaction that inserts their
jobs. A schedule's tick is taken only if later than the stored one, in the transaction that
inserts its job. A lock is a row, taken when free, expired or already ours, with a fencing token
drawn under the same write lock. A value another writer left that is not a number counts as
expired, or as no tick.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Mapping, Sequence

import trio

from ...errors import ConfigError
from ...infra.threads import run_callers_io
from ..protocol import Bounds, InsertResult, NewJob, OutboxEvent, OutboxPublished, Route, ScheduleState
from .connection import IDS_PER_STATEMENT
from .insert import inserted_events
from .transactions import SqliteTransaction, Transactions

__all__ = ["Coordination"]


class Coordination(Transactions):
    """The `Outbox`, `ScheduleStore` and `LockStore` capabilities."""

    _PUBLISH = "INSERT INTO nj_outbox (topic, payload, created_at) VALUES (?, ?, ?)"

    async def publish(self, events: Sequence[tuple[str, str]]) -> None:
        if not events:
            await trio.lowlevel.checkpoint()
            return
        rows = [(topic, payload, self.now()) for topic, payload in events]
        await self._call(self._tx, lambda conn: conn.executemany(self._PUBLISH, rows))
        self._emit([OutboxPublished()])

    async def publish_tx(self, conn: Any, events: Sequence[tuple[str, str]]) -> None:
        rows = [(topic, payload, self.now()) for topic, payload in events]
        if isinstance(conn, SqliteTransaction) and conn.backend is self:
            conn._check_open()
            await self._tx_io(conn._conn.executemany, self._PUBLISH, rows)
            conn.inserted.append(OutboxPublished())
            return
        if not isinstance(conn, sqlite3.Connection):
            raise ConfigError(
                "publish on the SQLite backend takes the transaction rt.transaction() lends, or a "
                f"sqlite3.Connection of your own to {self.path!r}, not {type(conn).__name__}"
            )

        def insert() -> None:
            self._check_same_file(conn)
            self._in_callers_transaction(conn, lambda c: c.executemany(self._PUBLISH, rows))

        if self._blocking_io:
            return insert()
        try:
            await run_callers_io(insert)
        except sqlite3.ProgrammingError as exc:
            if "thread" not in str(exc):
                raise
            insert()  # a connection usable only on this thread (see insert_tx)

    async def relay(self, topics: Sequence[str], route: Route, limit: int, bounds: Bounds | None = None) -> int:
        # SQLite has one writer, so there is nothing to skip: the candidates are read without
        # the write lock, routed here on the Trio thread (the app's filters never run on the
        # database thread nor hold the lock), and claimed in one short write transaction by
        # deleting them: a row another relay deleted meanwhile is not this pass's, and its jobs
        # are left out. The jobs of the rows deleted are inserted in the same transaction.
        if limit <= 0 or not topics:
            await trio.lowlevel.checkpoint()
            return 0
        wanted = list(topics)

        def read() -> list[Any]:
            assert self._conn is not None
            marks = ",".join("?" * len(wanted))
            return self._conn.execute(
                f"SELECT id, topic, payload FROM nj_outbox WHERE topic IN ({marks}) ORDER BY id LIMIT ?",
                (*wanted, limit),
            ).fetchall()

        rows = await self._call(read)
        if not rows:
            return 0
        claimed = [OutboxEvent(int(i), str(t), str(p)) for i, t, p in rows]
        made = route(claimed)
        now = self.now()

        def body(conn: sqlite3.Connection) -> tuple[int, list[NewJob], list[InsertResult]]:
            won: set[int] = set()
            ids = [e.id for e in claimed]
            for i in range(0, len(ids), IDS_PER_STATEMENT):
                chunk = ids[i : i + IDS_PER_STATEMENT]
                won.update(
                    r[0]
                    for r in conn.execute(
                        f"DELETE FROM nj_outbox WHERE id IN ({','.join('?' * len(chunk))}) RETURNING id", chunk
                    )
                )
            jobs = [job for event, jobs in zip(claimed, made) if event.id in won for job in jobs]
            return len(won), jobs, self._insert_rows(conn, jobs, now, bounds) if jobs else []

        _won, jobs, results = await self._call(self._tx, body)
        self._emit(inserted_events(jobs, results, now))
        return len(claimed)

    async def schedule_states(self, names: Sequence[str]) -> Mapping[str, ScheduleState]:
        wanted = list(names)

        def body() -> Any:
            assert self._conn is not None
            return self._conn.execute("SELECT name, last_tick, last_job_id FROM nj_schedules").fetchall()

        out: dict[str, ScheduleState] = {}
        for name, tick, job_id in await self._call(body):
            if name in wanted:  # a value another writer left that is not a number reads as none
                out[name] = ScheduleState(
                    float(tick) if isinstance(tick, (int, float)) else None,
                    job_id if isinstance(job_id, int) else None,
                )
        return out

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> int | None:
        now = self.now()

        def body(conn: sqlite3.Connection) -> int | None:
            # An expiry that is not a number (written by someone else) counts as expired.
            row = conn.execute(
                "INSERT INTO nj_locks (name, owner, expires_at) VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE"
                " SET owner = excluded.owner, expires_at = excluded.expires_at"
                " WHERE nj_locks.owner = excluded.owner OR typeof(nj_locks.expires_at) NOT IN ('real', 'integer')"
                " OR nj_locks.expires_at <= ? RETURNING name",
                (name, owner, now + ttl, now),
            ).fetchone()
            if row is None:
                return None
            # Drawn under the same write lock: every acquisition after this one draws a larger token.
            (fence,) = conn.execute(
                "INSERT INTO nj_lock_fence (id, last) VALUES (0, 1)"
                " ON CONFLICT (id) DO UPDATE SET last = nj_lock_fence.last + 1 RETURNING last"
            ).fetchone()
            return int(fence)

        fence: int | None = await self._call(self._tx, body)
        return fence

    async def renew_lock(self, name: str, owner: str, ttl: float) -> bool:
        now = self.now()

        def body(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "UPDATE nj_locks SET expires_at = ? WHERE name = ? AND owner = ? AND expires_at > ? RETURNING name",
                (now + ttl, name, owner, now),
            ).fetchone()
            return row is not None

        held: bool = await self._call(self._tx, body)
        return held

    async def release_lock(self, name: str, owner: str) -> None:
        def body(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM nj_locks WHERE name = ? AND owner = ?", (name, owner))

        await self._call(self._tx, body)

    async def enqueue_tick(self, name: str, tick: float, job: NewJob, bounds: Bounds | None = None) -> InsertResult | None:
        now = self.now()

        def body(conn: sqlite3.Connection) -> InsertResult | None:
            # The write lock is ours (BEGIN IMMEDIATE): the row's check and the insert are one.
            # A last tick that is not a number (written by someone else) is replaced.
            advanced = conn.execute(
                "INSERT INTO nj_schedules (name, last_tick) VALUES (?, ?) ON CONFLICT (name) DO UPDATE"
                " SET last_tick = excluded.last_tick, last_job_id = NULL"
                " WHERE typeof(nj_schedules.last_tick) NOT IN ('real', 'integer')"
                " OR nj_schedules.last_tick < excluded.last_tick RETURNING name",
                (name, tick),
            ).fetchone()
            if advanced is None:
                return None
            (result,) = self._insert_rows(conn, [job], now, bounds)  # as insert_many stores it
            if not result.existing:
                conn.execute("UPDATE nj_schedules SET last_job_id = ? WHERE name = ?", (result.id, name))
            return result

        result: InsertResult | None = await self._call(self._tx, body)
        if result is not None:
            self._emit(inserted_events([job], [result], now))
        return result
