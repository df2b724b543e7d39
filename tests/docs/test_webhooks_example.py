"""examples/webhooks.py: run as a user runs it (a subprocess, on the embedded memory backend), and
in this process on virtual time, where what its handlers saw is checked: never more than one
delivery in flight per endpoint, the slow endpoint's deliveries one at a time in enqueue order,
and the index queue done while the slow endpoint is still busy."""

from __future__ import annotations

from tests.docs.examples_kit import EXAMPLES, load_example, run_example_script, run_main_on_virtual_time

EXAMPLE = EXAMPLES / "webhooks.py"


def test_the_webhooks_example_keeps_one_delivery_per_endpoint_and_never_delays_indexing() -> None:
    example = load_example(EXAMPLE, "webhooks_example")
    log = run_main_on_virtual_time(example)
    assert dict(log.max_in_flight) == {0: 1, 1: 1, 2: 1}
    assert log.started[example.SLOW_ENDPOINT] == [10, 11, 12, 13]  # one at a time, in enqueue order
    assert len(log.index_done_at) == 20
    assert max(log.index_done_at) < log.slow_busy_until
    # The hung POST was cut by the attempt's timeout and the 503 retried; both then delivered.
    assert {e: n for e, n in log.attempts.items() if n > 1} == {21: 2, 22: 2}


def test_the_webhooks_example_runs_as_a_script() -> None:
    result = run_example_script(EXAMPLE)
    assert "endpoint 1: deliveries started in order [10, 11, 12, 13], at most 1 in flight" in result.stdout
    assert "retried: event 21 (2 attempts), event 22 (2 attempts)" in result.stdout
    assert "index: 20 documents done" in result.stdout
