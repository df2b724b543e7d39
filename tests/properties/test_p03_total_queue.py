"""P03 -- nothing lost, duplicated or invented (Jepsen's total-queue check).

How: the harness's command loop with bursts, many workers and short jobs (so outcomes pile up
into batches), shutdowns with restarts on the same backend (interrupted jobs are "recovered"
and must run again), cancels and hung jobs. After the final drain: the accepted job ids and
the `JobFinalized` records are equal as multisets -- nothing lost, no id unexpected, exactly
one terminal record per job -- every job ends in the model's final state, and a receipt asked
twice tells the same final outcome.
Mutant: `Faults(completer_drops_batch=True)` (the completer drops batches of > 1 outcome).
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.properties.faults import NO_FAULTS, Faults

from .audit import expect
from .checks import final_states_match, one_terminal_record_each
from .harness import Config, Example, MEMORY, Store, examples
from .model import DISCARD, HANG, OK, RAISE, SNOOZE

CONFIG = Config(
    max_workers=(2, 3),
    max_duration=1,
    max_child=2,
    outcomes=(OK, OK, OK, RAISE, SNOOZE, DISCARD, HANG),
    weights=(("advance", 3), ("enqueue", 4), ("burst", 3), ("cancel", 1), ("shutdown", 1)),
)
MUTANT = Faults(completer_drops_batch=True)


async def receipts_agree(ex: Example) -> None:
    rt = ex.rt
    assert rt is not None
    for n, job_id in sorted(ex.world.id_of.items()):
        first = await rt.wait(job_id, timeout=0)
        again = await rt.wait(job_id, timeout=0)
        expect(first == again, "P03", f"job {n}: two receipts disagree: {first} then {again}")
        expect(first.done, "P03", f"job {n}: drained but its receipt is not done: {first}")


def check(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    ex = Example(data, faults, CONFIG, store=store)
    ex.on_drained.append(receipts_agree)
    ex.run()
    one_terminal_record_each(ex, "P03")
    final_states_match(ex, "P03")


@settings(max_examples=examples(100))
@given(data=st.data(), _sched=st.random_module())
def test_p03_nothing_lost_duplicated_or_invented(data: st.DataObject, _sched: object) -> None:
    check(data)
