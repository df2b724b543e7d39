"""Rate keys: each key's recorded starts, and the jobs parked for their rate.

A job with a rate key may start only while its key has a slot in its window
(`rules.rate_slot`). The claim reads each key's record once (`RateStarts`, from `nj_rate`)
and writes it back once, trimmed to the starts that still count (`record_starts`). A due job
refused for its rate alone is parked (`rate_park`), with its key's wake time in the queue
(`nj_rate_wake`) at its next slot, so a key over its rate with a large backlog costs later claims
nothing; when the wake time comes, the claim first brings back the key's best parked jobs, as many
as the window admits (`rate_wake_release`). A record someone else damaged counts as no starts.
"""

from __future__ import annotations

import json
import math
import sqlite3
from typing import Any, Iterator, Mapping, Sequence

from ...jobs import JobState
from ...rules import rate_log, rate_release, rate_time, unparks
from ..protocol import JobsAvailable
from .connection import IDS_PER_STATEMENT
from .parking import unpark

__all__ = ["RateStarts", "rate_of", "rate_park", "rate_wake_release", "record_starts"]

_NO_LIMIT = 2**31
"""A limit no key reaches: a parked row whose rate cannot be read comes back at once."""


class RateStarts(Mapping[str, Sequence[float]]):
    """Each rate key's recorded starts, read from `nj_rate` when `admit_rated` first asks for a
    key (a damaged record reads as no starts), with the key's `cap` and `per` kept for the write."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.read: dict[str, tuple[list[float], int, float]] = {}

    def __getitem__(self, key: str) -> Sequence[float]:
        got = self.read.get(key)
        if got is None:
            row = self._conn.execute("SELECT starts, cap, per FROM nj_rate WHERE key = ?", (key,)).fetchone()
            got = self.read[key] = _rate_record(row)
        return got[0]

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _rate_record(row: Any) -> tuple[list[float], int, float]:
    """(starts, cap, per) of an `nj_rate` row; a row someone else damaged counts as no starts."""
    if row is None:
        return [], 1, 0.0
    text, cap, per = row
    try:
        starts = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        starts = None
    if not isinstance(starts, list) or not all(is_number(t) for t in starts):
        starts = []
    cap = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1 else 1
    per = float(per) if is_number(per) else 0.0
    return sorted(float(t) for t in starts), cap, per


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def rate_of(key: Any, limit: Any, per: Any) -> tuple[str, int, float] | None:
    """A row's rate limit as the claim applies it: a limit that is not an int >= 1 counts as 1;
    a window that is not a positive number of seconds limits nothing."""
    if key is None or not is_number(per) or per <= 0:
        return None
    return str(key), (limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1 else 1), float(per)


def record_starts(
    conn: sqlite3.Connection,
    starts: RateStarts,
    sized: Mapping[str, tuple[int, float]],
    added: Mapping[str, int],
    now: float,
) -> None:
    """Each rate key's record after the claim: its latest starts (`rules.rate_log`), kept
    for the largest limit and window of the jobs the claim weighed against it (`rate_sized`);
    a key that only refused jobs keeps its starts, its `cap` and `per` grown to those."""
    for key, (most, longest) in sized.items():
        old, cap, per = starts.read.get(key) or ([], 1, 0.0)
        grown = max(cap, most), max(per, longest)
        n = added.get(key, 0)
        if n:
            conn.execute(
                "INSERT INTO nj_rate (key, starts, cap, per, last) VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (key)"
                " DO UPDATE SET starts = ?2, cap = ?3, per = ?4, last = ?5",
                (key, json.dumps(rate_log(old, n, now, *grown)), *grown, rate_time(old, now)),
            )
        elif grown != (cap, per):
            conn.execute("UPDATE nj_rate SET cap = ?2, per = ?3 WHERE key = ?1", (key, *grown))


def rate_wake_release(conn: sqlite3.Connection, queue: str, now: float, starts: RateStarts) -> int:
    """The rate keys of `queue` whose wake time has come bring back their best parked jobs, as
    many as their window admits now (`rules.rate_release`); each key's wake moves to the
    next slot of the first job kept, or goes when none is. Returns how many came back."""
    back = 0
    for (key,) in conn.execute("SELECT key FROM nj_rate_wake WHERE queue = ? AND wake <= ?", (queue, now)).fetchall():
        cur = conn.execute(
            "SELECT id, rate_limit, rate_per FROM nj_jobs WHERE queue = ? AND rate_key = ? AND state = 'available'"
            " AND parked = 1 AND rate_wait = 1 ORDER BY priority DESC, run_at, id",
            (queue, key),
        )
        released: list[int] = []

        def parked() -> Iterator[tuple[int, float]]:
            for job_id, limit, per in cur:
                rate = rate_of(key, limit, per)
                yield (rate[1], rate[2]) if rate is not None else (_NO_LIMIT, 0.0)  # no rate: nothing holds it
                released.append(job_id)

        _, wake = rate_release(starts[str(key)], parked(), now)
        cur.close()
        for i in range(0, len(released), IDS_PER_STATEMENT):
            chunk = released[i : i + IDS_PER_STATEMENT]
            conn.execute(f"UPDATE nj_jobs SET parked = 0, rate_wait = 0 WHERE id IN ({','.join('?' * len(chunk))})", chunk)
        if wake is None:
            conn.execute("DELETE FROM nj_rate_wake WHERE queue = ? AND key = ?", (queue, key))
        else:
            conn.execute("UPDATE nj_rate_wake SET wake = ? WHERE queue = ? AND key = ?", (wake, queue, key))
        back += len(released)
    return back


def rate_park(
    conn: sqlite3.Connection, queue: str, refused: Sequence[tuple[int, str, float, str | None]]
) -> list[JobsAvailable]:
    """Park the jobs a claim refused for their rate alone, (id, rate key, its next slot, its
    concurrency key), and keep each key's wake time in `queue` at the earliest of those slots.
    A job with a concurrency key may have been the one its key's freed slot brought back: that
    key's best parked job takes its place (`unparks`, of a job parked for its rate). Returns
    the wake-ups of the queues such jobs came back to."""
    conn.executemany(
        "UPDATE nj_jobs SET state = 'available', parked = 1, rate_wait = 1 WHERE id = ?", [(r[0],) for r in refused]
    )
    wakes: dict[str, float] = {}
    for _, key, slot, _ in refused:
        wakes[key] = min(slot, wakes.get(key, slot))
    conn.executemany(
        "INSERT INTO nj_rate_wake (queue, key, wake) VALUES (?1, ?2, ?3) ON CONFLICT (queue, key)"
        " DO UPDATE SET wake = min(wake, ?3)",
        [(queue, key, wake) for key, wake in wakes.items()],
    )
    freed = unparks(JobState.AVAILABLE, JobState.AVAILABLE, parks=True)
    return unpark(conn, [r[3] for r in refused if r[3] is not None] * freed)
