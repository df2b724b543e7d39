"""P04 -- attempt accounting.

How: the harness's command loop with snooze-heavy scripts, failures, timeouts, cancels and
restarts. From the history the scripted handlers write (each start records `ctx.attempt`):
no start after the job's terminal record, no attempt number above `max_attempts`, and every
attempt number equal to the reference model's -- where a failure or a timeout costs one
attempt, a snooze or an interruption by shutdown gives it back, and `Discard` and cancel are
terminal. The backend's final attempt count must match too.
Mutant: `Faults(snooze_counts_attempt=True)` (a snooze spends an attempt).
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.properties.faults import NO_FAULTS, Faults

from .audit import expect
from .checks import attempts_match, final_states_match, starts_match
from .harness import Config, Example, MEMORY, Store, examples
from .model import DISCARD, HANG, OK, RAISE, SNOOZE

CONFIG = Config(
    max_attempts=(1, 3),
    outcomes=(OK, RAISE, SNOOZE, SNOOZE, SNOOZE, DISCARD, HANG),
    weights=(("advance", 4), ("enqueue", 4), ("burst", 1), ("cancel", 1), ("shutdown", 1)),
)
MUTANT = Faults(snooze_counts_attempt=True)


def history_is_consistent(ex: Example) -> None:
    final: dict[int, float] = {}
    for event in ex.world.history:  # in the order things happened
        t, what, job_id = event[:3]
        if what == "final":
            final[job_id] = t
        elif what == "start":
            n, attempt, k = event[3:6]
            limit = ex.world.queues[ex.world.specs[n].queue].max_attempts
            expect(1 <= attempt <= limit, "P04", f"job {n} execution {k} started as attempt {attempt} of {limit}")
            expect(
                job_id not in final,
                "P04",
                f"job {n} started again at t={t} after its terminal record at t={final.get(job_id)}",
            )


def check(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    ex = Example(data, faults, CONFIG, store=store)
    ex.run()
    history_is_consistent(ex)
    starts_match(ex, "P04")
    attempts_match(ex, "P04")
    final_states_match(ex, "P04")


@settings(max_examples=examples(100))
@given(data=st.data(), _sched=st.random_module())
def test_p04_attempt_accounting(data: st.DataObject, _sched: object) -> None:
    check(data)
