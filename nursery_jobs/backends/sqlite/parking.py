"""Parked jobs: due jobs of a full concurrency key, kept out of the claim's way.

A claim that reads a due job whose key is at its limit cannot start it, and the next claim would
read it again, and every one after, so a backlog of one busy key would make every claim of the
queue slower. Such a job is parked instead (a flag that keeps it out of the claim's index,
`nj_jobs_claimable`): it stays `available`, and no claim reads it, until a change frees a place
of its key -- a job of the key leaving `running`, or a cancelled pending job that was not parked
-- which brings back the key's best parked job (`unpark`, as `rules.unparks` says how many).
The rescuer's pass repairs a key left with parked jobs and a free slot (`repair_parked`), which
only a row written by something else can leave.
"""

from __future__ import annotations

import collections
import sqlite3
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ...rules import key_admits, parked_can_start
from ..protocol import JobsAvailable

__all__ = ["HAS_PARKED", "RunningByKey", "passed_over", "repair_parked", "unpark"]


class RunningByKey(Mapping[str, int]):
    """The running jobs of each concurrency key, read when `admit` first asks for a key."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._read: dict[str, int] = {}

    def __getitem__(self, key: str) -> int:
        n = self._read.get(key)
        if n is None:
            row = self._conn.execute(
                "SELECT count(*) FROM nj_jobs WHERE state = 'running' AND concurrency_key = ?", (key,)
            ).fetchone()
            n = self._read[key] = int(row[0]) if row else 0
        return n

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def passed_over(
    seen: Sequence[tuple[int, str | None, int]], among: Iterable[int], started: Sequence[int], running: Mapping[str, int]
) -> list[int]:
    """The jobs of `among` a claim read and did not start because their key is full, as
    indexes in `seen`: `seen` are (id, key, limit) in the order read, `started` the indexes it
    started, `running` each key's running jobs before the claim. Each key's count includes what
    the claim started."""
    taken = collections.Counter(seen[i][1] for i in started)
    chosen = set(started)
    out = []
    for i in among:
        key, most = seen[i][1:]
        if key is not None and i not in chosen and not key_admits(running[key] + taken[key], most):
            out.append(i)
    return out


def unpark(conn: sqlite3.Connection, keys: Sequence[Any]) -> list[JobsAvailable]:
    """Bring back into claim order the best parked job of its key once per entry of `keys`
    (`rules.unparks`): the job is claimable again, in the transaction that freed its
    place. Returns the wake-up of each queue a job came back to: a key is not scoped to a
    queue, so the job a slot lets back may be another queue's than the one that freed it."""
    queues: dict[str, None] = {}
    for key, n in collections.Counter(keys).items():
        # The jobs first, then each by `id = ?`: `id IN (...)` fills a temporary b-tree with
        # the subquery's ids, and `RETURNING` one with the rows it returns, per statement (the
        # write lock is held: nothing changes between the two).
        back = conn.execute(_BEST_PARKED + " LIMIT ?2", (key, n)).fetchall()
        conn.executemany("UPDATE nj_jobs SET parked = 0 WHERE id = ?", [(job_id,) for job_id, _ in back])
        for _, queue in back:
            queues[str(queue)] = None
    return [JobsAvailable(q) for q in queues]


_BEST_PARKED = (
    "SELECT id, queue FROM nj_jobs WHERE concurrency_key = ?1 AND state = 'available' AND parked = 1 AND rate_wait = 0"
    " ORDER BY priority DESC, run_at, id"
)
"""A key's parked jobs that wait for its slot (not for a rate), best first (`nj_jobs_parked`),
with their queues."""
HAS_PARKED = (
    "CASE WHEN concurrency_key IS NULL THEN 0 ELSE EXISTS (SELECT 1 FROM nj_jobs p WHERE p.concurrency_key"
    " = nj_jobs.concurrency_key AND p.state = 'available' AND p.parked = 1 AND p.rate_wait = 0) END"
)
"""A result column of a read of `nj_jobs`: whether the row's key has a parked job that waits
for its slot, so an outcome writes an unpark only for such a key (most keys have none: the
probe of `nj_jobs_parked` is cheaper than the statement that would find nothing)."""


def repair_parked(conn: sqlite3.Connection, now: float) -> list[str]:
    """The rescuer's repair (`rules.parked_can_start`): a key with parked jobs and a free
    slot brings back its best one; normally there is none (only a row written by something else
    can leave one; a parked job with no key, which no slot would bring back, always comes back).
    Returns the queue of each job brought back."""
    # Waiting for a rate with no rate key (a row written by something else): the flag means
    # nothing, and left set no branch below would bring the row back.
    conn.execute(
        "UPDATE nj_jobs SET rate_wait = 0 WHERE state = 'available' AND parked = 1 AND rate_wait = 1 AND rate_key IS NULL"
    )
    unkeyed = conn.execute(
        "UPDATE nj_jobs SET parked = 0 WHERE state = 'available' AND parked = 1 AND concurrency_key IS NULL"
        " AND (rate_wait = 0 OR rate_key IS NULL) RETURNING queue"
    ).fetchall()
    queues = list(dict.fromkeys(str(q) for (q,) in unkeyed))
    # Jobs parked for their rate whose key has no wake time in their queue (a row written by
    # something else): the key wakes now, and the next claim brings back what its rate admits.
    woken = conn.execute(
        "INSERT INTO nj_rate_wake (queue, key, wake) SELECT DISTINCT j.queue, j.rate_key, ? FROM nj_jobs j"
        " WHERE j.state = 'available' AND j.parked = 1 AND j.rate_wait = 1 AND j.rate_key IS NOT NULL"
        " AND NOT EXISTS (SELECT 1 FROM nj_rate_wake w WHERE w.queue = j.queue AND w.key = j.rate_key) RETURNING queue",
        (now,),
    ).fetchall()
    queues += [str(q) for (q,) in woken if str(q) not in queues]
    for (key,) in conn.execute(
        "SELECT DISTINCT concurrency_key FROM nj_jobs WHERE state = 'available' AND parked = 1 AND rate_wait = 0"
        " AND concurrency_key IS NOT NULL"
    ).fetchall():
        head = conn.execute(
            "SELECT id, queue, max_concurrent FROM nj_jobs WHERE concurrency_key = ? AND state = 'available' AND parked = 1"
            " AND rate_wait = 0 ORDER BY priority DESC, run_at, id LIMIT 1",
            (key,),
        ).fetchone()
        if head is None:  # pragma: no cover - the DISTINCT above found one, under the write lock
            continue
        (running,) = conn.execute(
            "SELECT count(*) FROM nj_jobs WHERE state = 'running' AND concurrency_key = ?", (key,)
        ).fetchone()
        limit = head[2] if isinstance(head[2], int) and head[2] >= 1 else None
        if parked_can_start(running, limit):
            conn.execute("UPDATE nj_jobs SET parked = 0 WHERE id = ?", (head[0],))
            queues.append(str(head[1]))
    return queues
