"""`rt.transaction()` and `kind.enqueue_tx`: a job enqueued in a transaction follows the rules of
`enqueue` (one code path), exists only once the transaction commits, and a worker starts it at
the commit, not at a poll. Backends without transactions skip."""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import TransactionalEnqueue


@pytest.fixture
def tx_backend(make_backend, backend_name):
    backend = make_backend()
    if not isinstance(backend, TransactionalEnqueue):
        pytest.skip(f"the {backend_name} backend has no transactions")
    return backend


async def test_a_worker_starts_the_job_at_the_commit(tx_backend, autojump_clock):
    # The durable test backends poll every 60 s: only the commit's wake-up starts it sooner.
    app = nj.App()
    started: list[float] = []

    @app.job()
    async def index(ctx: nj.JobContext, doc_id: int) -> None:
        started.append(trio.current_time())

    async with nj.open_runtime(app, backend=tx_backend) as rt:
        async with rt.transaction() as conn:
            job_id = await index.enqueue_tx(conn, doc_id=1)
            await trio.sleep(1)
            assert started == []  # not before the commit
        committed = trio.current_time()
        receipt = await rt.wait(job_id, timeout=30)
    assert receipt.state is nj.JobState.COMPLETED
    assert started[0] - committed < 5


async def test_enqueue_tx_applies_the_rules_of_enqueue(tx_backend, autojump_clock):
    app = nj.App()

    @app.job(priority=3, max_attempts=4)
    async def index(ctx: nj.JobContext, doc_id: int) -> None:
        pass

    async with nj.open_runtime(app, backend=tx_backend, queues=[]) as rt:
        now = tx_backend.now()
        async with rt.transaction() as conn:
            plain = await index.enqueue_tx(conn, doc_id=1)
            later = await index.options(delay=10, priority=7, unique_key="doc-2").enqueue_tx(conn, doc_id=2)
            again = await index.options(unique_key="doc-2").enqueue_tx(conn, doc_id=2)
            by_name = await rt.enqueue_tx(conn, "index", {"doc_id": 3})
            with pytest.raises(nj.ArgsError):
                await index.enqueue_tx(conn, doc="1")
        jobs = [await rt.get_job(i) for i in (plain, later, by_name)]
    assert again == later and again.existing and not later.existing
    assert [(j.args, j.priority, j.max_attempts, j.state) for j in jobs] == [
        ({"doc_id": 1}, 3, 4, nj.JobState.AVAILABLE),
        ({"doc_id": 2}, 7, 4, nj.JobState.SCHEDULED),
        ({"doc_id": 3}, 3, 4, nj.JobState.AVAILABLE),
    ]
    assert jobs[1].run_at == pytest.approx(now + 10) and jobs[1].unique_key == "doc-2"


async def test_an_error_in_the_block_rolls_back_and_propagates(tx_backend, autojump_clock):
    app = nj.App()

    @app.job()
    async def index(ctx: nj.JobContext, doc_id: int) -> None:
        pass

    class Failed(Exception):
        pass

    async with nj.open_runtime(app, backend=tx_backend) as rt:
        with pytest.raises(Failed):
            async with rt.transaction() as conn:
                job_id = await index.enqueue_tx(conn, doc_id=1)
                raise Failed
        with pytest.raises(nj.JobNotFound):
            await rt.get_job(job_id)
        rt.begin_shutdown()
        with pytest.raises(nj.RuntimeClosed):
            async with rt.transaction():
                pass


async def test_enqueue_tx_needs_a_runtime_and_a_transaction(tx_backend, autojump_clock):
    app = nj.App()

    @app.job()
    async def index(ctx: nj.JobContext, doc_id: int) -> None:
        pass

    with pytest.raises(nj.RuntimeClosed, match="index.enqueue_tx"):
        await index.enqueue_tx(object(), doc_id=1)
    async with nj.open_runtime(app, backend=tx_backend, queues=[]):
        with pytest.raises(nj.ConfigError, match="not object"):
            await index.enqueue_tx(object(), doc_id=1)


async def test_a_job_enqueues_its_follow_up_in_a_transaction_of_ctx_client(tx_backend, autojump_clock):
    app = nj.App()
    done: list[int] = []

    @app.job()
    async def notify(ctx: nj.JobContext, doc_id: int) -> None:
        done.append(doc_id)

    @app.job()
    async def index(ctx: nj.JobContext, doc_id: int) -> None:
        client: nj.Client = ctx.client
        async with client.transaction() as conn:
            await notify.enqueue_tx(conn, doc_id=doc_id)

    async with nj.open_runtime(app, backend=tx_backend) as rt:
        assert (await rt.wait(await index.enqueue(doc_id=7), timeout=30)).state is nj.JobState.COMPLETED
        with trio.fail_after(30):
            while not done:
                await trio.sleep(0.1)
    assert done == [7]
