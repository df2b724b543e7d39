"""Reads: one job by id, and the counts per queue and state.

A row read back may hold what the runtime did not write (a hand edit, another tool): `get_job`
reads it through `backends.rows`, and when its error list cannot be read, replaces what cannot
be read by a note, once, and says so in the log. `stats` is the one statement that counts every
row: it turns sequential scans back on for itself (the pool's sessions refuse them,
`POOL_SESSION`).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Mapping

from ...errors import JobNotFound
from ...infra.pg import TrioConnection
from ...jobs import Job
from ..protocol import JobsAvailable, QueueCounts
from ..rows import counts_from_rows, job_from_row
from .connection import PostgresBase, execute, fetch_all, fetch_one

__all__ = ["Reads"]

log = logging.getLogger("nursery_jobs")


class Reads(PostgresBase):
    """`get_job` and `stats`."""

    async def get_job(self, job_id: int) -> Job:
        q = self._q["get"]
        row = await self._run(lambda c: fetch_one(c, q, (job_id,)))
        if row is None:
            raise JobNotFound(f"no job with id {job_id} in {self.url}")
        job, damage = job_from_row(row)
        if damage:
            # The column types and checks keep everything but the errors' shape readable:
            # replace what cannot be read by notes, once (only if nobody wrote it meanwhile).
            entries = [{"attempt": e.attempt, "at": e.at, "message": e.message, "traceback": e.traceback} for e in job.errors]
            fixed = json.dumps(entries)
            await self._run(lambda c: execute(c, self._q["repair_errors"], (fixed, job_id, row[12])))
            log.warning(
                "PostgreSQL job %d: %s; replaced by a note",
                job_id,
                "; ".join(d.describe() for d in damage),
                extra={"event": "row_repaired", "job_id": job_id, "backend": self.url},
            )
            if not job.state.final:  # the repair held the row: a claim meanwhile skipped it
                self._emit([JobsAvailable(job.queue)])
        return job

    async def stats(self) -> Mapping[str, QueueCounts]:
        q = self._q["stats"]

        async def count(conn: TrioConnection) -> list[tuple[Any, ...]]:
            # Counting every row is the one statement a whole-table scan is right for: allow it
            # here (the pool's sessions refuse sequential scans, POOL_SESSION).
            async with conn.transaction():
                await execute(conn, "SET LOCAL enable_seqscan = on")
                return await fetch_all(conn, q)

        return counts_from_rows(await self._run(count))
