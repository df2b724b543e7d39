"""`rt.cache` on virtual time (the memory backend): one computation per key however many callers,
the leader's value or exception for every waiter, a cancelled leader handing over at once, waits
bounded by `wait_timeout`, cached errors, stale values served while one task refreshes them, the
request cache and its lifetime guard, safe keys, the JSON rule, `check()`, the decorator.

The backend-independent rules live in `nursery_jobs.cache`, so they are tested here once; what a
store must do is `tests/contract/test_cache_store.py`'s, on every backend."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs.backends import CacheEntry
from nursery_jobs.backends.cache_memory import MemoryCacheStore


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class Counted:
    """A computation that takes `seconds` and counts its calls (and the ones running now)."""

    def __init__(self, seconds: float = 1.0, value: Any = None, error: Exception | None = None) -> None:
        self.seconds = seconds
        self.value = value
        self.error = error
        self.calls = 0
        self.started: list[float] = []

    async def __call__(self) -> Any:
        self.calls += 1
        self.started.append(trio.current_time())
        await trio.sleep(self.seconds)
        if self.error is not None:
            raise self.error
        return {"n": self.calls} if self.value is None else self.value


async def test_a_thousand_callers_of_a_cold_key_make_one_computation_and_each_gets_a_copy(autojump_clock: Any) -> None:
    compute = Counted(seconds=2.0)
    got: list[Any] = []
    async with nj.open_runtime(nj.App()) as rt:
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(1000):
                nursery.start_soon(lambda: _append(got, rt.cache.get_or_compute("cold", compute, ttl=60)))
        assert trio.current_time() - start == pytest.approx(2.0)
        assert compute.calls == 1
        assert len(got) == 1000 and all(v == {"n": 1} for v in got)
        assert len({id(v) for v in got}) == 1000  # each waiter decoded its own copy
        assert await rt.cache.get_or_compute("cold", compute, ttl=60) == {"n": 1}  # a hit now
        assert compute.calls == 1


async def _append(out: list[Any], call: Any) -> None:
    out.append(await call)


async def test_waiters_get_the_leaders_exception_itself_and_it_is_not_kept_without_error_ttl(autojump_clock: Any) -> None:
    boom = LookupError("no such repository")
    compute = Counted(error=boom)
    raised: list[BaseException] = []

    async def call(rt: nj.Runtime) -> None:
        try:
            await rt.cache.get_or_compute("repo:1", compute, ttl=60)
        except LookupError as exc:
            raised.append(exc)

    async with nj.open_runtime(nj.App()) as rt:
        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(call, rt)
        assert compute.calls == 1
        assert len(raised) == 50 and all(e is boom for e in raised)
        with pytest.raises(LookupError):
            await rt.cache.get_or_compute("repo:1", compute, ttl=60)
        assert compute.calls == 2  # not kept: the next caller computes again


async def test_an_error_kept_for_error_ttl_comes_back_as_a_cached_error_with_its_class_and_message(autojump_clock: Any) -> None:
    compute = Counted(error=KeyError("user 7"))
    async with nj.open_runtime(nj.App()) as rt:
        with pytest.raises(KeyError):  # the computing caller gets its own exception
            await rt.cache.get_or_compute("user:7", compute, ttl=60, error_ttl=10)
        with pytest.raises(nj.CachedError) as caught:
            await rt.cache.get_or_compute("user:7", compute, ttl=60, error_ttl=10)
        assert compute.calls == 1
        cached = caught.value
        assert (cached.key, cached.type_name, cached.message) == ("user:7", "builtins.KeyError", "'user 7'")
        assert cached.matches(KeyError) and cached.matches(LookupError) and not cached.matches(ValueError)
        assert "KeyError: 'user 7' (a cached error of key 'user:7')" == str(cached)
        assert cached.__traceback__ is not None and cached.__cause__ is None and cached.__context__ is None
        with pytest.raises(nj.CachedError):
            await rt.cache.get("user:7")  # a plain get sees it too
        await trio.sleep(10)
        with pytest.raises(KeyError):
            await rt.cache.get_or_compute("user:7", compute, ttl=60, error_ttl=10)
        assert compute.calls == 2


async def test_only_the_errors_named_in_cache_errors_are_kept(autojump_clock: Any) -> None:
    timeout = Counted(error=TimeoutError("upstream slow"))
    async with nj.open_runtime(nj.App()) as rt:
        for _ in range(2):
            with pytest.raises(TimeoutError):
                await rt.cache.get_or_compute("k", timeout, ttl=60, error_ttl=30, cache_errors=(LookupError,))
        assert timeout.calls == 2


async def test_a_cancelled_leader_hands_over_at_once_and_its_waiters_are_not_cancelled(autojump_clock: Any) -> None:
    compute = Counted(seconds=5.0)
    got: list[Any] = []
    async with nj.open_runtime(nj.App()) as rt:
        async with trio.open_nursery() as nursery:
            leader = trio.CancelScope()

            async def lead() -> None:
                with leader:
                    await rt.cache.get_or_compute("k", compute, ttl=60, wait_timeout=30)

            nursery.start_soon(lead)
            await trio.sleep(0.1)
            for _ in range(10):
                nursery.start_soon(lambda: _append(got, rt.cache.get_or_compute("k", compute, ttl=60, wait_timeout=30)))
            await trio.sleep(1.0)
            leader.cancel()
        assert leader.cancelled_caught
        assert compute.calls == 2
        # The second computation started when the leader was cancelled, not after any wait.
        assert compute.started[1] - compute.started[0] == pytest.approx(1.1)
        assert got == [{"n": 2}] * 10


async def test_a_wait_past_wait_timeout_raises_or_computes_as_asked(autojump_clock: Any) -> None:
    compute = Counted(seconds=10.0)
    async with nj.open_runtime(nj.App()) as rt:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: rt.cache.get_or_compute("k", compute, ttl=60))
            await trio.sleep(0.5)
            start = trio.current_time()
            with pytest.raises(nj.CacheWaitTimeout, match=r"did not end within wait_timeout \(2 s\)"):
                await rt.cache.get_or_compute("k", compute, ttl=60, wait_timeout=2)
            assert trio.current_time() - start == pytest.approx(2.0)
            assert compute.calls == 1
            value = await rt.cache.get_or_compute("k", compute, ttl=60, wait_timeout=2, on_wait_timeout="compute")
            assert value == {"n": 2} and compute.calls == 2


async def test_a_stale_value_is_served_at_once_while_one_task_of_the_runtime_refreshes_it(autojump_clock: Any) -> None:
    compute = Counted(seconds=3.0)
    async with nj.open_runtime(nj.App()) as rt:
        assert await rt.cache.get_or_compute("k", compute, ttl=10, stale_ttl=60) == {"n": 1}
        await trio.sleep(11)  # stale now
        start = trio.current_time()
        served = [await rt.cache.get_or_compute("k", compute, ttl=10, stale_ttl=60) for _ in range(20)]
        assert trio.current_time() == start  # none of them waited
        assert served == [{"n": 1}] * 20
        await trio.sleep(3.5)
        assert compute.calls == 2  # one refresh for the twenty stale hits
        assert await rt.cache.get_or_compute("k", compute, ttl=10, stale_ttl=60) == {"n": 2}
        assert await rt.cache.get("k") == {"n": 2}
        await trio.sleep(75)  # past ttl + stale_ttl: gone, a miss that waits
        start = trio.current_time()
        assert await rt.cache.get_or_compute("k", compute, ttl=10, stale_ttl=60) == {"n": 3}
        assert trio.current_time() - start == pytest.approx(3.0)


async def test_a_failed_refresh_keeps_the_stale_value_and_is_logged(autojump_clock: Any, caplog: Any) -> None:
    good = Counted(seconds=0.5, value="v1")
    bad = Counted(seconds=0.5, error=RuntimeError("upstream down"))
    async with nj.open_runtime(nj.App()) as rt:
        await rt.cache.get_or_compute("k", good, ttl=10, stale_ttl=60, error_ttl=30)
        await trio.sleep(11)
        with caplog.at_level(logging.WARNING, "nursery_jobs"):
            assert await rt.cache.get_or_compute("k", bad, ttl=10, stale_ttl=60, error_ttl=30) == "v1"
            await trio.sleep(1)
        assert bad.calls == 1
        assert [r.event for r in caplog.records if getattr(r, "event", "") == "cache_refresh_failed"] == [
            "cache_refresh_failed"
        ]
        assert "upstream down" in caplog.text
        # The error was not kept over the stale value (no error_ttl for a refresh).
        assert await rt.cache.get_or_compute("k", bad, ttl=10, stale_ttl=60, error_ttl=30) == "v1"


async def test_a_refresh_runs_without_the_callers_request_cache_and_stops_at_shutdown(autojump_clock: Any) -> None:
    seen: list[Any] = []
    never = trio.Event()

    async def hangs() -> str:
        seen.append(nj.cache._request.get())
        await never.wait()
        return "never"

    async with nj.open_runtime(nj.App(), grace=0) as rt:
        await rt.cache.set("k", "old", ttl=1)
        await rt.cache.get_or_compute("k2", lambda: _value("v"), ttl=1, stale_ttl=600)
        await trio.sleep(2)
        with rt.cache.request_scope():
            assert await rt.cache.get_or_compute("k2", hangs, ttl=1, stale_ttl=600, wait_timeout=3600) == "v"
        await trio.sleep(1)
        assert seen == [None]
        stopping = trio.current_time()
    assert trio.current_time() - stopping < 5  # the hanging refresh did not hold the shutdown


async def _value(v: Any) -> Any:
    return v


async def test_the_request_cache_reads_a_key_once_per_request_in_its_own_task(autojump_clock: Any) -> None:
    backend = nj.MemoryBackend()
    reads: list[str] = []
    store = backend.cache_store()
    real_get = store.get

    async def counting_get(key: str) -> Any:
        reads.append(key)
        return await real_get(key)

    store.get = counting_get  # type: ignore[method-assign]
    async with nj.open_runtime(nj.App(), backend=backend) as rt:
        await rt.cache.set("perm", {"admin": True}, ttl=60)
        with rt.cache.request_scope() as rc:
            first = await rt.cache.get_or_compute("perm", Counted(), ttl=60)
            again = await rt.cache.get_or_compute("perm", Counted(), ttl=60)
            assert first is again and len(reads) == 1
            child: list[Any] = []
            async with trio.open_nursery() as nursery:  # another task: not implicitly
                nursery.start_soon(lambda: _append(child, rt.cache.get_or_compute("perm", Counted(), ttl=60)))
            assert len(reads) == 2
            await rt.cache.delete("perm")  # a write drops the request's copy
            assert await rt.cache.get_or_compute("perm", Counted(value="recomputed"), ttl=60) == "recomputed"
            memo = Counted(seconds=0, value=object())  # the request's own: any object, computed once
            assert await rc.get_or_compute("x", memo) is await rc.get_or_compute("x", memo)
            assert memo.calls == 1
        reads.clear()
        await rt.cache.get_or_compute("perm", Counted(), ttl=60)
        assert len(reads) == 1  # no scope, no request cache


async def test_a_request_cache_used_past_its_lifetime_warns_and_serves_nothing(autojump_clock: Any, caplog: Any) -> None:
    async with nj.open_runtime(nj.App()) as rt:
        with rt.cache.request_scope() as rc:
            memo = Counted(seconds=0, value="v")
            await rc.get_or_compute("x", memo)
            await trio.sleep(301)
            with caplog.at_level(logging.WARNING, "nursery_jobs"):
                await rc.get_or_compute("x", memo)
                await rc.get_or_compute("x", memo)
            assert memo.calls == 3
            assert [r for r in caplog.records if getattr(r, "event", "") == "request_cache_expired"] != []
            assert len([r for r in caplog.records if getattr(r, "event", "") == "request_cache_expired"]) == 1


async def test_keys_are_namespaced_versioned_and_long_or_unsafe_ones_hashed(autojump_clock: Any) -> None:
    app = nj.App()
    app.cache_keys(namespace="shop", version="7")
    async with nj.open_runtime(app) as rt:
        assert rt.cache.key("user:1") == "shop:7:s-user:1"
        long = "q:" + "x" * 300
        hashed = rt.cache.key(long)
        assert hashed.startswith("shop:7:h-q:xxxxxxxx") and len(hashed) == len("shop:7:h-") + 40 + 1 + 64
        mail = rt.cache.key("avatar:ann@example.com visible")
        assert mail.startswith("shop:7:h-avatar:ann@example.com_visible-")
        assert rt.cache.key("h-" + "0" * 64) != rt.cache.key("\x00")  # the marks keep them apart
        assert rt.cache.key("é") != rt.cache.key("e")
        await rt.cache.set(long, 1, ttl=5)
        assert await rt.cache.get(long) == 1
    other = nj.App()
    other.cache_keys(namespace="shop", version="8")
    async with nj.open_runtime(other) as rt:
        assert rt.cache.key("user:1") == "shop:8:s-user:1"


@pytest.mark.parametrize("namespace", ["", "a:b", "x" * 65, "sp ace", "é"])
def test_a_bad_namespace_is_a_config_error(namespace: str) -> None:
    with pytest.raises(nj.ConfigError, match="cache namespace"):
        nj.App().cache_keys(namespace=namespace)


@pytest.mark.parametrize(
    "value, needle",
    [((1, 2), "do not survive a JSON round trip"), ({1: "a"}, "do not survive"), (float("nan"), "not JSON"), (object(), "not JSON")],
)
async def test_a_value_that_is_not_json_is_refused_as_on_every_backend(autojump_clock: Any, value: Any, needle: str) -> None:
    async with nj.open_runtime(nj.App()) as rt:
        with pytest.raises(nj.ArgsError, match=f"a cache value.*{needle}|{needle}"):
            await rt.cache.set("k", value, ttl=5)
        with pytest.raises(nj.ArgsError):
            await rt.cache.get_or_compute("k", lambda: _value(value), ttl=5)
        assert await rt.cache.get("k") is None


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"ttl": 0}, "ttl must be"),
        ({"ttl": True}, "ttl must be"),
        ({"ttl": float("inf")}, "ttl must be"),
        ({"ttl": 5, "error_ttl": -1}, "error_ttl must be"),
        ({"ttl": 5, "wait_timeout": 0}, "wait_timeout must be"),
        ({"ttl": 5, "on_wait_timeout": "wait"}, "on_wait_timeout must be"),
        ({"ttl": 5, "cache_errors": KeyboardInterrupt}, "cache_errors must be"),
    ],
)
async def test_bad_settings_are_config_errors(autojump_clock: Any, kwargs: dict[str, Any], needle: str) -> None:
    async with nj.open_runtime(nj.App()) as rt:
        with pytest.raises(nj.ConfigError, match=needle):
            await rt.cache.get_or_compute("k", lambda: _value(1), **kwargs)
        with pytest.raises(nj.ConfigError, match=needle):
            nj.cached(**kwargs)


class FailingStore(MemoryCacheStore):
    """A store whose every call fails (`fail`) or takes `delay` seconds."""

    never_yields = False

    def __init__(self, *, fail: bool = False, delay: float = 0.0) -> None:
        super().__init__(trio.current_time)
        self.fail, self.delay = fail, delay

    async def _act(self) -> None:
        await trio.sleep(self.delay)
        if self.fail:
            raise nj.BackendUnavailable("the cache store is down")

    async def get(self, key: str) -> CacheEntry | None:
        await self._act()
        return await super().get(key)

    async def set(self, key: str, entry: CacheEntry) -> None:
        await self._act()
        await super().set(key, entry)

    async def delete(self, key: str) -> None:
        await self._act()
        await super().delete(key)


class WithStore(nj.MemoryBackend):
    def __init__(self, store: MemoryCacheStore) -> None:
        super().__init__()
        self._store = store

    def cache_store(self) -> MemoryCacheStore:
        return self._store


async def test_a_failing_store_is_logged_once_and_the_value_computed_without_it(autojump_clock: Any, caplog: Any) -> None:
    compute = Counted(seconds=0.1, value="v")
    async with nj.open_runtime(nj.App(), backend=WithStore(FailingStore(fail=True))) as rt:
        with caplog.at_level(logging.WARNING, "nursery_jobs"):
            assert [await rt.cache.get_or_compute("k", compute, ttl=60) for _ in range(3)] == ["v"] * 3
        assert compute.calls == 3
        assert len([r for r in caplog.records if getattr(r, "event", "") == "cache_unavailable"]) == 1
        with pytest.raises(nj.BackendUnavailable):
            await rt.cache.get("k")  # a plain call says so


async def test_a_slow_store_is_not_waited_for_longer_than_its_bound(autojump_clock: Any) -> None:
    async with nj.open_runtime(nj.App(), backend=WithStore(FailingStore(delay=60))) as rt:
        start = trio.current_time()
        assert await rt.cache.get_or_compute("k", Counted(seconds=0, value="v"), ttl=60) == "v"
        assert trio.current_time() - start == pytest.approx(2 * nj.cache.STORE_BOUND)  # the read, then the write


async def test_check_times_a_round_trip_and_reports_slow_and_failing_stores(autojump_clock: Any) -> None:
    async with nj.open_runtime(nj.App()) as rt:
        ok = await rt.cache.check()
        assert ok.ok and not ok.slow and ok.error is None and ok.slow_threshold == 0.030 and ok.backend == "memory://"
        assert await rt.cache.get("nursery_jobs.check") is None  # it leaves nothing behind
    async with nj.open_runtime(nj.App(), backend=WithStore(FailingStore(fail=True))) as rt:
        down = await rt.cache.check()
        assert not down.ok and "the cache store is down" in (down.error or "")
    async with nj.open_runtime(nj.App(), backend=WithStore(FailingStore(delay=10))) as rt:
        hung = await rt.cache.check(timeout=1)
        assert not hung.ok and hung.error == "no answer within 1 s"


async def test_the_decorator_keys_by_arguments_and_invalidates(autojump_clock: Any) -> None:
    calls: list[tuple[int, str]] = []

    @nj.cached(ttl=60)
    async def profile(user_id: int, view: str = "short") -> dict[str, Any]:
        calls.append((user_id, view))
        return {"id": user_id, "view": view}

    @nj.cached(ttl=60, key=lambda user_id: f"avatar:{user_id}")
    async def avatar(user_id: int) -> str:
        calls.append((user_id, "avatar"))
        return f"/a/{user_id}.png"

    with pytest.raises(nj.RuntimeClosed):
        await profile(1)
    async with nj.open_runtime(nj.App()) as rt:
        assert await profile(1) == await profile(user_id=1) == await profile(1, "short") == {"id": 1, "view": "short"}
        assert await profile(1, view="long") == {"id": 1, "view": "long"}
        assert calls == [(1, "short"), (1, "long")]
        assert profile.key(1).endswith('profile:{"user_id":1,"view":"short"}')
        await profile.invalidate(1)
        await profile(1)
        assert calls[-1] == (1, "short") and len(calls) == 3
        assert await avatar(3) == await avatar(3) == "/a/3.png"
        assert await rt.cache.get("avatar:3") == "/a/3.png"
        with pytest.raises(nj.ArgsError, match="pass key="):
            await profile(object())  # type: ignore[arg-type]


def test_the_decorator_takes_async_functions_only() -> None:
    def plain() -> int:
        return 1

    with pytest.raises(nj.ConfigError, match="async function"):
        nj.cached(ttl=1)(plain)  # type: ignore[arg-type]


async def test_a_backend_without_a_cache_says_so(autojump_clock: Any) -> None:
    from tests.outoftree.backend import DelegatingBackend

    class NoCache(DelegatingBackend):
        """A backend that implements the job protocol and not `Caching`."""

        cache_store = None  # type: ignore[assignment]

    async with nj.open_runtime(nj.App(), backend=NoCache(nj.MemoryBackend())) as rt:
        with pytest.raises(nj.ConfigError, match="has no cache"):
            rt.cache


async def test_the_memory_store_keeps_at_most_max_entries_dropping_the_least_recently_used(autojump_clock: Any) -> None:
    store = MemoryCacheStore(trio.current_time, max_entries=3)
    for key in "abc":
        await store.set(key, CacheEntry('"v"', False, 100, 100))
    assert await store.get("a") is not None  # used: now the most recent
    await store.set("d", CacheEntry('"v"', False, 100, 100))
    assert [k for k in "abcd" if await store.get(k) is not None] == ["a", "c", "d"]
