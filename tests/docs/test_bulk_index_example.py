"""examples/bulk_index.py: run as a user runs it (a subprocess, on the embedded memory backend,
and on SQLite), and in this process on virtual time, where what the fake search engine saw is
checked: full batches while the backlog lasts, small ones for the trickle, the engine's outage
retried, the malformed document discarded alone after its own 3 attempts."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import nursery_jobs as nj

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "bulk_index.py"


def _load_example() -> Any:
    spec = importlib.util.spec_from_file_location("bulk_index_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bulk_indexer_writes_in_batches_and_discards_only_the_malformed_document() -> None:
    example = _load_example()

    async def body() -> Any:
        async with nj.open_runtime(example.app) as rt:
            return await example.main(rt)

    summary = trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))
    assert summary["states"] == {"completed": 124, "discarded": 1}
    assert summary["indexed"] == 124 and 7 not in example.SEARCH.index
    requests = summary["bulk_requests"]
    assert max(requests) == 50 and requests.count(50) >= 2  # the backlog: full batches
    assert len(requests) < 15  # 125 documents (and their retries) in a handful of bulk requests
    assert summary["malformed"] == "the batch handler returned this job as not handled"


@pytest.mark.parametrize("backend", ["memory://", "sqlite"])
def test_the_bulk_indexer_runs_as_a_script(backend: str, tmp_path: Path) -> None:
    url = backend if backend != "sqlite" else f"sqlite:///{tmp_path / 'jobs.db'}"
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), url],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "125 index jobs: {'completed': 124, 'discarded': 1}" in result.stdout
    assert "124 documents indexed in" in result.stdout
    assert "attempt 3 of 3 failed" in result.stderr and "no attempt left: discarded" in result.stderr
