"""The memory backend's cache store: this process's entries in a dict, bounded.

Entries are kept as the JSON text `nursery_jobs.cache` encoded, so a value that would not survive
a durable store does not survive here either (a test on memory fails where production would).
The dict is ordered by last use, and past `max_entries` the least recently used entry goes:
an embedded service's cache cannot grow without bound whatever its keys. Expired entries are
never returned, dropped when read, and purged by expiry from a heap (entries a later write
replaced leave stale heap items, skipped when popped; the heap is rebuilt once it holds more
than twice the entries).

Every call is atomic with respect to other Trio tasks and never yields (`never_yields`), as the
memory backend's own calls: a hit costs a dict lookup.
"""

from __future__ import annotations

import collections
import heapq
from typing import Callable

from .protocol import CacheEntry

__all__ = ["MAX_ENTRIES", "MemoryCacheStore"]

MAX_ENTRIES = 100_000
"""Entries a memory cache keeps at most (the least recently used go first): at ~1 KB an entry,
about 100 MB."""


class MemoryCacheStore:
    """Cache entries in this process (`CacheStore`)."""

    shared = False
    never_yields = True

    def __init__(self, clock: Callable[[], float], *, url: str = "memory://", max_entries: int = MAX_ENTRIES) -> None:
        self.url = url
        self._clock = clock
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[str, CacheEntry] = collections.OrderedDict()
        self._expiry: list[tuple[float, str]] = []

    def __repr__(self) -> str:
        return f"<MemoryCacheStore entries={len(self._entries)}>"

    def now(self) -> float:
        return self._clock()

    async def get(self, key: str) -> CacheEntry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires_at <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return entry

    async def set(self, key: str, entry: CacheEntry) -> None:
        entries = self._entries
        entries[key] = entry
        entries.move_to_end(key)
        heapq.heappush(self._expiry, (entry.expires_at, key))
        while len(entries) > self.max_entries:
            entries.popitem(last=False)
        if len(self._expiry) > 2 * len(entries) + 1_000:
            self._expiry = [(e.expires_at, k) for k, e in entries.items()]
            heapq.heapify(self._expiry)

    async def delete(self, key: str) -> None:
        self._entries.pop(key, None)

    async def purge(self, limit: int) -> int:
        now = self._clock()
        entries, heap = self._entries, self._expiry
        purged = 0
        while heap and heap[0][0] <= now and purged < limit:
            expires_at, key = heapq.heappop(heap)
            entry = entries.get(key)
            if entry is not None and entry.expires_at == expires_at:
                del entries[key]
                purged += 1
        return purged
