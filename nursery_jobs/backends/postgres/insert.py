"""Jobs in: one job, a batch, a batch with unique keys, a bounded queue's batch.

The insert is on the enqueue path of every request, so each shape takes the fewest round trips it
can. One job is one `INSERT ... RETURNING` whose `pg_notify` rides in the same statement; a batch
is one `INSERT ... SELECT FROM unnest(...)`, or from `COPY_AT` jobs on, `COPY` in one transaction
(ids reserved from the sequence first, so they keep the order). Jobs with a unique key go one by
one (`ON CONFLICT ... DO NOTHING`, then a lookup of the holder). A batch into a queue declared
with `max_length` is inserted and counted in one transaction under the queue's enqueue lock
(`rules.check_room` decides).

Every shape runs on a `Session`, so a job stored in a transaction (`rt.transaction()`, a caller's
connection) is the job `insert_many` stores. Inserts are not retried on a lost connection: whether
they committed is unknown.
"""

from __future__ import annotations

from typing import Any, Sequence

import trio

from ...rules import check_room
from ..protocol import Bounds, InsertResult, JobsAvailable, NewJob
from .connection import PostgresBase
from .sessions import Session, TrioSession, atomic

__all__ = ["COPY_AT", "Inserts"]

COPY_AT = 50
"""Batches of at least this many jobs (none with a unique key) are inserted with COPY: its
extra round trips (a transaction, the ids, the COPY) cost less than passing the batch as arrays
from about here on (measured on the benchmark machine: 50 jobs take ~3.3 ms either way, 100 take
4.3 against 5.8 ms, 2,000 take 40 against 81 ms)."""


class Inserts(PostgresBase):
    """`insert_many`, and the insert every other path (transactions, schedules, the relay) shares."""

    async def insert_many(self, jobs: Sequence[NewJob], bounds: Bounds | None = None) -> list[InsertResult]:
        if not jobs:
            await trio.lowlevel.checkpoint()
            return []
        now = self.now()
        run_ats = [now if j.run_at is None or j.run_at < now else j.run_at for j in jobs]
        results: list[InsertResult] = await self._run(
            lambda c: self._insert(TrioSession(c), jobs, run_ats, now, bounds), retry=False
        )
        if len(results) == 1:  # the common case, without the sets of `_emit_inserted`
            if not results[0].existing:
                self._emit([JobsAvailable(jobs[0].queue) if run_ats[0] <= now else JobsAvailable(jobs[0].queue, run_ats[0])])
            return results
        self._emit_inserted(jobs, run_ats, results, now)
        return results

    async def _insert(
        self,
        s: Session,
        jobs: Sequence[NewJob],
        run_ats: list[float],
        now: float,
        bounds: Bounds | None = None,
        *,
        serialize: bool = True,
    ) -> list[InsertResult]:
        """The jobs' rows, on session `s`: a pooled connection of the backend's own, the one
        `transaction()` lent, or the caller's (`insert_tx`). One code for all of them, so a
        job stored in a transaction is the job `insert_many` stores. Each statement queues the
        wake-up NOTIFY of its queues, sent at the commit (at once on an autocommit session).

        With `bounds` for a queue of the batch: in one transaction (a savepoint inside one
        already open), take each bounded queue's enqueue lock (`serialize`: a transaction-level
        advisory lock, in queue order, held to the commit), insert the rows, then count each
        bounded queue's pending jobs with them (`count_pending`: three index-only reads of the
        pending rows' partial indexes, each of at most `max_length + 1` entries, so the cost
        grows with the bound, never with the table), and let `rules.check_room` decide; `QueueFull` rolls the
        rows back. Under the lock the count is a new statement, and so (READ COMMITTED) sees
        every enqueue of the queue that committed before the lock was granted: exact."""
        if not jobs:
            return []
        if bounds and any(j.queue in bounds for j in jobs):
            queues = sorted({j.queue for j in jobs if j.queue in bounds})
            async with atomic(s):
                if serialize:
                    await s.one(self._q["lock_queue"], (queues,))
                results = await self._insert(s, jobs, run_ats, now)
                for queue in queues:
                    limit = bounds[queue]
                    row = await s.one(self._q["count_pending"], {"queue": queue, "limit": limit + 1})
                    assert row is not None
                    check_room(queue, int(row[0]), limit)
            return results
        if any(j.unique_key is not None for j in jobs):
            if len(jobs) == 1:
                return [await self._insert_one(s, jobs[0], run_ats[0], now)]
            # One transaction: the batch is all or nothing, and no job of it can be claimed
            # (and its key freed) before the rest is in -- a key twice in one batch is one job.
            async with atomic(s):
                return [await self._insert_one(s, j, r, now) for j, r in zip(jobs, run_ats)]
        if len(jobs) == 1:
            job = jobs[0]
            one = (job.kind, job.queue, job.args_json, "available" if run_ats[0] <= now else "scheduled",
                   job.max_attempts, job.priority, run_ats[0], now, job.concurrency_key, job.max_concurrent,
                   job.rate_key, job.rate_limit, job.rate_per, self._jobs_channel, job.queue)  # fmt: skip
            row = await s.one(self._q["insert_single"], one)
            assert row is not None
            return [InsertResult(row[0], False)]
        if len(jobs) >= COPY_AT:
            return [InsertResult(i, False) for i in await self._copy_in(s, jobs, run_ats, now)]
        params = (
            now,
            [j.kind for j in jobs],
            [j.queue for j in jobs],
            [j.args_json for j in jobs],
            ["available" if r <= now else "scheduled" for r in run_ats],
            [j.max_attempts for j in jobs],
            [j.priority for j in jobs],
            run_ats,
            [j.concurrency_key for j in jobs],
            [j.max_concurrent for j in jobs],
            [j.rate_key for j in jobs],
            [j.rate_limit for j in jobs],
            [j.rate_per for j in jobs],
            self._jobs_channel,
        )
        rows = await s.all(self._q["insert_many"], params)
        return [InsertResult(i, False) for i in sorted(r[0] for r in rows)]

    async def _copy_in(self, s: Session, jobs: Sequence[NewJob], run_ats: list[float], now: float) -> list[int]:
        """A large batch through COPY, in one transaction: take its ids from the table's
        sequence first (ascending, so the jobs keep their order), queue the NOTIFYs (sent at
        commit), then COPY the rows with their ids."""
        queues = sorted({j.queue for j in jobs})
        async with atomic(s):
            row = await s.one(self._q["reserve_ids"], (self._jobs_channel, queues, len(jobs)))
            assert row is not None
            first, last, listed = row
            # Without concurrent inserts the ids are one run: only its ends travel.
            ids = list(range(first, last + 1)) if listed is None else [int(i) for i in listed.split(",")]
            await s.copy(self._q["copy_in"], _copy_text(ids, jobs, run_ats, now))
        return ids

    async def _insert_one(self, s: Session, job: NewJob, run_at: float, now: float) -> InsertResult:
        while True:
            row = await s.one(
                self._q["insert_one"],
                (job.kind, job.queue, job.args_json, "available" if run_at <= now else "scheduled", job.max_attempts,
                 job.priority, run_at, now, job.unique_key, job.concurrency_key, job.max_concurrent,
                 job.rate_key, job.rate_limit, job.rate_per, self._jobs_channel, job.queue),
            )  # fmt: skip
            if row is not None:
                return InsertResult(row[0], False)
            existing = await s.one(self._q["find_unique"], (job.unique_key,))
            if existing is not None:
                return InsertResult(existing[0], True)
            # the holder became final between the two statements: try again

    def _emit_inserted(self, jobs: Sequence[NewJob], run_ats: list[float], results: list[InsertResult], now: float) -> None:
        due_now: set[str] = set()
        due_later: dict[str, float] = {}
        for job, run_at, res in zip(jobs, run_ats, results):
            if res.existing:
                continue
            if run_at <= now:
                due_now.add(job.queue)
            else:
                due_later[job.queue] = min(run_at, due_later.get(job.queue, run_at))
        self._emit([JobsAvailable(q) for q in sorted(due_now)] + [JobsAvailable(q, d) for q, d in sorted(due_later.items())])


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(ids: Sequence[int], jobs: Sequence[NewJob], run_ats: Sequence[float], now: float) -> str:
    """The rows of a COPY batch in COPY's text format. A batch is mostly one kind, queue and
    time: the columns after the id and the arguments are formatted once per distinct
    combination, not per row (psycopg's generic row formatter costs ~4 us per row, measured)."""
    now_text = repr(float(now))
    tails: dict[tuple[Any, ...], str] = {}
    lines = []
    for job_id, job, run_at in zip(ids, jobs, run_ats):
        key = (run_at, job.kind, job.queue, job.max_attempts, job.priority, job.concurrency_key, job.max_concurrent,
               job.rate_key, job.rate_limit, job.rate_per)  # fmt: skip
        tail = tails.get(key)
        if tail is None:
            state = "available" if run_at <= now else "scheduled"
            ckey = "\\N" if job.concurrency_key is None else job.concurrency_key.translate(_COPY_ESCAPES)
            most = "\\N" if job.max_concurrent is None else str(int(job.max_concurrent))
            rkey = "\\N" if job.rate_key is None else job.rate_key.translate(_COPY_ESCAPES)
            rlimit = "\\N" if job.rate_limit is None else str(int(job.rate_limit))
            rper = "\\N" if job.rate_per is None else repr(float(job.rate_per))
            tail = tails[key] = "\t".join(
                (repr(float(run_at)), job.kind.translate(_COPY_ESCAPES), job.queue.translate(_COPY_ESCAPES), state,
                 str(int(job.max_attempts)), str(int(job.priority)), now_text, ckey, most, rkey, rlimit, rper)
            ) + "\n"  # fmt: skip
        lines.append(f"{job_id}\t{job.args_json.translate(_COPY_ESCAPES)}\t{tail}")
    return "".join(lines)
