"""`CacheStore` (and `CacheFlights` where a backend has it): an entry is read until it expires
and never after, replaced whole, deleted idempotently, purged in bounded batches oldest first,
its JSON text kept exactly, and shared by every instance on one store; a key's flight has one
owner at a time across instances, is given back when the entry it would compute is there, frees
itself when it expires, and its fill wakes the key's watchers in other instances."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import CacheEntry, CacheFlights, CacheStore, Caching

from .common import opened


@pytest.fixture(autouse=True)
def _has_cache(make_backend: Any) -> None:
    """A capability of its own: a backend without it is not held to it (the package's backends
    all have it: `tests/unit/test_cache.py` runs on memory, the conformance suite on each)."""
    if not isinstance(make_backend(), Caching):
        pytest.skip("this backend has no cache (it does not implement Caching)")


def cache_of(backend: nj.Backend) -> CacheStore:
    assert isinstance(backend, Caching)
    store = backend.cache_store()
    assert isinstance(store, CacheStore) and store is backend.cache_store()
    return store


def entry(store: CacheStore, fresh: float, expires: float, value: str = '{"a":1}', error: bool = False) -> CacheEntry:
    now = store.now()
    return CacheEntry(value, error, now + fresh, now + expires)


async def test_an_entry_is_read_until_it_expires_and_never_after(make_backend: Any, autojump_clock: Any) -> None:
    async with opened(make_backend) as backend:
        store = cache_of(backend)
        assert await store.get("k") is None
        written = entry(store, 10, 20)
        await store.set("k", written)
        assert await store.get("k") == written
        await trio.sleep(15)  # stale: still read; what stale means is the cache's business
        assert await store.get("k") == written
        await trio.sleep(6)
        assert await store.get("k") is None  # expired, purged or not


async def test_a_set_replaces_the_whole_entry_and_a_delete_is_idempotent(make_backend: Any, autojump_clock: Any) -> None:
    async with opened(make_backend) as backend:
        store = cache_of(backend)
        await store.set("k", entry(store, 10, 10, '"old"'))
        replaced = entry(store, 5, 50, '{"error":"x"}', error=True)
        await store.set("k", replaced)
        assert await store.get("k") == replaced
        await store.set("other", entry(store, 10, 10))
        await store.delete("k")
        await store.delete("k")
        await store.delete("never-there")
        assert await store.get("k") is None and await store.get("other") is not None


@pytest.mark.parametrize(
    "text",
    [
        '"plain"',
        '{"nested":[1,2.5,-0.0,1e16,null,true,{"k":"v"}],"big":123456789012345678901234567890}',
        '"\\u00e9\\u4e2d\\ud83d\\ude00 and a lone surrogate \\udcff and NUL \\u0000"',
        '"' + "x" * 200_000 + '"',
    ],
)
async def test_the_text_comes_back_exactly(make_backend: Any, autojump_clock: Any, text: str) -> None:
    async with opened(make_backend) as backend:
        store = cache_of(backend)
        await store.set("k", entry(store, 10, 10, text))
        got = await store.get("k")
        assert got is not None and got.value == text


async def test_purge_deletes_only_expired_entries_at_most_limit_a_call_oldest_first(make_backend: Any, autojump_clock: Any) -> None:
    async with opened(make_backend) as backend:
        store = cache_of(backend)
        for i in range(5):
            await store.set(f"old{i}", entry(store, 1 + i, 1 + i))
        await store.set("stale", entry(store, 1, 1000))  # stale, not expired: kept
        await store.set("fresh", entry(store, 1000, 1000))
        await trio.sleep(10)
        await store.set("old-again", entry(store, 1, 1))  # written after: expires last
        await trio.sleep(2)
        assert await store.purge(2) == 2
        assert await store.purge(2) == 2
        assert await store.purge(10) == 2
        assert await store.purge(10) == 0
        assert await store.get("stale") is not None and await store.get("fresh") is not None


async def test_instances_on_one_store_share_entries(store: Any, autojump_clock: Any) -> None:
    one, two = store.open(), store.open()
    await one.open()
    await two.open()
    try:
        a, b = cache_of(one), cache_of(two)
        assert a.shared and b.shared
        written = entry(a, 60, 60)
        await a.set("k", written)
        assert await b.get("k") == written
        await b.delete("k")
        assert await a.get("k") is None
    finally:
        await one.close()
        await two.close()


async def test_the_store_is_usable_again_after_its_backend_reopens(make_backend: Any, autojump_clock: Any) -> None:
    backend = make_backend()
    await backend.open()
    store = cache_of(backend)
    await store.set("k", entry(store, 60, 60))
    await backend.close()
    await backend.open()
    try:
        assert cache_of(backend) is store
        assert await store.get("k") is not None  # as a backend's jobs, its entries outlive a close
    finally:
        await backend.close()


# -- CacheFlights --


def flights_of(backend: nj.Backend) -> CacheFlights:
    store = cache_of(backend)
    if not isinstance(store, CacheFlights):
        pytest.skip("this backend's cache has no flights across processes (CacheFlights)")
    return store


async def test_a_flight_has_one_owner_until_filled_freed_or_expired(store: Any, autojump_clock: Any) -> None:
    one, two = store.open(), store.open()
    await one.open()
    await two.open()
    try:
        a, b = flights_of(one), flights_of(two)
        now = cache_of(one).now()
        assert await a.lead("k", "A", now + 30) == (True, None)
        assert await b.lead("k", "B", now + 30) == (False, None)
        assert (await a.lead("k", "A", now + 30))[0]  # its owner takes it again
        filled = entry(cache_of(one), 60, 60, '"v"')
        await a.fill("k", "A", filled)
        # Filled: nobody leads it, and the entry comes with the answer.
        assert await b.lead("k", "B", now + 30) == (False, filled)
        assert await a.lead("k", "A", now + 30) == (False, filled)
        # Freed without an entry (the computation failed): the next caller leads.
        assert (await a.lead("f", "A", now + 30))[0]
        await a.fill("f", "A", None)
        assert (await b.lead("f", "B", now + 30))[0]
        # A fill by another owner stores its entry but does not free the owner's flight.
        assert (await a.lead("g", "A", now + 30))[0]
        await b.fill("g", "B", None)
        assert not (await b.lead("g", "B", now + 30))[0]
        # A flight whose owner died frees itself at its `until`.
        assert (await a.lead("x", "A", now + 5))[0]
        await trio.sleep(6)
        assert (await b.lead("x", "B", cache_of(two).now() + 30))[0]
        # A stale entry is led (refreshed) and comes with the answer.
        stale = entry(cache_of(one), 1, 600, '"old"')
        await a.set("s", stale)
        await trio.sleep(2)
        assert await b.lead("s", "B", cache_of(two).now() + 30) == (True, stale)
    finally:
        await one.close()
        await two.close()


async def test_concurrent_leads_of_a_free_flight_make_one_owner(store: Any) -> None:
    backends = [store.open() for _ in range(4)]
    for backend in backends:
        await backend.open()
    try:
        flights = [flights_of(backend) for backend in backends]
        now = cache_of(backends[0]).now()
        won: list[bool] = []

        async def lead(i: int) -> None:
            won.append((await flights[i % 4].lead("k", f"owner{i}", now + 30))[0])

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(lead, i)
        assert sorted(won) == [False] * 19 + [True]
    finally:
        for backend in backends:
            await backend.close()


async def test_a_fill_wakes_the_watchers_of_its_key_in_another_instance(store: Any) -> None:
    one, two = store.open(), store.open()
    await one.open()
    await two.open()
    try:
        a, b = flights_of(one), flights_of(two)
        async with trio.open_nursery() as nursery:
            await nursery.start(two.serve)  # the LISTEN connection notifications come through
            with b.watch("k") as watch, b.watch("other") as other:
                await a.fill("k", "A", entry(cache_of(one), 60, 60))
                with trio.fail_after(10):
                    await watch.wait()
                with trio.move_on_after(0.5) as quiet:
                    await other.wait()
                assert quiet.cancelled_caught  # only the key's own watchers wake
                await a.fill("k", "A", None)  # a free wakes them too
                with trio.fail_after(10):
                    await watch.wait()
            nursery.cancel_scope.cancel()
    finally:
        await one.close()
        await two.close()
