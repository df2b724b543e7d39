"""Middleware (`app.middleware`, `nj.Middleware`): what each hook sees, in which order, and what a
hook that fails does, on the memory backend under virtual time. What a durable backend stores
with a job (its meta) is in tests/conformance/test_middleware.py."""

from __future__ import annotations

import logging
from typing import Any, Sequence

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import NewJob
from nursery_jobs.infra import watchdog

FAST_RETRY = nj.RetryPolicy(base=10.0, factor=1.0, cap=10.0, jitter=0.0)


class Recorder(nj.Middleware):
    def __init__(self, name: str, log: list[Any]) -> None:
        self.name = name
        self.log = log
        self.ends: list[nj.AttemptEnd] = []

    async def around_attempt(self, ctx: Any, call_next: Any) -> Any:
        self.log.append((self.name, "before", ctx.id, ctx.attempt))
        try:
            return await call_next(ctx)
        finally:
            self.log.append((self.name, "after", ctx.id, ctx.attempt))

    def attempt_ended(self, end: nj.AttemptEnd) -> None:
        self.log.append((self.name, "ended", end.job_id, end.attempt, end.outcome))
        self.ends.append(end)


async def test_hooks_run_outermost_first_around_the_handler_and_are_told_each_outcome(autojump_clock) -> None:
    app = nj.App()
    log: list[Any] = []
    snoozes: list[int] = []
    outer, inner = Recorder("outer", log), Recorder("inner", log)
    app.middleware(outer)
    app.middleware(inner)

    @app.job(retry=FAST_RETRY, max_attempts=2)
    async def work(ctx: nj.JobContext, what: str) -> None:
        log.append(("handler", ctx.id, ctx.attempt))
        if what == "fail":
            raise ValueError("bad row")
        if what == "snooze" and not snoozes:
            snoozes.append(ctx.id)
            raise nj.Snooze(3)
        if what == "discard":
            raise nj.Discard("not wanted")

    async with nj.open_runtime(app) as rt:
        ok = await work.enqueue(what="ok")
        await rt.wait(ok, timeout=5)
        failed = await work.enqueue(what="fail")
        snoozed = await work.enqueue(what="snooze")
        discarded = await work.enqueue(what="discard")
        for job_id in (failed, snoozed, discarded):
            await rt.wait(job_id, timeout=60)
    assert log[:5] == [
        ("outer", "before", ok, 1),
        ("inner", "before", ok, 1),
        ("handler", ok, 1),
        ("inner", "after", ok, 1),
        ("outer", "after", ok, 1),
    ]
    assert log[5:7] == [("outer", "ended", ok, 1, "completed"), ("inner", "ended", ok, 1, "completed")]
    outcomes = [(e.job_id, e.attempt, e.outcome, e.message) for e in outer.ends]
    assert sorted(outcomes) == sorted(
        [
            (ok, 1, "completed", None),
            (failed, 1, "retry", "ValueError: bad row"),
            (failed, 2, "discard", "ValueError: bad row"),
            (snoozed, 1, "snooze", None),
            (snoozed, 1, "completed", None),  # a snooze gives its attempt back
            (discarded, 1, "discard", "not wanted"),
        ]
    )
    assert [e for e in outer.ends if e.outcome == "retry"][0].error.args == ("bad row",)
    assert all(isinstance(e.context, nj.JobContext) and e.context.id == e.job_id for e in outer.ends)
    assert outer.ends == inner.ends


async def test_an_attempt_end_times_the_wait_from_when_the_job_was_due_and_the_run(autojump_clock) -> None:
    app = nj.App()
    app.queue("one", max_workers=1, timeout=60)
    rec = Recorder("r", [])
    app.middleware(rec)

    @app.job(queue="one")
    async def work(ctx: nj.JobContext, seconds: float) -> None:
        await trio.sleep(seconds)

    async with nj.open_runtime(app) as rt:
        first = await work.enqueue(seconds=3)
        second = await work.enqueue(seconds=1)  # waits for the only worker: 3 s
        later = await work.options(delay=10).enqueue(seconds=0)  # due at 10, starts at 10
        await rt.wait(later, timeout=60)
        await rt.wait(second, timeout=60)
    got = {e.job_id: (round(e.wait, 6), round(e.duration, 6)) for e in rec.ends}
    assert got == {first: (0.0, 3.0), second: (3.0, 1.0), later: (0.0, 0.0)}


async def test_a_timed_out_a_cancelled_and_an_interrupted_attempt_each_end_as_such(autojump_clock) -> None:
    app = nj.App()
    rec = Recorder("r", [])
    app.middleware(rec)
    started = trio.Event()

    @app.job(timeout=2, max_attempts=1)
    async def slow(ctx: nj.JobContext) -> None:
        await trio.sleep(10)

    @app.job(timeout=None)
    async def waiting(ctx: nj.JobContext) -> None:
        started.set()
        await trio.sleep_forever()

    async with nj.open_runtime(app, grace=1) as rt:
        timed = await slow.enqueue()
        await rt.wait(timed, timeout=5)
        cancelled = await waiting.enqueue()
        await started.wait()
        await rt.cancel(cancelled)
        await rt.wait(cancelled, timeout=5)
        started = trio.Event()
        interrupted = await waiting.enqueue()
        await started.wait()
    ends = {e.job_id: (e.outcome, e.timed_out, e.message) for e in rec.ends}
    assert ends == {
        timed: ("discard", True, "timed out after 2 s"),
        cancelled: ("cancelled", False, None),
        interrupted: ("interrupted", False, None),
    }


async def test_a_job_that_cannot_run_is_told_as_a_discard_with_no_context(autojump_clock) -> None:
    app = nj.App()
    rec = Recorder("r", [])
    app.middleware(rec)

    @app.job()
    async def typed(ctx: nj.JobContext, n: int) -> None:
        pass

    backend = nj.MemoryBackend()
    async with nj.open_runtime(app, backend=backend) as rt:
        [(job_id, _)] = await backend.insert_many([NewJob("typed", "default", '{"n": "x"}', 0, None, 3)])
        await rt.wait(job_id, timeout=5)
    [end] = rec.ends
    assert (end.job_id, end.outcome, end.context, end.duration) == (job_id, "discard", None, 0.0)
    assert end.message is not None and "do not fit the handler" in end.message


async def test_a_function_is_middleware_around_each_attempt_and_a_batch_passes_its_context(autojump_clock) -> None:
    app = nj.App()
    seen: list[Any] = []

    @app.middleware
    async def around(ctx: Any, call_next: Any) -> Any:
        seen.append(type(ctx).__name__)
        return await call_next(ctx)

    @app.batch_job(max_size=3, max_wait=0.5)
    async def many(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> None:
        pass

    @app.job()
    async def one(ctx: nj.JobContext) -> None:
        pass

    async with nj.open_runtime(app) as rt:
        ids = await many.enqueue_many([{}, {}, {}])
        await rt.wait(await one.enqueue(), timeout=5)
        for job_id in ids:
            await rt.wait(job_id, timeout=5)
    assert sorted(seen) == ["BatchContext", "JobContext"]
    assert [type(m).__name__ for m in app.middlewares] == ["_Around"]


async def test_enqueue_meta_is_stored_with_the_job_read_by_every_attempt_and_never_in_its_args(autojump_clock) -> None:
    app = nj.App()
    seen: list[tuple[int, dict[str, Any], dict[str, str]]] = []
    batches: list[list[dict[str, str]]] = []

    class Stamp(nj.Middleware):
        def __init__(self) -> None:
            self.calls: list[list[tuple[str, str, dict[str, Any]]]] = []

        async def around_enqueue(self, jobs: Sequence[nj.EnqueuedJob], call_next: Any) -> list[nj.JobId]:
            self.calls.append([(j.kind, j.queue, j.args) for j in jobs])
            for i, job in enumerate(jobs):
                job.meta["trace"] = f"t-{i}"
            return await call_next()

    stamp = Stamp()
    app.middleware(stamp)

    @app.job(retry=FAST_RETRY)
    async def work(ctx: nj.JobContext, n: int) -> None:
        seen.append((ctx.attempt, dict(ctx.args), ctx.meta))
        if ctx.attempt == 1:
            raise ValueError("again")

    @app.batch_job(max_size=2, max_wait=1)
    async def grouped(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> None:
        batches.append([job.meta for job in jobs] + [job.args for job in jobs])

    async with nj.open_runtime(app) as rt:
        job_id = await work.enqueue(n=1)
        await rt.wait(job_id, timeout=60)
        async with rt.transaction() as conn:
            tx_id = await work.enqueue_tx(conn, n=2)
        await rt.wait(tx_id, timeout=60)
        pair = await grouped.enqueue_many([{"a": 1}, {"a": 2}])
        await rt.wait(pair[1], timeout=60)
        stored = await rt.get_job(job_id)
    assert seen == [
        (1, {"n": 1}, {"trace": "t-0"}),
        (2, {"n": 1}, {"trace": "t-0"}),
        (1, {"n": 2}, {"trace": "t-0"}),
        (2, {"n": 2}, {"trace": "t-0"}),
    ]
    assert stamp.calls == [[("work", "default", {"n": 1})], [("work", "default", {"n": 2})], [("grouped", "default", {"a": 1}), ("grouped", "default", {"a": 2})]]
    assert batches == [[{"trace": "t-0"}, {"trace": "t-1"}, {"a": 1}, {"a": 2}]]
    assert stored.args == {"n": 1}


async def test_args_may_not_use_the_key_meta_is_kept_under(autojump_clock) -> None:
    app = nj.App()

    @app.job()
    async def anything(ctx: nj.JobContext, **kwargs: Any) -> None:
        pass

    async with nj.open_runtime(app):
        with pytest.raises(nj.ArgsError, match="nursery_jobs.meta"):
            await anything.enqueue(**{"nursery_jobs.meta": {"x": "y"}})


async def test_meta_that_is_not_str_to_str_or_too_large_refuses_the_enqueue(autojump_clock) -> None:
    app = nj.App()
    bad: list[Any] = []

    class Bad(nj.Middleware):
        async def around_enqueue(self, jobs: Sequence[nj.EnqueuedJob], call_next: Any) -> list[nj.JobId]:
            jobs[0].meta.update(bad[-1])
            return await call_next()

    app.middleware(Bad())

    @app.job()
    async def work(ctx: nj.JobContext) -> None:
        pass

    async with nj.open_runtime(app) as rt:
        for value, message in (({"n": 1}, "must map str to str"), ({"big": "x" * 5000}, "over the limit")):
            bad.append(value)
            with pytest.raises(nj.ConfigError, match=message):
                await work.enqueue()
        assert (await rt.stats())["default"].queued == 0


async def test_an_observer_that_raises_is_logged_and_the_jobs_go_on(autojump_clock, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="nursery_jobs")
    app = nj.App()

    class Broken(nj.Middleware):
        def attempt_ended(self, end: nj.AttemptEnd) -> None:
            raise RuntimeError("metrics down")

    rec = Recorder("after", [])
    app.middleware(Broken())
    app.middleware(rec)

    @app.job()
    async def work(ctx: nj.JobContext) -> None:
        pass

    async with nj.open_runtime(app) as rt:
        receipts = [await rt.wait(await work.enqueue(), timeout=5) for _ in range(2)]
    assert all(r.state is nj.JobState.COMPLETED for r in receipts)
    assert len(rec.ends) == 2  # the next observer still heard of both
    failed = [r for r in caplog.records if getattr(r, "event", None) == "middleware_failed"]
    assert len(failed) == 2 and failed[0].hook == "attempt_ended" and "metrics down" in failed[0].exc_text


async def test_a_blocked_loop_and_a_rescue_reach_the_middleware(monkeypatch: pytest.MonkeyPatch, autojump_clock) -> None:
    fake = [1000.0]
    monkeypatch.setattr(watchdog, "default_clock", lambda: fake[0])
    app = nj.App()
    blocked: list[nj.LoopBlocked] = []
    rescued: list[list[int]] = []

    class Watch(nj.Middleware):
        def loop_blocked(self, b: nj.LoopBlocked) -> None:
            blocked.append(b)

        def jobs_rescued(self, job_ids: Sequence[int]) -> None:
            rescued.append(list(job_ids))

    app.middleware(Watch())

    @app.job()
    async def hog(ctx: nj.JobContext) -> None:
        fake[0] += 0.5  # this step "held the loop" half a second
        await trio.sleep(0)
        fake[0] += 0.3

    backend = nj.MemoryBackend()
    settings = nj.RuntimeSettings(heartbeat_interval=1, rescue_after=5, rescue_interval=1, blocked_loop_warning=0.25)
    async with nj.open_runtime(app, backend=backend, settings=settings) as rt:
        [(stale, _)] = await backend.insert_many([NewJob("hog", "other", "{}", 0, None, 3)])
        await backend.claim("other", 1)  # a worker that died: rescued after 5 s
        job_id = await hog.enqueue()
        await rt.wait(job_id, timeout=5)
        await trio.sleep(8)
    mine = [(round(b.seconds, 6), b.job_id, b.kind, b.queue) for b in blocked if b.job_id == job_id]
    assert mine == [(0.5, job_id, "hog", "default"), (0.3, job_id, "hog", "default")]
    assert rescued == [[stale]]


def test_middleware_is_an_async_function_or_an_instance_registered_once() -> None:
    app = nj.App()

    def sync(ctx: Any, call_next: Any) -> Any:
        return call_next(ctx)

    for wrong, message in ((sync, "async def mw"), (nj.Middleware, "takes an instance"), (42, "async def mw")):
        with pytest.raises(nj.ConfigError, match=message):
            app.middleware(wrong)
    one = nj.Middleware()
    app.middleware(one)
    with pytest.raises(nj.ConfigError, match="registered twice"):
        app.middleware(one)
    assert app.middlewares == (one,)


def test_contexts_compare_by_identity_so_middleware_can_key_state_by_them() -> None:
    a = nj.JobContext({}, 0.0, None)
    b = nj.JobContext({}, 0.0, None)
    assert a != b and len({a, b, a}) == 2
