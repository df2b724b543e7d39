"""P02 -- no task outlives its scope, and the task tree mirrors the model.

How: the harness's command loop. At every quiescent point the job ids found by walking the task
tree from `current_root_task()` (each task's `current_attempt`) must equal the attempts the
scripted handlers report running, `rt.attempts`, and -- checked here -- the reference model's
running set. When a handler ends, and when a job's terminal state is recorded, no live task may
still belong to it; when the example ends, only the baseline tasks are alive and
`tasks_living` is back to the baseline count (`TaskAudit.check_exit`). The structural half is
ambient in every property.
Mutant: `Faults(children_in_queue_scope=True)` (children started into the queue's scope).
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.properties.faults import NO_FAULTS, Faults

from .audit import expect
from .harness import Config, Example, MEMORY, Store, examples

CONFIG = Config(
    max_children=3,
    max_child=6,
    weights=(("advance", 4), ("enqueue", 5), ("burst", 1), ("cancel", 1), ("shutdown", 1)),
)
MUTANT = Faults(children_in_queue_scope=True)


async def tree_mirrors_model(ex: Example) -> None:
    expect(
        set(ex.world.running) == ex.model_running_ids(),
        "P02",
        f"at t={ex.model.now} running attempts {sorted(ex.world.running)} != model {sorted(ex.model_running_ids())}",
    )


def check(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    ex = Example(data, faults, CONFIG, store=store)
    ex.on_step.append(tree_mirrors_model)
    ex.run()


@settings(max_examples=examples(100))
@given(data=st.data(), _sched=st.random_module())
def test_p02_no_task_outlives_its_scope(data: st.DataObject, _sched: object) -> None:
    check(data)
