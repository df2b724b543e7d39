"""Testing a service's jobs with nursery_jobs.testing: the `runtime` fixture, drain, the enqueue
assertions, run_job, and check_at_least_once (docs/testing.md walks through this file).

Run it as your own tests run, with pytest-trio installed: ``pytest examples/test_service.py``
in a project whose pytest configuration sets ``trio_mode = true`` (or mark each test
``@pytest.mark.trio``). ``--nj-backend sqlite`` or ``--nj-backend postgresql://user@host/db``
runs the same tests on a durable backend (a fresh file or schema per test).
"""

from __future__ import annotations

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.testing import TestRuntime

# -- the service (in your project, its own module, which the tests import) --

app = nj.App()
app.queue("mail", max_workers=4, timeout=30)


class Outbox:
    """Stands for the mail provider's API. Like most, it takes an idempotency key: a second
    send with the same key is accepted and not delivered again."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.keys: set[str] = set()
        self.down_for = 0  # calls that fail before the provider is back

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    async def send(self, to: str, subject: str, key: str | None = None) -> None:
        await trio.sleep(0.2)  # the HTTP call
        if self.down_for > 0:
            self.down_for -= 1
            raise ConnectionError("the mail provider is down")
        if key is None or key not in self.keys:
            self.sent.append((to, subject))
            self.keys.add(key or "")


outbox = Outbox()
welcomed: set[int] = set()  # stands for the service's own table


@app.job(queue="mail", retry=nj.RetryPolicy(base=5, jitter=0))
async def send_welcome(ctx: nj.JobContext, user_id: int) -> None:
    await outbox.send(f"user{user_id}@example.com", "Welcome!", key=f"welcome-{user_id}")
    await trio.sleep(0.1)  # the UPDATE that marks the user welcomed
    welcomed.add(user_id)
    await send_tips.options(delay=60).enqueue(user_id=user_id)


@app.job(queue="mail")
async def send_tips(ctx: nj.JobContext, user_id: int) -> None:
    if user_id in welcomed:
        await outbox.send(f"user{user_id}@example.com", "Three tips", key=f"tips-{user_id}")


@app.job(queue="mail")
async def send_welcome_naive(ctx: nj.JobContext, user_id: int) -> None:
    await outbox.send(f"user{user_id}@example.com", "Welcome!")  # no key: every run sends
    await trio.sleep(0.1)  # the UPDATE that marks the user welcomed
    welcomed.add(user_id)


# -- the tests --


@pytest.fixture
def nj_app() -> nj.App:
    """The app the `runtime` fixture runs (usually in conftest.py)."""
    return app


@pytest.fixture(autouse=True)
def fresh_fakes() -> None:
    reset()


def reset() -> None:
    outbox.clear()
    welcomed.clear()


def observe() -> tuple[list[tuple[str, str]], list[int]]:
    return list(outbox.sent), sorted(welcomed)


async def test_welcome_then_tips_a_minute_later(runtime: TestRuntime) -> None:
    await send_welcome.enqueue(user_id=1)

    jobs = await runtime.drain(horizon=120)

    assert [(j.kind, j.state) for j in jobs] == [
        ("send_welcome", nj.JobState.COMPLETED),
        ("send_tips", nj.JobState.COMPLETED),
    ]
    assert outbox.sent == [("user1@example.com", "Welcome!"), ("user1@example.com", "Three tips")]
    nj.testing.assert_enqueued(runtime, send_tips, user_id=1)
    nj.testing.assert_not_enqueued(runtime, send_tips, user_id=2)


async def test_a_provider_outage_is_retried(runtime: TestRuntime) -> None:
    outbox.down_for = 2
    start = trio.current_time()

    job = await nj.testing.run_job(send_welcome, user_id=2)

    assert (job.state, job.attempt) == (nj.JobState.COMPLETED, 3)
    assert [e.message for e in job.errors] == ["ConnectionError: the mail provider is down"] * 2
    assert trio.current_time() - start >= 5 + 10  # RetryPolicy(base=5): in virtual time


async def test_the_welcome_is_sent_once_however_its_runs_are_cut(runtime: TestRuntime) -> None:
    await nj.testing.check_at_least_once(send_welcome, {"user_id": 3}, observe=observe, reset=reset)


async def test_the_naive_welcome_is_sent_twice_when_run_again(runtime: TestRuntime) -> None:
    with pytest.raises(nj.testing.NotIdempotent) as failed:
        await nj.testing.check_at_least_once(send_welcome_naive, {"user_id": 3}, observe=observe, reset=reset)
    assert "interrupted at checkpoint 2 of 2" in str(failed.value)
    assert "in send_welcome_naive" in str(failed.value)
