"""A receipt awaited in another process than the one running the job (an enqueue-only web
process) learns of the outcome within the job's queue's `poll_interval`, not the backend's."""

from __future__ import annotations

import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs.backends.sqlite import SqliteBackend


def test_a_cross_process_receipt_polls_at_the_queues_interval(tmp_path) -> None:
    path = str(tmp_path / "jobs.db")
    app = nj.App()
    app.queue("search", max_workers=2, timeout=30, poll_interval=0.1)
    finished_at: list[float] = []

    @app.job(queue="search")
    async def index(ctx: nj.JobContext) -> None:
        await trio.sleep(1.03)
        finished_at.append(trio.current_time())

    def backend() -> SqliteBackend:
        # Two instances on one file: nothing is delivered in-process between them, as between
        # two processes. Calls on the Trio thread keep MockClock's virtual times exact.
        return SqliteBackend(path, synchronous="NORMAL", clock=trio.current_time, _blocking_io=True)

    async def main() -> float:
        async with nj.open_runtime(app, backend=backend(), queues=[]) as web:
            async with nj.open_runtime(app, backend=backend(), queues=["search"]):
                job_id = await index.enqueue()
                receipt = await web.wait(job_id, timeout=10)
                assert receipt.state is nj.JobState.COMPLETED
                return trio.current_time()

    answered = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    # the backend polls every 1 s; the queue asks for 0.1 s, and the waiter honours it
    assert 0 <= answered - finished_at[0] <= 0.1 + 1e-6
