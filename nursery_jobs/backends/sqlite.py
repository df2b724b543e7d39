"""The SQLite backend: embedded and durable (``sqlite:///path/to/jobs.db``).

One file holds the jobs; WAL mode lets readers run beside the single writer, and every state
change is one short transaction, so a process killed at any moment leaves the file consistent
and loses nothing that was committed. Several processes may share a file: a claim is
`BEGIN IMMEDIATE` (SQLite's write lock) around an `UPDATE ... RETURNING`, so two processes can
never claim the same job, and every state change a worker writes is conditional on the attempt it
claimed (the fencing token), so a late worker can never overwrite a job that moved on.

SQLite calls block, and the Trio loop must not: each call runs on a worker thread through
infra's `run_sync_io` under this backend's own limiter, one call at a time on the one
connection (serialised by a `trio.Lock`), and is never abandoned. A call is short: SQLite's
`busy_timeout` bounds how long it waits for another process's write lock.

Wake-ups. In one process every event is delivered in-process, at once. Between the processes of
one host that share the file, `infra.wake` carries them: each process's `serve` binds a datagram
socket in a registry directory beside the file, and after each commit that made jobs available,
finalized jobs or requested a cancellation, the backend sends a datagram to the other processes'
sockets (`_emit`). A receiver turns it into the hints a PostgreSQL notification gives --
`JobsAvailable(queue)`, `JobFinalized(id, None)`, `CancelRequested(id, verified=False)` -- and
re-reads the database; a process that works no queue hears finalizations only. The poll
(`poll_interval`, 1 s) stays as the fallback for a datagram lost to a full socket buffer, and for
processes on other hosts, which SQLite does not support well anyway. ``?wake=off`` (``wake=False``)
turns the sockets off: poll only.

Clock: Unix time by default; tests pass `clock=trio.current_time` so `MockClock` drives it.
A subclass that sets `_blocking_io = True` (the test suites' deterministic SQLite) makes every
call on the Trio thread itself, which a service must never do but which lets MockClock's
autojump see a database call as work; that mode has no wake-up sockets (it runs in one process).
"""

from __future__ import annotations

import collections
import contextvars
import itertools
import json
import logging
import math
import os
import sqlite3
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, ClassVar, Iterable, Iterator, Mapping, Sequence
from urllib.parse import parse_qs

import trio

from ..errors import BackendUnavailable, ConfigError, JobNotFound
from ..infra.threads import run_callers_io, run_sync_io
from ..infra.wake import Wake, WakeRegistry
from ..jobs import MAX_ERRORS_KEPT, Job, JobState
from .cache_sqlite import SqliteCacheStore
from .protocol import (
    BackendEvent,
    Bounds,
    CancelRequested,
    ClaimedJob,
    ClaimResult,
    HeartbeatResult,
    InsertResult,
    JobFinalized,
    JobsAvailable,
    Listener,
    NewJob,
    OutboxEvent,
    OutboxPublished,
    Outcome,
    QueueCounts,
    Route,
    ScheduleState,
)
from .transitions import (
    PARK_AT_ONCE, CancelAction, admit_rated, after_outcome, after_rescue, check_room, on_cancel, parked_can_start,
    rate_log, rate_release, rate_slot, unparks,
)  # fmt: skip
from .rows import (
    SET_ASIDE_COLUMNS,
    STATES,
    Damage,
    counts_from_rows,
    error_entry,
    job_from_row,
    read_claimed,
    read_errors,
    rescue_message,
    set_aside_message,
)

__all__ = ["SqliteBackend", "SqliteCursor", "SqliteTransaction"]

log = logging.getLogger("nursery_jobs")

SCHEMA_VERSION = 6
"""2 added the concurrency key and its limit (`_UPGRADE_2`), 3 the rate key and its rate
(`_UPGRADE_3`), 4 the parked flag of a full key's jobs (`_UPGRADE_4`), 5 the flag of a job
parked for its rate and each key's wake time (`_UPGRADE_5`, `nj_rate_wake`), 6 the partial
indexes' conditions written without lists of three states (`_UPGRADE_6`, `_PENDING`): an
older file is upgraded in place when opened."""

_PENDING = "(state = 'available' OR state = 'scheduled' OR state = 'retryable')"
"""A pending row, as the partial indexes over pending rows say it (and so every statement that
reads them, word for word: SQLite uses a partial index only for a query whose terms contain its
condition). Not ``state IN (...)``: SQLite evaluates a partial index's condition for the old and
the new row of every write that changes `state`, and a constant list of more than two values
builds a temporary b-tree each time (``OpenEphemeral``: a page cache allocated and freed), eight
per job written with the indexes of schema 5. That made every outcome, claim and parking write
cost about four times its work, and far more once the allocator returned each freed cache to the
system (a write behind a parked backlog: 14-20 ms of CPU per outcome batch instead of 2 ms)."""
_FINAL_STATE = "(state = 'completed' OR state = 'discarded' OR state = 'cancelled')"
_NOT_FINAL = "state <> 'completed' AND state <> 'discarded' AND state <> 'cancelled'"
"""A job that is not final yet, as the unique keys' index says it (the upsert's conflict target
repeats it exactly, as SQLite requires)."""

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS nj_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nj_jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    queue TEXT NOT NULL,
    args TEXT NOT NULL,
    state TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    run_at REAL NOT NULL,
    created_at REAL NOT NULL,
    attempted_at REAL,
    finalized_at REAL,
    heartbeat_at REAL,
    errors TEXT,
    failed_attempts INTEGER NOT NULL DEFAULT 0,
    interrupted INTEGER NOT NULL DEFAULT 0,
    unique_key TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    concurrency_key TEXT,
    max_concurrent INTEGER,
    rate_key TEXT,
    rate_limit INTEGER,
    rate_per REAL,
    parked INTEGER NOT NULL DEFAULT 0,
    rate_wait INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS nj_jobs_due ON nj_jobs (queue, run_at) WHERE {_PENDING};
CREATE INDEX IF NOT EXISTS nj_jobs_running ON nj_jobs (heartbeat_at) WHERE state = 'running';
-- Retention finds old final rows without a scan (and deletes them in batches).
CREATE INDEX IF NOT EXISTS nj_jobs_finalized ON nj_jobs (state, finalized_at) WHERE {_FINAL_STATE};
-- While a job with a unique key is not final, no other job may hold that key.
CREATE UNIQUE INDEX IF NOT EXISTS nj_jobs_unique ON nj_jobs (unique_key) WHERE unique_key IS NOT NULL AND {_NOT_FINAL};
-- The outbox: events published with the service's rows, deleted as the relay makes their jobs
-- (created on a file of an older version too: IF NOT EXISTS, no schema version change).
CREATE TABLE IF NOT EXISTS nj_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS nj_outbox_topic ON nj_outbox (topic, id);
-- Periodic schedules: each one's last enqueued tick (Unix time) and that tick's job.
CREATE TABLE IF NOT EXISTS nj_schedules (name TEXT PRIMARY KEY, last_tick REAL NOT NULL, last_job_id INTEGER);
-- Named locks (rt.lock): the holder's token and its expiry on the backend's clock.
CREATE TABLE IF NOT EXISTS nj_locks (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at REAL NOT NULL);
-- The last fencing token an acquisition of a lock drew, for every name: one row, never deleted
-- (created on a file of an older version too: IF NOT EXISTS, no schema version change).
CREATE TABLE IF NOT EXISTS nj_lock_fence (id INTEGER PRIMARY KEY CHECK (id = 0), last INTEGER NOT NULL);
-- Rate keys: each one's latest starts (a JSON array, ascending, at most `cap`), the largest
-- limit and window its jobs carried, and its latest start; retention drops idle keys.
CREATE TABLE IF NOT EXISTS nj_rate (
    key TEXT PRIMARY KEY, starts TEXT NOT NULL, cap INTEGER NOT NULL, per REAL NOT NULL, last REAL NOT NULL
);
-- Rate keys with jobs parked for their rate, per queue: when the claim brings the next ones back.
CREATE TABLE IF NOT EXISTS nj_rate_wake (queue TEXT NOT NULL, key TEXT NOT NULL, wake REAL NOT NULL, PRIMARY KEY (queue, key));
"""

_UPGRADE_2 = (
    "ALTER TABLE nj_jobs ADD COLUMN concurrency_key TEXT",
    "ALTER TABLE nj_jobs ADD COLUMN max_concurrent INTEGER",
)
_UPGRADE_3 = (
    "ALTER TABLE nj_jobs ADD COLUMN rate_key TEXT",
    "ALTER TABLE nj_jobs ADD COLUMN rate_limit INTEGER",
    "ALTER TABLE nj_jobs ADD COLUMN rate_per REAL",
)
_UPGRADE_4 = ("ALTER TABLE nj_jobs ADD COLUMN parked INTEGER NOT NULL DEFAULT 0", "DROP INDEX IF EXISTS nj_jobs_claim")
_UPGRADE_5 = ("ALTER TABLE nj_jobs ADD COLUMN rate_wait INTEGER NOT NULL DEFAULT 0",)
_UPGRADE_6 = (
    # The same indexes, their conditions written as `_PENDING` and the like (`_KEY_INDEXES`
    # creates the claim's again); the unique keys' index is dropped and made again in the
    # upgrade's one transaction, so no duplicate can slip in between.
    "DROP INDEX IF EXISTS nj_jobs_due",
    "DROP INDEX IF EXISTS nj_jobs_finalized",
    "DROP INDEX IF EXISTS nj_jobs_unique",
    "DROP INDEX IF EXISTS nj_jobs_claimable",
    f"CREATE INDEX nj_jobs_due ON nj_jobs (queue, run_at) WHERE {_PENDING}",
    f"CREATE INDEX nj_jobs_finalized ON nj_jobs (state, finalized_at) WHERE {_FINAL_STATE}",
    f"CREATE UNIQUE INDEX nj_jobs_unique ON nj_jobs (unique_key) WHERE unique_key IS NOT NULL AND {_NOT_FINAL}",
)
_KEY_INDEXES = (
    # The running jobs of a concurrency key, counted by every claim that meets the key.
    "CREATE INDEX IF NOT EXISTS nj_jobs_running_key ON nj_jobs (concurrency_key)"
    " WHERE state = 'running' AND concurrency_key IS NOT NULL",
    # Claim order, over claimable rows that are not parked only, so claim cost grows neither
    # with finished rows nor with the backlog of full keys.
    "CREATE INDEX IF NOT EXISTS nj_jobs_claimable ON nj_jobs (queue, priority DESC, run_at, id)"
    f" WHERE {_PENDING} AND parked = 0",
    # A key's parked jobs in claim order: its best one comes back when a slot frees.
    "CREATE INDEX IF NOT EXISTS nj_jobs_parked ON nj_jobs (concurrency_key, priority DESC, run_at, id)"
    " WHERE state = 'available' AND parked = 1",
    # A rate key's jobs parked for its rate, per queue, in claim order: the best ones come back
    # at the key's wake time.
    "CREATE INDEX IF NOT EXISTS nj_jobs_rate_parked ON nj_jobs (queue, rate_key, priority DESC, run_at, id)"
    " WHERE state = 'available' AND parked = 1 AND rate_wait = 1",
)

_NO_LIMIT = 2**31
"""A limit no key reaches: a parked row whose rate cannot be read comes back at once."""
_IDS_PER_STATEMENT = 500
"""Ids per `IN (...)` list: under SQLite's oldest variable limit (999)."""
_COUNT_PENDING = (
    f"SELECT count(*) FROM (SELECT 1 FROM nj_jobs INDEXED BY nj_jobs_due WHERE queue = ? AND {_PENDING} LIMIT ?)"
)
"""A bounded queue's pending jobs, up to a limit (`max_length + 1` answers "does it fit"):
read from the pending rows' index, so its cost grows with the bound, never with the table."""
_FINAL = ("completed", "discarded", "cancelled")
_SYNC_MODES = {"full": "FULL", "normal": "NORMAL"}
_WAKE_MODES = {"on": True, "off": False}


class _RunningByKey(Mapping[str, int]):
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


def _passed_over(
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
        if key is not None and i not in chosen and running[key] + taken[key] >= most:
            out.append(i)
    return out


def _unpark(conn: sqlite3.Connection, keys: Sequence[Any]) -> list[JobsAvailable]:
    """Bring back into claim order the best parked job of its key once per entry of `keys`
    (`transitions.unparks`): the job is claimable again, in the transaction that freed its
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
_HAS_PARKED = (
    "CASE WHEN concurrency_key IS NULL THEN 0 ELSE EXISTS (SELECT 1 FROM nj_jobs p WHERE p.concurrency_key"
    " = nj_jobs.concurrency_key AND p.state = 'available' AND p.parked = 1 AND p.rate_wait = 0) END"
)
"""A result column of a read of `nj_jobs`: whether the row's key has a parked job that waits
for its slot, so an outcome writes an unpark only for such a key (most keys have none: the
probe of `nj_jobs_parked` is cheaper than the statement that would find nothing)."""


def _repair_parked(conn: sqlite3.Connection, now: float) -> list[str]:
    """The rescuer's repair (`transitions.parked_can_start`): a key with parked jobs and a free
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


class _RateStarts(Mapping[str, Sequence[float]]):
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
    if not isinstance(starts, list) or not all(_is_number(t) for t in starts):
        starts = []
    cap = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 1 else 1
    per = float(per) if _is_number(per) else 0.0
    return sorted(float(t) for t in starts), cap, per


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _rate_of(key: Any, limit: Any, per: Any) -> tuple[str, int, float] | None:
    """A row's rate limit as the claim applies it: a limit that is not an int >= 1 counts as 1;
    a window that is not a positive number of seconds limits nothing."""
    if key is None or not _is_number(per) or per <= 0:
        return None
    return str(key), (limit if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1 else 1), float(per)


def _record_starts(
    conn: sqlite3.Connection,
    starts: _RateStarts,
    sized: Mapping[str, tuple[int, float]],
    added: Mapping[str, int],
    now: float,
) -> None:
    """Each rate key's record after the claim: its latest starts (`transitions.rate_log`), kept
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
                (key, json.dumps(rate_log(old, n, now, *grown)), *grown, now),
            )
        elif grown != (cap, per):
            conn.execute("UPDATE nj_rate SET cap = ?2, per = ?3 WHERE key = ?1", (key, *grown))


def _rate_wake_release(conn: sqlite3.Connection, queue: str, now: float, starts: _RateStarts) -> int:
    """The rate keys of `queue` whose wake time has come bring back their best parked jobs, as
    many as their window admits now (`transitions.rate_release`); each key's wake moves to the
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
                rate = _rate_of(key, limit, per)
                yield (rate[1], rate[2]) if rate is not None else (_NO_LIMIT, 0.0)  # no rate: nothing holds it
                released.append(job_id)

        _, wake = rate_release(starts[str(key)], parked(), now)
        cur.close()
        for i in range(0, len(released), _IDS_PER_STATEMENT):
            chunk = released[i : i + _IDS_PER_STATEMENT]
            conn.execute(f"UPDATE nj_jobs SET parked = 0, rate_wait = 0 WHERE id IN ({','.join('?' * len(chunk))})", chunk)
        if wake is None:
            conn.execute("DELETE FROM nj_rate_wake WHERE queue = ? AND key = ?", (queue, key))
        else:
            conn.execute("UPDATE nj_rate_wake SET wake = ? WHERE queue = ? AND key = ?", (wake, queue, key))
        back += len(released)
    return back


def _rate_park(
    conn: sqlite3.Connection, queue: str, refused: Sequence[tuple[int, str, float, str | None]]
) -> list[JobsAvailable]:
    """Park the jobs a claim refused for their rate alone, (id, rate key, its next slot, its
    concurrency key), and keep each key's wake time in `queue` at the earliest of those slots.
    A job with a concurrency key may have been the one its key's freed slot brought back: that
    key's best parked job takes its place (as `unparks` says of a cancelled one). Returns the
    wake-ups of the queues such jobs came back to."""
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
    return _unpark(conn, [r[3] for r in refused if r[3] is not None])


def parse_sqlite_url(url: str) -> tuple[str, str, bool]:
    """(path, synchronous, wake) from ``sqlite:///path?synchronous=full|normal&wake=on|off``."""
    rest = url[len("sqlite://") :]
    path, _, query = rest.partition("?")
    if not path.startswith("/") or path == "/":
        raise ConfigError(f"SQLite URL {url!r} needs a path: 'sqlite:///jobs.db' or 'sqlite:////abs/jobs.db'")
    path = path[1:]
    params = parse_qs(query, keep_blank_values=True)
    unknown = set(params) - {"synchronous", "wake"}
    if unknown:
        raise ConfigError(f"unknown SQLite URL option(s) {sorted(unknown)} in {url!r}; known: synchronous, wake")
    sync = params.get("synchronous", ["full"])[-1].lower()
    if sync not in _SYNC_MODES:
        raise ConfigError(f"synchronous must be 'full' or 'normal' in {url!r}, not {sync!r}")
    wake = params.get("wake", ["on"])[-1].lower()
    if wake not in _WAKE_MODES:
        raise ConfigError(f"wake must be 'on' or 'off' in {url!r}, not {wake!r}")
    return path, _SYNC_MODES[sync], _WAKE_MODES[wake]


def _inserted_events(jobs: Sequence[NewJob], results: Sequence[InsertResult], now: float) -> list[BackendEvent]:
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


_in_transaction: contextvars.ContextVar[SqliteBackend | None] = contextvars.ContextVar(
    "nursery_jobs.sqlite_transaction", default=None
)
"""The backend whose `transaction()` block this task is in: a write on the backend's own
connection there would wait for the block's own write lock."""


class SqliteCursor:
    """The rows of one statement of a `SqliteTransaction`, read on its thread with the
    statement (so reading them never blocks the Trio loop)."""

    __slots__ = ("_rows", "lastrowid", "rowcount")

    def __init__(self, rows: list[Any], rowcount: int, lastrowid: int | None) -> None:
        self._rows = rows
        self.rowcount = rowcount
        self.lastrowid = lastrowid

    async def fetchone(self) -> Any:
        await trio.lowlevel.checkpoint()
        return self._rows.pop(0) if self._rows else None

    async def fetchall(self) -> list[Any]:
        await trio.lowlevel.checkpoint()
        rows, self._rows = self._rows, []
        return rows


class SqliteTransaction:
    """What `rt.transaction()` lends on SQLite: the file's transaction connection inside
    ``BEGIN IMMEDIATE``. ``await tx.execute(sql, params)`` runs one statement on a worker
    thread (as the backend runs its own) and returns a `SqliteCursor` whose rows are already
    read; `executemany` likewise. Pass it to `kind.enqueue_tx(tx, ...)`."""

    __slots__ = ("_conn", "backend", "inserted", "open")

    def __init__(self, backend: SqliteBackend, conn: sqlite3.Connection) -> None:
        self.backend = backend
        self._conn = conn
        self.open = True
        self.inserted: list[BackendEvent] = []
        """The events of the jobs inserted in it, emitted once it committed."""

    def __repr__(self) -> str:
        return f"<SqliteTransaction {self.backend.path!r} open={self.open}>"

    def _check_open(self) -> None:
        if not self.open:
            raise ConfigError("this SQLite transaction has ended; use it inside its `async with rt.transaction()` block")

    async def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> SqliteCursor:
        self._check_open()

        def run() -> SqliteCursor:
            cur = self._conn.execute(sql, params)
            return SqliteCursor(cur.fetchall(), cur.rowcount, cur.lastrowid)

        result: SqliteCursor = await self.backend._tx_io(run)
        return result

    async def executemany(self, sql: str, seq: Iterable[Sequence[Any] | Mapping[str, Any]]) -> SqliteCursor:
        self._check_open()

        def run() -> SqliteCursor:
            cur = self._conn.executemany(sql, seq)
            return SqliteCursor([], cur.rowcount, cur.lastrowid)

        result: SqliteCursor = await self.backend._tx_io(run)
        return result


class SqliteBackend:
    """Jobs in one SQLite file, shared safely by every process that opens it."""

    poll_interval: float | None = 1.0
    never_yields = False
    _blocking_io: ClassVar[bool] = False
    """Every database call blocks the Trio thread: set only by a test subclass that runs the
    runtime under `MockClock(autojump_threshold=0)`, never by a service."""

    def __init__(
        self,
        path: str,
        *,
        synchronous: str = "FULL",
        clock: Callable[[], float] = time.time,
        busy_timeout: float = 10.0,
        outage_timeout: float = 30.0,
        wake: bool = True,
    ) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        self._synchronous = synchronous
        self._clock = clock
        self._wall_offset: float | None = None
        self._busy_timeout = busy_timeout
        self.outage_timeout = outage_timeout
        self._conn: sqlite3.Connection | None = None
        self._lock = trio.Lock()
        self._limiter = trio.CapacityLimiter(1)
        self._listeners: list[Listener] = []
        self._wake = WakeRegistry(path) if wake and not self._blocking_io else None
        self._workers: int | None = None
        """The most queue workers a runtime on this backend has (`check_budget`); None: unknown."""
        self._tx_conn: sqlite3.Connection | None = None
        """The file's transaction connection (`transaction()`), opened at its first use."""
        self._tx_lock = trio.Lock()
        self._tx_limiter = trio.CapacityLimiter(1)
        self.acquire_timeout = busy_timeout
        """The longest wait for the transaction connection (one transaction at a time)."""
        self._cache: SqliteCacheStore | None = None

    def __repr__(self) -> str:
        return f"<SqliteBackend {self.path!r}>"

    def now(self) -> float:
        return self._clock()

    def wall_offset(self) -> float:
        if self._wall_offset is None:
            self._wall_offset = 0.0 if self._clock is time.time else self._clock() - time.time()
        return self._wall_offset

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def _emit(self, events: Sequence[BackendEvent]) -> None:
        """Deliver the events of this instance's own write, here and to the other processes."""
        self._deliver(events)
        if self._wake is not None and events:
            self._wake.send(
                Wake(
                    tuple(e.queue for e in events if type(e) is JobsAvailable),
                    tuple(e.job_id for e in events if type(e) is JobFinalized),
                    tuple(e.job_id for e in events if type(e) is CancelRequested),
                    any(type(e) is OutboxPublished for e in events),
                )
            )

    # -- the outbox --

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
            for i in range(0, len(ids), _IDS_PER_STATEMENT):
                chunk = ids[i : i + _IDS_PER_STATEMENT]
                won.update(
                    r[0]
                    for r in conn.execute(
                        f"DELETE FROM nj_outbox WHERE id IN ({','.join('?' * len(chunk))}) RETURNING id", chunk
                    )
                )
            jobs = [job for event, jobs in zip(claimed, made) if event.id in won for job in jobs]
            return len(won), jobs, self._insert_rows(conn, jobs, now, bounds) if jobs else []

        _won, jobs, results = await self._call(self._tx, body)
        self._emit(_inserted_events(jobs, results, now))
        return len(claimed)

    def _deliver(self, events: Sequence[BackendEvent]) -> None:
        for event in events:
            for listener in tuple(self._listeners):
                listener(event)

    def _on_wake(self, wake: Wake) -> None:
        """Another process's datagram: hints only, each one leads to a re-read of the database."""
        events: list[BackendEvent] = [JobsAvailable(q) for q in wake.queues]
        events += [JobFinalized(i, None) for i in wake.finalized]
        events += [CancelRequested(i, False) for i in wake.cancel]
        if wake.outbox:
            events.append(OutboxPublished())
        self._deliver(events)

    # -- connection --

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._blocking_io:
            # Deterministic tests only: the call blocks the Trio thread, so under MockClock's
            # autojump a database call never looks like "every task is waiting".
            await trio.lowlevel.checkpoint()
            return fn(*args)
        return await run_sync_io(fn, *args, limiter=self._limiter)

    async def open(self) -> None:
        if self._conn is None:
            self._conn = await self._io(self._connect)

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout)
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open SQLite database {self.path!r}: {exc}") from None
        # Several processes may open a new file at the same moment: switching it to WAL and
        # creating the schema can then meet "database is locked" without SQLite's busy handler
        # being consulted, so retry (bounded by busy_timeout). Runs on a worker thread.
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute(f"PRAGMA synchronous={self._synchronous}")
                conn.executescript(_SCHEMA)
                conn.execute(
                    "INSERT OR IGNORE INTO nj_meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                )
                self._upgrade(conn)
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    conn.close()
                    raise ConfigError(f"cannot prepare SQLite database {self.path!r}: {exc}") from None
                time.sleep(0.02)
        (version,) = conn.execute("SELECT value FROM nj_meta WHERE key = 'schema_version'").fetchone()
        if int(version) != SCHEMA_VERSION:
            conn.close()
            raise ConfigError(
                f"SQLite database {self.path!r} has schema version {version}, this nursery_jobs needs "
                f"{SCHEMA_VERSION}; use a matching nursery_jobs version or a new file"
            )
        return conn

    @staticmethod
    def _upgrade(conn: sqlite3.Connection) -> None:
        """Bring an older file to this version, in one write transaction (another process may
        be opening the same file): the two columns of the concurrency key (from 1), the three of
        the rate key (from 1 or 2), the parked flag (from 1, 2 or 3), the rate's parked flag
        (from 1 to 4; `nj_rate_wake` is created by the schema script), the indexes over states
        made again with their conditions as `_PENDING` says them (from 1 to 5), then the
        indexes that use the new columns."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            (version,) = conn.execute("SELECT value FROM nj_meta WHERE key = 'schema_version'").fetchone()
            if version == "1":
                for statement in _UPGRADE_2:
                    conn.execute(statement)
            if version in ("1", "2"):
                for statement in _UPGRADE_3:
                    conn.execute(statement)
            if version in ("1", "2", "3"):
                for statement in _UPGRADE_4:
                    conn.execute(statement)
            if version in ("1", "2", "3", "4"):
                for statement in _UPGRADE_5:
                    conn.execute(statement)
            if version in ("1", "2", "3", "4", "5"):
                for statement in _UPGRADE_6:
                    conn.execute(statement)
                conn.execute("UPDATE nj_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
            if version in ("1", "2", "3", "4", "5", str(SCHEMA_VERSION)):
                for statement in _KEY_INDEXES:
                    conn.execute(statement)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._wake is None:
            task_status.started()  # every wake-up is delivered in-process; nothing to run
            await trio.sleep_forever()
        # A process with no queue workers (a web process that only enqueues and waits) has no
        # fetcher to wake and no job to cancel: it hears finalizations only.
        await self._wake.serve(self._on_wake, works=self._workers != 0, task_status=task_status)

    def check_budget(self, workers: int) -> None:
        self._workers = workers if self._workers is None else max(self._workers, workers)

    def cache_store(self) -> SqliteCacheStore:
        if self._cache is None:
            self._cache = SqliteCacheStore(
                self.path,
                clock=self._clock,
                limiter=self._limiter,
                busy_timeout=self._busy_timeout,
                outage_timeout=self.outage_timeout,
                blocking=self._blocking_io,
                backend_open=lambda: self._conn is not None,
                in_transaction=lambda: _in_transaction.get() is self,
            )
        return self._cache

    async def close(self) -> None:
        if self._wake is not None:
            self._wake.close()
        if self._cache is not None:
            await self._cache.close()
        conn, self._conn = self._conn, None
        if conn is not None:
            async with self._lock:
                await self._io(conn.close)
        tx_conn, self._tx_conn = self._tx_conn, None
        if tx_conn is not None:
            async with self._tx_lock:
                await self._tx_io(tx_conn.close)

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the connection. Every call starts with `BEGIN IMMEDIATE` (or is a
        read), so "database is locked" means nothing was written: another connection held the
        write lock past `busy_timeout` (an operator's shell, a backup). Such a call is retried
        with backoff for up to `outage_timeout` from its start, its waits for the connection
        included, then `BackendUnavailable` says so: a call ends within `outage_timeout` plus the
        one `busy_timeout` of an attempt begun before that, however many wait; any other
        SQLite error is a `BackendUnavailable` at once, naming the cause. A write from inside
        this backend's own `transaction()` block is a `ConfigError`: it would wait for the
        block's own write lock."""
        if fn == self._tx and _in_transaction.get() is self:
            raise ConfigError(
                "inside `async with rt.transaction()` on SQLite, this call would wait for the transaction's own "
                "write lock (SQLite has one writer): enqueue with kind.enqueue_tx(conn, ...), and make other "
                "changes (cancel, plain enqueue) after the block"
            )
        if self._conn is None:
            await self.open()
        deadline = trio.current_time() + self.outage_timeout
        delay = 0.05
        lock = self._lock
        while True:
            try:
                if lock.locked():
                    # The wait for the connection counts against the deadline too: behind other
                    # calls that each wait `busy_timeout` for the file, a call would otherwise
                    # give up only after a `busy_timeout` per call ahead of it.
                    with trio.move_on_at(deadline) as waited:
                        await lock.acquire()
                    if waited.cancelled_caught:
                        raise self._unavailable("the calls ahead of this one on its connection met the same lock")
                else:
                    await lock.acquire()
                try:
                    return await self._io(fn, *args)
                finally:
                    lock.release()
            except sqlite3.OperationalError as exc:
                locked = "locked" in str(exc) or "busy" in str(exc)
                if not locked or trio.current_time() + delay > deadline:
                    raise self._unavailable(str(exc), locked) from exc
                log.warning(
                    "SQLite database %r is locked (%s); retrying in %.2f s",
                    self.path,
                    exc,
                    delay,
                    extra={"event": "backend_retry", "backend": self.url, "retry_in": delay},
                )
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)
            except sqlite3.DatabaseError as exc:
                raise BackendUnavailable(f"SQLite database {self.path!r} failed: {exc}") from exc

    def _unavailable(self, cause: str, locked: bool = True) -> BackendUnavailable:
        what = f"another connection held its write lock for over {self.outage_timeout:g} s" if locked else "an SQLite error"
        return BackendUnavailable(
            f"SQLite database {self.path!r} unavailable: {what} ({cause}); check for long "
            "transactions, a backup in progress, or the disk"
        )

    def _tx(self, body: Callable[[sqlite3.Connection], Any]) -> Any:
        conn = self._conn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = body(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # a failed COMMIT leaves it open too
                conn.execute("ROLLBACK")
            raise
        return result

    # -- protocol --

    async def insert_many(self, jobs: Sequence[NewJob], bounds: Bounds | None = None) -> list[InsertResult]:
        now = self.now()
        results: list[InsertResult] = await self._call(self._tx, lambda conn: self._insert_rows(conn, jobs, now, bounds))
        self._emit(_inserted_events(jobs, results, now))
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
        pending rows' index) and `transitions.check_room` decides; `QueueFull` rolls back to the
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
                f" ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL AND {_NOT_FINAL} DO NOTHING RETURNING id",
                (new.kind, new.queue, new.args_json, state, new.max_attempts, new.priority, run_at, now, new.unique_key,
                 new.concurrency_key, new.max_concurrent, new.rate_key, new.rate_limit, new.rate_per),
            ).fetchone()  # fmt: skip
            if row is None:
                (existing,) = conn.execute(
                    f"SELECT id FROM nj_jobs WHERE unique_key = ? AND {_NOT_FINAL}",
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

    # -- transactions --

    async def _tx_io(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A call on the transaction connection: a thread of its own limiter (one at a time), or
        inline in the deterministic tests' mode."""
        if self._blocking_io:
            await trio.lowlevel.checkpoint()
            return fn(*args)
        return await run_sync_io(fn, *args, limiter=self._tx_limiter)

    def _connect_tx(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout)
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        return conn

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[SqliteTransaction]:
        """The file's transaction connection in ``BEGIN IMMEDIATE`` for the block (see
        `TransactionalEnqueue`). One transaction at a time in a process (SQLite has one writer
        anyway): the next waits at most `acquire_timeout` for it. ``BEGIN IMMEDIATE`` takes the
        file's write lock at once, so no statement of the block can fail later for want of it;
        while the block runs, other connections' writes (this process's runtime too) wait for
        it, so keep it short. The commit emits the inserted jobs' wake-ups, here and to the
        other processes; a block that raises or is cancelled is rolled back (shielded: a local
        file operation)."""
        if _in_transaction.get() is self:
            raise ConfigError(
                "rt.transaction() inside another on the same SQLite file: SQLite has one writer, the inner one "
                "would wait for the outer; enqueue in the outer transaction"
            )
        with trio.move_on_after(self.acquire_timeout) as waited:
            await self._tx_lock.acquire()
        if waited.cancelled_caught:
            raise BackendUnavailable(
                f"the SQLite transaction connection of {self.path!r} was busy for {self.acquire_timeout:g} s: another "
                "rt.transaction() of this process held it; keep transactions short (no network calls inside)"
            )
        try:
            if self._conn is None:
                await self.open()
            if self._tx_conn is None:
                self._tx_conn = await self._tx_io(self._connect_tx)
            conn = self._tx_conn
            try:
                await self._tx_io(conn.execute, "BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise BackendUnavailable(
                    f"SQLite database {self.path!r}: cannot begin a transaction ({exc}); another connection held "
                    f"the write lock for over {self._busy_timeout:g} s: check for long transactions or a backup"
                ) from exc
            tx = SqliteTransaction(self, conn)
            token = _in_transaction.set(self)
            try:
                yield tx
                tx.open = False
                await self._tx_io(conn.execute, "COMMIT")
            except BaseException:
                tx.open = False
                with trio.CancelScope(shield=True):
                    if conn.in_transaction:  # a failed COMMIT leaves it open too
                        await self._tx_io(conn.execute, "ROLLBACK")
                raise
            finally:
                _in_transaction.reset(token)
            self._emit(tx.inserted)
        finally:
            self._tx_lock.release()

    async def insert_tx(self, conn: Any, jobs: Sequence[NewJob], bounds: Bounds | None = None) -> list[InsertResult]:
        now = self.now()
        if isinstance(conn, SqliteTransaction) and conn.backend is self:
            conn._check_open()
            results: list[InsertResult] = await self._tx_io(self._insert_rows, conn._conn, jobs, now, bounds)
            conn.inserted += _inserted_events(jobs, results, now)
            return results
        if not isinstance(conn, sqlite3.Connection):
            raise ConfigError(
                "enqueue_tx on the SQLite backend takes the transaction rt.transaction() lends, or a "
                f"sqlite3.Connection of your own to {self.path!r}, not {type(conn).__name__}"
            )

        def insert() -> list[InsertResult]:
            self._check_same_file(conn)
            added: list[InsertResult] = self._in_callers_transaction(conn, lambda c: self._insert_rows(c, jobs, now, bounds))
            return added

        if self._blocking_io:
            return insert()
        try:
            inserted: list[InsertResult] = await run_callers_io(insert)
            return inserted
        except sqlite3.ProgrammingError as exc:
            if "thread" not in str(exc):
                raise
            # Made without check_same_thread=False: usable only on the thread that made it,
            # this one, where the caller runs its own statements on it too.
            return insert()

    def _check_same_file(self, conn: sqlite3.Connection) -> None:
        main = next((row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main"), "")
        try:
            same = bool(main) and os.path.samefile(main, self.path)
        except OSError:
            same = False
        if not same:
            raise ConfigError(
                f"enqueue_tx got a sqlite3 connection to {main or 'an in-memory database'!r}, but this runtime's "
                f"jobs are in {self.path!r}; connect to that file, or use `async with rt.transaction() as conn:`"
            )

    @staticmethod
    def _in_callers_transaction(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], Any]) -> Any:
        """`body` in the caller's transaction on `conn`: the one open; if none is, one the
        caller's `commit()` ends (Python's default, implicit transactions); on an autocommit
        connection one of its own, committed at once (the jobs are then committed as `enqueue`
        commits them)."""
        if conn.in_transaction:
            return body(conn)
        conn.execute("BEGIN IMMEDIATE")
        if conn.isolation_level is not None and getattr(conn, "autocommit", None) is not True:
            return body(conn)
        try:
            result = body(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    async def claim(self, queue: str, limit: int, *, max_running: int | None = None) -> ClaimResult:
        now = self.now()

        def body(conn: sqlite3.Connection) -> tuple[ClaimResult, list[BackendEvent]]:
            # The due jobs that are not parked, in claim order, read lazily: `transitions.admit`
            # takes them one by one, counting each key's running jobs once, and stops at
            # `limit`. A keyed job it passes over (its key is full) is parked, so later claims
            # do not read it again; a job of the key leaving `running` brings the best one back
            # (`_unpark`). A job it passes over for its rate alone is parked too, and its key's
            # wake time in the queue kept at its next slot; first of all, the keys whose wake
            # time has come bring back as many parked jobs as their window admits
            # (`_rate_wake_release`), so the claim weighs them in claim order. At most
            # `PARK_AT_ONCE` are read beyond `limit`. SQLite has one writer, and this runs
            # under its write lock (BEGIN IMMEDIATE): the counts are exact.
            starts = _RateStarts(conn)
            _rate_wake_release(conn, queue, now, starts)
            queue_running = 0
            if max_running is not None:
                (queue_running,) = conn.execute(
                    "SELECT count(*) FROM nj_jobs WHERE queue = ? AND state = 'running'", (queue,)
                ).fetchone()
            cur = conn.execute(
                "SELECT id, concurrency_key, max_concurrent, rate_key, rate_limit, rate_per"
                f" FROM nj_jobs WHERE queue = ?2 AND {_PENDING}"
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
                    rate = _rate_of(rkey, rlimit, rper)
                    rates.append(rate)
                    yield *seen[-1][1:], *(rate or (None, None, None))

            running = _RunningByKey(conn)
            verdict = admit_rated(
                candidates(), running, starts, want=limit, now=now, queue_running=queue_running, max_running=max_running
            )
            cur.close()
            # Only the rows the admission weighed were read (it stops at the one that filled
            # the claim), and each of their keys' running jobs counted once, by it.
            due = range(len(seen))
            picked = list(verdict.started)
            over_key = _passed_over(seen, due, picked, running)
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
                _record_starts(conn, starts, sized, verdict.rate_started, now)
            woken = _rate_park(conn, queue, refused)
            rate_next = min((r[2] for r in refused), default=None)
            ids = [seen[i][0] for i in picked]
            passed = [(seen[i][0],) for i in over_key]
            conn.executemany("UPDATE nj_jobs SET state = 'available', parked = 1, rate_wait = 0 WHERE id = ?", passed)
            rows = []
            for i in range(0, len(ids), _IDS_PER_STATEMENT):
                chunk = ids[i : i + _IDS_PER_STATEMENT]
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
                f"SELECT MIN(run_at) FROM nj_jobs WHERE queue = ? AND {_PENDING} AND run_at > ?",
                (queue, now),
            ).fetchone()
            if next_due is None or (isinstance(next_due, (int, float)) and not isinstance(next_due, bool)):
                return next_due
            bad = conn.execute(
                f"SELECT id, run_at FROM nj_jobs WHERE queue = ? AND {_PENDING}"
                " AND typeof(run_at) NOT IN ('integer', 'real') LIMIT 100",
                (queue,),
            ).fetchall()
            if not bad:  # pragma: no cover - MIN found it, so the scan does
                return None
            for job_id, run_at in bad:
                events += self._set_aside(conn, job_id, [Damage("run_at", run_at, "a number of seconds")], now)

    def _set_aside(self, conn: sqlite3.Connection, job_id: int, damage: list[Damage], now: float) -> list[BackendEvent]:
        """Discard a row the runtime cannot read, in the caller's transaction: its unreadable
        columns are reset so that it can be read from now on, and an error names what was found
        (see `backends.rows`). A keyed row that held a slot (one the claim had just started) brings
        back its key's best parked job (`transitions.unparks`), as any job leaving `running` does.
        Returns its JobFinalized, then the wake-up of each queue a job came back to."""
        found = conn.execute("SELECT errors, state, concurrency_key, parked FROM nj_jobs WHERE id = ?", (job_id,)).fetchone()
        entries, _ = read_errors(found[0] if found else None)
        message = set_aside_message(damage)
        entries = [*entries, error_entry(0, now, message)][-MAX_ERRORS_KEPT:]
        conn.execute(
            "UPDATE nj_jobs SET state = 'discarded', finalized_at = ?1, heartbeat_at = NULL, errors = ?2,"
            " kind = CAST(kind AS TEXT), queue = CAST(queue AS TEXT),"
            " attempt = CASE WHEN typeof(attempt) = 'integer' THEN attempt ELSE 0 END,"
            " max_attempts = CASE WHEN typeof(max_attempts) = 'integer' THEN max_attempts ELSE 1 END,"
            " priority = CASE WHEN typeof(priority) = 'integer' THEN priority ELSE 0 END,"
            " run_at = CASE WHEN typeof(run_at) IN ('integer', 'real') THEN run_at ELSE ?1 END,"
            " created_at = CASE WHEN typeof(created_at) IN ('integer', 'real') THEN created_at ELSE ?1 END,"
            " failed_attempts = CASE WHEN typeof(failed_attempts) = 'integer' THEN failed_attempts ELSE 0 END,"
            " interrupted = CASE WHEN typeof(interrupted) = 'integer' THEN interrupted ELSE 0 END,"
            " unique_key = CASE WHEN typeof(unique_key) IN ('null', 'text') THEN unique_key END, parked = 0"
            " WHERE id = ?3",
            (now, json.dumps(entries), job_id),
        )
        before = STATES.get(found[1]) if found and isinstance(found[1], str) else None
        woken: list[BackendEvent] = []
        if before is not None and found[2] is not None:
            woken += _unpark(conn, [found[2]] * unparks(before, JobState.DISCARDED, parked=bool(found[3])))
        log.warning(
            "SQLite %r: job %d set aside (discarded), its row could not be read: %s",
            self.path,
            job_id,
            "; ".join(d.describe() for d in damage),
            extra={"event": "row_set_aside", "job_id": job_id, "backend": self.url},
        )
        return [JobFinalized(job_id, JobState.DISCARDED, message), *woken]

    async def finish_many(self, outcomes: Sequence[Outcome]) -> None:
        now = self.now()

        def body(conn: sqlite3.Connection) -> list[BackendEvent]:
            # One read for the whole batch and one executemany per kind of write: a batch of
            # outcomes costs a few statements, not two per job.
            current: dict[int, tuple[Any, ...]] = {}
            ids = [out.job_id for out in outcomes]
            for i in range(0, len(ids), _IDS_PER_STATEMENT):
                chunk = ids[i : i + _IDS_PER_STATEMENT]
                for row in conn.execute(
                    f"SELECT id, queue, state, attempt, cancel_requested, errors, concurrency_key, {_HAS_PARKED}"
                    f" FROM nj_jobs WHERE id IN ({','.join('?' * len(chunk))})",
                    chunk,
                ):
                    current[row[0]] = row[1:]
            events: list[BackendEvent] = []
            finals: list[tuple[Any, ...]] = []
            again: list[tuple[Any, ...]] = []
            freed: list[Any] = []
            for out in outcomes:
                row = current.get(out.job_id)
                if row is None:
                    continue
                queue, state, attempt, cancel_requested, errors_json, key, has_parked = row
                if state != "running" or attempt != out.attempt:
                    continue  # stale: the job moved on without this worker
                current[out.job_id] = (queue, "done", *row[2:])  # once per batch
                errors, _ = read_errors(errors_json)
                if out.error is not None:
                    e = out.error
                    errors.append(error_entry(e.attempt, e.at, e.message, e.traceback))
                    del errors[:-MAX_ERRORS_KEPT]
                nxt = after_outcome(
                    out.kind,
                    cancel_requested=bool(cancel_requested),
                    has_error=out.error is not None,
                    run_at=out.run_at,
                    now=now,
                )
                errors_text = json.dumps(errors) if errors else None
                if has_parked:  # read before this batch's writes, none of which parks a job
                    freed += [key] * unparks(JobState.RUNNING, nxt.state)
                if nxt.state.final:
                    finals.append((nxt.state.value, now, errors_text, nxt.failed, out.job_id))
                    events.append(JobFinalized(out.job_id, nxt.state, errors[-1]["message"] if errors else None))
                    if key is not None:
                        events.append(JobsAvailable(queue))  # its slot is free
                    continue
                assert nxt.run_at is not None
                again.append(
                    (nxt.state.value, -nxt.attempt_delta, nxt.run_at, errors_text, nxt.failed, nxt.interrupted, out.job_id)
                )
                events.append(JobsAvailable(queue, None if nxt.state is JobState.AVAILABLE else nxt.run_at))
                if key is not None and nxt.state is not JobState.AVAILABLE:
                    events.append(JobsAvailable(queue))  # its slot is free
            if finals:
                conn.executemany(
                    "UPDATE nj_jobs SET state = ?, finalized_at = ?, errors = ?, failed_attempts = failed_attempts + ?,"
                    " heartbeat_at = NULL, parked = 0 WHERE id = ?",
                    finals,
                )
            if again:
                conn.executemany(
                    "UPDATE nj_jobs SET state = ?, attempt = attempt - ?, run_at = ?, errors = ?,"
                    " failed_attempts = failed_attempts + ?, interrupted = interrupted + ?, heartbeat_at = NULL,"
                    " parked = 0 WHERE id = ?",
                    again,
                )
            events += _unpark(conn, freed)
            return events

        events: list[BackendEvent] = await self._call(self._tx, body)
        self._emit(list(dict.fromkeys(events)))  # a batch's rows share their queues' wake-ups

    async def cancel(self, job_id: int) -> JobState:
        now = self.now()

        def body(conn: sqlite3.Connection) -> tuple[JobState, list[BackendEvent]]:
            row = conn.execute(
                "SELECT state, errors, concurrency_key, parked, queue FROM nj_jobs WHERE id = ?", (job_id,)
            ).fetchone()
            if row is None:
                raise JobNotFound(f"no job with id {job_id} in {self.url}")
            state = STATES.get(row[0]) if isinstance(row[0], str) else None
            if state is None:
                return JobState.DISCARDED, self._set_aside(conn, job_id, [Damage("state", row[0], "a job state")], now)
            action = on_cancel(state)
            if action is CancelAction.NONE:
                return state, []
            if action is CancelAction.REQUEST:
                cur = conn.execute("UPDATE nj_jobs SET cancel_requested = 1 WHERE id = ? AND cancel_requested = 0", (job_id,))
                return state, [CancelRequested(job_id)] if cur.rowcount else []
            conn.execute("UPDATE nj_jobs SET state = 'cancelled', finalized_at = ?, parked = 0 WHERE id = ?", (now, job_id))
            errors, _ = read_errors(row[1])
            events: list[BackendEvent] = [JobFinalized(job_id, JobState.CANCELLED, errors[-1]["message"] if errors else None)]
            if row[2] is not None:  # its key's next job may take its place
                events += _unpark(conn, [row[2]] * unparks(state, JobState.CANCELLED, parked=bool(row[3])))
            return JobState.CANCELLED, events

        state, events = await self._call(self._tx, body)
        self._emit(events)
        result: JobState = state
        return result

    async def heartbeat(self, running: Sequence[tuple[int, int]]) -> HeartbeatResult:
        now = self.now()

        def body(conn: sqlite3.Connection) -> HeartbeatResult:
            result = HeartbeatResult([], [])
            for job_id, attempt in running:
                row = conn.execute(
                    "UPDATE nj_jobs SET heartbeat_at = ? WHERE id = ? AND state = 'running' AND attempt = ?"
                    " RETURNING cancel_requested",
                    (now, job_id, attempt),
                ).fetchone()
                if row is None:
                    result.lost.append((job_id, attempt))
                elif row[0]:
                    result.cancel.append(job_id)
            return result

        if not running:
            return HeartbeatResult([], [])
        result: HeartbeatResult = await self._call(self._tx, body)
        return result

    async def rescue(self, stale_before: float) -> list[int]:
        now = self.now()

        def body(conn: sqlite3.Connection) -> tuple[list[int], list[BackendEvent]]:
            # A running row with no readable heartbeat (NULL, or text written by hand) is stale
            # too: otherwise it would stay running for ever.
            rows = conn.execute(
                "SELECT id, queue, attempt, max_attempts, heartbeat_at, errors, cancel_requested, concurrency_key FROM nj_jobs"
                " WHERE state = 'running' AND (heartbeat_at < ? OR heartbeat_at IS NULL"
                "  OR typeof(heartbeat_at) NOT IN ('integer', 'real')) ORDER BY id",
                (stale_before,),
            ).fetchall()
            events: list[BackendEvent] = []
            freed: list[Any] = []
            for job_id, queue, attempt, max_attempts, beat, errors_json, cancel_requested, key in rows:
                if not (isinstance(attempt, int) and isinstance(max_attempts, int) and isinstance(queue, str)):
                    damage = [
                        Damage(column, value, expected)
                        for column, value, expected, ok in (
                            ("queue", queue, "text", isinstance(queue, str)),
                            ("attempt", attempt, "an integer", isinstance(attempt, int)),
                            ("max_attempts", max_attempts, "an integer", isinstance(max_attempts, int)),
                        )
                        if not ok
                    ]
                    events += self._set_aside(conn, job_id, damage, now)
                    continue
                message = rescue_message(beat)
                errors, _ = read_errors(errors_json)
                errors.append(error_entry(attempt, now, message))
                del errors[:-MAX_ERRORS_KEPT]
                nxt = after_rescue(
                    attempt=attempt, max_attempts=max_attempts, cancel_requested=bool(cancel_requested), now=now
                )
                if key is not None:
                    freed += [key] * unparks(JobState.RUNNING, nxt.state)
                if nxt.state.final:
                    conn.execute(
                        "UPDATE nj_jobs SET state = ?, finalized_at = ?, errors = ?, failed_attempts = failed_attempts + ?,"
                        " heartbeat_at = NULL, parked = 0 WHERE id = ?",
                        (nxt.state.value, now, json.dumps(errors), nxt.failed, job_id),
                    )
                    events.append(JobFinalized(job_id, nxt.state, message))
                    if key is not None:
                        events.append(JobsAvailable(queue))  # its slot is free
                else:
                    conn.execute(
                        "UPDATE nj_jobs SET state = ?, run_at = ?, errors = ?,"
                        " failed_attempts = failed_attempts + ?, heartbeat_at = NULL, parked = 0 WHERE id = ?",
                        (nxt.state.value, nxt.run_at, json.dumps(errors), nxt.failed, job_id),
                    )
                    events.append(JobsAvailable(queue))
            events += _unpark(conn, freed)
            events += [JobsAvailable(q) for q in _repair_parked(conn, now)]
            return [r[0] for r in rows], events

        rescued, events = await self._call(self._tx, body)
        self._emit(events)
        result: list[int] = rescued
        return result

    async def delete_finished(self, before: Mapping[JobState, float], limit: int) -> int:
        now = self.now()

        def body(conn: sqlite3.Connection) -> int:
            # Rate keys idle longer than their window limit nothing (`transitions.rate_idle`).
            conn.execute(
                "DELETE FROM nj_rate WHERE key IN (SELECT key FROM nj_rate WHERE last + per <= ? LIMIT ?)", (now, limit)
            )
            deleted = 0
            for state, cutoff in sorted(before.items()):
                cur = conn.execute(
                    "DELETE FROM nj_jobs WHERE id IN (SELECT id FROM nj_jobs WHERE state = ? AND finalized_at < ?"
                    " ORDER BY finalized_at LIMIT ?)",
                    (JobState(state).value, cutoff, limit - deleted),
                )
                deleted += cur.rowcount
                if deleted >= limit:
                    break
            return deleted

        result: int = await self._call(self._tx, body)
        return result

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

    async def _repair(self, job_id: int, state: Any, damage: list[Damage]) -> None:
        now = self.now()
        pending = not (isinstance(state, str) and state in _FINAL)
        set_aside = [d for d in damage if d.column in SET_ASIDE_COLUMNS]

        def body(conn: sqlite3.Connection) -> list[BackendEvent]:
            if pending and set_aside:
                return self._set_aside(conn, job_id, set_aside, now)
            if any(d.column == "errors" for d in damage):
                (raw,) = conn.execute("SELECT errors FROM nj_jobs WHERE id = ?", (job_id,)).fetchone() or (None,)
                entries, found = read_errors(raw)
                if found is not None:
                    conn.execute("UPDATE nj_jobs SET errors = ? WHERE id = ?", (json.dumps(entries), job_id))
                    log.warning(
                        "SQLite %r: job %d: %s; replaced by a note",
                        self.path,
                        job_id,
                        found.describe(),
                        extra={"event": "row_repaired", "job_id": job_id, "backend": self.url},
                    )
            return []

        self._emit(await self._call(self._tx, body))

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

    # -- ScheduleStore --

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

    # -- LockStore --

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
            self._emit(_inserted_events([job], [result], now))
        return result
