"""Every test has a time bound (tests/timeouts.py on top of pytest-timeout): a hang is a failure
with a traceback of where it hung, and the run goes on. Checked on small pytest sessions in a
subprocess, each bounded by the subprocess timeout, with a planted fault that hangs the runtime."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOUND = 120  # the whole planted session; far above what it needs, so it only catches a hang
# In this process, and in one xdist worker (the suite's own addopts run it in workers).
WHERE = pytest.mark.parametrize("where", [["-n", "0"], ["-n", "1"]], ids=["in-process", "xdist-worker"])

PLANTED = textwrap.dedent(
    '''
    import trio
    import nursery_jobs as nj


    class NeverReadyBackend(nj.MemoryBackend):
        async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED):
            await trio.sleep_forever()  # the planted fault: start-up never completes


    async def test_hangs_inside_open_runtime():
        async with nj.open_runtime(nj.App(), backend=NeverReadyBackend()):
            pass


    async def test_a_trio_test_after_the_hang_still_runs(autojump_clock):
        async with nj.open_runtime(nj.App()) as rt:
            assert (await rt.stats()) == {}  # no queue is used


    def test_a_plain_test_that_hangs():
        import time

        time.sleep(3600)
    '''
)

STUCK = textwrap.dedent(
    '''
    import trio


    async def test_ignores_its_cancellation():
        with trio.CancelScope(shield=True):
            await trio.sleep_forever()


    def test_never_reached():
        pass
    '''
)

CONFTEST = textwrap.dedent(
    """
    import pytest
    import trio.testing


    @pytest.fixture
    def autojump_clock():
        return trio.testing.MockClock(autojump_threshold=0)
    """
)


def run_session(tmp_path: Path, source: str, *options: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_planted.py").write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.timeouts", "-p", "no:cacheprovider",
         "-o", "trio_mode=true", "--timeout=1", "--timeout-method=signal", *options,
         "test_planted.py"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300"},
        capture_output=True, text=True, timeout=BOUND,
    )  # fmt: skip


@WHERE
def test_a_hang_inside_open_runtime_is_a_failure_with_a_traceback_and_the_run_goes_on(tmp_path, where):
    result = run_session(tmp_path, PLANTED, *where)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "2 failed, 1 passed" in out, out
    assert "FAILED test_planted.py::test_hangs_inside_open_runtime" in out, out
    assert "Timeout (>1.0s) from pytest-timeout: the Trio run was cancelled. Where its tasks were waiting:" in out, out
    assert "FAILED test_planted.py::test_a_plain_test_that_hangs - Failed: Timeout (>1.0s)" in out, out
    # where it hung: the planted line, under the backend's task, and the test's own line
    assert "await trio.sleep_forever()  # the planted fault: start-up never completes" in out, out
    assert "async with nj.open_runtime(nj.App(), backend=NeverReadyBackend()):" in out, out
    # Trio's run was closed properly: the next Trio test did not find a run still open
    assert "Attempted to call run() from inside a run()" not in out, out


@WHERE
def test_a_trio_run_that_does_not_unwind_fails_and_stops_the_session(tmp_path, where):
    result = run_session(tmp_path, STUCK, "-o", "timeout_unwind=1", *where)
    out = result.stdout
    assert result.returncode == pytest.ExitCode.INTERRUPTED, out + result.stderr
    assert "FAILED test_planted.py::test_ignores_its_cancellation - Failed: Timeout (>1.0s)" in out, out
    assert "await trio.sleep_forever()" in out, out  # where it hung
    assert "its Trio run did not unwind within 1 s" in out, out
    assert "1 failed in" in out and "test_never_reached" not in out, out


def test_this_suite_runs_with_a_default_bound_and_the_trio_aware_timer(pytestconfig):
    # pyproject.toml's [tool.pytest.ini_options] sets them; an unmarked test gets the default.
    assert pytestconfig.pluginmanager.hasplugin("timeout")
    assert pytestconfig.pluginmanager.hasplugin("tests.timeouts")
    assert float(pytestconfig.getini("timeout")) > 0
    assert pytestconfig.getini("timeout_method") == "signal"


def test_this_suite_runs_in_xdist_workers_by_default(pytestconfig):
    # README's command runs the suite in parallel; the bounds above hold in a worker (tested above).
    assert pytestconfig.pluginmanager.hasplugin("xdist")
    addopts = pytestconfig.getini("addopts")
    assert "-n" in addopts and addopts[addopts.index("-n") + 1] == "auto", addopts
