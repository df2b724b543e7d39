"""The advisory flake8 plugin: same findings as the CLI, and proof that flake8's # noqa is why
the CLI (not flake8) is the gate."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

from nursery_jobs_lint.flake8_plugin import _CONFIG_CACHE, Plugin

TABLE = '[tool.nursery_jobs.lint]\ninclude = ["pkg"]\nallow = ["pkg/infra/**"]\n'


@pytest.fixture
def project(tmp_path: pathlib.Path) -> pathlib.Path:
    _CONFIG_CACHE.clear()
    (tmp_path / "pyproject.toml").write_text(TABLE)
    (tmp_path / "pkg" / "infra").mkdir(parents=True)
    return tmp_path


def run_plugin(path: pathlib.Path, text: str) -> list[tuple[int, int, str]]:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    lines = text.splitlines(keepends=True)
    plugin = Plugin(ast.parse(text), str(path), lines)
    return [(line, col, message.split(" ")[0]) for line, col, message, kind in plugin.run() if kind is Plugin]


def test_plugin_yields_zero_based_character_columns(project: pathlib.Path) -> None:
    assert run_plugin(project / "pkg" / "job.py", 'x = "é"; nursery.start_soon(f)\n') == [(1, 9, "NJS102")]


def test_plugin_applies_allow_and_include(project: pathlib.Path) -> None:
    assert run_plugin(project / "pkg" / "infra" / "owner.py", "nursery.start_soon(f)\n") == []
    assert run_plugin(project / "scripts" / "tool.py", "nursery.start_soon(f)\n") == []


def test_plugin_reports_a_bad_config_instead_of_crashing(project: pathlib.Path) -> None:
    (project / "pyproject.toml").write_text(TABLE + "alow = []\n")
    found = run_plugin(project / "pkg" / "job.py", "x = 1\n")
    assert found == [(1, 0, "NJS001")]


def test_real_flake8_runs_the_plugin_and_honours_noqa(project: pathlib.Path, lint_import_dir: str) -> None:
    pytest.importorskip("flake8", reason="flake8 is an optional extra")
    (project / ".flake8").write_text(
        "[flake8]\nselect = NJS\n\n"
        f"[flake8:local-plugins]\nextension =\n    NJS = nursery_jobs_lint.flake8_plugin:Plugin\npaths = {lint_import_dir}\n"
    )
    (project / "pkg" / "job.py").write_text(
        "nursery.start_soon(f)\n"
        "nursery.start_soon(f)  # noqa: NJS102\n"
        "nursery.start_soon(f)  # noqa\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "flake8", "pkg/job.py"], cwd=project, capture_output=True, text=True, check=False
    )
    assert result.stderr == ""
    # sorted(set()): if the distribution is also installed, flake8 loads the NJS entry point too
    lines = sorted(set(result.stdout.splitlines()))
    # flake8 silences NJS102 on lines 2 and 3 (and even NJS002 under the bare noqa) ...
    assert [line.split(": ")[0] + " " + line.split(": ")[1][:6] for line in lines] == [
        "pkg/job.py:1:1 NJS102",
        "pkg/job.py:2:24 NJS002",
    ]
    # ... which is why the gate is the CLI, which reports all five findings
    from nursery_jobs_lint.checker import check_source
    from nursery_jobs_lint.config import load_config

    config = load_config(project / "pyproject.toml")
    codes = [f.code for f in check_source((project / "pkg" / "job.py").read_text(), "pkg/job.py", config)]
    assert codes == ["NJS102", "NJS102", "NJS002", "NJS102", "NJS002"]
