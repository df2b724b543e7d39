"""`LockStore`: a lock is held by one owner at a time, renewed only while held, freed by its
owner or by its expiry, and each acquisition's fencing token is larger than every earlier one's,
on every backend, and across instances on one store."""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj

from .common import opened


@pytest.fixture(autouse=True)
def _has_locks(make_backend) -> None:
    """A capability of its own: a backend without it is not held to it (the package's backends
    all have it: `tests/unit/test_locks.py`)."""
    if not isinstance(make_backend(), nj.backends.LockStore):
        pytest.skip("this backend does not implement LockStore")


async def test_one_owner_at_a_time_until_released(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        assert isinstance(backend, nj.backends.LockStore)
        assert await backend.acquire_lock("a", "me", 30)
        assert not await backend.acquire_lock("a", "you", 30)
        assert await backend.acquire_lock("b", "you", 30)  # locks are apart
        assert await backend.acquire_lock("a", "me", 30)  # the owner again: extended
        await backend.release_lock("a", "you")  # not the owner: nothing
        assert not await backend.acquire_lock("a", "you", 30)
        await backend.release_lock("a", "me")
        await backend.release_lock("a", "me")  # idempotent
        assert await backend.acquire_lock("a", "you", 30)


async def test_a_lock_expires_after_its_ttl_and_is_renewed_only_while_held(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        assert isinstance(backend, nj.backends.LockStore)
        assert await backend.acquire_lock("a", "me", 10)
        await trio.sleep(8)
        assert await backend.renew_lock("a", "me", 10)  # now held until 18
        assert not await backend.renew_lock("a", "you", 10)
        await trio.sleep(8)
        assert not await backend.acquire_lock("a", "you", 10)  # 16: still mine
        await trio.sleep(3)
        assert not await backend.renew_lock("a", "me", 10)  # 19: expired, a crashed holder's
        assert await backend.acquire_lock("a", "you", 10)
        assert not await backend.renew_lock("a", "me", 10)
        await backend.release_lock("a", "me")  # a stale owner's release frees nothing
        assert not await backend.acquire_lock("a", "me", 10)


async def test_each_acquisition_draws_a_larger_token_than_every_earlier_one(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        assert isinstance(backend, nj.backends.LockStore)
        tokens = [await backend.acquire_lock("a", "me", 10)]
        assert await backend.acquire_lock("a", "you", 10) is None  # held: no token
        tokens.append(await backend.acquire_lock("a", "me", 10))  # the owner again: a new acquisition
        await backend.release_lock("a", "me")
        tokens.append(await backend.acquire_lock("a", "you", 10))  # after a release
        await trio.sleep(11)
        tokens.append(await backend.acquire_lock("a", "me", 10))  # after an expiry
        assert await backend.acquire_lock("b", "me", 10) is not None  # another name draws too ...
        await backend.release_lock("a", "me")
        tokens.append(await backend.acquire_lock("a", "me", 10))  # ... and tokens of "a" still grow
    assert all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in tokens), tokens
    assert tokens == sorted(set(tokens)), tokens


async def test_tokens_grow_across_instances_and_a_restart(store, autojump_clock) -> None:
    """Holders on several instances (as several processes) take the lock in turn: each one's token
    is larger than the one before, and an instance opened after the others closed (a restart)
    draws a larger one still."""
    backends = [store.open() for _ in range(3)]
    for backend in backends:
        await backend.open()
    taken: list[int] = []
    try:

        async def take_turns(backend: nj.Backend, owner: str) -> None:
            assert isinstance(backend, nj.backends.LockStore)
            for _ in range(3):
                while (token := await backend.acquire_lock("shared", owner, 30)) is None:
                    await trio.sleep(0.2)
                taken.append(token)
                await trio.sleep(0.05)
                await backend.release_lock("shared", owner)

        async with trio.open_nursery() as nursery:
            for i, backend in enumerate(backends):
                for j in range(2):
                    nursery.start_soon(take_turns, backend, f"owner-{i}-{j}")
    finally:
        for backend in backends:
            await backend.close()
    assert len(taken) == 18 and taken == sorted(set(taken)), taken
    later = store.open()
    await later.open()
    try:
        assert isinstance(later, nj.backends.LockStore)
        token = await later.acquire_lock("shared", "after-a-restart", 30)
    finally:
        await later.close()
    assert token is not None and token > taken[-1]


@pytest.mark.parametrize(
    "name, needle",
    [
        ("", "must be a non-empty str"),
        (7, "must be a non-empty str"),
        ("a\x00b", "must not contain NUL"),
        ("a\ud800b", r"must be valid text \(it holds a lone surrogate\)"),
        ("\u00e9" * 501, "is 1,002 bytes, over the limit of 1,000"),  # 501 characters, 1,002 bytes of UTF-8
    ],
)
async def test_a_bad_lock_name_is_the_same_config_error_on_every_backend(
    make_backend, autojump_clock, name: object, needle: str
) -> None:
    """The rule of concurrency and rate keys (`check_unique_key`), before any backend sees it."""
    async with opened(make_backend) as backend, nj.open_runtime(nj.App(), backend=backend, queues=[]) as rt:
        with pytest.raises(nj.ConfigError, match=f"a lock name {needle}"):
            async with rt.lock(name, timeout=0):  # type: ignore[arg-type]
                pytest.fail("held a lock by a bad name")
        with pytest.raises(nj.ConfigError, match=f"a lock name {needle}"):
            await rt.try_lock(name)  # type: ignore[arg-type]


async def test_the_longest_lock_name_is_held_on_every_backend(make_backend, autojump_clock) -> None:
    name = "\u00e9" * 500  # 1,000 bytes of UTF-8
    async with opened(make_backend) as backend, nj.open_runtime(nj.App(), backend=backend, queues=[]) as rt:
        async with rt.lock(name, timeout=0):
            assert not (await rt.try_lock(name))[0]
        acquired, release = await rt.try_lock(name)
        assert acquired
        await release()


async def test_concurrent_acquires_from_several_instances_give_the_lock_to_one(store, autojump_clock) -> None:
    backends = [store.open() for _ in range(3)]
    for backend in backends:
        await backend.open()
    try:
        winners: list[str] = []

        async def take(backend: nj.Backend, owner: str) -> None:
            assert isinstance(backend, nj.backends.LockStore)
            if await backend.acquire_lock("shared", owner, 30):
                winners.append(owner)

        async with trio.open_nursery() as nursery:
            for i, backend in enumerate(backends):
                for j in range(3):
                    nursery.start_soon(take, backend, f"owner-{i}-{j}")
        assert len(winners) == 1
    finally:
        for backend in backends:
            await backend.close()
