"""P07 -- bounded waits and backpressure for receipts.

How: the harness's command loop with many `rt.wait(job, timeout=T)` probes, each a task of the
example's own nursery that records when it returned and what. After the run every probe is
checked, in start order, against the model's finalization times and the runtime's waiter limit:
- a job already final when the wait starts answers at once, done, with its final state;
- beyond `max_waiters` waits in flight for the queue, the wait answers at once, not done;
- otherwise it returns exactly when the job reaches its final state, or exactly at `t + T`,
  not done -- never later (no wait is unbounded), never before.
T is k + 0.75 so a timeout never ties with an attempt's end. The runtime has no bounded push
queue (enqueue never blocks), so that half of the row has nothing to check.
Mutant: `Faults(wait_misses_recorded=True)` (a waiter misses an outcome already recorded).
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.properties.faults import NO_FAULTS, Faults

from .audit import expect
from .harness import Config, Example, MEMORY, Store, examples

CONFIG = Config(
    max_waiters=(1, 3),
    weights=(("advance", 4), ("enqueue", 3), ("burst", 1), ("cancel", 1), ("wait", 4)),
)
MUTANT = Faults(wait_misses_recorded=True)


def receipts_are_bounded_and_exact(ex: Example) -> None:
    # Times are ordered as (virtual time, model tick): commands at one instant apply in order, so
    # a job cancelled right after a wait began, at the same instant, was not final for it.
    in_flight: list[tuple[str, tuple[float, int]]] = []  # (queue, end) of the waits that waited
    for w in ex.waits:
        mjob = ex.model.jobs[w.n]
        f = mjob.finalized_at
        began = (w.start, w.tick)
        assert w.receipt is not None and w.end is not None, w
        end: float
        what = f"wait #{ex.waits.index(w)} for job {w.n} at t={w.start} (T={w.timeout})"
        expect(w.end <= w.start + w.timeout, "P07", f"{what} returned at {w.end}, after its bound")
        if f is not None and (f, mjob.finalized_tick) <= began:
            expect(
                (w.end, w.receipt.done, w.receipt.state.value) == (w.start, True, mjob.state),
                "P07",
                f"{what}: the job was already {mjob.state}; expected an immediate done receipt, got {w.receipt} at {w.end}",
            )
            continue
        busy = sum(1 for q, end in in_flight if q == w.queue and end > began)
        if busy >= ex.max_waiters:
            expect(
                (w.end, w.receipt.done) == (w.start, False),
                "P07",
                f"{what}: {busy} waits in flight (max {ex.max_waiters}); "
                f"expected an immediate 'not done', got {w.receipt} at {w.end}",
            )
            continue
        done = f is not None and f <= w.start + w.timeout
        end = f if done and f is not None else w.start + w.timeout
        # a timeout (k + 0.75) never falls on a command's instant, so its tick does not matter
        in_flight.append((w.queue, (end, mjob.finalized_tick if done else 0)))
        expect(
            (w.end, w.receipt.done) == (end, done),
            "P07",
            f"{what}: expected done={done} at t={end} (model: {mjob.state} at {f}), got {w.receipt} at {w.end}",
        )
        if done:
            expect(w.receipt.state.value == mjob.state, "P07", f"{what}: receipt {w.receipt}, model {mjob.state}")
        else:
            expect(not w.receipt.state.final, "P07", f"{what}: not done but final: {w.receipt}")


def check(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    ex = Example(data, faults, CONFIG, store=store)
    ex.run()
    receipts_are_bounded_and_exact(ex)


@settings(max_examples=examples(100))
@given(data=st.data(), _sched=st.random_module())
def test_p07_bounded_waits(data: st.DataObject, _sched: object) -> None:
    check(data)
