"""Jobs in: a batch in one write transaction.

The write lock is held from ``BEGIN IMMEDIATE`` to the commit, so a batch is all or nothing, no
job of it can be claimed before the rest is in, and the enqueues into a bounded queue are
serialized by the lock itself: the batch's rows go in under a savepoint, the queue's pending jobs
are counted with them, and `rules.check_room` decides. A batch without unique keys is one
`executemany`; a job with a unique key is an upsert that finds the holder when there is one.

Every path that stores jobs (`insert_many`, `rt.transaction()`, a caller's connection, schedules,
the relay) runs `_insert_rows`, so a job stored in a transaction is the job `insert_many` stores.
"""

from __future__ import annotations

import sqlite3
from typing import Sequence

from ...rules import check_room
from ..protocol import BackendEvent, Bounds, InsertResult, JobsAvailable, NewJob
from .connection import SqliteBase
from .schema import IS_PENDING, NOT_FINAL

__all__ = ["Inserts", "inserted_events"]

_COUNT_PENDING = (
    f"SELECT count(*) FROM (SELECT 1 FROM nj_jobs INDEXED BY nj_jobs_due WHERE queue = ? AND {IS_PENDING} LIMIT ?)"
)
"""A bounded queue's pending jobs, up to a limit (`max_length + 1` answers "does it fit"):
read from the pending rows' index, so its cost grows with the bound, never with the table."""


def inserted_events(jobs: Sequence[NewJob], results: Sequence[InsertResult], now: float) -> list[BackendEvent]:
    """`JobsAvailable` per queue with a new job due now, and per queue with later ones (with
    the earliest `run_at`), as `insert_many` promises."""
    due_now: set[str] = set()
    due_later: dict[str, float] = {}
    for new, res in zip(jobs, results):
        if res.existing:
            continue
        if new.run_at is None or new.run_at <= now:
            due_now.add(new.queue)
        else:
            due_later[new.queue] = min(new.run_at, due_later.get(new.queue, new.run_at))
    events: list[BackendEvent] = [JobsAvailable(q) for q in sorted(due_now)]
    return events + [JobsAvailable(q, d) for q, d in sorted(due_later.items())]


class Inserts(SqliteBase):
    """`insert_many`, and the insert every other path shares."""

    async def insert_many(self, jobs: Sequence[NewJob], bounds: Bounds | None = None) -> list[InsertResult]:
        now = self.now()
        results: list[InsertResult] = await self._call(self._tx, lambda conn: self._insert_rows(conn, jobs, now, bounds))
        self._emit(inserted_events(jobs, results, now))
        return results

    def _insert_rows(
        self, conn: sqlite3.Connection, jobs: Sequence[NewJob], now: float, bounds: Bounds | None = None
    ) -> list[InsertResult]:
        """The jobs' rows, inside the transaction open on `conn` (which holds the write lock):
        the backend's own connection (`insert_many`), the transaction connection
        (`transaction()`) or the caller's (`insert_tx`). One code for all of them, so a job
        stored in a transaction is the job `insert_many` stores.

        With `bounds` for a queue of the batch: the rows go in under a savepoint, each bounded
        queue's pending jobs are counted with them (at most `max_length + 1`, through the
        pending rows' index) and `rules.check_room` decides; `QueueFull` rolls back to the
        savepoint, so a caller's transaction keeps the rest of its work. The write lock, held
        from the insert to the commit, is what serializes the enqueues of a queue."""
        if bounds and any(job.queue in bounds for job in jobs):
            queues = sorted({job.queue for job in jobs if job.queue in bounds})
            conn.execute("SAVEPOINT nj_bounded")
            try:
                results = self._insert_rows(conn, jobs, now)
                for queue in queues:
                    limit = bounds[queue]
                    (pending,) = conn.execute(_COUNT_PENDING, (queue, limit + 1)).fetchone()
                    check_room(queue, pending, limit)
            except BaseException:
                conn.execute("ROLLBACK TO nj_bounded")
                conn.execute("RELEASE nj_bounded")
                raise
            conn.execute("RELEASE nj_bounded")
            return results
        if len(jobs) > 1 and not any(new.unique_key for new in jobs):
            return self._insert_plain_batch(conn, jobs, now)
        out: list[InsertResult] = []
        for new in jobs:
            run_at = now if new.run_at is None or new.run_at < now else new.run_at
            state = "available" if run_at <= now else "scheduled"
            row = conn.execute(
                "INSERT INTO nj_jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at, unique_key,"
                " concurrency_key, max_concurrent, rate_key, rate_limit, rate_per)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                f" ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND {NOT_FINAL} DO NOTHING RETURNING id",
                (new.kind, new.queue, new.args_json, state, new.max_attempts, new.priority, run_at, now, new.unique_key,
                 new.concurrency_key, new.max_concurrent, new.rate_key, new.rate_limit, new.rate_per),
            ).fetchone()  # fmt: skip
            if row is None:
                (existing,) = conn.execute(
                    f"SELECT id FROM nj_jobs WHERE unique_key = ? AND {NOT_FINAL}",
                    (new.unique_key,),
                ).fetchone()
                out.append(InsertResult(existing, True))
            else:
                out.append(InsertResult(row[0], False))
        return out

    @staticmethod
    def _insert_plain_batch(conn: sqlite3.Connection, jobs: Sequence[NewJob], now: float) -> list[InsertResult]:
        # No unique keys: one executemany. The write lock is ours (BEGIN IMMEDIATE) and the
        # ids are AUTOINCREMENT, so the rows above the largest id so far are exactly this
        # batch's, in insertion order.
        row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'nj_jobs'").fetchone()
        before = row[0] if row else 0
        rows = []
        for new in jobs:
            run_at = now if new.run_at is None or new.run_at < now else new.run_at
            state = "available" if run_at <= now else "scheduled"
            rows.append((new.kind, new.queue, new.args_json, state, new.max_attempts, new.priority, run_at, now,
                         new.concurrency_key, new.max_concurrent, new.rate_key, new.rate_limit, new.rate_per))  # fmt: skip
        conn.executemany(
            "INSERT INTO nj_jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at,"
            " concurrency_key, max_concurrent, rate_key, rate_limit, rate_per) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        ids = [r[0] for r in conn.execute("SELECT id FROM nj_jobs WHERE id > ? ORDER BY id", (before,))]
        if len(ids) != len(jobs):
            raise AssertionError(f"SQLite insert of {len(jobs)} jobs produced {len(ids)} ids above {before}")
        return [InsertResult(i, False) for i in ids]
