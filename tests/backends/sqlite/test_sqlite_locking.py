"""SQLite: another connection holding the write lock (an operator's shell, a backup) delays the
runtime but neither blocks the Trio loop nor kills the runtime; held past `outage_timeout`, a
call fails with `BackendUnavailable` that says why. Real time (the lock is held by a thread of
this test), kept to a few seconds."""

from __future__ import annotations

import sqlite3
import threading

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import NewJob
from nursery_jobs.backends.sqlite import SqliteBackend


def _app(done: list[int]) -> nj.App:
    app = nj.App()

    @app.job()
    async def work(ctx: nj.JobContext, n: int) -> None:
        done.append(n)

    return app


def _hold_write_lock(path: str, seconds: float, locked: threading.Event) -> None:
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        locked.set()
        threading.Event().wait(seconds)
        other.execute("ROLLBACK")
    finally:
        other.close()


async def _while_locked(path: str, seconds: float, body) -> None:
    locked = threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(path, seconds, locked))
    holder.start()
    try:
        await trio.to_thread.run_sync(locked.wait, 5)
        await body()
    finally:
        await trio.to_thread.run_sync(holder.join)


async def test_a_lock_held_for_a_while_delays_but_does_not_break_the_runtime(tmp_path, caplog) -> None:
    path = str(tmp_path / "jobs.db")
    done: list[int] = []
    backend = SqliteBackend(path, busy_timeout=0.1, outage_timeout=10)
    async with nj.open_runtime(_app(done), backend=backend, grace=1) as rt:

        async def enqueue_while_locked() -> None:
            job_id = await rt.enqueue("work", {"n": 1})  # retried until the lock is gone, then goes in
            assert (await rt.wait(job_id, timeout=10)).state is nj.JobState.COMPLETED

        await _while_locked(path, 1.0, enqueue_while_locked)
    assert done == [1]
    assert "is locked" in caplog.text and "retrying" in caplog.text


async def test_a_lock_held_past_the_outage_timeout_is_a_clear_error(tmp_path) -> None:
    # The caller's enqueue gives up with the reason; the runtime's own services give up too and
    # the runtime stops (its supervisor restarts it), as on PostgreSQL: never a raw sqlite3 error.
    path = str(tmp_path / "jobs.db")
    backend = SqliteBackend(path, busy_timeout=0.1, outage_timeout=0.5)
    backend.poll_interval = 0.1  # the fetcher keeps claiming, so it meets the lock too
    with pytest.raises(BaseExceptionGroup) as stopped:
        async with nj.open_runtime(_app([]), backend=backend, grace=1) as rt:

            async def enqueue_while_locked() -> None:
                with pytest.raises(nj.BackendUnavailable, match="held its write lock for over 0.5 s"):
                    await rt.enqueue("work", {"n": 1})

            await _while_locked(path, 3.0, enqueue_while_locked)
    leaves = _leaves(stopped.value)
    assert leaves and all(isinstance(e, nj.BackendUnavailable) for e in leaves), leaves


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


async def test_waiting_for_the_lock_never_blocks_the_trio_loop(tmp_path) -> None:
    # busy_timeout longer than the lock is held: the one call waits inside SQLite the whole
    # time, on a worker thread, while other tasks keep running (on the Trio thread they could
    # not run at all: zero ticks).
    path = str(tmp_path / "jobs.db")
    backend = SqliteBackend(path, busy_timeout=5.0)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await trio.sleep(0.01)
            ticks += 1

    async with nj.open_runtime(_app([]), backend=backend, grace=1) as rt:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ticker)

            async def enqueue_while_locked() -> None:
                before = ticks
                await rt.enqueue("work", {"n": 1})
                assert ticks > before, "the Trio loop was blocked while SQLite waited for the lock"

            await _while_locked(path, 0.5, enqueue_while_locked)
            nursery.cancel_scope.cancel()


async def test_a_call_gives_up_within_outage_timeout_plus_one_busy_timeout_however_many_wait(tmp_path, autojump_clock) -> None:
    # Every call of a backend shares its one connection. With the file locked, each attempt holds
    # that connection for a whole busy_timeout (SQLite's own wait, faked here on Trio's clock):
    # the calls in line behind it must not wait past their deadline for their turn, or a call
    # gives up a busy_timeout later per call ahead of it (six calls: 3 + 6 s, not 3 + 1).
    class Deterministic(SqliteBackend):
        _blocking_io = True

    backend = Deterministic(str(tmp_path / "jobs.db"), busy_timeout=1.0, outage_timeout=3.0)
    await backend.open()

    def locked(body: object) -> None:
        autojump_clock.jump(1.0)  # SQLite waited busy_timeout for the other connection's lock
        raise sqlite3.OperationalError("database is locked")

    backend._tx = locked  # type: ignore[method-assign]  # every write begins here, inside the connection
    took: list[float] = []

    async def enqueue() -> None:
        started = trio.current_time()
        with pytest.raises(nj.BackendUnavailable, match="held its write lock for over 3 s"):
            await backend.insert_many([NewJob("work", "default", "{}", 0, None, 25)])
        took.append(trio.current_time() - started)

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(enqueue)
    await backend.close()
    assert len(took) == 6 and max(took) <= 3.0 + 1.0, took
