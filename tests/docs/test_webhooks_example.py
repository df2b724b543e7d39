"""examples/webhooks.py: run as a user runs it (a subprocess, on the embedded memory backend), and
in this process on virtual time, where what its handlers saw is checked: never more than one
delivery in flight per endpoint, the slow endpoint's deliveries one at a time in enqueue order,
and the index queue done while the slow endpoint is still busy."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio
import trio.testing

import nursery_jobs as nj

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "webhooks.py"


def _load_example() -> Any:
    spec = importlib.util.spec_from_file_location("webhooks_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_webhooks_example_keeps_one_delivery_per_endpoint_and_never_delays_indexing() -> None:
    example = _load_example()

    async def body() -> Any:
        async with nj.open_runtime(example.app) as rt:
            return await example.main(rt)

    log = trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))
    assert dict(log.max_in_flight) == {0: 1, 1: 1, 2: 1}
    assert log.started[example.SLOW_ENDPOINT] == [10, 11, 12, 13]  # one at a time, in enqueue order
    assert len(log.index_done_at) == 20
    assert max(log.index_done_at) < log.slow_busy_until
    # The hung POST was cut by the attempt's timeout and the 503 retried; both then delivered.
    assert {e: n for e, n in log.attempts.items() if n > 1} == {21: 2, 22: 2}


def test_the_webhooks_example_runs_as_a_script() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "endpoint 1: deliveries started in order [10, 11, 12, 13], at most 1 in flight" in result.stdout
    assert "retried: event 21 (2 attempts), event 22 (2 attempts)" in result.stdout
    assert "index: 20 documents done" in result.stdout
