"""examples/write_then_index.py runs as its docstring says: a request's row, index job and event
commit together; it answers within its 2 s wait; a burst of max_waiters + 1 requests gets 64
answers after the wait and one at once; every event becomes its owner's notification. Run in
this process on virtual time (the waits are seconds long), on SQLite and PostgreSQL; the script
as a user runs it is `main` under `nj.run`, which this drives under `open_runtime`."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from tests import pgutil
from tests.docs.examples_kit import run_main_on_virtual_time

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "write_then_index.py"


def load(monkeypatch: pytest.MonkeyPatch, jobs_url: str) -> ModuleType:
    monkeypatch.setenv("JOBS_URL", jobs_url)
    spec = importlib.util.spec_from_file_location("write_then_index", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "write_then_index", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=["sqlite", "postgres"])
def jobs_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'write_then_index.db'}"
    url = request.getfixturevalue("pg_url")
    return f"{url}{'&' if '?' in url else '?'}schema={pgutil.new_schema(url)}"


def test_the_example_answers_within_its_wait_and_at_once_past_the_cap(monkeypatch, jobs_url, capsys) -> None:
    example = load(monkeypatch, jobs_url)

    run_main_on_virtual_time(example, backend=jobs_url, grace=0, autojump_threshold=0.05)  # the burst's jobs stay queued
    assert capsys.readouterr().out.splitlines() == [
        "one document: {'id': 1, 'indexed': True}",
        "burst of 65: 64 waited 2 s, 1 answered at once; indexed within the wait: 0",
        "owners notified: 66",
    ]
