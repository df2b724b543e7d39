"""The PostgreSQL backend's cache store: UNLOGGED tables, and one computation per key across
processes (migration 0023).

Entries are rows of `cache` (an UNLOGGED table: a crash empties it, standbys do not have it;
docs/cache.md), read and written by one statement each on the backend's pool, on its clock, with
its bounds and its retries (every statement here is safe to repeat).

Flights (`CacheFlights`). The process that computes a key holds its row in `cache_flights`
(owner: a runtime's random id; until: the end of the computation's wait bound), taken by
`cache_lead` (the migration's function: take the flight, then read the entry on a new snapshot,
so a flight freed by a fill that had just committed finds the entry and is given back). The
other processes watch the key: `fill` stores the entry, deletes the flight and sends
``pg_notify(<schema>_events, 'k:<digest>')`` in one statement, committed together; the
notification reaches each process through the backend's one LISTEN connection
(`PostgresBackend._on_notify`, which hands ``k:`` payloads to `on_notify` here) and wakes the
watchers of that digest. A process drops the echo of its own pool's notifications, so `fill`
wakes this process's watchers itself. A notification is a hint: a woken watcher reads the row
again. The digest (32 hex characters of the key's SHA-256) keeps every payload short whatever
the key.

Why a row and not `pg_try_advisory_lock`: an advisory lock is held by a connection, so holding
one for a computation (the service's code, often a network call) would hold a pooled connection
for as long, one per key being computed; a row is held by its owner, frees itself at `until`
if the owner died, and costs the pool nothing while the computation runs.
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator, Protocol

import trio

from ...infra.pg import TrioConnection, sql
from ..protocol import CacheEntry

__all__ = ["PgCacheStore", "key_digest"]


class _Backend(Protocol):
    """What the store uses of `PostgresBackend` (which imports this module, not the reverse)."""

    url: str
    schema: str

    def now(self) -> float: ...

    async def _run(self, fn: Callable[[TrioConnection], Awaitable[Any]], *, retry: bool = True, durable: bool = True) -> Any: ...


def key_digest(key: str) -> str:
    """What a notification names a key by: short, the same in every process."""
    return hashlib.sha256(key.encode("ascii", "backslashreplace")).hexdigest()[:32]


class _Watch:
    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = trio.Event()

    def notify(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()
        self._event = trio.Event()


_QUERIES = {
    "get": "SELECT value, is_error, fresh_until, expires_at FROM {s}.cache WHERE key = %s AND expires_at > %s",
    "set": (
        "INSERT INTO {s}.cache AS c (key, value, is_error, fresh_until, expires_at) VALUES (%s, %s, %s, %s, %s)"
        " ON CONFLICT (key) DO UPDATE SET value = excluded.value, is_error = excluded.is_error,"
        " fresh_until = excluded.fresh_until, expires_at = excluded.expires_at"
    ),
    "delete": "DELETE FROM {s}.cache WHERE key = %s",
    # Expired entries, oldest expiry first, by `cache_expiry`; rows a concurrent purge holds are
    # skipped. Flights whose owner died (their `until` passed) go in the same statement.
    "purge": (
        "WITH gone AS (DELETE FROM {s}.cache WHERE key IN (SELECT key FROM {s}.cache WHERE expires_at <= %s"
        " ORDER BY expires_at LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING 1),"
        " stale AS (DELETE FROM {s}.cache_flights WHERE key IN (SELECT key FROM {s}.cache_flights WHERE until <= %s"
        " LIMIT %s FOR UPDATE SKIP LOCKED))"
        " SELECT count(*) FROM gone"
    ),
    "lead": "SELECT led, value, is_error, fresh_until, expires_at FROM {s}.cache_lead(%s, %s, %s, %s)",
    "fill": (
        "WITH up AS (INSERT INTO {s}.cache AS c (key, value, is_error, fresh_until, expires_at)"
        " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value,"
        " is_error = excluded.is_error, fresh_until = excluded.fresh_until, expires_at = excluded.expires_at),"
        " freed AS (DELETE FROM {s}.cache_flights WHERE key = %s AND owner = %s)"
        " SELECT pg_notify(%s, %s)"
    ),
    "free": (
        "WITH freed AS (DELETE FROM {s}.cache_flights WHERE key = %s AND owner = %s) SELECT pg_notify(%s, %s)"
    ),
}


class PgCacheStore:
    """Cache entries in the backend's schema, shared by every process on it (`CacheStore`,
    `CacheFlights`)."""

    shared = True
    never_yields = False

    def __init__(self, backend: _Backend) -> None:
        self._backend = backend
        self.url = backend.url
        self._channel = f"{backend.schema}_events"
        self._q = {
            name: sql.SQL(text).format(s=sql.Identifier(backend.schema)).as_bytes(None) for name, text in _QUERIES.items()
        }
        self._watches: dict[str, set[_Watch]] = {}

    def __repr__(self) -> str:
        return f"<PgCacheStore {self.url}>"

    def now(self) -> float:
        return self._backend.now()

    async def _one(self, name: str, params: tuple[Any, ...], *, rows: bool = True) -> tuple[Any, ...] | None:
        q = self._q[name]

        async def one(conn: TrioConnection) -> tuple[Any, ...] | None:
            # The backend's way with its own statements: a cursor kept per statement, prepared.
            cur = conn.cached_cursor(q)
            await cur.execute(q, params, prepare=True)
            return await cur.fetchone() if rows else None

        row: tuple[Any, ...] | None = await self._backend._run(one)
        return row

    async def get(self, key: str) -> CacheEntry | None:
        row = await self._one("get", (key, self.now()))
        return None if row is None else CacheEntry(row[0], row[1], row[2], row[3])

    async def set(self, key: str, entry: CacheEntry) -> None:
        await self._one("set", (key, *entry), rows=False)

    async def delete(self, key: str) -> None:
        await self._one("delete", (key,), rows=False)

    async def purge(self, limit: int) -> int:
        now = self.now()
        row = await self._one("purge", (now, limit, now, limit))
        return 0 if row is None else int(row[0])

    # -- CacheFlights --

    @contextmanager
    def watch(self, key: str) -> Iterator[_Watch]:
        digest = key_digest(key)
        watch = _Watch()
        self._watches.setdefault(digest, set()).add(watch)
        try:
            yield watch
        finally:
            watches = self._watches.get(digest)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[digest]

    def on_notify(self, digest: str) -> None:
        """A ``k:<digest>`` notification from another process (or this one's `fill`)."""
        for watch in self._watches.get(digest, ()):
            watch.notify()

    async def lead(self, key: str, owner: str, until: float) -> tuple[bool, CacheEntry | None]:
        row = await self._one("lead", (key, owner, until, self.now()))
        assert row is not None  # a function with OUT parameters returns one row
        led, value, is_error, fresh_until, expires_at = row
        entry = None if value is None else CacheEntry(value, is_error, fresh_until, expires_at)
        return bool(led), entry

    async def fill(self, key: str, owner: str, entry: CacheEntry | None) -> None:
        digest = key_digest(key)
        payload = f"k:{digest}"
        if entry is None:
            await self._one("free", (key, owner, self._channel, payload))
        else:
            await self._one("fill", (key, *entry, key, owner, self._channel, payload))
        self.on_notify(digest)
