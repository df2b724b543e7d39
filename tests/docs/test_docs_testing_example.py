"""Testing a service's jobs with a MockClock: retries, timeouts, snoozes and shutdown in virtual time.

docs/testing.md includes this file verbatim (tests/docs/test_examples.py checks that it does), so the
page cannot drift from code that runs. Copy it next to your own tests and adapt.

pytest-trio's `autojump_clock` fixture is `trio.testing.MockClock(autojump_threshold=0)`:
whenever every task is blocked, virtual time jumps to the next deadline. The memory backend's
clock is `trio.current_time()`, so backoffs, snoozes, delays, timeouts and the shutdown grace all
pass instantly, and each test below takes milliseconds of real time.
"""

import trio

import nursery_jobs as nj

app = nj.App()
app.queue("webhook", max_workers=2, timeout=15)


class EndpointDown(Exception):
    pass


@app.job(queue="webhook", retry=nj.RetryPolicy(base=30, jitter=0))
async def deliver(ctx: nj.JobContext, endpoint: str, fail_first: int = 0) -> None:
    if ctx.attempt <= fail_first:
        raise EndpointDown(f"{endpoint} is down")


@app.job(queue="webhook", retry=nj.RetryPolicy(base=60, jitter=0))
async def hang(ctx: nj.JobContext) -> None:
    await trio.sleep(3600)  # longer than the queue's 15 s timeout


leases: set[str] = set()


@app.job(queue="webhook")
async def deliver_with_lease(ctx: nj.JobContext, endpoint: str) -> None:
    leases.add(endpoint)
    try:
        await trio.sleep(3600)
    finally:
        # Shielded, so the release is not cancelled at its first checkpoint; bounded, so a hung
        # release cannot hold up the shutdown.
        with trio.move_on_after(2, shield=True):
            await trio.sleep(0.5)  # stands for the UPDATE that releases the lease
            leases.discard(endpoint)


@app.job(queue="webhook")
async def wait_for_turn(ctx: nj.JobContext, busy_until: float) -> None:
    if trio.current_time() < busy_until:
        raise nj.Snooze(10)


async def test_a_failed_attempt_is_retried_after_its_backoff(autojump_clock: trio.testing.MockClock) -> None:
    async with nj.open_runtime(app) as rt:
        start = trio.current_time()
        job_id = await deliver.enqueue(endpoint="https://hooks.example/1", fail_first=2)
        receipt = await rt.wait(job_id, timeout=600)

        assert receipt.done and receipt.state is nj.JobState.COMPLETED
        job = await rt.get_job(job_id)
        assert job.attempt == 3
        assert [e.message for e in job.errors] == ["EndpointDown: https://hooks.example/1 is down"] * 2
        # RetryPolicy(base=30): 30 s before attempt 2, 60 s before attempt 3 -- in virtual time.
        assert 90 <= trio.current_time() - start < 91


async def test_an_attempt_that_outlives_the_timeout_is_cancelled_and_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with nj.open_runtime(app) as rt:
        job_id = await hang.enqueue()
        receipt = await rt.wait(job_id, timeout=20)

        assert not receipt.done  # the attempt timed out at 15 s; the retry is due at 75 s
        job = await rt.get_job(job_id)
        assert job.state is nj.JobState.RETRYABLE
        assert job.errors[0].message == "timed out after 15 s"
        await rt.cancel(job_id)  # a pending job is cancelled at once
        assert (await rt.get_job(job_id)).state is nj.JobState.CANCELLED


async def test_a_snooze_runs_the_job_later_without_spending_an_attempt(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with nj.open_runtime(app) as rt:
        job_id = await wait_for_turn.enqueue(busy_until=trio.current_time() + 25)
        receipt = await rt.wait(job_id, timeout=60)

        assert receipt.state is nj.JobState.COMPLETED
        job = await rt.get_job(job_id)
        assert job.attempt == 1  # three snoozes (at 0, 10 and 20 s), then one real attempt
        assert job.errors == ()


async def test_a_delayed_job_waits_for_its_time(autojump_clock: trio.testing.MockClock) -> None:
    async with nj.open_runtime(app) as rt:
        job_id = await deliver.options(delay=300).enqueue(endpoint="https://hooks.example/2")

        assert (await rt.wait(job_id, timeout=299)).state is nj.JobState.SCHEDULED
        assert (await rt.wait(job_id, timeout=2)).state is nj.JobState.COMPLETED


async def test_shutdown_gives_the_attempt_back_and_a_restart_runs_it_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = nj.MemoryBackend()  # an instance outlives the runtime: this is a "restart"
    async with nj.open_runtime(app, backend=backend, grace=5) as rt:
        job_id = await hang.enqueue()
        await trio.sleep(1)
        assert (await rt.get_job(job_id)).state is nj.JobState.RUNNING
    # Leaving the block shut the runtime down: 5 s of grace, then the attempt was interrupted.
    # It does not count: the job is available again with its attempt given back.
    job = await backend.get_job(job_id)
    assert (job.state, job.attempt) == (nj.JobState.AVAILABLE, 0)

    async with nj.open_runtime(app, backend=backend) as rt:
        receipt = await rt.wait(job_id, timeout=20)
        assert receipt.state is nj.JobState.RETRYABLE  # it ran again, and timed out again
        assert (await rt.stats())["webhook"].interrupted_attempts == 1


async def test_cleanup_runs_when_the_shutdown_interrupts_a_job(autojump_clock: trio.testing.MockClock) -> None:
    backend = nj.MemoryBackend()  # an instance, so the job can be inspected after shutdown
    async with nj.open_runtime(app, backend=backend, grace=5):
        job_id = await deliver_with_lease.enqueue(endpoint="https://hooks.example/3")
        await trio.sleep(1)
        assert leases == {"https://hooks.example/3"}
        stopping_at = trio.current_time()
    assert leases == set()
    # 5 s of grace, then the cancellation, then 0.5 s of shielded cleanup.
    assert 5.5 <= trio.current_time() - stopping_at < 5.6
    assert (await backend.get_job(job_id)).state is nj.JobState.AVAILABLE
