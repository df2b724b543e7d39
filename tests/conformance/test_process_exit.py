"""A handler that makes the process exit (`sys.exit(3)`, `KeyboardInterrupt`).

The process exits with the code, as `nj.run` documents; before it does, the other running
attempts are interrupted (given back, as in a shutdown) and their outcomes written, and the
raising job's attempt is recorded as failed, so a job that always exits is bounded by
`max_attempts` like any failure instead of exiting every process that picks it up.
"""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj

ONCE = nj.RetryPolicy(base=1.0, factor=1.0, cap=1.0, jitter=0.0)


def _app(exit_with: BaseException) -> nj.App:
    app = nj.App()
    app.queue("q", max_workers=4, timeout=None)

    @app.job(queue="q", timeout=None)
    async def bystander(ctx: nj.JobContext) -> None:
        await trio.sleep(3600)

    @app.job(queue="q", max_attempts=3, retry=ONCE)
    async def quitter(ctx: nj.JobContext, in_child: bool = False) -> None:
        await trio.sleep(1)
        if not in_child:
            raise exit_with

        async def child() -> None:
            raise exit_with

        async with ctx.children() as tasks:
            tasks.spawn(child)

    return app


@pytest.mark.parametrize(
    "exit_with, in_child",
    [(SystemExit(3), False), (KeyboardInterrupt(), False), (SystemExit(4), True)],
    ids=["sys.exit", "KeyboardInterrupt", "sys.exit-in-a-child"],
)
async def test_the_process_exits_and_every_other_outcome_is_written(make_backend, autojump_clock, exit_with, in_child):
    backend = make_backend()
    app = _app(exit_with)
    async with nj.open_runtime(app, backend=backend, queues=[]) as rt:
        bystanders = await rt.enqueue_many("bystander", [{}, {}])
        quitter = await rt.enqueue("quitter", {"in_child": in_child})
    with pytest.raises(type(exit_with)) as raised:
        async with nj.open_runtime(app, backend=backend, grace=30) as rt:
            await trio.sleep(3600)  # cancelled: main is told to unwind, the grace is skipped
    assert raised.value is exit_with
    async with nj.open_runtime(app, backend=backend, queues=[]) as rt:
        others = [await rt.get_job(i) for i in bystanders]
        job = await rt.get_job(quitter)
    assert [(j.state, j.attempt) for j in others] == [(nj.JobState.AVAILABLE, 0)] * 2  # interrupted, given back
    assert job.state is nj.JobState.RETRYABLE and job.attempt == 1
    assert job.errors[-1].message.startswith(f"{type(exit_with).__name__}")
    assert "the handler made the process exit" in job.errors[-1].message


async def test_a_job_that_always_exits_is_discarded_after_max_attempts(make_backend, autojump_clock):
    backend = make_backend()
    app = _app(SystemExit(3))
    async with nj.open_runtime(app, backend=backend, queues=[]) as rt:
        quitter = await rt.enqueue("quitter", {})
    for _ in range(3):  # three "processes", each exited by the job
        with pytest.raises(SystemExit):
            async with nj.open_runtime(app, backend=backend) as rt:
                await trio.sleep(3600)
    async with nj.open_runtime(app, backend=backend) as rt:
        job = await rt.get_job(quitter)
        await trio.sleep(10)  # a fourth process runs nothing
        assert (await rt.get_job(quitter)).attempt == 3
    assert job.state is nj.JobState.DISCARDED and job.attempt == 3 and len(job.errors) == 3
