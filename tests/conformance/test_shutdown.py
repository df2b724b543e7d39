"""Graceful shutdown: stop claiming, wait up to grace, interrupt the rest, lose nothing."""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import Outbox, TransactionalEnqueue


def _app(log: list) -> nj.App:
    app = nj.App()
    app.queue("work", max_workers=2, timeout=None)

    @app.job(queue="work")
    async def sleeper(ctx: nj.JobContext, seconds: float) -> None:
        log.append(("start", ctx.id, ctx.attempt, trio.current_time()))
        try:
            await trio.sleep(seconds)
        finally:
            log.append(("end", ctx.id, ctx.attempt, trio.current_time()))

    return app


async def test_jobs_that_finish_within_grace_complete(make_backend, autojump_clock):
    log: list = []
    app = _app(log)
    backend = make_backend()
    async with nj.open_runtime(app, backend=backend, grace=10) as rt:
        job_id = await rt.enqueue("sleeper", {"seconds": 4})
        await trio.sleep(1)
        t0 = trio.current_time()
    assert trio.current_time() - t0 == pytest.approx(3)
    assert (await backend.get_job(job_id)).state is nj.JobState.COMPLETED


async def test_jobs_past_grace_are_interrupted_at_exactly_grace_and_rerun_after_restart(make_backend, autojump_clock):
    log: list = []
    app = _app(log)
    backend = make_backend()
    async with nj.open_runtime(app, backend=backend, grace=5) as rt:
        long_id = await rt.enqueue("sleeper", {"seconds": 100})
        short_id = await rt.enqueue("sleeper", {"seconds": 2})
        queued_id = await rt.enqueue("sleeper", {"seconds": 1})  # no free worker: never claimed
        await trio.sleep(1)
        t0 = trio.current_time()
    t_exit = trio.current_time()
    assert t_exit - t0 == pytest.approx(5)  # bounded by grace (+ an instant flush)
    ends = {job: t for kind, job, _, t in log if kind == "end"}
    assert ends[long_id] - t0 == pytest.approx(5)
    long_job = await backend.get_job(long_id)
    assert long_job.state is nj.JobState.AVAILABLE and long_job.attempt == 0 and long_job.errors == ()
    assert (await backend.get_job(short_id)).state is nj.JobState.COMPLETED
    stats = await backend.stats()
    assert stats["work"].interrupted == 1 and stats["work"].available >= 1

    # "restart": a new runtime on the same backend picks the interrupted job up at once
    async with nj.open_runtime(app, backend=backend, grace=5) as rt:
        r1 = await rt.wait(long_id, timeout=200)
        r2 = await rt.wait(queued_id, timeout=200)
    assert r1.state is nj.JobState.COMPLETED and r2.state is nj.JobState.COMPLETED
    assert [a for k, j, a, _ in log if k == "start" and j == long_id] == [1, 1]


async def test_stats_show_interrupted_jobs_back_in_available(make_backend, autojump_clock):
    log: list = []
    app = _app(log)
    backend = make_backend()
    async with nj.open_runtime(app, backend=backend, grace=0) as rt:
        await rt.enqueue_many("sleeper", [{"seconds": 50}] * 2)
        await trio.sleep(1)
        assert (await rt.stats())["work"].running == 2
    stats = (await backend.stats())["work"]
    assert (stats.running, stats.available, stats.interrupted) == (0, 2, 2)


async def test_enqueue_during_shutdown_is_refused(make_backend, autojump_clock):
    log: list = []
    app = _app(log)
    refused = []

    async def late_submitter(rt: nj.Runtime) -> None:
        await trio.sleep(2)
        try:
            await rt.enqueue("sleeper", {"seconds": 1})
        except nj.RuntimeClosed as exc:
            refused.append(str(exc))

    async with trio.open_nursery() as nursery:
        async with nj.open_runtime(app, backend=make_backend(), grace=10) as rt:
            await rt.enqueue("sleeper", {"seconds": 5})
            nursery.start_soon(late_submitter, rt)
            await trio.sleep(1)
    assert refused and "shutting down" in refused[0]


async def test_skip_grace_interrupts_at_once(make_backend, autojump_clock):
    log: list = []
    app = _app(log)
    backend = make_backend()

    async def second_signal(rt: nj.Runtime) -> None:
        await trio.sleep(3)
        rt.skip_grace()

    async with trio.open_nursery() as nursery:
        async with nj.open_runtime(app, backend=backend, grace=60) as rt:
            await rt.enqueue("sleeper", {"seconds": 100})
            await trio.sleep(1)
            nursery.start_soon(second_signal, rt)
            t0 = trio.current_time()
    assert trio.current_time() - t0 == pytest.approx(3)  # the "signal" came 3 s in, not after 60


async def test_outside_cancellation_skips_the_grace_and_keeps_the_job(make_backend, autojump_clock):
    log: list = []
    app = _app(log)
    backend = make_backend()
    with trio.move_on_after(3):
        async with nj.open_runtime(app, backend=backend, grace=60) as rt:
            job_id = await rt.enqueue("sleeper", {"seconds": 100})
            await trio.sleep_forever()
    assert trio.current_time() == pytest.approx(3)
    job = await backend.get_job(job_id)
    assert job.state is nj.JobState.AVAILABLE and job.attempt == 0


async def test_job_that_ignores_cancellation_is_named_and_exit_still_waits(make_backend, autojump_clock, caplog):
    app = nj.App()

    @app.job()
    async def stubborn(ctx: nj.JobContext) -> None:
        with trio.CancelScope(shield=True):
            await trio.sleep(30)

    settings = nj.RuntimeSettings(flush_bound=5)
    async with nj.open_runtime(app, backend=make_backend(), grace=1, settings=settings) as rt:
        await stubborn.enqueue()
        await trio.sleep(1)
    assert "ignored cancellation" in caplog.text and "stubborn" in caplog.text


# -- a backend that stops answering (a database that hangs without closing the connection) --


class Hanging:
    """The test's backend, until told to hang: then outcome writes, or claims, never answer.
    Its calls round-trip (not `never_yields`), as on a durable backend."""

    never_yields = False

    def __init__(self, inner: nj.Backend) -> None:
        self.inner = inner
        self.hang_finish = False
        self.hang_claim = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def finish_many(self, outcomes: object) -> None:
        if self.hang_finish:
            await trio.sleep_forever()
        await self.inner.finish_many(outcomes)  # type: ignore[arg-type]

    async def claim(self, queue: str, limit: int) -> object:
        if self.hang_claim:
            await trio.sleep_forever()
        return await self.inner.claim(queue, limit)


@pytest.fixture
def fail_loudly_if_the_shutdown_hangs():
    # A shutdown that waits in a shield for ever deadlocks MockClock too (no deadline left to
    # jump to): without this a regression would hang the suite instead of failing it.
    import faulthandler

    faulthandler.dump_traceback_later(60, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _work_app() -> nj.App:
    app = nj.App()

    @app.job(timeout=None)
    async def work(ctx: nj.JobContext, seconds: float) -> None:
        await trio.sleep(seconds)

    return app


async def test_outcome_writes_that_never_answer_cannot_hang_the_shutdown(
    make_backend, autojump_clock, caplog, fail_loudly_if_the_shutdown_hangs
):
    """`open_runtime` exits within `grace + 3 * flush_bound` and says which outcomes it could
    not write."""
    import logging

    backend = Hanging(make_backend())
    settings = nj.RuntimeSettings(grace=1, flush_bound=0.5)
    with trio.fail_after(100):  # a hang shows up as this error, not as a stuck test
        async with nj.open_runtime(_work_app(), backend=backend, settings=settings) as rt:  # type: ignore[arg-type]
            quick = await rt.enqueue("work", {"seconds": 0})
            assert (await rt.wait(quick, timeout=5)).done
            backend.hang_finish = True
            done_soon = await rt.enqueue("work", {"seconds": 0.5})
            cut = await rt.enqueue("work", {"seconds": 60})
            await trio.sleep(0.1)
            t0 = trio.current_time()
        elapsed = trio.current_time() - t0
    await backend.inner.close()
    assert elapsed <= 1 + 3 * 0.5 + 1e-6
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("did not take the last outcomes within flush_bound (0.5 s)" in e for e in errors), errors
    unwritten = next(e for e in errors if "not written" in e)
    assert f"job {done_soon}" in unwritten and f"job {cut}" in unwritten


async def test_a_claim_that_never_answers_is_cut_at_the_flush_bound(
    make_backend, autojump_clock, caplog, fail_loudly_if_the_shutdown_hangs
):
    backend = Hanging(make_backend())
    settings = nj.RuntimeSettings(grace=1, flush_bound=0.5)
    with trio.fail_after(100):
        async with nj.open_runtime(_work_app(), backend=backend, settings=settings) as rt:  # type: ignore[arg-type]
            backend.hang_claim = True
            await rt.enqueue("work", {"seconds": 0})  # wakes the fetcher into a claim that hangs
            await trio.sleep(0.1)
            t0 = trio.current_time()
        elapsed = trio.current_time() - t0
    await backend.inner.close()
    assert elapsed <= 1 + 3 * 0.5 + 1e-6
    assert "did not answer within flush_bound (0.5 s)" in caplog.text


# -- what a running attempt may still do once shutdown began (docs/shutdown.md) --

TOPIC = "delivered"


def _follow_up_app(log: list, ids: list, escaped: list) -> nj.App:
    """`deliver` does the idempotency recipe of docs/guarantees.md after the shutdown began: its
    POST (a sleep), then its row and a follow-up in one transaction, and more follow-ups by every
    other way of adding work (from a child task too); `cut` does the same in the cleanup of an
    attempt the grace interrupts. Every call is one the shutdown must let through."""
    app = nj.App()
    app.queue("work", max_workers=3, timeout=None)
    cut_runs: list[int] = []

    @app.job(queue="work")
    async def follow_up(ctx: nj.JobContext, how: str) -> None:
        log.append(("follow_up", how))

    @app.subscribe(TOPIC)
    @app.job(queue="work")
    async def audit(ctx: nj.JobContext, how: str) -> None:
        log.append(("audit", how))

    async def add_work(ctx: nj.JobContext, how: str) -> None:
        async with ctx.client.transaction() as conn:
            ids.append(await follow_up.enqueue_tx(conn, how=f"{how}/tx"))
            await nj.publish(conn, TOPIC, {"how": f"{how}/tx"})
        ids.append(await ctx.client.enqueue(follow_up, {"how": f"{how}/client"}))
        ids.append(await follow_up.enqueue(how=f"{how}/kind"))
        await ctx.client.publish(TOPIC, {"how": f"{how}/publish"})

    @app.job(queue="work")
    async def deliver(ctx: nj.JobContext, seconds: float) -> None:
        await trio.sleep(seconds)  # the POST: the shutdown begins meanwhile
        assert ctx.client.closing
        await add_work(ctx, "grace")
        receipt = await ctx.client.wait(ids[0], timeout=1)  # a receipt no worker here will give
        log.append(("receipt", receipt.done))
        async with ctx.children() as tasks:
            tasks.spawn(add_work, ctx, "child")
        outside = escaped[0]

        async def late() -> None:
            # Started outside ctx.children(), so it outlives the attempt: its time is up.
            await trio.sleep(seconds)
            try:
                await follow_up.enqueue(how="late")
            except nj.RuntimeClosed as exc:
                log.append(("late refused", str(exc)))

        outside.start_soon(late)

    @app.job(queue="work")
    async def cut(ctx: nj.JobContext) -> None:
        cut_runs.append(ctx.id)
        if len(cut_runs) > 1:
            return  # its run after the restart
        try:
            await trio.sleep(1000)
        finally:
            with trio.move_on_after(1, shield=True):
                await add_work(ctx, "unwind")

    return app


async def test_a_running_attempt_keeps_its_transactions_and_follow_ups_through_the_shutdown(
    make_backend, backend_name, autojump_clock
):
    """A job that is running when shutdown begins writes its row and enqueues its follow-ups
    in the grace and in its unwind; it completes on its first attempt (or, cut, is given back);
    what it added is in the backend for the next runtime; a task that outlived its attempt,
    and code outside any job, are refused."""
    backend = make_backend()
    if not isinstance(backend, TransactionalEnqueue) or not isinstance(backend, Outbox):
        pytest.skip(f"the {backend_name} backend has no transactions or no outbox")
    log: list = []
    ids: list = []
    refused: list[str] = []
    async with trio.open_nursery() as outside:
        app = _follow_up_app(log, ids, [outside])
        async with nj.open_runtime(app, backend=backend, grace=5) as rt:
            delivery = await rt.enqueue("deliver", {"seconds": 2})
            interrupted = await rt.enqueue("cut")
            await trio.sleep(1)
            assert (await rt.stats())["work"].running == 2
            rt.begin_shutdown()
            try:
                await rt.enqueue("follow_up", {"how": "outside"})
            except nj.RuntimeClosed as exc:
                refused.append(str(exc))
    assert refused and "outside" in refused[0] and "running job" in refused[0]
    assert ("receipt", False) in log
    late = [text for what, text in log if what == "late refused"]
    assert len(late) == 1 and f"job {delivery}" in late[0] and "ended" in late[0], late
    job = await backend.get_job(delivery)
    assert (job.state, job.attempt, job.errors) == (nj.JobState.COMPLETED, 1, ())
    cut_job = await backend.get_job(interrupted)
    assert (cut_job.state, cut_job.attempt) == (nj.JobState.AVAILABLE, 0)
    assert len(ids) == 9
    for job_id in ids:
        assert (await backend.get_job(job_id)).state is nj.JobState.AVAILABLE

    # The next runtime on the store runs what the attempts added (memory: the same instance).
    del log[:]
    async with nj.open_runtime(app, backend=backend, grace=5) as rt:
        with trio.fail_after(60):
            while sum(1 for what, _ in log if what in ("follow_up", "audit")) < 15:
                await trio.sleep(0.1)
        assert (await rt.wait(interrupted, timeout=30)).done
    hows = {"grace", "child", "unwind"}
    assert sorted(how for what, how in log if what == "follow_up") == sorted(
        f"{h}/{way}" for h in hows for way in ("tx", "client", "kind")
    )
    assert sorted(how for what, how in log if what == "audit") == sorted(
        f"{h}/{way}" for h in hows for way in ("tx", "publish")
    )
