"""Checks of the property harness itself: the audit sees escapes without any planted fault, the
reference model reproduces a timeline worked out by hand, and the profiles are registered.
A harness that cannot fail would make every property a toy."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import settings

import nursery_jobs as nj

from .audit import PropertyFailed, TaskAudit
from .model import OK, RAISE, JobSpec, Model, QueueSpec, Step, raise_message, timeout_message

ROOT = Path(__file__).resolve().parents[2]


def run_audited(app: nj.App) -> TaskAudit:
    audit = TaskAudit()

    async def main() -> None:
        audit.mark_baseline()
        audit.owner = trio.lowlevel.current_task()
        async with nj.open_runtime(app, grace=0) as rt:
            job_id = await rt.enqueue("leaky")
            await rt.wait(job_id, timeout=5)
            await trio.sleep(2)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0), instruments=[audit])
    return audit


def test_audit_catches_a_system_task_spawned_by_a_job() -> None:
    app = nj.App()
    app.queue("q", max_workers=1, timeout=None)

    @app.job(queue="q")
    async def leaky(ctx: nj.JobContext) -> None:
        trio.lowlevel.spawn_system_task(trio.sleep, 1, name="escaped")

    audit = run_audited(app)
    with pytest.raises(PropertyFailed, match="escaped") as info:
        audit.raise_violations()
    assert info.value.prop == "P01"


def test_audit_catches_a_job_task_outside_the_runtime() -> None:
    app = nj.App()
    app.queue("q", max_workers=1, timeout=None)
    outside: list[trio.Nursery] = []

    @app.job(queue="q")
    async def leaky(ctx: nj.JobContext) -> None:
        outside[0].start_soon(trio.sleep, 1, name="stray")

    audit = TaskAudit()

    async def driver() -> None:
        audit.owner = trio.lowlevel.current_task()
        async with nj.open_runtime(app, grace=0) as rt:
            await rt.wait(await rt.enqueue("leaky"), timeout=5)

    async def main() -> None:
        audit.mark_baseline()
        async with trio.open_nursery() as nursery:  # a "process-global" nursery beside the runtime
            outside.append(nursery)
            nursery.start_soon(driver)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0), instruments=[audit])
    prop, message = audit.violations[0]
    assert prop == "P01" and "stray" in message


def test_model_reproduces_a_timeline_worked_out_by_hand() -> None:
    q = QueueSpec("q", max_workers=1, timeout=2.5, max_attempts=2, retry_base=2)
    model = Model([q])
    model.open()
    model.enqueue(0, JobSpec("q", (Step(1, RAISE), Step(3, OK)), priority=0))  # starts at once
    model.enqueue(1, JobSpec("q", (Step(1, OK),), priority=1))  # waits for the worker
    model.advance_to(10)
    # A fails at 1 (retry after 2 s), B runs 1..2, A's second attempt times out at 3 + 2.5 and
    # spends its last attempt.
    assert model.starts == [(0, 0, 1, 0), (1.0, 1, 1, 0), (3.0, 0, 2, 1)]
    assert model.ends == [(1.0, 0, 1, "retryable"), (2.0, 1, 1, "completed"), (5.5, 0, 2, "discarded")]
    assert model.jobs[0].errors == [(1, 1.0, raise_message(0, 0)), (2, 5.5, timeout_message(2.5))]
    assert model.shutdown(grace=1.25) == 10


def test_profiles() -> None:
    assert settings.get_profile("ci").max_examples == 100
    assert settings.get_profile("nightly").max_examples == 3000
    for name in ("ci", "nightly"):
        assert settings.get_profile(name).deadline is None


# What each profile sets that Hypothesis's own defaults (100 examples, 50 steps, a 200 ms
# deadline) do not: so "ci" in effect is told apart from no profile loaded at all.
_IN_EFFECT = {"ci": ["100", "30", "None"], "nightly": ["3000", "100", "None"]}


@pytest.mark.parametrize("variable", ["ci", "nightly", None])
def test_the_profile_the_environment_names_is_the_one_in_effect(variable) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NURSERY_JOBS_HYPOTHESIS_PROFILE"}
    if variable is not None:
        env["NURSERY_JOBS_HYPOTHESIS_PROFILE"] = variable
    code = (
        "import tests.properties.conftest\n"
        "from hypothesis import settings\n"
        "s = settings.default\n"
        "print(s.max_examples, s.stateful_step_count, s.deadline)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == _IN_EFFECT[variable or "ci"]


def test_an_unknown_profile_name_is_an_error_not_a_silent_default() -> None:
    env = {**os.environ, "NURSERY_JOBS_HYPOTHESIS_PROFILE": "nightlyy"}
    proc = subprocess.run(
        [sys.executable, "-c", "import tests.properties.conftest"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0 and "nightlyy" in proc.stderr, proc.stderr
