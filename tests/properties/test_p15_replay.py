"""P15 -- replay determinism: the same drawn inputs and schedule seed give the same history.

How: each example is run twice. The first run draws its scenario from `st.data()` and records
every drawn value; before each run the scheduling RNG that Trio registers with Hypothesis
(`trio._core._run._r`) and Python's global `random` (the runtime seeds its retry RNG from it)
are restored to the same state; the second run replays the recorded values. Then everything
observable must be identical: the handlers' history (every start and end with its virtual time,
attempt and execution), the terminal records, and every job as the backend holds it at the end
(state, attempts, errors with their times, `run_at`). The retry policies have 10 % jitter and the
scripts are failure-heavy, so retry times depend on the seeded RNG. Hypothesis's own
`FlakyFailure` on replay is the ambient detector of any nondeterminism left in other properties.
Mutant: `Faults(unseeded_jitter=True)` (jitter drawn from the OS's entropy).
"""

from __future__ import annotations

import random
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.properties.faults import NO_FAULTS, Faults

from .audit import expect
from .harness import Config, Example, MEMORY, Store, examples
from .model import HANG, OK, RAISE, SNOOZE

CONFIG = Config(
    jitter=0.1,
    max_attempts=(2, 3),
    outcomes=(OK, RAISE, RAISE, SNOOZE, HANG),
    last_outcomes=(OK, RAISE, RAISE),
    weights=(("advance", 4), ("enqueue", 4), ("burst", 1), ("cancel", 1), ("shutdown", 1)),
)
MUTANT = Faults(unseeded_jitter=True)


def observed(ex: Example) -> tuple[Any, ...]:
    return (ex.world.history, ex.world.finals, ex.jobs_at_end, [(s.t0, s.real_exit) for s in ex.shutdowns])


def check(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    scheduler = trio._core._run._r
    saved = (scheduler.getstate(), random.getstate())
    drawn: list[Any] = []

    def record(strategy: st.SearchStrategy[Any], label: str) -> Any:
        value = data.draw(strategy, label=label)
        drawn.append(value)
        return value

    first = Example(data, faults, CONFIG, draw=record, store=store)
    first.run()
    scheduler.setstate(saved[0])
    random.setstate(saved[1])
    replay = iter(drawn)
    second = Example(data, faults, CONFIG, draw=lambda _strategy, _label: next(replay), store=store)
    second.run()
    a, b = observed(first), observed(second)
    for name, x, y in zip(("history", "terminal records", "jobs at the end", "shutdowns"), a, b):
        expect(x == y, "P15", f"two runs of the same example differ in their {name}:\n  first  {x}\n  second {y}")


@settings(max_examples=examples(80))
@given(data=st.data(), _sched=st.random_module())
def test_p15_replay_determinism(data: st.DataObject, _sched: object) -> None:
    check(data)
