"""Every backend accepts the same values and refuses the same values, with the same error.

A value class is decided once (`nursery_jobs.config` for priorities, unique keys and names,
`nursery_jobs.jobs` for args and ids): either every backend stores it exactly, or every backend
refuses it before it reaches storage. The memory backend must never let a test pass where
PostgreSQL would fail in production.
"""

from __future__ import annotations

import pytest

import nursery_jobs as nj
from nursery_jobs.config import MAX_UNIQUE_KEY, PRIORITY_RANGE
from nursery_jobs.jobs import MAX_ARGS_DEPTH, MAX_ARGS_SIZE


def _app() -> tuple[nj.App, nj.JobKind]:
    app = nj.App()

    @app.job()
    async def task(ctx: nj.JobContext, **kwargs: object) -> None:
        pass

    return app, task


async def test_ids_are_ints_on_every_backend(make_backend, autojump_clock):
    app, task = _app()
    async with nj.open_runtime(app, backend=make_backend(), queues=[]) as rt:
        job_id = await task.enqueue()
        assert job_id == 1 and (await rt.get_job(1)).id == 1
        for bad in ("1", 1.0, None, True, b"1"):
            for call in (rt.get_job(bad), rt.cancel(bad), rt.wait(bad, timeout=0)):  # type: ignore[arg-type]
                with pytest.raises(nj.ConfigError, match="a job id is an int"):
                    await call
        for missing in (0, -1, 2**63, 2**64, 2**70):
            for call in (rt.get_job(missing), rt.cancel(missing), rt.wait(missing, timeout=0)):
                with pytest.raises(nj.JobNotFound, match=f"no job with id {missing}"):
                    await call
        with pytest.raises(nj.JobNotFound):
            await rt.get_job(2**63 - 1)  # the largest id: a valid id that does not exist


async def test_priorities_outside_a_32_bit_int_are_refused_on_every_backend(make_backend, autojump_clock):
    app, task = _app()
    low, high = PRIORITY_RANGE
    async with nj.open_runtime(app, backend=make_backend(), queues=[]) as rt:
        for bad in (2**31, 2**40, 2**70, -(2**31) - 1):
            with pytest.raises(nj.ConfigError, match="32-bit"):
                await task.options(priority=bad).enqueue()
            with pytest.raises(nj.ConfigError, match="32-bit"):
                await rt.enqueue_many("task", [{}], priority=bad)
        for ok in (low, high):
            job = await rt.get_job(await task.options(priority=ok).enqueue())
            assert job.priority == ok


async def test_unique_keys_that_a_database_cannot_index_are_refused_on_every_backend(make_backend, autojump_clock):
    app, task = _app()
    async with nj.open_runtime(app, backend=make_backend(), queues=[]) as rt:
        for bad, why in (("a\x00b", "NUL"), ("\udcff.txt", "surrogate"), ("x" * 3000, "over the limit")):
            with pytest.raises(nj.ConfigError, match=why):
                await task.options(unique_key=bad).enqueue()
        longest = "é" * (MAX_UNIQUE_KEY // 2)  # two bytes each: exactly the limit
        first = await task.options(unique_key=longest).enqueue()
        again = await task.options(unique_key=longest).enqueue()
        assert again == first and again.existing
        assert (await rt.get_job(first)).unique_key == longest


async def test_unique_key_functions_are_held_to_the_same_rule(make_backend, autojump_clock):
    app = nj.App()

    @app.job(unique=lambda args: str(args["key"]))
    async def keyed(ctx: nj.JobContext, key: str) -> None:
        pass

    async with nj.open_runtime(app, backend=make_backend(), queues=[]):
        with pytest.raises(nj.ConfigError, match="NUL"):
            await keyed.enqueue(key="a\x00")
        with pytest.raises(nj.ConfigError, match="over the limit"):
            await keyed.enqueue_many([{"key": "ok"}, {"key": "y" * 2000}])


async def test_args_too_deep_or_too_large_are_refused_on_every_backend(make_backend, autojump_clock):
    app, task = _app()
    deep: object = 0
    for _ in range(MAX_ARGS_DEPTH):  # with the args dict itself: one level too many
        deep = [deep]
    fits: object = 0
    for _ in range(MAX_ARGS_DEPTH - 1):
        fits = {"a": fits}
    async with nj.open_runtime(app, backend=make_backend(), queues=[]) as rt:
        with pytest.raises(nj.ArgsError, match=f"deeper than {MAX_ARGS_DEPTH}"):
            await task.enqueue(v=deep)
        loop: list[object] = []
        loop.append(loop)
        with pytest.raises(nj.ArgsError, match="contain"):
            await task.enqueue(v=loop)
        very_deep: object = 0
        for _ in range(100_000):  # json alone would raise RecursionError
            very_deep = [very_deep]
        with pytest.raises(nj.ArgsError):
            await task.enqueue(v=very_deep)
        with pytest.raises(nj.ArgsError, match="over the limit"):
            await task.enqueue(v="x" * MAX_ARGS_SIZE)
        job = await rt.get_job(await task.enqueue(v=fits))
        assert job.args == {"v": fits}


async def test_args_are_checked_against_the_handlers_annotations_on_every_backend(make_backend, autojump_clock):
    app = nj.App()
    seen: list[dict[str, object]] = []

    @app.job(max_attempts=1)
    async def index_doc(ctx: nj.JobContext, doc_id: int, ratio: float = 1.0) -> None:
        seen.append(dict(ctx.args))

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        for call in (
            index_doc.enqueue(doc_id="1"),
            rt.enqueue("index_doc", {"doc_id": True}),
            index_doc.enqueue_many([{"doc_id": 1}, {"doc_id": 2.0}]),
            rt.enqueue_many(index_doc, [{"doc_id": 1, "ratio": "x"}]),
        ):
            with pytest.raises(nj.ArgsError, match="job 'index_doc': argument '(doc_id|ratio)' must be (int|float), not"):
                await call
        assert (await rt.stats())["default"].queued == 0  # nothing of a refused batch was stored
        job_id = await index_doc.enqueue(doc_id=7, ratio=2)  # a JSON int is a valid float
        assert (await rt.wait(job_id, timeout=10)).state is nj.JobState.COMPLETED
    assert seen == [{"doc_id": 7, "ratio": 2}] and type(seen[0]["ratio"]) is int  # received as enqueued
