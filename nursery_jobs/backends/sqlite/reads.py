"""Reads: one job by id, and the counts per queue and state.

Reads run on the backend's connection without a transaction (WAL lets them run beside the
writer). A row read back that cannot be read is set aside or repaired first (`repair`), once, and
shown as it is then; a count that meets a state no job has sets those rows aside, then counts.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Mapping

from ...errors import JobNotFound
from ...jobs import Job
from ..protocol import BackendEvent, QueueCounts
from ..rows import STATES, Damage, counts_from_rows, job_from_row
from .repair import Repairs

__all__ = ["Reads"]


class Reads(Repairs):
    """`get_job` and `stats`."""

    async def get_job(self, job_id: int) -> Job:
        def body() -> Any:
            assert self._conn is not None
            return self._conn.execute(
                "SELECT id, kind, queue, args, state, attempt, max_attempts, priority, run_at, created_at,"
                " attempted_at, finalized_at, errors, unique_key FROM nj_jobs WHERE id = ?",
                (job_id,),
            ).fetchone()

        row = await self._call(body)
        if row is None:
            raise JobNotFound(f"no job with id {job_id} in {self.url}")
        job, damage = job_from_row(row)
        if not damage:
            return job
        # Set aside (or repair) what cannot be read, once, and show the row as it is then.
        await self._repair(job_id, row[4], damage)
        row = await self._call(body)
        if row is None:  # pragma: no cover - deleted meanwhile
            raise JobNotFound(f"no job with id {job_id} in {self.url}")
        return job_from_row(row)[0]

    async def stats(self) -> Mapping[str, QueueCounts]:
        def body() -> Any:
            assert self._conn is not None
            return self._conn.execute(
                "SELECT queue, state, COUNT(*), SUM(failed_attempts), SUM(interrupted) FROM nj_jobs GROUP BY queue, state"
            ).fetchall()

        rows = await self._call(body)
        if any(r[1] not in STATES for r in rows):  # rows no job state names: set them aside, then count
            now = self.now()

            def set_aside(conn: sqlite3.Connection) -> list[BackendEvent]:
                bad = conn.execute(
                    "SELECT id, state FROM nj_jobs WHERE state NOT IN ("
                    + ", ".join(f"'{s}'" for s in STATES)
                    + ") OR typeof(state) != 'text'"
                ).fetchall()
                return [e for i, st in bad for e in self._set_aside(conn, i, [Damage("state", st, "a job state")], now)]

            self._emit(await self._call(self._tx, set_aside))
            rows = await self._call(body)
        return counts_from_rows(rows)
