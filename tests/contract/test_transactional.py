"""`TransactionalEnqueue.insert_sql`, called directly on the caller's own connection (the
registry's `transaction` hook): the job exists, and its wake-up is sent, only if the caller's
transaction commits; a unique key held by a pending job returns no row. Backends without the
capability skip."""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import JobsAvailable, TransactionalEnqueue
from tests.registry import TestBackend

from .common import Q, in_state, new, opened


class Rollback(Exception):
    pass


@pytest.fixture
def transaction(test_backend: TestBackend, make_backend):
    backend = make_backend()
    if not isinstance(backend, TransactionalEnqueue) or test_backend.transaction is None:
        pytest.skip(f"the {test_backend.name} backend has no transactional enqueue")
    return test_backend.transaction


async def test_a_committed_insert_stores_the_job_as_insert_many_would(make_backend, transaction, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        now = backend.now()
        with transaction(backend) as execute:
            now_id = execute(*backend.insert_sql(new(3, args='{"n": 1}', priority=2), now))[0]
            later_id = execute(*backend.insert_sql(new(delay=10, now=now), now))[0]
        jobs = [await backend.get_job(now_id), await backend.get_job(later_id)]
        (claimed,) = (await backend.claim(Q, 10)).jobs
    assert [(j.state, j.run_at, j.attempt) for j in jobs] == [(nj.JobState.AVAILABLE, now, 0), (nj.JobState.SCHEDULED, now + 10, 0)]
    assert (jobs[0].args, jobs[0].priority, jobs[0].max_attempts) == ({"n": 1}, 2, 3)
    assert claimed.id == now_id


async def test_a_rolled_back_insert_leaves_no_job(make_backend, transaction, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        with pytest.raises(Rollback), transaction(backend) as execute:
            job_id = execute(*backend.insert_sql(new(), backend.now()))[0]
            raise Rollback
        with pytest.raises(nj.JobNotFound):
            await backend.get_job(job_id)
        assert await backend.stats() == {}


@pytest.mark.parametrize("start", ["available", "running", "completed"])
async def test_a_unique_key_held_by_a_pending_job_returns_no_row(make_backend, transaction, autojump_clock, start) -> None:
    async with opened(make_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        holder = await in_state(backend, start, unique_key="k")
        with transaction(backend) as execute:
            row = execute(*backend.insert_sql(new(unique_key="k"), backend.now()))
    if start == "completed":
        assert row is not None and row[0] != holder
    else:
        assert row is None


async def test_the_wake_up_is_sent_when_the_transaction_commits(make_backend, transaction, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        heard = trio.Event()
        backend.add_listener(lambda e: heard.set() if isinstance(e, JobsAvailable) and e.queue == Q else None)
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.serve)
            with transaction(backend) as execute:
                execute(*backend.insert_sql(new(), backend.now()))
            with trio.fail_after(30):
                await heard.wait()
            nursery.cancel_scope.cancel()
