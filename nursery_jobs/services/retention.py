"""Retention: final jobs are deleted some time after they ended.

Every `retention_interval` the service deletes completed, cancelled and discarded jobs older
than their `keep_*` period, at most `RETENTION_BATCH` rows per call: each call is a short
transaction (no long lock, no statement timeout after downtime left a backlog), and it loops
until a batch comes back short. Discarded jobs are kept longest (7 days by default): they are
what an operator investigates. Expired cache entries go the same way, in batches of at most
`RETENTION_BATCH` (reads ignore them already, so how late they go never matters for a value).
Failures are logged and tried again at the next interval.
"""

from __future__ import annotations

import logging

import trio

from ..backends import Backend, CacheStore
from ..jobs import JobState

__all__ = ["RETENTION_BATCH", "Retention"]

log = logging.getLogger("nursery_jobs")

RETENTION_BATCH = 1000
"""Rows one retention call deletes at most."""


class Retention:
    name = "retention"

    def __init__(
        self,
        backend: Backend,
        *,
        interval: float,
        keep_completed: float,
        keep_cancelled: float,
        keep_discarded: float,
        cache: CacheStore | None = None,
    ) -> None:
        self._backend = backend
        self._cache = cache
        self._interval = interval
        self._keep = {
            JobState.COMPLETED: keep_completed,
            JobState.CANCELLED: keep_cancelled,
            JobState.DISCARDED: keep_discarded,
        }

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self._interval)
            await self.sweep()
            await self.purge_cache()

    async def sweep(self) -> int:
        """Delete what is old enough now, in batches; returns how many rows went."""
        backend = self._backend
        now = backend.now()
        before = {state: now - keep for state, keep in self._keep.items()}
        deleted = 0
        try:
            while True:
                batch = await backend.delete_finished(before, RETENTION_BATCH)
                deleted += batch
                if batch < RETENTION_BATCH:
                    break
                await trio.lowlevel.checkpoint()  # a backend whose call never yields (memory)
        except Exception:
            log.exception(
                "retention failed after deleting %d final jobs; retrying in %g s",
                deleted,
                self._interval,
                extra={"event": "retention_failed", "deleted": deleted, "backend": backend.url},
            )
        else:
            if deleted:
                log.info(
                    "retention deleted %d final jobs",
                    deleted,
                    extra={"event": "retention_deleted", "deleted": deleted, "backend": backend.url},
                )
        return deleted

    async def purge_cache(self) -> int:
        """Delete the cache's expired entries now, in batches; returns how many went."""
        cache = self._cache
        if cache is None:
            return 0
        purged = 0
        try:
            while True:
                batch = await cache.purge(RETENTION_BATCH)
                purged += batch
                if batch < RETENTION_BATCH:
                    break
                await trio.lowlevel.checkpoint()  # a store whose call never yields (memory)
        except Exception:
            log.exception(
                "cache purge failed after deleting %d expired entries; retrying in %g s",
                purged,
                self._interval,
                extra={"event": "cache_purge_failed", "deleted": purged, "backend": cache.url},
            )
        else:
            if purged:
                log.info(
                    "retention deleted %d expired cache entries",
                    purged,
                    extra={"event": "cache_purged", "deleted": purged, "backend": cache.url},
                )
        return purged
