"""Coordination: periodic schedules, named locks, the outbox.

Each is a small table of its own (migrations 0008, 0009, 0019) and a few one-statement calls.
A schedule's tick is taken only if later than the stored one, in the transaction that inserts its
job, so a tick is enqueued once however many processes tick. A lock is a row, taken when free,
expired or already ours, with a fencing token drawn once the row is ours. The outbox stores
events with the service's rows (`publish_tx` on the lent or a caller's connection); the relay
claims them with SKIP LOCKED, routes them in memory, and inserts their jobs and deletes the rows
in one short transaction, so a pass that fails anywhere leaves the events for the next.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import trio

from ...errors import ConfigError
from ...infra.pg import TrioConnection, psycopg  # psycopg only through infra: import order
from ...infra.redact import redact_exception
from ..protocol import Bounds, InsertResult, NewJob, OutboxEvent, OutboxPublished, Route, ScheduleState
from .connection import execute, fetch_all, fetch_one, int_array
from .sessions import TrioSession
from .transactions import Transactions

__all__ = ["Coordination"]


class Coordination(Transactions):
    """The `ScheduleStore`, `LockStore` and `Outbox` capabilities."""

    async def schedule_states(self, names: Sequence[str]) -> Mapping[str, ScheduleState]:
        q = self._q["schedule_states"]
        rows = await self._run(lambda c: fetch_all(c, q, (list(names),)))
        return {name: ScheduleState(float(tick), job_id) for name, tick, job_id in rows}

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> int | None:
        now = self.now()
        q = self._q["acquire_lock"]
        row = await self._run(lambda c: fetch_one(c, q, (name, owner, now + ttl, now)), retry=False)
        return None if row is None else int(row[0])

    async def renew_lock(self, name: str, owner: str, ttl: float) -> bool:
        now = self.now()
        q = self._q["renew_lock"]
        return await self._run(lambda c: fetch_one(c, q, (now + ttl, name, owner, now))) is not None

    async def release_lock(self, name: str, owner: str) -> None:
        q = self._q["release_lock"]
        await self._run(lambda c: execute(c, q, (name, owner)))

    async def enqueue_tick(self, name: str, tick: float, job: NewJob, bounds: Bounds | None = None) -> InsertResult | None:
        now = self.now()
        run_at = now if job.run_at is None or job.run_at < now else job.run_at

        async def body(conn: TrioConnection) -> InsertResult | None:
            async with conn.transaction():
                if await fetch_one(conn, self._q["advance_tick"], (name, tick)) is None:
                    return None
                (result,) = await self._insert(TrioSession(conn), [job], [run_at], now, bounds)
                if not result.existing:
                    await execute(conn, self._q["tick_job"], (result.id, name))
                return result

        result: InsertResult | None = await self._run(body, retry=False)
        if result is not None:
            self._emit_inserted([job], [run_at], [result], now)
        return result

    async def publish(self, events: Sequence[tuple[str, str]]) -> None:
        if not events:
            await trio.lowlevel.checkpoint()
            return
        q, params = self._publish_params(events)
        # Not retried: whether a lost connection's insert committed is unknown.
        await self._run(lambda c: fetch_one(c, q, params), retry=False)
        self._emit([OutboxPublished()])

    def _publish_params(self, events: Sequence[tuple[str, str]]) -> tuple[bytes, tuple[Any, ...]]:
        topics = [t for t, _ in events]
        payloads = [p for _, p in events]
        return self._q["publish"], (self.now(), topics, payloads, self._events_channel)

    async def publish_tx(self, conn: Any, events: Sequence[tuple[str, str]]) -> None:
        staged = None
        if isinstance(conn, TrioConnection):  # only ever one of the pool's: lent, or no longer
            staged = self._lent.get(conn)
            if staged is None:
                raise ConfigError(
                    "publish: this transaction has ended (its connection went back to the pool); "
                    "publish inside its `async with rt.transaction()` block"
                )
        session = self._session_for(conn, "publish")
        q, params = self._publish_params(events)
        try:
            await session.one(q, params)
        except psycopg.errors.UndefinedTable as exc:
            raise ConfigError(
                f"publish: the connection reaches database {conn.info.dbname!r}, which has no nursery_jobs schema "
                f"{self.schema!r} at version 9 or later; pass a connection to the runtime's database ({self.url}) "
                "and run `nursery-jobs migrate`"
            ) from exc
        except psycopg.Error as exc:
            raise redact_exception(exc, self.conninfo)
        if staged is not None:
            staged.append(OutboxPublished())

    async def relay(self, topics: Sequence[str], route: Route, limit: int, bounds: Bounds | None = None) -> int:
        if limit <= 0 or not topics:
            await trio.lowlevel.checkpoint()
            return 0
        now = self.now()
        wanted = list(topics)
        claim, delete = self._q["relay_claim"], self._q["relay_delete"]

        async def one_pass(conn: TrioConnection) -> tuple[int, list[NewJob], list[float], list[InsertResult]]:
            # One short transaction: claim (rows other passes hold are skipped, not waited
            # for), route in memory, insert the jobs, delete the rows. Anything that raises in
            # it -- route, a lost connection, a cancellation -- rolls all of it back.
            async with conn.transaction():
                rows = await fetch_all(conn, claim, (wanted, limit))
                if not rows:
                    return 0, [], [], []
                claimed = [OutboxEvent(r[0], r[1], r[2]) for r in rows]
                jobs = [job for made in route(claimed) for job in made]
                run_ats = [now if j.run_at is None or j.run_at < now else j.run_at for j in jobs]
                results = await self._insert(TrioSession(conn), jobs, run_ats, now, bounds)
                await execute(conn, delete, (int_array([e.id for e in claimed]),))
            return len(claimed), jobs, run_ats, results

        # Safe to repeat: a pass that committed before its connection was lost deleted its
        # rows, so the retry finds them gone and makes no second job.
        count, jobs, run_ats, results = await self._run(one_pass)
        if jobs:
            self._emit_inserted(jobs, run_ats, results, now)
        relayed: int = count
        return relayed
