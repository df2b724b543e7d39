"""P06 -- work conservation and no lost wake-up.

How: the harness's command loop on a backend whose claim answers after a checkpoint (the round
trip of a durable backend), with bursts of back-to-back enqueues so that inserts land while a
claim is in flight, plus delays, retries and snoozes whose due-time wake-ups land the same way.
At every quiescent point, for each queue: if the backend holds a job that is due, the queue
runs `max_workers` attempts -- so an enqueue that lands during a fetch was started without any
further advance of the clock.
Mutant: `Faults(drop_wakeup_during_fetch=True)` (a wake-up during a claim is forgotten).
"""

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.properties.faults import NO_FAULTS, Faults

from .audit import expect
from .harness import Config, Example, MEMORY, Store, examples

CONFIG = Config(
    claim_yields=True,
    max_workers=(2, 3),
    weights=(("advance", 3), ("enqueue", 2), ("burst", 4), ("cancel", 1)),
)
MUTANT = Faults(drop_wakeup_during_fetch=True)


async def no_idle_worker_beside_due_work(ex: Example) -> None:
    rt = ex.rt
    assert rt is not None
    now = trio.current_time()
    for q in ex.queues:
        running = sum(1 for a in rt.attempts.values() if a.job.queue == q.name)
        if running >= q.max_workers:
            continue
        for n, job_id in sorted(ex.world.id_of.items()):
            if ex.world.specs[n].queue != q.name:
                continue
            job = await rt.get_job(job_id)
            due = job.state.value in ("available", "scheduled", "retryable") and job.run_at <= now
            expect(
                not due,
                "P06",
                f"at t={now} job {n} ({job.state.value}, run_at={job.run_at}) is due but queue {q.name} "
                f"runs {running} of {q.max_workers}",
            )


def check(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    ex = Example(data, faults, CONFIG, store=store)
    ex.on_step.append(no_idle_worker_beside_due_work)
    ex.run()


@settings(max_examples=examples(100))
@given(data=st.data(), _sched=st.random_module())
def test_p06_work_conservation(data: st.DataObject, _sched: object) -> None:
    check(data)
