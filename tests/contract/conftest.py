"""The contract suite: each backend protocol method called directly, for each starting state of
a job, on every backend, checked against the job rules (`nursery_jobs.backends.transitions`).

Where the conformance suite runs the runtime end to end, this one plays the runtime's part
itself: it puts a row in a state through the protocol (insert, claim, finish, cancel), calls one
method, and compares the row, the counts and the events with what the rules say. A backend is
done when both suites pass on it.
"""

from tests.registry import autojump_clock, backend_name, damage, make_backend, store, test_backend  # noqa: F401
