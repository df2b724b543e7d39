"""nursery_jobs' pytest plugin (`nursery_jobs.pytest_plugin`, loaded by its ``pytest11`` entry
point): each case is a small project run by pytest in this process (`pytester`)."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

# The plugin by name as well as by its entry point: the same registration either way.
ARGS = ("-p", "no:cacheprovider", "-p", "nursery_jobs.pytest_plugin")

APP = """
import pytest
import trio
import trio.testing

import nursery_jobs as nj

app = nj.App()


@app.job()
async def hello(ctx: nj.JobContext, name: str) -> str:
    await trio.sleep(10)
    return name


@pytest.fixture
def nj_app():
    return app
"""


def test_a_project_that_does_not_use_the_fixture_is_left_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_other="""
        import pytest
        import trio

        @pytest.fixture
        def runtime():
            return "the project's own"

        def test_sync(runtime):
            assert runtime == "the project's own"

        @pytest.mark.trio
        async def test_async():
            await trio.sleep(0)
        """
    )
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(passed=2)


def test_the_runtime_fixture_runs_the_app_in_virtual_time_without_trio_mode(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_service=APP
        + """
@pytest.mark.trio
async def test_hello(runtime):
    clock = trio.lowlevel.current_clock()
    assert isinstance(clock, trio.testing.MockClock) and clock.autojump_threshold == 0
    job = await nj.testing.run_job(hello, name="kit")
    assert job.state is nj.JobState.COMPLETED and trio.current_time() >= 10
    nj.testing.assert_enqueued(runtime, hello, name="kit")


@pytest.mark.trio
async def test_a_clock_of_the_tests_own_wins(runtime, mock_clock):
    assert trio.lowlevel.current_clock() is mock_clock
"""
    )
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(passed=2)


def test_the_backend_comes_from_the_option_or_the_environment(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\ntrio_mode = true\n")
    pytester.makepyfile(
        test_service=APP
        + """
from nursery_jobs.backends.sqlite import SqliteBackend


async def test_on_sqlite(runtime, nj_clock):
    assert isinstance(runtime.backend, SqliteBackend) and nj_clock.autojump_threshold == 0
    job = await nj.testing.run_job(hello, name="kit")
    assert job.state is nj.JobState.COMPLETED
"""
    )
    pytester.runpytest(*ARGS, "--nj-backend", "sqlite").assert_outcomes(passed=1)
    monkeypatch.setenv("NURSERY_JOBS_TEST_BACKEND", "sqlite")
    pytester.runpytest(*ARGS).assert_outcomes(passed=1)
    result = pytester.runpytest(*ARGS, "--nj-backend", "mysql")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test backend 'mysql' is not one of: memory, sqlite, a postgresql:// URL*"])


def test_without_nj_app_the_failure_says_what_to_define(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_service="""
        import pytest

        @pytest.mark.trio
        async def test_it(runtime):
            pass
        """
    )
    result = pytester.runpytest(*ARGS)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture needs your App: define a fixture named `nj_app` returning it*"])


def test_without_pytest_trio_the_fixture_is_refused_at_collection(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_service=APP + "\nasync def test_it(runtime):\n    pass\n")
    result = pytester.runpytest(*ARGS, "-p", "no:trio")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*uses nursery_jobs' `runtime` fixture, which runs under Trio: install pytest-trio*"])
