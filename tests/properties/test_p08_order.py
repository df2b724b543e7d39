"""P08 -- order and isolation against the model.

How: the harness's command loop with priorities, delays, one or two queues of one or two
workers, and hung jobs that saturate a queue. After the run, per queue, the attempts started
(time, job, attempt) equal the reference model's: no job starts before its `run_at`, starts
follow (priority, run_at, insertion order) whenever a worker frees, and with `max_workers=1`
the start *sequence* is the model's exactly. Isolation: each queue's starts also equal those of
a model replayed with that queue's jobs only -- a saturated or hanging other queue changes
nothing.
Mutant: `Faults(invert_priority=True)` (lower priority runs first).
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.properties.faults import NO_FAULTS, Faults

from .audit import expect
from .checks import starts_match
from .harness import Config, Example, MEMORY, Store, examples
from .model import DISCARD, HANG, OK, RAISE, SNOOZE, replay

CONFIG = Config(
    max_workers=(1, 2),
    priorities=(0, 3),
    max_delay=3,
    outcomes=(OK, OK, RAISE, SNOOZE, DISCARD, HANG),
    weights=(("advance", 3), ("enqueue", 6), ("burst", 1), ("cancel", 1)),
)
MUTANT = Faults(invert_priority=True)


def queues_are_isolated(ex: Example) -> None:
    real = [(t, n, a) for t, n, a, _k in ex.world.starts()]
    for q in ex.queues:
        mine = {n for n, spec in ex.world.specs.items() if spec.queue == q.name}
        alone = replay(ex.queues, ex.model.log, mine)
        expected = sorted((t, n, a) for t, n, a, _k in alone.starts)
        got = sorted(s for s in real if s[1] in mine)
        expect(got == expected, "P08", f"queue {q.name} alone would start {expected}, but started {got}")


def check(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    ex = Example(data, faults, CONFIG, store=store)
    ex.run()
    starts_match(ex, "P08", ordered_single_worker=True)
    queues_are_isolated(ex)


@settings(max_examples=examples(100))
@given(data=st.data(), _sched=st.random_module())
def test_p08_order_and_isolation(data: st.DataObject, _sched: object) -> None:
    check(data)
