"""`rt.cache` end to end on every backend: what one runtime stores another on the same store
reads; one computation per key for many callers; cached errors; a stale value refreshed once;
retention purging expired entries in batches; the self-check."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import Caching


def _instances(test_backend: Any, request: Any) -> list[nj.Backend]:
    made = test_backend.new_store(request)
    first = made.open()
    return [first, made.open()] if made.shared else [first, first]


async def test_what_one_runtime_caches_another_on_the_store_reads(test_backend, request, autojump_clock) -> None:
    a, b = _instances(test_backend, request)
    app = nj.App()
    app.cache_keys(namespace="svc", version="3")
    async with nj.open_runtime(app, backend=a, queues=[]) as rt_a, nj.open_runtime(app, backend=b, queues=[]) as rt_b:
        await rt_a.cache.set("user:1", {"name": "Ann", "tags": ["a", "é"], "n": 1e16}, ttl=60)
        assert await rt_b.cache.get("user:1") == {"name": "Ann", "tags": ["a", "é"], "n": 1e16}
        await rt_b.cache.delete("user:1")
        assert await rt_a.cache.get("user:1", "gone") == "gone"
        other = nj.App()
        other.cache_keys(namespace="svc", version="4")  # a deploy that changed what values mean
        await rt_a.cache.set("user:2", "v3", ttl=60)
        async with nj.open_runtime(other, backend=b, queues=[]) as rt_v4:
            assert await rt_v4.cache.get("user:2") is None


async def test_many_callers_make_one_computation_and_an_error_is_kept_for_error_ttl(make_backend, autojump_clock) -> None:
    calls = 0

    async def compute() -> dict[str, int]:
        nonlocal calls
        calls += 1
        await trio.sleep(1)
        return {"calls": calls}

    async def missing() -> None:
        nonlocal calls
        calls += 1
        raise LookupError("no repository 9")

    got: list[Any] = []
    async with nj.open_runtime(nj.App(), backend=make_backend(), queues=[]) as rt:

        async def call() -> None:
            got.append(await rt.cache.get_or_compute("cold", compute, ttl=60))

        async with trio.open_nursery() as nursery:
            for _ in range(200):
                nursery.start_soon(call)
        assert calls == 1 and got == [{"calls": 1}] * 200
        calls = 0
        with pytest.raises(LookupError):
            await rt.cache.get_or_compute("repo:9", missing, ttl=60, error_ttl=30)
        with pytest.raises(nj.CachedError) as cached:
            await rt.cache.get_or_compute("repo:9", missing, ttl=60, error_ttl=30)
        assert calls == 1 and cached.value.matches(LookupError) and cached.value.message == "no repository 9"


async def test_a_stale_value_is_served_and_refreshed_once(make_backend, autojump_clock) -> None:
    versions = iter(["v1", "v2", "v3"])
    calls = 0

    async def compute() -> str:
        nonlocal calls
        calls += 1
        await trio.sleep(2)
        return next(versions)

    async with nj.open_runtime(nj.App(), backend=make_backend(), queues=[]) as rt:
        assert await rt.cache.get_or_compute("k", compute, ttl=5, stale_ttl=100) == "v1"
        await trio.sleep(6)
        assert [await rt.cache.get_or_compute("k", compute, ttl=5, stale_ttl=100) for _ in range(5)] == ["v1"] * 5
        await trio.sleep(3)
        assert calls == 2
        assert await rt.cache.get("k") == "v2"


async def test_retention_purges_expired_entries_in_batches_and_keeps_the_rest(make_backend, autojump_clock) -> None:
    backend = make_backend()
    assert isinstance(backend, Caching)
    settings = nj.RuntimeSettings(retention_interval=5)
    async with nj.open_runtime(nj.App(), backend=backend, queues=[], settings=settings) as rt:
        for i in range(2_500):  # more than one batch of 1,000
            await rt.cache.set(f"short:{i}", i, ttl=1)
        await rt.cache.set("long", "kept", ttl=3600)
        await rt.cache.get_or_compute("stale", lambda: _value("old"), ttl=1, stale_ttl=3600)
        await trio.sleep(6)
        assert await backend.cache_store().purge(10_000) == 0  # retention took them already
        assert await rt.cache.get("long") == "kept"
        assert await rt.cache.get_or_compute("stale", lambda: _value("new"), ttl=1, stale_ttl=3600) == "old"


async def _value(v: Any) -> Any:
    return v


async def test_the_self_check_makes_a_round_trip(make_backend, autojump_clock) -> None:
    async with nj.open_runtime(nj.App(), backend=make_backend(), queues=[]) as rt:
        check = await rt.cache.check()
        assert check.ok and check.error is None and check.seconds >= 0 and check.backend == rt.backend.url
