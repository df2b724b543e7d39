"""`ctx.client`: inside a job, the client of the runtime running it (enqueue, get_job, wait, cancel)."""

from __future__ import annotations

import trio
import trio.testing

import nursery_jobs as nj


async def test_a_job_enqueues_waits_reads_and_cancels_through_ctx_client(autojump_clock: trio.testing.MockClock) -> None:
    app = nj.App()
    seen: dict = {}

    @app.job()
    async def child(ctx: nj.JobContext, n: int) -> None:
        await trio.sleep(n)

    @app.job()
    async def parent(ctx: nj.JobContext) -> None:
        client: nj.Client = ctx.client
        seen["is_runtime"] = client is runtime[0]
        quick = await client.enqueue(child, {"n": 1})
        seen["quick"] = (await client.wait(quick, timeout=5)).state
        slow = await client.enqueue("child", {"n": 0}, delay=60)
        seen["slow_before"] = (await client.get_job(slow)).state
        seen["cancel"] = await client.cancel(slow)

    runtime: list[nj.Runtime] = []
    async with nj.open_runtime(app) as rt:
        runtime.append(rt)
        receipt = await rt.wait(await parent.enqueue(), timeout=10)
    assert receipt.state is nj.JobState.COMPLETED, receipt
    assert seen == {
        "is_runtime": True,
        "quick": nj.JobState.COMPLETED,
        "slow_before": nj.JobState.SCHEDULED,
        "cancel": nj.JobState.CANCELLED,
    }
