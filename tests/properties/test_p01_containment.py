"""P01 -- containment: every task spawned on behalf of a job, or by a runtime service, has the
runtime's owner task among its ancestors, and no system task appears.

How: the harness's command loop (harness.Example) with scripted jobs that spawn children through
`ctx.children()`. `TaskAudit.task_spawned` attributes each new task to a job (its context's job id,
else its spawner's) and walks its ancestor chain (`eventual_parent_nursery or parent_nursery`);
an escape is recorded, and raised at the next quiescent point. P01 is also ambient: every other
property's examples run the same audit.
Mutant: `Faults(system_task_children=True)` (a job's children are Trio system tasks).
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.properties.faults import NO_FAULTS, Faults

from .harness import Config, Example, MEMORY, Store, examples

CONFIG = Config(max_children=3, weights=(("advance", 4), ("enqueue", 5), ("burst", 1), ("cancel", 1), ("shutdown", 1)))
MUTANT = Faults(system_task_children=True)


def check(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    Example(data, faults, CONFIG, store=store).run()


@settings(max_examples=examples(100))
@given(data=st.data(), _sched=st.random_module())
def test_p01_containment(data: st.DataObject, _sched: object) -> None:
    check(data)
