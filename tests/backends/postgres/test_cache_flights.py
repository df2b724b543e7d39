"""PostgreSQL: one computation per key across processes.

Three runtimes, each with a backend of its own (its own pool and LISTEN connection), stand for
three processes: the callers of a cold key in all three make one computation; a leader cancelled
with nobody waiting in its process frees the key's flight at once, so another process computes
without waiting out the flight; a leader that died (its flight never freed) is taken over when
its flight expires; a failure is shared through the table when kept (`error_ttl`) and otherwise
lets the next process compute at once; a forged notification only makes a waiter read again.
Real time: the notifications travel through the server. Each test is bounded; none times a
speed."""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

import psycopg
import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends.postgres.cache import PgCacheStore, key_digest
from nursery_jobs.backends.postgres import PostgresBackend
from tests import pgutil


class Counted:
    def __init__(self, seconds: float, error: Exception | None = None) -> None:
        self.seconds, self.error, self.calls = seconds, error, 0

    async def __call__(self) -> Any:
        self.calls += 1
        await trio.sleep(self.seconds)
        if self.error is not None:
            raise self.error
        return {"computed": self.calls}


async def _runtimes(stack: AsyncExitStack, url: str, schema: str, n: int = 3) -> list[nj.Runtime]:
    out = []
    for _ in range(n):
        backend = PostgresBackend(url, schema=schema)
        rt = await stack.enter_async_context(nj.open_runtime(nj.App(), backend=backend, queues=[]))
        stack.push_async_callback(backend.close)
        await rt.cache.get("warm-up")  # the pool has a connection
        out.append(rt)
    return out


async def test_three_processes_with_300_callers_each_make_one_computation(pg_url: str) -> None:
    schema = pgutil.new_schema(pg_url)
    compute = Counted(0.5)
    got: list[Any] = []
    with trio.fail_after(60):
        async with AsyncExitStack() as stack:
            runtimes = await _runtimes(stack, pg_url, schema)

            async def call(rt: nj.Runtime) -> None:
                got.append(await rt.cache.get_or_compute("cold", compute, ttl=60, wait_timeout=30))

            async with trio.open_nursery() as nursery:
                for _ in range(300):
                    for rt in runtimes:
                        nursery.start_soon(call, rt)
    assert compute.calls == 1
    assert got == [{"computed": 1}] * 900


async def test_a_cancelled_leader_frees_the_flight_for_another_process_at_once(pg_url: str) -> None:
    schema = pgutil.new_schema(pg_url)
    slow, fast = Counted(3600), Counted(0.1)
    with trio.fail_after(20):  # far below the flight's 60 s: the flight was freed, not waited out
        async with AsyncExitStack() as stack:
            a, b = await _runtimes(stack, pg_url, schema, 2)
            async with trio.open_nursery() as nursery:
                leader = trio.CancelScope()

                async def lead() -> None:
                    with leader:
                        await a.cache.get_or_compute("k", slow, ttl=60, wait_timeout=60)

                nursery.start_soon(lead)
                while slow.calls == 0:
                    await trio.sleep(0.01)
                other: list[Any] = []

                async def wait_in_b() -> None:
                    other.append(await b.cache.get_or_compute("k", fast, ttl=60, wait_timeout=60))

                nursery.start_soon(wait_in_b)
                await trio.sleep(0.5)
                assert fast.calls == 0 and other == []  # b waits for a's computation
                leader.cancel()
            assert other == [{"computed": 1}] and fast.calls == 1


async def test_a_dead_leaders_flight_is_taken_over_when_it_expires(pg_url: str) -> None:
    schema = pgutil.new_schema(pg_url)
    compute = Counted(0.1)
    with trio.fail_after(20):
        async with AsyncExitStack() as stack:
            (rt,) = await _runtimes(stack, pg_url, schema, 1)
            store = rt.cache.store
            assert isinstance(store, PgCacheStore)
            # A process took the flight and died: nobody will fill or free it.
            assert (await store.lead(rt.cache.key("k"), "a-dead-process", store.now() + 2))[0]
            start = trio.current_time()
            assert await rt.cache.get_or_compute("k", compute, ttl=60, wait_timeout=30) == {"computed": 1}
            assert trio.current_time() - start >= 1.5  # it did wait for the flight's end


async def test_an_error_is_shared_through_the_table_when_kept_and_frees_the_key_when_not(pg_url: str) -> None:
    schema = pgutil.new_schema(pg_url)
    with trio.fail_after(30):
        async with AsyncExitStack() as stack:
            a, b = await _runtimes(stack, pg_url, schema, 2)
            for error_ttl, key in ((30, "kept"), (None, "not-kept")):
                failing = Counted(1.0, LookupError("no such user"))
                fallback = Counted(0.1)
                outcomes: list[Any] = []

                async def in_a() -> None:
                    with pytest.raises(LookupError):
                        await a.cache.get_or_compute(key, failing, ttl=60, error_ttl=error_ttl, wait_timeout=20)

                async def in_b() -> None:
                    while failing.calls == 0:  # a leads
                        await trio.sleep(0.01)
                    try:
                        outcomes.append(await b.cache.get_or_compute(key, fallback, ttl=60, error_ttl=error_ttl, wait_timeout=20))
                    except nj.CachedError as exc:
                        outcomes.append(exc)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(in_a)
                    nursery.start_soon(in_b)
                assert failing.calls == 1
                if error_ttl:
                    (cached,) = outcomes
                    assert isinstance(cached, nj.CachedError) and cached.matches(LookupError) and fallback.calls == 0
                else:
                    assert outcomes == [{"computed": 1}] and fallback.calls == 1


async def test_a_forged_notification_makes_a_waiter_read_again_and_nothing_more(pg_url: str) -> None:
    schema = pgutil.new_schema(pg_url)
    compute, waiting = Counted(2.0), Counted(0.1)
    with trio.fail_after(30):
        async with AsyncExitStack() as stack:
            a, b = await _runtimes(stack, pg_url, schema, 2)
            got: list[Any] = []
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: a.cache.get_or_compute("k", compute, ttl=60))
                while compute.calls == 0:
                    await trio.sleep(0.01)

                async def in_b() -> None:
                    got.append(await b.cache.get_or_compute("k", waiting, ttl=60, wait_timeout=20))

                nursery.start_soon(in_b)
                await trio.sleep(0.3)
                with psycopg.connect(pg_url, autocommit=True) as conn:  # any role that can connect may NOTIFY
                    conn.execute("SELECT pg_notify(%s, %s)", (f"{schema}_events", "k:" + key_digest(b.cache.key("k"))))
                await trio.sleep(0.5)
                assert got == [] and waiting.calls == 0  # read again, found no entry, waits on
    assert got == [{"computed": 1}] and waiting.calls == 0


async def test_callers_of_a_key_in_one_process_read_the_store_once(pg_url: str) -> None:
    schema = pgutil.new_schema(pg_url)
    with trio.fail_after(30):
        async with AsyncExitStack() as stack:
            (rt,) = await _runtimes(stack, pg_url, schema, 1)
            await rt.cache.set("hot", "v", ttl=60)
            store = rt.cache.store
            reads = 0
            real_get = store.get

            async def counted(key: str) -> Any:
                nonlocal reads
                reads += 1
                return await real_get(key)

            store.get = counted  # type: ignore[method-assign]
            async with trio.open_nursery() as nursery:
                for _ in range(500):
                    nursery.start_soon(lambda: rt.cache.get_or_compute("hot", Counted(0), ttl=60))
            assert reads == 1


async def test_a_stale_key_read_all_the_time_is_still_refreshed(pg_url: str) -> None:
    """Callers of a key share its reads (one flight per read), so a busy key has a read in
    flight nearly always: the refresh waits for it instead of giving up."""
    schema = pgutil.new_schema(pg_url)
    versions = iter(["v1", "v2", "v3"])

    async def compute() -> str:
        await trio.sleep(0.05)
        return next(versions)

    with trio.fail_after(30):
        async with AsyncExitStack() as stack:
            (rt,) = await _runtimes(stack, pg_url, schema, 1)
            assert await rt.cache.get_or_compute("busy", compute, ttl=1, stale_ttl=600) == "v1"
            await trio.sleep(1.1)
            seen: list[str] = []
            stop = trio.Event()

            async def reader() -> None:
                while not stop.is_set():
                    seen.append(await rt.cache.get_or_compute("busy", compute, ttl=1, stale_ttl=600))

            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(reader)
                with trio.move_on_after(10):
                    while "v2" not in seen:
                        await trio.sleep(0.05)
                stop.set()
            assert "v2" in seen and seen[0] == "v1"
