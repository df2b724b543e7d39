"""A backend built outside `nursery_jobs/`: every call delegates to an inner backend.

It exists to prove the backend seam (`nursery_jobs.backends.protocol`): it reaches its inner
backend only through the public protocol (no private attribute), so whatever the runtime needs
of a backend is in that protocol, and a new backend outside the package (MariaDB, say) passes
the contract, conformance and property suites as this one does (`tests/outoftree/delegating.py`
registers it; `tests/contract/test_outoftree.py` runs the suites on it).

Every async call passes a real Trio checkpoint before it reaches the inner backend, as a call
over a network would: the backend therefore does not claim, as memory does, that no call ever
yields (`never_yields` is False), and the runtime's cancellation handling for durable backends
is what runs on it. The checkpoint comes before the call, never after it: the protocol wants each
call cancel-atomic (a cancellation once the inner backend made the change would report "not
done" for something done; `tests/contract/test_atomic.py` fails such a backend).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import trio

import nursery_jobs as nj
from nursery_jobs.backends import (
    CacheEntry,
    CacheStore,
    Caching,
    ClaimResult,
    HeartbeatResult,
    InsertResult,
    Listener,
    LockStore,
    NewJob,
    Outcome,
    QueueCounts,
    ScheduleState,
    ScheduleStore,
)

SCHEME = "delegate"


class DelegatingBackend:
    """A `nursery_jobs.Backend` made of `inner`, whose every call goes to `inner` after a
    checkpoint. Its URL is ``delegate://<inner url>``."""

    never_yields = False

    def __init__(self, inner: nj.Backend) -> None:
        self.inner = inner
        self.url = f"{SCHEME}://{inner.url}"
        self.poll_interval = inner.poll_interval
        self.calls = 0
        self._cache: DelegatingCacheStore | None = None
        """Async protocol calls made through this backend: a test can tell it was used."""

    async def _step(self) -> None:
        self.calls += 1
        await trio.lowlevel.checkpoint()

    def now(self) -> float:
        return self.inner.now()

    def wall_offset(self) -> float:
        return self.inner.wall_offset()

    async def open(self) -> None:
        await self._step()
        await self.inner.open()

    async def close(self) -> None:
        await self._step()
        await self.inner.close()

    def check_budget(self, workers: int) -> None:
        self.inner.check_budget(workers)

    async def insert_many(self, jobs: Sequence[NewJob], bounds: Mapping[str, int] | None = None) -> list[InsertResult]:
        await self._step()
        return await self.inner.insert_many(jobs, bounds)

    async def claim(self, queue: str, limit: int, *, max_running: int | None = None) -> ClaimResult:
        await self._step()
        return await self.inner.claim(queue, limit, max_running=max_running)

    async def finish_many(self, outcomes: Sequence[Outcome]) -> None:
        await self._step()
        await self.inner.finish_many(outcomes)

    async def cancel(self, job_id: int) -> nj.JobState:
        await self._step()
        return await self.inner.cancel(job_id)

    async def heartbeat(self, running: Sequence[tuple[int, int]]) -> HeartbeatResult:
        await self._step()
        return await self.inner.heartbeat(running)

    async def rescue(self, stale_before: float) -> list[int]:
        await self._step()
        return await self.inner.rescue(stale_before)

    async def delete_finished(self, before: Mapping[nj.JobState, float], limit: int) -> int:
        await self._step()
        return await self.inner.delete_finished(before, limit)

    async def get_job(self, job_id: int) -> nj.Job:
        await self._step()
        return await self.inner.get_job(job_id)

    async def stats(self) -> Mapping[str, QueueCounts]:
        await self._step()
        return await self.inner.stats()

    def add_listener(self, listener: Listener) -> None:
        self.inner.add_listener(listener)

    def remove_listener(self, listener: Listener) -> None:
        self.inner.remove_listener(listener)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._step()
        await self.inner.serve(task_status=task_status)

    # -- ScheduleStore: a capability of its own, delegated the same way --

    def _schedules(self) -> ScheduleStore:
        assert isinstance(self.inner, ScheduleStore), f"{self.url}: the inner backend does not store schedules"
        return self.inner

    async def schedule_states(self, names: Sequence[str]) -> Mapping[str, ScheduleState]:
        await self._step()
        return await self._schedules().schedule_states(names)

    async def enqueue_tick(
        self, name: str, tick: float, job: NewJob, bounds: Mapping[str, int] | None = None
    ) -> InsertResult | None:
        await self._step()
        return await self._schedules().enqueue_tick(name, tick, job, bounds)


    # -- LockStore --

    def _lock_store(self) -> LockStore:
        assert isinstance(self.inner, LockStore), f"{self.url}: the inner backend has no locks"
        return self.inner

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> int | None:
        await self._step()
        return await self._lock_store().acquire_lock(name, owner, ttl)

    async def renew_lock(self, name: str, owner: str, ttl: float) -> bool:
        await self._step()
        return await self._lock_store().renew_lock(name, owner, ttl)

    async def release_lock(self, name: str, owner: str) -> None:
        await self._step()
        await self._lock_store().release_lock(name, owner)

    # -- Caching: a store of its own over the inner backend's, made once --

    def cache_store(self) -> CacheStore:
        if self._cache is None:
            inner = self.inner
            assert isinstance(inner, Caching), f"{self.url}: the inner backend has no cache"
            self._cache = DelegatingCacheStore(self.url, inner.cache_store())
        return self._cache


class DelegatingCacheStore:
    """A `CacheStore` whose every call goes to `inner` after a checkpoint, as the backend's do.
    It does not hand on `CacheFlights` (one computation across processes): a backend without it
    still passes the suites, single-flight then holding within each process only."""

    never_yields = False

    def __init__(self, url: str, inner: CacheStore) -> None:
        self.url = url
        self.inner = inner
        self.shared = inner.shared

    def now(self) -> float:
        return self.inner.now()

    async def get(self, key: str) -> CacheEntry | None:
        await trio.lowlevel.checkpoint()
        return await self.inner.get(key)

    async def set(self, key: str, entry: CacheEntry) -> None:
        await trio.lowlevel.checkpoint()
        await self.inner.set(key, entry)

    async def delete(self, key: str) -> None:
        await trio.lowlevel.checkpoint()
        await self.inner.delete(key)

    async def purge(self, limit: int) -> int:
        await trio.lowlevel.checkpoint()
        return await self.inner.purge(limit)


def open_delegate(url: str) -> nj.Backend:
    """``delegate://<inner url>``: a `DelegatingBackend` over ``nj.open_backend(<inner url>)``."""
    prefix = f"{SCHEME}://"
    inner = url[len(prefix):] if url.startswith(prefix) else ""
    if "://" not in inner:
        raise nj.ConfigError(f"a delegate URL wraps another backend's URL, such as 'delegate://memory://', not {url!r}")
    return DelegatingBackend(nj.open_backend(inner))
