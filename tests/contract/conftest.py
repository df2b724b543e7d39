"""The contract suite: each backend protocol method called directly, for each starting state of
a job, on every backend, checked against what the method's docstring promises
(`nursery_jobs/backends/protocol.py`) and against the job rules
(`nursery_jobs.rules`).

Where the conformance suite runs the runtime end to end, this one plays the runtime's part
itself: it puts a row in a state through the protocol (`common.in_state`: insert, claim,
finish, cancel), calls one method, and compares the row, the counts and the events with what the
docstring and the rules say. A backend is done when both suites pass on it.

- `test_transitions.py`: `finish_many`, `rescue`, `cancel`, `heartbeat` against the rules, for
  every outcome and starting state, the fence included;
- `test_insert_claim.py`: `insert_many` (order, uniqueness, due or later, events) and `claim`
  (queue, order, limit, due versus later, `next_due`, concurrent claims);
- `test_store.py`: heartbeat, rescue, cancel, retention, `get_job`, `stats`, the clock, `open`,
  `close`, `check_budget`;
- `test_notifier.py`: listeners and `serve`; `test_atomic.py`: checkpoints versus `never_yields`, and
  cancel-atomicity;
- `test_transactional.py`: `TransactionalEnqueue`, where a backend has it;
- `test_outoftree.py`: a backend built outside the package passes all the backend suites.

The backends are those of `tests/registry.py`.
"""

from tests.registry import autojump_clock, backend_name, damage, make_backend, store, test_backend  # noqa: F401
