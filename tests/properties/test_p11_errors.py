"""P11 -- errors reach someone; failures are isolated.

How, two tests:
- isolation: the harness's command loop with failure-heavy scripts; every job's errors and final
  state equal the model's, in which a failure touches only its own job (retry per its queue's
  policy, discard once attempts are spent). `check_isolation` compares each queue also against a
  model replayed with only that queue's jobs.
- service crash: the backend's `finish_many` -- called by the completer -- raises on its first or
  second call. `open_runtime` must raise an `ExceptionGroup` that contains that very exception
  (found with `ExceptionGroup.split`), after cancelling the whole tree: the exit invariants of
  P02 (only baseline tasks alive) still hold.
Mutant: `Faults(swallow_service_errors=True)` (services run detached; their crashes are logged
and absorbed).
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.properties.faults import NO_FAULTS, Faults

from .audit import expect
from .checks import errors_match, final_states_match
from .harness import Config, Example, MEMORY, Store, examples
from .model import DISCARD, OK, RAISE, replay

ISOLATION = Config(
    outcomes=(OK, RAISE, RAISE, DISCARD),
    last_outcomes=(OK, RAISE, RAISE, DISCARD),
    weights=(("advance", 4), ("enqueue", 4), ("burst", 1), ("cancel", 1)),
)
CRASH = ISOLATION.but(crash=True, crash_at=(1, 2), commands=(3, 15))
MUTANT = Faults(swallow_service_errors=True)


def failures_stay_in_their_job(ex: Example) -> None:
    errors_match(ex, "P11")
    final_states_match(ex, "P11")
    for q in ex.queues:
        mine = {n for n, spec in ex.world.specs.items() if spec.queue == q.name}
        alone = replay(ex.queues, ex.model.log, mine)
        for n in sorted(mine):
            got, want = ex.jobs_at_end[n], alone.jobs[n]
            expect(
                (got.state.value, [(e.attempt, e.at, e.message) for e in got.errors]) == (want.state, want.errors),
                "P11",
                f"job {n} of queue {q.name}: {got.state.value} {got.errors}, but alone {want.state} {want.errors}",
            )


def check_isolation(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    ex = Example(data, faults, ISOLATION, store=store)
    ex.run()
    failures_stay_in_their_job(ex)


def check(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    """The service-crash half (the one the P11 mutant breaks)."""
    ex = Example(data, faults, CRASH, store=store)
    ex.run()
    if not ex.backend.crashed:
        failures_stay_in_their_job(ex)
        return
    expect(ex.crash is not None, "P11", "the completer's backend call crashed, and open_runtime did not raise it")
    assert isinstance(ex.crash, BaseExceptionGroup)
    original = ex.backend.crashed
    crash, _rest = ex.crash.split(lambda exc: exc is original)
    expect(crash is not None, "P11", f"open_runtime raised {ex.crash!r} without the original {original!r}")


@settings(max_examples=examples(80))
@given(data=st.data(), _sched=st.random_module())
def test_p11_failures_are_isolated(data: st.DataObject, _sched: object) -> None:
    check_isolation(data)


@settings(max_examples=examples(60))
@given(data=st.data(), _sched=st.random_module())
def test_p11_service_crash_is_not_swallowed(data: st.DataObject, _sched: object) -> None:
    check(data)
