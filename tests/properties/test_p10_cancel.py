"""P10 -- cancellation semantics.

How: the harness's command loop with cancels of jobs in every state (pending, running, final,
already cancelled). Each `rt.cancel` is checked at once: it answers what the model answers
(cancelled for a pending job, running for a running one, the final state for a final one),
and a final job's state is unchanged by it -- so a cancel is idempotent and a late cancel is a
no-op. After the run: a job cancelled while pending never started afterwards; a running one
ended at the instant it was cancelled (no virtual time elapsed) with its cleanup run (every
start has its end record, written in the handler's shielded `finally`); and every job --
cancelled or not -- ends in the model's final state, so cancelling one job changed no other.
Mutant: `Faults(late_cancel_overwrites=True)` (read by the memory backend: cancelling a finished
job overwrites its outcome).
"""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.properties.faults import NO_FAULTS, Faults

from .audit import expect
from .checks import ends_match, final_states_match
from .harness import Config, Example, MEMORY, Store, examples
from .model import DISCARD, HANG, OK, RAISE, SNOOZE

CONFIG = Config(
    max_duration=2,
    commands=(6, 20),
    outcomes=(OK, OK, RAISE, SNOOZE, DISCARD, HANG),
    weights=(("advance", 3), ("enqueue", 3), ("burst", 1), ("cancel", 4), ("shutdown", 1)),
)
MUTANT = Faults(late_cancel_overwrites=True)


async def cancels_answer_like_the_model(ex: Example) -> None:
    for c in ex.cancels:
        if c.state_after is None:
            continue
        expect(
            c.returned.value == c.model_returned,
            "P10",
            f"cancel of job {c.n} ({c.before}) at t={c.t} answered {c.returned.value}, expected {c.model_returned}",
        )
        if c.before in ("completed", "discarded", "cancelled"):
            expect(
                c.state_after.value == c.before,
                "P10",
                f"cancel of job {c.n} at t={c.t} changed its final state {c.before} to {c.state_after.value}",
            )
        c.state_after = None  # checked


def cancelled_jobs_stopped(ex: Example) -> None:
    starts = ex.world.starts()
    ends = ex.world.ends()
    for c in ex.cancels:
        if c.before == "pending":
            after = ex.world.history[c.history_len:]
            late = [e for e in after if e[1] == "start" and e[3] == c.n]
            expect(not late, "P10", f"job {c.n} was cancelled while pending at t={c.t} but started: {late}")
        if c.before == "running":
            ended = [e for e in ends if e[1] == c.n and e[0] == c.t]
            expect(ended, "P10", f"job {c.n} was cancelled while running at t={c.t} but did not end then: {ends}")
    begun = Counter((n, k) for _t, n, _a, k in starts)
    finished = Counter((n, k) for _t, n, _a, k, _how in ends)
    expect(begun == finished, "P10", f"executions without their cleanup/end record: {begun - finished}")


def check(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    ex = Example(data, faults, CONFIG, store=store)
    ex.on_step.append(cancels_answer_like_the_model)
    ex.run()
    cancelled_jobs_stopped(ex)
    ends_match(ex, "P10")
    final_states_match(ex, "P10")


@settings(max_examples=examples(100))
@given(data=st.data(), _sched=st.random_module())
def test_p10_cancellation(data: st.DataObject, _sched: object) -> None:
    check(data)
