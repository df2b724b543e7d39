"""`TransactionalEnqueue`, called directly: `transaction()` (a transaction of the backend's own)
and `insert_tx` on it and on a connection of the caller's own (the registry's `transaction`
hook). A job exists only if its transaction commits, is stored as `insert_many` stores it (the
unique-key rule included), and its wake-up comes after the commit, never before. Backends
without the capability skip; the caller's-connection tests skip where a backend takes none."""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import JobsAvailable, TransactionalEnqueue
from tests.registry import TestBackend

from .common import Q, in_state, listen, new, opened


class Rollback(Exception):
    pass


@pytest.fixture
def tx_backend(test_backend: TestBackend, make_backend):
    """A factory of fresh backends that have the capability (skips the others)."""
    if not isinstance(make_backend(), TransactionalEnqueue):
        pytest.skip(f"the {test_backend.name} backend has no transactions")
    return make_backend


@pytest.fixture
def callers(test_backend: TestBackend, tx_backend):
    if test_backend.transaction is None:
        pytest.skip(f"the {test_backend.name} backend takes no connection of the caller's own")
    return test_backend.transaction


# -- a transaction of the backend's own --


async def test_a_committed_transaction_stores_the_jobs_as_insert_many_would(tx_backend, autojump_clock) -> None:
    async with opened(tx_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        now = backend.now()
        events = listen(backend)
        async with backend.transaction() as conn:
            (now_job,) = await backend.insert_tx(conn, [new(3, args='{"n": 1}', priority=2)])
            later, plain = await backend.insert_tx(conn, [new(delay=10, now=now), new()])
            assert events == []  # nothing is announced before the commit
        assert set(events.of(JobsAvailable)) == {JobsAvailable(Q), JobsAvailable(Q, now + 10)}
        jobs = [await backend.get_job(r.id) for r in (now_job, later, plain)]
        claimed = (await backend.claim(Q, 10)).jobs
    assert [(j.state, j.run_at, j.attempt) for j in jobs] == [
        (nj.JobState.AVAILABLE, now, 0),
        (nj.JobState.SCHEDULED, now + 10, 0),
        (nj.JobState.AVAILABLE, now, 0),
    ]
    assert (jobs[0].args, jobs[0].priority, jobs[0].max_attempts) == ({"n": 1}, 2, 3)
    assert now_job.id < later.id < plain.id and not any(r.existing for r in (now_job, later, plain))
    assert [c.id for c in claimed] == [now_job.id, plain.id]


@pytest.mark.parametrize("end", ["raises", "cancelled"])
async def test_a_transaction_that_raises_or_is_cancelled_stores_nothing(tx_backend, autojump_clock, end) -> None:
    async with opened(tx_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        events = listen(backend)
        with trio.move_on_after(5) as scope:
            with pytest.raises(Rollback) if end == "raises" else _nothing():
                async with backend.transaction() as conn:
                    (res,) = await backend.insert_tx(conn, [new(unique_key="k")])
                    if end == "raises":
                        raise Rollback
                    await trio.sleep_forever()
        assert scope.cancelled_caught == (end == "cancelled")
        with pytest.raises(nj.JobNotFound):
            await backend.get_job(res.id)
        assert await backend.stats() == {} and events == []
        (again,) = await backend.insert_many([new(unique_key="k")])  # the key went with the job
        assert not again.existing


async def test_every_exit_gives_the_connection_back(tx_backend, autojump_clock) -> None:
    # More rounds than PostgreSQL's pool lends transactions at once: a connection kept by
    # any exit path would make a later borrow wait out its bound and fail.
    async with opened(tx_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        for _ in range(9):
            async with backend.transaction() as conn:
                await backend.insert_tx(conn, [new()])
            with pytest.raises(Rollback):
                async with backend.transaction() as conn:
                    await backend.insert_tx(conn, [new()])
                    raise Rollback
            with trio.move_on_after(1):
                async with backend.transaction() as conn:
                    await backend.insert_tx(conn, [new()])
                    await trio.sleep_forever()
        assert (await backend.stats())[Q].available == 9


async def test_a_unique_key_in_a_transaction_follows_the_insert_many_rule(tx_backend, autojump_clock) -> None:
    async with opened(tx_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        holder = await in_state(backend, "available", unique_key="held")
        async with backend.transaction() as conn:
            (held,) = await backend.insert_tx(conn, [new(unique_key="held")])
            first, twice = await backend.insert_tx(conn, [new(unique_key="k"), new(unique_key="k")])
            (third,) = await backend.insert_tx(conn, [new(unique_key="k")])
        assert held == (holder, True)
        assert not first.existing and twice == third == (first.id, True)
        assert (await backend.stats())[Q].available == 2


async def test_an_ended_transaction_takes_no_more_jobs(tx_backend, autojump_clock) -> None:
    async with opened(tx_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        async with backend.transaction() as conn:
            pass
        with pytest.raises(nj.ConfigError):
            await backend.insert_tx(conn, [new()])


async def test_insert_tx_refuses_what_is_not_a_connection(tx_backend, autojump_clock) -> None:
    async with opened(tx_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        with pytest.raises(nj.ConfigError, match="not object"):
            await backend.insert_tx(object(), [new()])


# -- a connection of the caller's own --


async def test_a_committed_insert_on_the_callers_connection_stores_the_job(tx_backend, callers, autojump_clock) -> None:
    async with opened(tx_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        now = backend.now()
        events = listen(backend)
        with callers(backend) as conn:
            (res,) = await backend.insert_tx(conn, [new(3, args='{"n": 1}', priority=2)])
            later, plain = await backend.insert_tx(conn, [new(delay=10, now=now), new()])
        job = await backend.get_job(res.id)
        assert (job.state, job.args, job.priority, job.max_attempts, job.run_at) == (nj.JobState.AVAILABLE, {"n": 1}, 2, 3, now)
        assert (await backend.get_job(later.id)).state is nj.JobState.SCHEDULED
        assert [c.id for c in (await backend.claim(Q, 10)).jobs] == [res.id, plain.id]
        assert events.of(JobsAvailable) == []  # a caller's commit is not the backend's to see


async def test_a_rolled_back_insert_on_the_callers_connection_leaves_no_job(tx_backend, callers, autojump_clock) -> None:
    async with opened(tx_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        with pytest.raises(Rollback), callers(backend) as conn:
            (res,) = await backend.insert_tx(conn, [new()])
            raise Rollback
        with pytest.raises(nj.JobNotFound):
            await backend.get_job(res.id)
        assert await backend.stats() == {}


@pytest.mark.parametrize("size", [3, 60])
async def test_a_batch_on_the_callers_connection_is_stored_in_order(tx_backend, callers, autojump_clock, size) -> None:
    # 60: PostgreSQL's COPY path; a batch with unique keys: its all-or-nothing block, a
    # savepoint inside the caller's transaction.
    async with opened(tx_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        with callers(backend) as conn:
            plain = await backend.insert_tx(conn, [new(args=f'{{"n": {i}}}') for i in range(size)])
            keyed = await backend.insert_tx(conn, [new(unique_key="a"), new(unique_key="b"), new(unique_key="a")])
        assert [r.id for r in plain] == sorted(r.id for r in plain) and not any(r.existing for r in plain)
        assert [(await backend.get_job(r.id)).args["n"] for r in plain] == list(range(size))
        assert keyed[2] == (keyed[0].id, True) and not keyed[1].existing
        assert (await backend.stats())[Q].available == size + 2


@pytest.mark.parametrize("start", ["available", "running", "completed"])
async def test_a_unique_key_on_the_callers_connection_gives_the_holder(tx_backend, callers, autojump_clock, start) -> None:
    async with opened(tx_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        holder = await in_state(backend, start, unique_key="k")
        with callers(backend) as conn:
            (res,) = await backend.insert_tx(conn, [new(unique_key="k")])
    if start == "completed":
        assert not res.existing and res.id != holder
    else:
        assert res == (holder, True)


async def test_a_connection_to_another_database_is_refused(tx_backend, callers, autojump_clock) -> None:
    async with opened(tx_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        with callers(backend, elsewhere=True) as conn:
            with pytest.raises(nj.ConfigError, match="enqueue_tx got a"):
                await backend.insert_tx(conn, [new()])


async def test_the_callers_commit_wakes_the_listeners(test_backend, tx_backend, callers, autojump_clock) -> None:
    if not test_backend.commit_wakes:
        pytest.skip(f"on {test_backend.name} a caller's own commit is found by the poll")
    async with opened(tx_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        heard = trio.Event()
        backend.add_listener(lambda e: heard.set() if isinstance(e, JobsAvailable) and e.queue == Q else None)
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.serve)
            with callers(backend) as conn:
                await backend.insert_tx(conn, [new()])
            with trio.fail_after(30):
                await heard.wait()
            nursery.cancel_scope.cancel()


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
