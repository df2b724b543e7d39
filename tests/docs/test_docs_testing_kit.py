"""docs/testing.md's worked example runs as a user runs it: `examples/test_service.py` copied
into a project of its own (pytest-trio's trio_mode, the page's conftest.py that parametrises
`nj_backend`), run by pytest in a subprocess, on memory, SQLite and PostgreSQL; and the failure
the page shows is the one the example's naive handler gives."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
import trio
import trio.testing

import nursery_jobs as nj
from tests.docs.examples_kit import EXAMPLES, load_example

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "testing.md"
PAGE_URL = "postgresql://postgres@127.0.0.1/myapp_test"


def conftest_block() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```$", PAGE.read_text(), re.MULTILINE | re.DOTALL)
    (block,) = [b for b in blocks if "def nj_backend" in b]
    assert PAGE_URL in block, block
    return block


def test_the_worked_example_passes_on_every_backend(tmp_path: Path, pg_url: str) -> None:
    # As a user's project: the plugin comes from the installed entry point, nothing names it.
    installed = [ep for ep in importlib.metadata.entry_points(group="pytest11") if ep.value == "nursery_jobs.pytest_plugin"]
    assert installed, "the pytest11 entry point is not installed in this environment: run .venv/bin/pip install -e '.[test]'"
    shutil.copy(ROOT / "examples" / "test_service.py", tmp_path)
    (tmp_path / "pytest.ini").write_text("[pytest]\ntrio_mode = true\n")
    (tmp_path / "conftest.py").write_text(conftest_block().replace(PAGE_URL, pg_url))
    env = {k: v for k, v in os.environ.items() if k != "NURSERY_JOBS_TEST_BACKEND"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "12 passed" in result.stdout, result.stdout
    with psycopg.connect(pg_url) as conn:  # each test's schema was dropped after it
        left = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'nj_test_%'").fetchall()
    assert left == []


def test_the_failure_the_page_shows_is_the_one_the_example_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # file names in the message are relative to the working directory
    example = load_example(EXAMPLES / "test_service.py", "example_test_service")

    async def check() -> str:
        async with nj.testing.open_test_runtime(example.app):
            with pytest.raises(nj.testing.NotIdempotent) as failed:
                await nj.testing.check_at_least_once(
                    example.send_welcome_naive, {"user_id": 3}, observe=example.observe, reset=example.reset
                )
        return str(failed.value)

    message = trio.run(check, clock=trio.testing.MockClock(autojump_threshold=0))
    shown = re.search(r"^  ```\n(  send_welcome_naive.*?)^  ```$", PAGE.read_text(), re.MULTILINE | re.DOTALL)
    assert shown, "docs/testing.md no longer shows the failure"
    lines = [line[2:] for line in shown.group(1).splitlines() if line.strip() != "..."]
    assert [line for line in lines if line not in message.splitlines()] == []
