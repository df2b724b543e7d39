"""Per-key rate limits end to end: the runtime starts at most `limit` jobs of a rate key in any
`per` seconds, a key over its rate delays no other key and no unlimited job, the fetcher
sleeps until the key's next slot (the stores here poll every 60 s: a job that waited for a poll
instead shows as a gap of a minute), and a retry's start counts. On virtual time the slots are
exact on memory; on the durable backends a slow database call on a loaded machine may let the
clock jump to the next timer, so their starts are bounded, not exact, after the slot."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import nursery_jobs as nj


def windows_hold_at_most(starts: list[float], limit: int, per: float) -> bool:
    """No half-open window of `per` seconds holds more than `limit` of `starts`."""
    s = sorted(starts)
    return all(s[i] + per <= s[i + limit] for i in range(len(s) - limit))


async def test_a_key_starts_at_most_its_rate_and_delays_no_other_key_nor_unlimited_jobs(
    make_backend, backend_name, autojump_clock
) -> None:
    app = nj.App()
    app.queue("fetch", max_workers=8, timeout=30)
    started: dict[str | None, list[float]] = {}

    @app.job(queue="fetch", rate=nj.Rate(3, per=10), rate_key=lambda args: args["host"] and f"host:{args['host']}")
    async def fetch(ctx: nj.JobContext, host: str | None, n: int) -> None:
        started.setdefault(host, []).append(trio.current_time())
        await trio.sleep(0.5)

    async with nj.open_runtime(app, backend=make_backend(), grace=0) as rt:
        t0 = trio.current_time()
        ids = await fetch.enqueue_many([{"host": h, "n": n} for n in range(9) for h in ("a", "b")])
        free = await fetch.enqueue_many([{"host": None, "n": n} for n in range(6)])  # rate_key None: no limit
        for job_id in free:
            assert (await rt.wait(job_id, timeout=30)).done
        free_done = trio.current_time() - t0
        for job_id in ids:
            assert (await rt.wait(job_id, timeout=120)).state is nj.JobState.COMPLETED
        stats = (await rt.stats())["fetch"]
    for host in ("a", "b"):
        assert len(started[host]) == 9 and windows_hold_at_most(started[host], 3, 10.0), started[host]
    assert free_done < 10  # the unlimited jobs waited behind neither key
    last = max(started["a"] + started["b"]) - t0
    if backend_name == "memory":
        assert sorted(started["a"]) == [t0 + 10 * (i // 3) for i in range(9)]  # each batch at its slot exactly
    assert 20 <= last < 40  # woken at the slots, not at a poll a minute later
    assert stats.completed == 24 and stats.failed_attempts == 0


async def test_a_retry_is_another_start_and_waits_for_its_slot(make_backend, autojump_clock) -> None:
    app = nj.App()
    attempts: list[float] = []

    @app.job(rate=nj.Rate(1, per=20), rate_key=lambda args: "endpoint", retry=nj.RetryPolicy(base=0.1, jitter=0))
    async def post(ctx: nj.JobContext) -> None:
        attempts.append(trio.current_time())
        if len(attempts) == 1:
            raise RuntimeError("503 from the endpoint")

    async with nj.open_runtime(app, backend=make_backend(), grace=0) as rt:
        job_id = await post.enqueue()
        receipt = await rt.wait(job_id, timeout=60)
    assert receipt.state is nj.JobState.COMPLETED
    assert len(attempts) == 2 and 20 <= attempts[1] - attempts[0] < 40  # not 0.1 s later: its slot came at 20 s


async def test_a_rate_key_function_that_raises_is_an_args_error_naming_the_kind(make_backend, autojump_clock) -> None:
    app = nj.App()

    @app.job(rate=nj.Rate(1, per=1), rate_key=lambda args: f"host:{args['host']}")
    async def fetch(ctx: nj.JobContext, **args: Any) -> None:
        return None

    async with nj.open_runtime(app, backend=make_backend(), grace=0) as rt:
        with pytest.raises(nj.ArgsError, match="rate_key function of job 'fetch' raised KeyError"):
            await fetch.enqueue(other=1)
        with pytest.raises(nj.ArgsError, match="rate key of job 'fetch'"):
            await rt.enqueue_many("fetch", [{"host": 1}, {"host": "\x00"}])
        assert (await rt.stats())["default"].available == 0  # the batch was refused whole



async def test_a_rate_holds_at_the_handlers_first_line(make_backend, autojump_clock) -> None:
    """What a rate limits is what the partner sees: the handler's calls. Two workers, one key
    of two starts a second: two short jobs, two that run 1.3 s, then short ones. At t=2 the key
    has its slots and both workers are busy until 2.3; at most two handler entries in any
    second, on virtual time exactly. (A job claimed at 2 for a worker still busy, counted at 2,
    would enter its handler at 2.3, and the next window's two at 3, handed to idle workers at
    once: four entries within 0.7 s.)"""
    app = nj.App()
    app.queue("api", max_workers=2, timeout=30)
    entered: list[float] = []

    @app.job(queue="api", rate=nj.Rate(2, per=1), rate_key=lambda args: "partner")
    async def call(ctx: nj.JobContext, sleep: float) -> None:
        entered.append(trio.current_time())
        await trio.sleep(sleep)

    async with nj.open_runtime(app, backend=make_backend(), grace=0) as rt:
        t0 = trio.current_time()
        ids = await call.enqueue_many([{"sleep": s} for s in (0.2, 0.2, 1.3, 1.3, 0.1, 0.1, 0.1, 0.1)])
        for job_id in ids:
            assert (await rt.wait(job_id, timeout=60)).done
    assert len(entered) == 8 and windows_hold_at_most(entered, 2, 1.0), [t - t0 for t in entered]
