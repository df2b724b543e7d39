"""examples/bulk_index.py: run as a user runs it (a subprocess, on the embedded memory backend,
and on SQLite), and in this process on virtual time, where what the fake search engine saw is
checked: full batches while the backlog lasts, small ones for the trickle, the engine's outage
retried, the malformed document discarded alone after its own 3 attempts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.examples_kit import EXAMPLES, load_example, run_example_script, run_main_on_virtual_time

EXAMPLE = EXAMPLES / "bulk_index.py"


def test_the_bulk_indexer_writes_in_batches_and_discards_only_the_malformed_document() -> None:
    example = load_example(EXAMPLE, "bulk_index_example")
    summary = run_main_on_virtual_time(example)
    assert summary["states"] == {"completed": 124, "discarded": 1}
    assert summary["indexed"] == 124 and 7 not in example.SEARCH.index
    requests = summary["bulk_requests"]
    assert max(requests) == 50 and requests.count(50) >= 2  # the backlog: full batches
    assert len(requests) < 15  # 125 documents (and their retries) in a handful of bulk requests
    assert summary["malformed"] == "the batch handler returned this job as not handled"


@pytest.mark.parametrize("backend", ["memory://", "sqlite"])
def test_the_bulk_indexer_runs_as_a_script(backend: str, tmp_path: Path) -> None:
    url = backend if backend != "sqlite" else f"sqlite:///{tmp_path / 'jobs.db'}"
    result = run_example_script(EXAMPLE, url)
    assert "125 index jobs: {'completed': 124, 'discarded': 1}" in result.stdout
    assert "124 documents indexed in" in result.stdout
    assert "attempt 3 of 3 failed" in result.stderr and "no attempt left: discarded" in result.stderr
