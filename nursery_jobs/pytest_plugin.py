"""nursery_jobs' pytest plugin: the `runtime` fixture (`nursery_jobs.testing`'s test runtime on
a `MockClock`), loaded through the ``pytest11`` entry point ``nursery_jobs.pytest_plugin``
wherever nursery_jobs is installed (``-p no:nursery_jobs.pytest_plugin`` turns it off).

Loaded into every pytest run of such an environment, so it is inert until a test asks for
`runtime`: importing it starts nothing and does no I/O (it imports the package, as any
``import nursery_jobs`` does, and pytest), its fixtures are lazy, it registers no marker, and
only an ``async def`` test that uses `runtime` is touched (given a clock). A project's own
fixture of the same name (in a conftest.py or a test module) overrides this one, as pytest
always lets a closer fixture win.

Fixtures:

- `runtime`: `open_test_runtime(nj_app, backend=...)` for the test, shut down after it.
- `nj_app`: the App under test. Yours: define a fixture of this name (conftest.py or the test
  module) returning it.
- `nj_backend`: ``memory`` (default), ``sqlite``, or a ``postgresql://`` URL, from
  ``--nj-backend`` or the ``NURSERY_JOBS_TEST_BACKEND`` environment variable; override it with
  a parametrised fixture to run each test on several backends.
- `nj_options`: more keyword arguments for `open_runtime` (``{"grace": 5}``, settings):
  ``{}`` unless you override it.
- `nj_clock`: the test's ``MockClock(autojump_threshold=0)``, on every backend (the durable
  ones run in their deterministic mode: `open_test_backend`). A test that asks for a clock of
  its own (pytest-trio's `autojump_clock`, `mock_clock`) runs on that one instead.

The clock reaches `trio.run` as pytest-trio allows it: a ``trio`` mark with its own ``run``,
put first on each async test that uses `runtime` (pytest-trio passes a clock only when the
test itself names it as an argument, and the `runtime` fixture is not a clock).
"""

from __future__ import annotations

import inspect
import os
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

import pytest

if TYPE_CHECKING:
    import trio
    import trio.testing

    from .app import App
    from .testing import TestRuntime

ENV = "NURSERY_JOBS_TEST_BACKEND"
FIXTURE = "runtime"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("nursery_jobs").addoption(
        "--nj-backend",
        default=None,
        metavar="BACKEND",
        help=f"backend of nursery_jobs' `runtime` fixture: memory (default), sqlite, or a postgresql:// URL "
        f"(a fresh schema per test); default from ${ENV}",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    users = [item for item in items if isinstance(item, pytest.Function) and FIXTURE in item.fixturenames]
    if not users:
        return
    if not _pytest_trio_active(config):
        raise pytest.UsageError(
            f"{users[0].nodeid} uses nursery_jobs' `{FIXTURE}` fixture, which runs under Trio: "
            "install pytest-trio (pip install pytest-trio)"
        )
    for item in users:
        if inspect.iscoroutinefunction(item.obj):
            # First, so pytest-trio takes this run (its trio_mode mark, if any, comes after).
            item.add_marker(pytest.mark.trio(run=_run_on_clock(item)), append=False)


def _pytest_trio_active(config: pytest.Config) -> bool:
    try:
        import pytest_trio.plugin  # type: ignore[import-untyped]
    except ImportError:
        return False
    return config.pluginmanager.is_registered(pytest_trio.plugin)  # by its entry point or by -p


def _run_on_clock(item: pytest.Function) -> Callable[..., Any]:
    def run(fn: Callable[[], Any], *, clock: trio.abc.Clock | None = None, instruments: Any = ()) -> Any:
        from .infra.runner import run_trio

        chosen: trio.abc.Clock = clock or item.funcargs["nj_clock"]  # type: ignore[assignment]  # funcargs: object
        return run_trio(fn, clock=chosen, instruments=instruments)

    return run


@pytest.fixture
def nj_app() -> App:
    """The App the `runtime` fixture runs: define a fixture of this name returning yours."""
    pytest.fail(
        f"nursery_jobs' `{FIXTURE}` fixture needs your App: define a fixture named `nj_app` returning it, "
        "in conftest.py or the test module",
        pytrace=False,
    )


@pytest.fixture
def nj_backend(request: pytest.FixtureRequest) -> str:
    """``memory``, ``sqlite`` or a ``postgresql://`` URL (``--nj-backend``, ``$NURSERY_JOBS_TEST_BACKEND``)."""
    from .testing import check_test_backend

    return check_test_backend(str(request.config.getoption("nj_backend") or os.environ.get(ENV) or "memory"))


@pytest.fixture
def nj_clock() -> trio.testing.MockClock:
    """The test's virtual clock: ``MockClock(autojump_threshold=0)``."""
    import trio.testing

    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture
def nj_options() -> dict[str, Any]:
    """More keyword arguments for the `runtime` fixture's `open_runtime` (none by default)."""
    return {}


@pytest.fixture
async def runtime(
    nj_app: App, nj_backend: str, nj_options: dict[str, Any], nj_clock: trio.testing.MockClock, tmp_path: Any
) -> AsyncIterator[TestRuntime]:
    """The test runtime (`nursery_jobs.testing.TestRuntime`) of `nj_app` on `nj_backend`, in
    virtual time; its jobs are shut down and the backend removed when the test ends."""
    from .testing import open_test_backend, open_test_runtime

    async with open_test_backend(nj_backend, tmp_path) as backend:
        async with open_test_runtime(nj_app, **nj_options, backend=backend) as rt:
            yield rt
