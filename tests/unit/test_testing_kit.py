"""nursery_jobs.testing: the `runtime` fixture, drain, the enqueue assertions, run_job and
check_at_least_once, each on the memory backend in virtual time."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path
from typing import AsyncIterator

import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs.testing import TestRuntime

app = nj.App()
app.queue("work", max_workers=2, timeout=30)


class Down(Exception):
    pass


@app.job(queue="work", retry=nj.RetryPolicy(base=60, jitter=0))
async def flaky(ctx: nj.JobContext, fail_first: int = 0) -> str:
    if ctx.attempt <= fail_first:
        raise Down("not yet")
    return "ok"


@app.job(queue="work")
async def snoozer(ctx: nj.JobContext, seconds: float) -> None:
    raise nj.Snooze(seconds)


@app.job(queue="work", max_attempts=2, retry=nj.RetryPolicy(base=1, jitter=0))
async def broken(ctx: nj.JobContext) -> None:
    raise Down("always")


@app.job(queue="work")
async def fan_out(ctx: nj.JobContext, n: int) -> None:
    await flaky.enqueue_many([{"fail_first": 0}] * n)


ledger: list[tuple[str, int]] = []
charged: dict[str, int] = {}


@app.job(queue="work")
async def charge(ctx: nj.JobContext, order: str, cents: int) -> None:
    await trio.sleep(0.1)  # read the order
    ledger.append((order, cents))  # not idempotent: a second run charges again
    await trio.sleep(0.1)  # mark the order paid (the second checkpoint)


@app.job(queue="work")
async def charge_once(ctx: nj.JobContext, order: str, cents: int) -> None:
    await trio.sleep(0.1)
    charged[order] = cents  # keyed by the order: running again changes nothing
    await trio.sleep(0.1)


class FakeApi:
    def __init__(self) -> None:
        self.posts: list[str] = []

    async def post(self, body: str) -> None:
        self.posts.append(body)  # sent before the call's first checkpoint
        await trio.sleep(0.1)  # the response


api = FakeApi()


@app.job(queue="work")
async def notify(ctx: nj.JobContext, body: str) -> None:
    await api.post(body)  # the call


def line_of(fn: object, marker: str) -> int:
    lines, start = inspect.getsourcelines(fn)  # type: ignore[arg-type]
    return next(i for i, line in enumerate(lines, start) if marker in line)


@app.job(queue="work")
async def skip_if_charged(ctx: nj.JobContext, order: str) -> None:
    if order not in charged:
        await trio.sleep(0.1)
        charged[order] = 1
        await trio.sleep(0.1)


runs: list[int] = []


@app.job(queue="work")
async def first_run_waits(ctx: nj.JobContext) -> None:
    runs.append(ctx.id)
    if len(runs) == 1:
        await trio.sleep(0.1)  # state the test's reset does not put back


SECOND_CHECKPOINT = line_of(charge.fn, "(the second checkpoint)")


@pytest.fixture
def nj_app() -> nj.App:
    return app


@app.resource
async def http() -> AsyncIterator[object]:
    raise AssertionError("the tests replace it")
    yield


@app.job(queue="work")
async def post_it(ctx: nj.JobContext, body: str) -> None:
    await ctx.resources.http.post(body)


@pytest.fixture
def nj_options() -> dict[str, object]:
    return {"grace": 3, "resources": {"http": api}}


@pytest.fixture(autouse=True)
def clean_fakes() -> None:
    ledger.clear()
    charged.clear()
    api.posts.clear()


async def test_the_fixture_runs_the_app_on_memory_under_an_autojump_clock(runtime: TestRuntime) -> None:
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, trio.testing.MockClock) and clock.autojump_threshold == 0
    assert isinstance(runtime, nj.Runtime) and isinstance(runtime.backend, nj.MemoryBackend)
    await trio.sleep(3600)  # virtual: returns at once


async def test_drain_follows_retries_snoozes_and_delays_and_returns_the_final_jobs(runtime: TestRuntime) -> None:
    start = trio.current_time()
    retried = await flaky.enqueue(fail_first=2)
    later = await flaky.options(delay=300).enqueue()
    far = await flaky.options(delay=2 * 3600).enqueue()

    jobs = await runtime.drain()

    assert [(j.id, j.state, j.attempt) for j in jobs] == [
        (retried, nj.JobState.COMPLETED, 3),
        (later, nj.JobState.COMPLETED, 1),
    ]
    # The retries took 60 + 120 s of virtual time; the drain ended when nothing was due within an hour.
    assert 300 <= trio.current_time() - start < 301
    assert (await runtime.get_job(far)).state is nj.JobState.SCHEDULED
    assert await runtime.drain() == []  # each final job is returned once
    assert [j.id for j in await runtime.drain(horizon=3 * 3600)] == [far]


async def test_drain_follows_the_jobs_that_jobs_enqueue(runtime: TestRuntime) -> None:
    await fan_out.enqueue(n=3)
    jobs = await runtime.drain()
    assert [j.kind for j in jobs] == ["fan_out", "flaky", "flaky", "flaky"]
    assert all(j.state is nj.JobState.COMPLETED for j in jobs)


async def test_drain_follows_jobs_enqueued_in_a_transaction_and_skips_rolled_back_ones(runtime: TestRuntime) -> None:
    async with runtime.transaction() as conn:
        kept = await flaky.enqueue_tx(conn, fail_first=1)
    with pytest.raises(Down):
        async with runtime.transaction() as conn:
            await flaky.enqueue_tx(conn, fail_first=0)
            raise Down("the request failed: its job goes with it")
    jobs = await runtime.drain(horizon=120)
    assert [(j.id, j.state, j.attempt) for j in jobs] == [(kept, nj.JobState.COMPLETED, 2)]
    assert nj.testing.assert_enqueued(runtime, flaky, fail_first=1) == kept


async def test_drain_reports_a_job_that_snoozes_forever_instead_of_hanging(runtime: TestRuntime) -> None:
    await flaky.enqueue()
    job_id = await snoozer.enqueue(seconds=7)
    with pytest.raises(nj.testing.DrainIncomplete) as failed:
        await runtime.drain(horizon=600)
    message = str(failed.value)
    assert "did not reach a final state within the horizon of 600 s" in message
    assert f"job {job_id} snoozer(seconds=7): scheduled, attempt 0, due in 7 s" in message


async def test_a_snooze_that_never_moves_the_clock_is_bounded_by_max_steps(runtime: TestRuntime) -> None:
    job_id = await snoozer.enqueue(seconds=0)
    with pytest.raises(nj.testing.DrainIncomplete, match=rf"after \d+ backend events \(max_steps=50\)(.|\n)*job {job_id} snoozer"):
        await runtime.drain(max_steps=50)


async def test_drain_refuses_a_bad_bound(runtime: TestRuntime) -> None:
    for bad in (-1, float("inf"), "60"):
        with pytest.raises(nj.ConfigError, match="horizon must be"):
            await runtime.drain(horizon=bad)  # type: ignore[arg-type]
    with pytest.raises(nj.ConfigError, match="max_steps must be"):
        await runtime.drain(max_steps=0)


async def test_assert_enqueued_matches_the_named_args_and_shows_what_was_enqueued_instead(runtime: TestRuntime) -> None:
    first = await flaky.enqueue(fail_first=1)
    await runtime.enqueue("snoozer", {"seconds": 5.0})

    assert nj.testing.assert_enqueued(runtime, flaky, fail_first=1) == first
    assert nj.testing.assert_enqueued(runtime, "flaky") == first
    nj.testing.assert_not_enqueued(runtime, flaky, fail_first=2)
    nj.testing.assert_not_enqueued(runtime, charge)

    with pytest.raises(AssertionError) as missing:
        nj.testing.assert_enqueued(runtime, flaky, fail_first=7)
    assert str(missing.value) == (
        "no job flaky(fail_first=7) was enqueued; enqueued instead:\n"
        f"  job {first}: flaky(fail_first=1)\n"
        f"  job {first + 1}: snoozer(seconds=5.0)"
    )
    with pytest.raises(AssertionError, match=rf"1 job\(s\) matching snoozer\(\) were enqueued: job {first + 1}: snoozer\(seconds=5.0\)"):
        nj.testing.assert_not_enqueued(runtime, snoozer)


async def test_run_job_returns_the_final_job_after_its_retries(runtime: TestRuntime) -> None:
    job = await nj.testing.run_job(flaky, fail_first=1)
    assert (job.kind, job.state, job.attempt, job.args) == ("flaky", nj.JobState.COMPLETED, 2, {"fail_first": 1})
    job = await nj.testing.run_job("broken")
    assert (job.state, [e.message for e in job.errors]) == (nj.JobState.DISCARDED, ["Down: always"] * 2)


async def test_the_kit_names_what_it_needs_outside_a_test_runtime() -> None:
    with pytest.raises(nj.ConfigError, match="needs the test runtime in this context: use the `runtime` fixture"):
        await nj.testing.run_job(flaky)
    async with nj.open_runtime(app, resources={"http": api}) as rt:
        with pytest.raises(nj.ConfigError, match="only the test runtime keeps"):
            nj.testing.assert_enqueued(rt, flaky)


async def test_check_at_least_once_finds_the_checkpoint_where_a_second_run_charges_twice(runtime: TestRuntime) -> None:
    with pytest.raises(nj.testing.NotIdempotent) as failed:
        await nj.testing.check_at_least_once(
            charge, {"order": "A-1", "cents": 500}, observe=lambda: list(ledger), reset=ledger.clear
        )
    message = str(failed.value)
    here = f"{Path(__file__).relative_to(Path.cwd())}:{SECOND_CHECKPOINT} in charge"
    assert "charge(order='A-1', cents=500) is not idempotent" in message
    assert f"interrupted at checkpoint 2 of 2, {here}" in message
    assert "clean run observed: [('A-1', 500)]" in message
    assert "this run observed:  [('A-1', 500), ('A-1', 500)]" in message
    assert f"after the last checkpoint ({here}): the handler returned, its outcome was not kept" in message
    assert "checkpoint 1 of 2" not in message  # cut before the append: the second run charges once
    assert "(2 of 3 interruptions)" in message


async def test_without_reset_the_first_difference_is_reported(runtime: TestRuntime) -> None:
    with pytest.raises(nj.testing.NotIdempotent, match=r"\(1 of 3 interruptions\)"):
        await nj.testing.check_at_least_once(charge, {"order": "A-1", "cents": 500}, observe=lambda: list(ledger))


async def test_check_at_least_once_passes_the_idempotent_version(runtime: TestRuntime) -> None:
    async def observe() -> dict[str, int]:  # an async observe (a query) works too
        await trio.sleep(0)
        return dict(charged)

    tried = await nj.testing.check_at_least_once(charge_once, {"order": "A-1", "cents": 500}, observe=observe)
    assert tried == 3  # two checkpoints, and after the last one
    assert charged == {"A-1": 500}


async def test_check_at_least_once_needs_a_clean_run_that_completes(runtime: TestRuntime) -> None:
    with pytest.raises(AssertionError, match=r"the clean run of broken\(\) ended discarded: Down: always"):
        await nj.testing.check_at_least_once(broken, {}, observe=lambda: None)


async def test_a_checkpoint_inside_a_call_names_the_handler_line_and_the_innermost_frame(runtime: TestRuntime) -> None:
    with pytest.raises(nj.testing.NotIdempotent) as failed:
        await nj.testing.check_at_least_once(notify, {"body": "hi"}, observe=lambda: api.posts, reset=api.posts.clear)
    here = Path(__file__).relative_to(Path.cwd())
    assert (
        f"interrupted at checkpoint 1 of 1, {here}:{line_of(notify.fn, '# the call')} in notify "
        f"(innermost: {here}:{line_of(FakeApi.post, '# the response')} in FakeApi.post)"
    ) in str(failed.value)
    assert "this run observed:  ['hi', 'hi']" in str(failed.value)  # observe's value was copied


async def test_the_fixture_takes_more_open_runtime_options(runtime: TestRuntime) -> None:
    assert runtime.settings.grace == 3
    await nj.testing.run_job(post_it, body="via the fake")
    assert api.posts == ["via the fake"]


def test_nj_testing_is_loaded_on_first_use_not_by_the_package() -> None:
    code = (
        "import sys, nursery_jobs as nj; assert 'nursery_jobs.testing' not in sys.modules; "
        "assert nj.testing.run_job and 'nursery_jobs.testing' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_without_reset_a_handler_that_finds_its_work_done_passes(runtime: TestRuntime) -> None:
    # The later runs find the order charged and skip both checkpoints: nothing to cut, same effects.
    assert await nj.testing.check_at_least_once(skip_if_charged, {"order": "A-1"}, observe=lambda: dict(charged)) == 3


async def test_a_handler_that_takes_another_path_after_reset_is_named(runtime: TestRuntime) -> None:
    runs.clear()
    with pytest.raises(AssertionError, match=r"first_run_waits\(\) took another path than its clean run") as failed:
        await nj.testing.check_at_least_once(first_run_waits, {}, observe=lambda: None, reset=lambda: None)
    here = f"{Path(__file__).relative_to(Path.cwd())}:{line_of(first_run_waits.fn, '# state the test')} in first_run_waits"
    assert (
        f"its run ended after 0 checkpoint(s), before the clean run's checkpoint 1, {here}, waiting in trio._timeouts.sleep"
    ) in str(failed.value)
