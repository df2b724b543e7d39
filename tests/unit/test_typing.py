"""mypy --strict passes on nursery_jobs/ (the package ships py.typed)."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.timeout(360)  # a cold mypy cache in a fresh clone; the subprocess bound is 300 s
def test_mypy_strict_is_clean():
    assert (ROOT / "nursery_jobs" / "py.typed").exists()
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
