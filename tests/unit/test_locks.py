"""`rt.lock` and `rt.try_lock` on virtual time: bounded waits, renewal while held, release
always, fencing when a renewal fails or the process froze, the fencing tokens the block gets,
and try_lock's release contract."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import nursery_jobs as nj


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def test_the_packages_backends_all_have_locks(tmp_path: Any) -> None:
    from nursery_jobs.backends.postgres import PostgresBackend
    from nursery_jobs.backends.sqlite import SqliteBackend

    for cls in (nj.MemoryBackend, SqliteBackend, PostgresBackend):
        assert all(callable(getattr(cls, m, None)) for m in ("acquire_lock", "renew_lock", "release_lock")), cls


async def test_a_lock_excludes_other_holders_and_a_waiter_gets_it_when_freed(autojump_clock: Any) -> None:
    backend = nj.MemoryBackend()
    order: list[str] = []
    async with nj.open_runtime(nj.App(), backend=backend) as rt:

        async def holder(tag: str, seconds: float) -> None:
            async with rt.lock("nightly", ttl=30, timeout=100):
                order.append(f"{tag} in")
                await trio.sleep(seconds)
                order.append(f"{tag} out")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(holder, "a", 45)  # longer than its ttl: renewed
            await trio.sleep(1)
            nursery.start_soon(holder, "b", 1)
    assert order == ["a in", "a out", "b in", "b out"]


async def test_waiting_is_bounded_by_timeout(autojump_clock: Any) -> None:
    async with nj.open_runtime(nj.App()) as rt:
        acquired, release = await rt.try_lock("x", ttl=60)
        assert acquired
        start = trio.current_time()
        with pytest.raises(nj.LockTimeout, match="was not freed within 5 s"):
            async with rt.lock("x", timeout=5):
                pytest.fail("entered a held lock")
        assert 4 <= trio.current_time() - start <= 5
        with pytest.raises(nj.LockTimeout):
            async with rt.lock("x", timeout=0):  # one try
                pass
        await release()


async def test_the_lock_is_released_when_the_block_raises_and_the_error_is_the_blocks(autojump_clock: Any) -> None:
    async with nj.open_runtime(nj.App()) as rt:
        with pytest.raises(KeyError, match="boom"):  # not wrapped in an exception group
            async with rt.lock("x"):
                raise KeyError("boom")
        acquired, release = await rt.try_lock("x")
        assert acquired
        await release()


class _RenewalFails(nj.MemoryBackend):
    renew_ok = True

    async def renew_lock(self, name: str, owner: str, ttl: float) -> bool:
        if not self.renew_ok:
            raise nj.BackendUnavailable("down for the test")
        return await super().renew_lock(name, owner, ttl)


async def test_a_lock_whose_renewal_fails_cancels_its_block_before_it_expires(autojump_clock: Any) -> None:
    backend = _RenewalFails()
    reached: list[float] = []
    async with nj.open_runtime(nj.App(), backend=backend) as rt:
        start = trio.current_time()
        with pytest.raises(nj.LockLost, match="could not be renewed before it expired"):
            async with rt.lock("x", ttl=30):
                backend.renew_ok = False
                for _ in range(100):
                    await trio.sleep(1)
                    reached.append(trio.current_time() - start)
        assert max(reached) <= 30  # never ran past its hold
        backend.renew_ok = True


async def test_a_holder_frozen_past_its_hold_takes_no_step_after_it_whichever_task_runs_first(autojump_clock: Any) -> None:
    """The process freezes (the clock jumps while every task waits): when it resumes, the block's
    sleep and the renewal's are due together, and Trio may run either first. The block's scope
    is cancelled by its own deadline, so the block takes no step."""
    late: list[int] = []
    async with nj.open_runtime(nj.App()) as rt:
        for attempt in range(20):
            resumed: list[float] = []
            steps: list[float] = []

            async def hold() -> None:
                with pytest.raises(nj.LockLost, match="could not be renewed before it expired"):
                    async with rt.lock("x", ttl=30):
                        while True:
                            await trio.sleep(1)
                            steps.append(trio.current_time())

            async def freeze() -> None:
                await trio.sleep(5.5)
                autojump_clock.jump(60)  # no task runs meanwhile: a SIGSTOP, a stalled VM
                resumed.append(trio.current_time())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(hold)
                nursery.start_soon(freeze)
            if any(t >= resumed[0] for t in steps):
                late.append(attempt)
    assert not late, f"the block took a step after its hold expired in attempts {late}"


async def test_a_hold_confirmed_after_it_expired_does_not_run_the_block(autojump_clock: Any) -> None:
    class _SlowAcquire(nj.MemoryBackend):
        async def acquire_lock(self, name: str, owner: str, ttl: float) -> bool:
            held = await super().acquire_lock(name, owner, ttl)
            await trio.sleep(ttl)  # the answer arrives after the hold has ended
            return held

    backend = _SlowAcquire()
    async with nj.open_runtime(nj.App(), backend=backend) as rt:
        with pytest.raises(nj.LockLost, match="its block did not run"):
            async with rt.lock("x", ttl=10):
                pytest.fail("the block ran after its hold had expired")
        assert "x" not in backend._locks  # released


async def test_a_lock_taken_over_after_expiry_cancels_the_old_block(autojump_clock: Any) -> None:
    """A holder whose loop was stuck past its ttl finds the lock another's: cancelled, LockLost."""
    backend = nj.MemoryBackend()
    async with nj.open_runtime(nj.App(), backend=backend) as rt:
        original = backend.renew_lock

        async def slow_then_refused(name: str, owner: str, ttl: float) -> bool:
            assert await backend.acquire_lock(name, "someone-else", ttl) is None  # still ours: refused
            backend._locks[name] = ("someone-else", backend.now() + ttl)  # expired and taken meanwhile
            return await original(name, owner, ttl)

        backend.renew_lock = slow_then_refused  # type: ignore[method-assign]
        with pytest.raises(nj.LockLost, match="may be another holder's"):
            async with rt.lock("x", ttl=30):
                await trio.sleep(100)


async def test_a_crashed_holders_lock_frees_itself_after_its_ttl(autojump_clock: Any) -> None:
    backend = nj.MemoryBackend()
    assert await backend.acquire_lock("x", "a-process-that-died", 30)
    async with nj.open_runtime(nj.App(), backend=backend) as rt:
        start = trio.current_time()
        async with rt.lock("x", timeout=60):
            waited = trio.current_time() - start
    assert 29 <= waited <= 31


async def test_try_lock_never_waits_renews_until_release_and_release_is_idempotent(autojump_clock: Any) -> None:
    backend = nj.MemoryBackend()
    async with nj.open_runtime(nj.App(), backend=backend) as rt:
        acquired, release = await rt.try_lock("x", ttl=10)
        assert acquired
        other, other_release = await rt.try_lock("x", ttl=10)
        assert not other
        await other_release()  # safe when not acquired: frees nothing
        await trio.sleep(60)  # six ttls: renewed by the runtime
        assert not (await rt.try_lock("x"))[0]
        assert not release.lost.is_set()
        await release()
        await release()
        again, release_again = await rt.try_lock("x")
        assert again
        await release_again()


async def test_try_lock_reports_a_lost_hold(autojump_clock: Any) -> None:
    backend = _RenewalFails()
    async with nj.open_runtime(nj.App(), backend=backend) as rt:
        acquired, release = await rt.try_lock("x", ttl=10)
        backend.renew_ok = False
        with trio.fail_after(11):
            await release.lost.wait()
        await release()


async def test_the_block_and_try_lock_get_each_acquisitions_fencing_token(autojump_clock: Any) -> None:
    async with nj.open_runtime(nj.App()) as rt:
        async with rt.lock("x") as first:
            assert isinstance(first, nj.HeldLock) and first.name == "x"
            not_acquired, nothing = await rt.try_lock("x")
            assert not not_acquired and nothing.token is None
        acquired, release = await rt.try_lock("x")
        assert acquired and release.token is not None and release.token > first.token
        await release()
        async with rt.lock("x") as third:
            assert third.token > release.token


class _OldProtocol(nj.MemoryBackend):
    """An out-of-tree backend written before fencing tokens: True where a token should be."""

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> Any:
        return await super().acquire_lock(name, owner, ttl) is not None


async def test_a_backend_that_answers_an_acquisition_without_a_token_is_a_config_error(autojump_clock: Any) -> None:
    backend = _OldProtocol()
    async with nj.open_runtime(nj.App(), backend=backend) as rt:
        with pytest.raises(nj.ConfigError, match=r"_OldProtocol.acquire_lock returned True, not a fencing token"):
            async with rt.lock("x"):
                pytest.fail("held a lock without a token")
        with pytest.raises(nj.ConfigError, match="not a fencing token"):
            await rt.try_lock("x")
    assert backend._locks == {}  # each acquisition it made was released


@pytest.mark.parametrize(
    "kw, needle", [({"name": ""}, "lock name"), ({"ttl": 0}, "ttl"), ({"timeout": -1}, "timeout"), ({"ttl": float("nan")}, "ttl")]
)
async def test_bad_arguments_are_config_errors(autojump_clock: Any, kw: dict[str, Any], needle: str) -> None:
    async with nj.open_runtime(nj.App()) as rt:
        name = kw.pop("name", "x")
        with pytest.raises(nj.ConfigError, match=needle):
            async with rt.lock(name, **kw):
                pass
