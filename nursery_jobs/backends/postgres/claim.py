"""Jobs out: the claim, one statement per look for as many jobs as the fetcher has idle workers.

Many fetchers in many processes claim from one table at once, and a claim must neither wait on
another nor cost more as finished rows, jobs not due yet, or the backlog of full keys grow. The
statement (`statements.claim`) is `UPDATE ... WHERE id = ANY(<best k of the due jobs, FOR UPDATE
SKIP LOCKED>) RETURNING ...`: SKIP LOCKED lets concurrent fetchers take disjoint rows, and the due
jobs come only from partial indexes that hold nothing else. A due job whose concurrency key is
full is parked by the claim that passes over it, so no later claim reads it again until a job of
its key leaves `running`; one refused for its rate is parked with its key's wake time. The same
round trip reports when the next scheduled job of the queue is due.

Here the Python side: the claim's looks (a look cut short by the limits looks again, behind what
it passed over, up to `_CLAIM_LOOKS`), the lean statement tried first on a queue whose claims have
been lean (no rate or global limit, nothing parked, every keyed pick started: `LEAN_PAUSE`), the
round trips that park rate-refused jobs and release rate keys whose wake time came, and the rows
put into claim order. Claims commit with `synchronous_commit = off`: losing the last milliseconds
of them in a server crash only makes jobs claimable again. (After such a crash the lost claim's
attempt number is handed out again, so a late outcome of the lost attempt can end the new one
early: a job may run twice, which at-least-once allows, and none is lost.)
"""

from __future__ import annotations

import operator
from typing import Any

from ...infra.pg import TrioConnection
from ..protocol import ClaimedJob, ClaimResult, JobsAvailable
from .connection import PostgresBase, fetch_all, fetch_one

__all__ = ["Claims", "LEAN_PAUSE"]

_tuple_new = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)
_RUN_AT_ID = operator.itemgetter(7, 0)
_PRIORITY = operator.itemgetter(6)
"""A claim row's (run_at, id) and its priority: the claim order's sort keys."""

_CLAIM_LOOKS = 4
"""Claim statements one claim runs at most, when the limits refused jobs it picked: each look
passes over the keys the looks before it filled."""

LEAN_PAUSE = 100
"""Claims of a queue that run the full claim statement directly after a lean one found it
needed (a full key, a rate key, a due scheduled job, a rate wake time): then one full claim
that the lean statement could have made brings it back."""


class Claims(PostgresBase):
    """`claim`: the jobs a fetcher's idle workers start."""

    async def claim(self, queue: str, limit: int, *, max_running: int | None = None) -> ClaimResult:
        if limit <= 0:
            return ClaimResult([], None)
        q = self._q["claim_limited" if max_running is not None else "claim"]
        q_park, q_release = self._q["rate_park"], self._q["rate_release"]
        pause = self._lean.get(queue)
        lean = max_running is None and pause == 0

        async def body(conn: TrioConnection) -> ClaimResult:
            # The time is read again before each statement, with the connection in hand: a
            # rate counts each start at the time its statement was sent (never before the key's
            # latest start, `rules.rate_time`), and the handler starts when the claim
            # answers, so a look that starts jobs after the round trips of the looks before
            # it must not count them from before those.
            now = self.now()
            next_due = rate_next = None
            jobs: list[tuple[Any, ...]] = []
            if lean:
                # The queue's claims have been lean: the lean statement first. Its last row
                # says whether the full one must run for the rest of the room; if so, this
                # queue's next `LEAN_PAUSE` claims run the full one directly, so a keyed queue
                # does not pay two round trips a claim.
                need, waiting, wake = False, None, None
                for r in await fetch_all(conn, self._q["claim_lean"], {"now": now, "queue": queue, "limit": limit}):
                    if r[0] is not None:
                        jobs.append(r)
                    else:
                        waiting, wake, need = r[7:10]
                if not need:
                    if wake is not None and wake > now:
                        rate_next = wake
                    return _claim_result(jobs, waiting if waiting is not None and waiting > now else None, rate_next)
                self._lean[queue] = LEAN_PAUSE
            plain = not lean
            # The claim statement picks at most `want` jobs, and the limits may refuse some of
            # them (several of one key): then it looks again, and the next look passes over
            # the keys now full, so a key's backlog never keeps the claim from other keys' jobs
            # (no head-of-line blocking). A job passed over for its key is parked by the look
            # that passed it (migration 0011), so no later look or claim reads it again; a look
            # that parked some read at most `PARK_AT_ONCE` of them, and the next look goes on
            # behind them. Each look is one statement: it claims the jobs with no limit itself
            # and the others through `claim_picked_parking`, under the limits' locks, which
            # also parks a picked job it refuses for its rate (migration 0014). A job the scan passed over
            # for its rate is parked by `rate_park` under its key's lock, and a queue's rate key
            # whose wake time has come brings back what its window admits (`rate_release`)
            # before the next look: each a round trip of its own, only when there is one to do.
            more = False
            for look in range(_CLAIM_LOOKS if len(jobs) < limit else 0):
                now = self.now()
                params = {"now": now, "queue": queue, "limit": limit - len(jobs)}
                if max_running is not None:
                    params["max_running"] = max_running
                full = False
                rate_ids: list[int] = []
                wake = None
                for r in await fetch_all(conn, q, params):
                    if r[0] is not None:
                        jobs.append(r)
                        continue
                    next_due, held, taken, parked, slot, rate_ids, wake, room, rated = r[7:16]
                    # The queue is full only when `claim_picked` found no room left under its
                    # global limit (migration 0015): then nothing more may start. A pick the
                    # keys or the rates cut short is not a full queue: what they passed over,
                    # and what was parked, may hide startable jobs behind it.
                    full = room is not None and room <= 0
                    more = not full and (parked > 0 or taken < held)
                    # Evidence that the lean statement would have done: jobs claimed by one
                    # look, every keyed pick started, none with a rate key, nothing parked or
                    # passed over for a rate.
                    plain = plain and look == 0 and taken == held and rated == 0 and parked == 0
                    plain = plain and not rate_ids and len(jobs) > 0 and (wake is None or wake > now)
                    if slot is not None and (rate_next is None or slot < rate_next):
                        rate_next = slot  # a rate key's next slot, seen under its lock (migration 0010)
                if rate_ids:
                    row = await fetch_one(conn, q_park, {"ids": rate_ids, "queue": queue, "now": now})
                    if row is not None and row[0] is not None and (rate_next is None or row[0] < rate_next):
                        rate_next = row[0]  # a rate key's wake time, armed under its lock
                    more = not full  # behind the ones parked, or not parked: the window moved
                if wake is not None and wake <= now:
                    row = await fetch_one(conn, q_release, {"queue": queue, "now": now})
                    if row is not None:
                        wake = row[1]
                        more = more or (not full and row[0] > 0)
                if wake is not None and wake > now and (rate_next is None or wake < rate_next):
                    rate_next = wake
                if len(jobs) >= limit or not more:
                    break  # room filled, or nothing was passed over: there is nothing behind
            if more and len(jobs) < limit:
                self._emit([JobsAvailable(queue)])  # jobs may wait behind the ones this claim parked
            if max_running is None and not lean:
                left = self._lean.get(queue)
                if left is not None and left > 1:
                    self._lean[queue] = left - 1
                elif plain:
                    self._lean[queue] = 0
            return _claim_result(jobs, next_due, rate_next)

        # Not durable: a claim lost in a server crash leaves its jobs claimable (or rescued),
        # which at-least-once allows; the outcome written later is durable, and its WAL flush
        # carries the claim's too.
        result: ClaimResult = await self._run(body, durable=False)
        return result


def _claim_result(jobs: list[tuple[Any, ...]], next_due: float | None, rate_next: float | None) -> ClaimResult:
    """The claimed rows in claim order, and the earlier of the next due time and rate slot."""
    # Claim order: priority descending, then run_at, id. Two sorts by C key functions (the
    # second stable, so it keeps the first's order within a priority) and the rows' first
    # eight columns as the ClaimedJob, with no Python call per row: half the cost of a lambda
    # key and the NamedTuple's own __new__ (RESULTS.md, h-twoproc).
    jobs.sort(key=_RUN_AT_ID)
    jobs.sort(key=_PRIORITY, reverse=True)
    if rate_next is not None and (next_due is None or rate_next < next_due):
        next_due = rate_next
    return ClaimResult([_tuple_new(ClaimedJob, r[:8]) for r in jobs], next_due)
