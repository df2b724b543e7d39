"""Jobs out: the claim, under the file's write lock.

A claim is ``BEGIN IMMEDIATE`` (SQLite's write lock) around the read of the due jobs and the
``UPDATE ... RETURNING`` that starts them, so two processes can never claim the same job, and the
counts the limits are judged on are exact: nobody else writes meanwhile. The due jobs are read
lazily, in claim order, from an index that holds only claimable rows that are not parked, and the
job rules decide which may start (`rules.admit_rated`, the concurrency and rate limits
together), stopping at the one that fills the claim. What a claim passes over for a full key is
parked (`parking`); what it passes over for its rate alone is parked with its key's wake time
(`rates`); at most `PARK_AT_ONCE` rows are read beyond the claim's room, so a backlog never makes
one claim long.
"""

from __future__ import annotations

import itertools
import sqlite3
from typing import Any, Iterator

from ...rules import PARK_AT_ONCE, admit_rated, rate_slot
from ..protocol import BackendEvent, ClaimedJob, ClaimResult, JobsAvailable
from ..rows import Damage, read_claimed
from .connection import IDS_PER_STATEMENT
from .parking import RunningByKey, passed_over
from .rates import RateStarts, rate_of, rate_park, rate_wake_release, record_starts
from .repair import Repairs
from .schema import IS_PENDING

__all__ = ["Claims"]


class Claims(Repairs):
    """`claim`: the jobs a fetcher's idle workers start."""

    async def claim(self, queue: str, limit: int, *, max_running: int | None = None) -> ClaimResult:
        def body(conn: sqlite3.Connection) -> tuple[ClaimResult, list[BackendEvent]]:
            # The claim's time is read once it holds the write lock, not before it waits for
            # it: a rate counts each start at this time (`rules.rate_time`), and the
            # handler starts right after the commit, so a claim that waited for another
            # process's transaction must not count its starts from before that wait.
            now = self._now_locked()
            # The due jobs that are not parked, in claim order, read lazily: `rules.admit`
            # takes them one by one, counting each key's running jobs once, and stops at
            # `limit`. A keyed job it passes over (its key is full) is parked, so later claims
            # do not read it again; a job of the key leaving `running` brings the best one back
            # (`unpark`). A job it passes over for its rate alone is parked too, and its key's
            # wake time in the queue kept at its next slot; first of all, the keys whose wake
            # time has come bring back as many parked jobs as their window admits
            # (`rate_wake_release`), so the claim weighs them in claim order. At most
            # `PARK_AT_ONCE` are read beyond `limit`. SQLite has one writer, and this runs
            # under its write lock (BEGIN IMMEDIATE): the counts are exact.
            starts = RateStarts(conn)
            rate_wake_release(conn, queue, now, starts)
            queue_running = 0
            if max_running is not None:
                (queue_running,) = conn.execute(
                    "SELECT count(*) FROM nj_jobs WHERE queue = ? AND state = 'running'", (queue,)
                ).fetchone()
            cur = conn.execute(
                "SELECT id, concurrency_key, max_concurrent, rate_key, rate_limit, rate_per"
                f" FROM nj_jobs WHERE queue = ?2 AND {IS_PENDING}"
                "  AND parked = 0 AND run_at <= ?1 ORDER BY priority DESC, run_at, id",
                (now, queue),
            )
            seen: list[tuple[int, str | None, int]] = []
            rates: list[tuple[str, int, float] | None] = []

            def candidates() -> Iterator[tuple[Any, ...]]:
                """The due rows, one at a time as `admit_rated` asks for the next (each kept in
                `seen`), at most `PARK_AT_ONCE` beyond `limit`."""
                for job_id, key, most, rkey, rlimit, rper in itertools.islice(cur, limit + PARK_AT_ONCE):
                    seen.append((job_id, None if key is None else str(key), most if isinstance(most, int) and most >= 1 else 1))
                    rate = rate_of(rkey, rlimit, rper)
                    rates.append(rate)
                    yield *seen[-1][1:], *(rate or (None, None, None))

            running = RunningByKey(conn)
            verdict = admit_rated(
                candidates(), running, starts, want=limit, now=now, queue_running=queue_running, max_running=max_running
            )
            cur.close()
            # Only the rows the admission weighed were read (it stops at the one that filled
            # the claim), and each of their keys' running jobs counted once, by it.
            due = range(len(seen))
            picked = list(verdict.started)
            over_key = passed_over(seen, due, picked, running)
            # Read and not started, its key not full, and over its rate after this claim's
            # starts: passed over for its rate alone, parked with its next slot.
            refused: list[tuple[int, str, float, str | None]] = []
            sized = dict(verdict.rate_sized)
            for i in sorted(set(due).difference(picked, over_key)):
                rate = rates[i]
                if rate is not None:
                    slot = rate_slot(starts[rate[0]], rate[1], rate[2], now, verdict.rate_started.get(rate[0], 0))
                    if slot is not None:
                        refused.append((seen[i][0], rate[0], slot, seen[i][1]))
                        most, longest = sized.get(rate[0], (1, 0.0))
                        sized[rate[0]] = max(most, rate[1]), max(longest, rate[2])
            if sized:  # the records of the keys it weighed or parked jobs of, sized for them
                record_starts(conn, starts, sized, verdict.rate_started, now)
            woken = rate_park(conn, queue, refused)
            rate_next = min((r[2] for r in refused), default=None)
            ids = [seen[i][0] for i in picked]
            passed = [(seen[i][0],) for i in over_key]
            conn.executemany("UPDATE nj_jobs SET state = 'available', parked = 1, rate_wait = 0 WHERE id = ?", passed)
            rows = []
            for i in range(0, len(ids), IDS_PER_STATEMENT):
                chunk = ids[i : i + IDS_PER_STATEMENT]
                rows += conn.execute(
                    "UPDATE nj_jobs SET state = 'running', attempt = attempt + 1, attempted_at = ?, heartbeat_at = ?"
                    f" WHERE id IN ({','.join('?' * len(chunk))})"
                    " RETURNING id, kind, queue, args, attempt, max_attempts, priority, run_at",
                    (now, now, *chunk),
                ).fetchall()
            events: list[BackendEvent] = []
            claimed: list[tuple[ClaimedJob, Any]] = []
            for r in rows:
                read = read_claimed(r)
                if isinstance(read, ClaimedJob):
                    claimed.append((read, r[7]))
                else:  # a row written by something else, with a column that cannot be read
                    events += self._set_aside(conn, r[0], read, now)
            if events or ((passed or refused) and len(rows) < limit):
                # rows set aside took places in this claim, or jobs may wait behind the ones it
                # parked: the queue may hold more
                events.append(JobsAvailable(queue))
            next_due = self._next_due(conn, queue, now, events)
            (wake,) = conn.execute("SELECT MIN(wake) FROM nj_rate_wake WHERE queue = ?", (queue,)).fetchone()
            for slot in (rate_next, wake):
                if slot is not None and (next_due is None or slot < next_due):
                    next_due = slot  # a rate key's next slot: a job it parked may start then
            claimed.sort(key=lambda c: (-c[0].priority, c[1] if isinstance(c[1], (int, float)) else 0.0, c[0].id))
            return ClaimResult([c[0] for c in claimed], next_due), events + woken

        if limit <= 0:
            return ClaimResult([], None)
        result, events = await self._call(self._tx, body)
        self._emit(events)
        claim: ClaimResult = result
        return claim

    def _next_due(self, conn: sqlite3.Connection, queue: str, now: float, events: list[BackendEvent]) -> float | None:
        """The earliest run_at of a pending job of `queue` that is not due yet. SQLite sorts
        TEXT after every number, so a pending row whose run_at is text (written by hand) is the
        answer only when no real one is left: it can never come due, and is set aside."""
        while True:
            (next_due,) = conn.execute(
                f"SELECT MIN(run_at) FROM nj_jobs WHERE queue = ? AND {IS_PENDING} AND run_at > ?",
                (queue, now),
            ).fetchone()
            if next_due is None or (isinstance(next_due, (int, float)) and not isinstance(next_due, bool)):
                return next_due
            bad = conn.execute(
                f"SELECT id, run_at FROM nj_jobs WHERE queue = ? AND {IS_PENDING}"
                " AND typeof(run_at) NOT IN ('integer', 'real') LIMIT 100",
                (queue,),
            ).fetchall()
            if not bad:  # pragma: no cover - MIN found it, so the scan does
                return None
            for job_id, run_at in bad:
                events += self._set_aside(conn, job_id, [Damage("run_at", run_at, "a number of seconds")], now)
