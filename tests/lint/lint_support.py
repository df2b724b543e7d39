"""Shared helpers for the lint's tests (imported by conftest.py and the test modules).

The import package ``nursery_jobs_lint`` is the folder of that name at the repository root, next
to ``nursery_jobs``. pytest puts the root on ``sys.path`` (``tests`` is a package), so in-process
tests import this checkout's copy, whatever is installed; subprocess runs get the root on
``PYTHONPATH`` for the same reason, so ``python -m nursery_jobs_lint`` is tested for real.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import tomllib
from collections.abc import Callable, Iterator

import pytest

import nursery_jobs_lint
from nursery_jobs_lint.cli import main

REPO = pathlib.Path(__file__).resolve().parents[2]
LINT_DIR = REPO / "nursery_jobs_lint"
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
assert pathlib.Path(nursery_jobs_lint.__file__ or "").resolve().parent == LINT_DIR, (
    f"the lint's tests imported {nursery_jobs_lint.__file__}, not this checkout's {LINT_DIR}: "
    "run pytest from the repository root (tests/ is a package, so the root goes on sys.path)"
)


@pytest.fixture(scope="session")
def lint_env() -> dict[str, str]:
    """Environment for subprocesses in which ``import nursery_jobs_lint`` finds this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("PYTHONSAFEPATH", None)
    return env


@pytest.fixture(scope="session")
def lint_import_dir() -> str:
    """The folder holding this checkout's ``nursery_jobs_lint`` (for flake8's local-plugins paths)."""
    return str(REPO)


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
