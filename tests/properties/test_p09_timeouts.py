"""P09 -- timeouts are exact and typed; which scope fired decides the outcome.

How: the harness's command loop on queues that all have a timeout T (k + 0.5, so it never ties
with an integer duration), with hung jobs, children, remote cancels and shutdowns. After the
run: every attempt ended at exactly the model's time (a too-long one at `start + T`); each job's
recorded errors equal the model's -- a timeout is a retryable failure "timed out after T s", a
remote cancel ends the job cancelled with no error, a shutdown gives the attempt back with no
error; and final states match. That the children are gone at the timeout instant is checked
by the audit when each attempt ends (P02, ambient).
Mutant: `Faults(outcome_from_exception_type=True)` (every cancellation taken for a timeout).
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.properties.faults import NO_FAULTS, Faults

from .checks import ends_match, errors_match, final_states_match
from .harness import Config, Example, MEMORY, Store, examples
from .model import HANG, OK, RAISE

CONFIG = Config(
    timeouts=True,
    max_duration=5,
    outcomes=(OK, RAISE, HANG, HANG),
    last_outcomes=(OK, RAISE, HANG),
    weights=(("advance", 4), ("enqueue", 4), ("cancel", 3), ("shutdown", 1)),
)
MUTANT = Faults(outcome_from_exception_type=True)


def check(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    ex = Example(data, faults, CONFIG, store=store)
    ex.run()
    ends_match(ex, "P09")
    errors_match(ex, "P09")
    final_states_match(ex, "P09")


@settings(max_examples=examples(100))
@given(data=st.data(), _sched=st.random_module())
def test_p09_timeouts_exact_and_typed(data: st.DataObject, _sched: object) -> None:
    check(data)
