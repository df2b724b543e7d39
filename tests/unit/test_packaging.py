"""The built wheel holds every package and data file found on disk.

An editable install imports straight from the checkout, so a package missing from the wheel
goes unnoticed until someone installs the wheel. This test builds a real wheel from a copy of
the source tree (offline, with the setuptools installed in this environment) and compares its
contents with the source tree.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP_PACKAGES = ("nursery_jobs", "nursery_jobs_lint")
# What the build needs; nothing else is copied, so stray files in the checkout cannot mask a bug.
BUILD_INPUTS = ("pyproject.toml", "README.md", *TOP_PACKAGES)


def _expected_files() -> set[str]:
    expected: set[str] = set()
    for top in TOP_PACKAGES:
        for init in (ROOT / top).rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                expected.add(init.relative_to(ROOT).as_posix())
    expected.add("nursery_jobs/py.typed")
    for sql in [*(ROOT / "nursery_jobs").rglob("pg_migrations/*.sql"), *(ROOT / "nursery_jobs").rglob("pg_schema.sql")]:
        expected.add(sql.relative_to(ROOT).as_posix())
    return expected


@pytest.mark.timeout(300)
def test_the_wheel_holds_every_package_py_typed_and_the_migrations(tmp_path: Path) -> None:
    expected = _expected_files()
    # The migrations and at least the subpackages known today are found, or the test proves nothing.
    assert any(name.endswith(".sql") for name in expected), expected
    assert "nursery_jobs/infra/pg/__init__.py" in expected, expected

    src = tmp_path / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in BUILD_INPUTS:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "--wheel-dir", str(out), str(src)],
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, (
        "building the wheel failed (needs setuptools>=68 and wheel>=0.42 from the test extras):\n"
        + proc.stdout[-3000:] + proc.stderr[-3000:]
    )
    wheels = list(out.glob("nursery_jobs-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as whl:
        names = set(whl.namelist())
    missing = sorted(expected - names)
    assert not missing, (
        f"the wheel lacks {missing}: a non-editable install cannot import them; "
        "list them in pyproject.toml's [tool.setuptools.packages.find] / package-data"
    )
