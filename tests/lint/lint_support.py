"""Shared helpers for the lint's tests (imported by conftest.py and the test modules).

The import package ``nursery_jobs_lint`` lives in the ``lint/`` folder (mapped by
``[tool.setuptools.package-dir]``). Tests must exercise *this checkout's* copy, whether or not the
distribution is installed (editable or not, possibly from another checkout), so the package is
loaded from ``lint/`` under the name ``nursery_jobs_lint`` unless the importable one already is
that folder. Subprocess runs get a PYTHONPATH entry holding a ``nursery_jobs_lint`` symlink to the
same folder, so ``python -m nursery_jobs_lint`` is tested for real.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
LINT_DIR = REPO / "lint"
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"


def _load_lint_package() -> None:
    existing = sys.modules.get("nursery_jobs_lint")
    if existing is None:
        try:
            import nursery_jobs_lint as existing
        except ImportError:
            existing = None
    if existing is not None and pathlib.Path(existing.__file__ or "").resolve().parent == LINT_DIR.resolve():
        return
    for name in [n for n in sys.modules if n == "nursery_jobs_lint" or n.startswith("nursery_jobs_lint.")]:
        del sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        "nursery_jobs_lint", LINT_DIR / "__init__.py", submodule_search_locations=[str(LINT_DIR)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["nursery_jobs_lint"] = module
    spec.loader.exec_module(module)


_load_lint_package()

from nursery_jobs_lint.cli import main  # noqa: E402


@pytest.fixture(scope="session")
def lint_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for subprocesses in which ``import nursery_jobs_lint`` finds this checkout."""
    shim = tmp_path_factory.mktemp("lint_shim")
    (shim / "nursery_jobs_lint").symlink_to(LINT_DIR, target_is_directory=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(shim), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("PYTHONSAFEPATH", None)
    return env


@pytest.fixture(scope="session")
def lint_shim_dir(lint_env: dict[str, str]) -> str:
    return lint_env["PYTHONPATH"].split(os.pathsep)[0]


class CliResult:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:
        return f"CliResult(code={self.code}, out={self.out!r}, err={self.err!r})"


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """Run the CLI in-process in ``cwd``; returns exit code, stdout and stderr."""

    def run(*args: str, cwd: pathlib.Path) -> CliResult:
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        code = main(list(args))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def git_init(path: pathlib.Path) -> None:
    subprocess.run(["git", "init", "-q", str(path)], check=True, capture_output=True)


def real_lint_table_text() -> str:
    """The repository's own ``[tool.nursery_jobs.lint]`` table, verbatim."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r"^\[tool\.nursery_jobs\.lint\]\n(?:(?!^\[).*\n?)*", text, re.MULTILINE)
    assert match, "pyproject.toml has no [tool.nursery_jobs.lint] table"
    copied = match.group(0)
    assert tomllib.loads(copied)["tool"]["nursery_jobs"]["lint"] == real_lint_table(), "verbatim copy differs"
    return copied


def real_lint_table() -> dict[str, object]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    table: dict[str, object] = data["tool"]["nursery_jobs"]["lint"]
    return table


class Project:
    """A throwaway git project with a pyproject.toml."""

    def __init__(self, root: pathlib.Path, table_text: str) -> None:
        self.root = root
        git_init(root)
        self.write("pyproject.toml", '[project]\nname = "planted"\nversion = "0"\n\n' + table_text)

    def write(self, relative: str, text: str) -> pathlib.Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return path

    def remove(self, relative: str) -> None:
        (self.root / relative).unlink()


@pytest.fixture
def make_project(tmp_path: pathlib.Path) -> Iterator[Callable[..., Project]]:
    counter = iter(range(1000))

    def make(table_text: str) -> Project:
        root = tmp_path / f"project{next(counter)}"
        root.mkdir()
        return Project(root, table_text)

    yield make
