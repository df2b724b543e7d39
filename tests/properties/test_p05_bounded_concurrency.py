"""P05 -- bounded concurrency: running jobs per queue never exceed `max_workers`; offloaded
threads never exceed the runtime's limiter.

How: counters in the scripted handler (incremented on entry, decremented in `finally`; the
maximum is kept), over bursts of long jobs and many schedules (`st.random_module()` makes the
Trio schedule a drawn, shrinkable input), checked at every quiescent point and at the end.
Threads are checked separately with a real clock: `run_blocking` must stay under
`thread_limit` (MockClock cannot see work in real threads).
Mutant: `Faults(pool_off_by_one=True)` (a queue starts max_workers + 1 workers).
"""

import threading
import time

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import nursery_jobs as nj
from tests.properties.faults import NO_FAULTS, Faults

from .audit import expect
from .harness import Config, Example, MEMORY, Store, examples
from .model import HANG, OK, RAISE

CONFIG = Config(
    max_workers=(1, 3),
    outcomes=(OK, RAISE, HANG),
    last_outcomes=(OK, RAISE, HANG),
    max_delay=2,
    weights=(("advance", 3), ("enqueue", 3), ("burst", 3), ("cancel", 1), ("shutdown", 1)),
)
MUTANT = Faults(pool_off_by_one=True)


def within_max_workers(ex: Example) -> None:
    for q in ex.queues:
        seen = ex.world.max_in_queue.get(q.name, 0)
        expect(seen <= q.max_workers, "P05", f"queue {q.name} ran {seen} jobs at once, max_workers={q.max_workers}")


async def within_max_workers_now(ex: Example) -> None:
    within_max_workers(ex)


def check(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    ex = Example(data, faults, CONFIG, store=store)
    ex.on_step.append(within_max_workers_now)
    ex.run()
    within_max_workers(ex)


@settings(max_examples=examples(100))
@given(data=st.data(), _sched=st.random_module())
def test_p05_bounded_concurrency(data: st.DataObject, _sched: object) -> None:
    check(data)


def test_p05_threads_stay_under_the_limiter() -> None:
    """Real threads, real clock: 8 jobs each block a thread for 20 ms under thread_limit=2."""
    app = nj.App()
    app.queue("q", max_workers=8, timeout=10)
    lock = threading.Lock()
    now = [0]
    peak = [0]

    def blocking() -> None:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.02)
        with lock:
            now[0] -= 1

    @app.job(queue="q")
    async def offload(ctx: nj.JobContext) -> None:
        await nj.run_blocking(blocking)

    async def main() -> None:
        async with nj.open_runtime(app, grace=5, settings=nj.RuntimeSettings(thread_limit=2)) as rt:
            ids = await rt.enqueue_many("offload", [{} for _ in range(8)])
            for job_id in ids:
                assert (await rt.wait(job_id, timeout=5)).done
            assert rt.threads.in_flight == 0
            assert rt.threads.limiter.borrowed_tokens == 0

    trio.run(main)
    assert 1 <= peak[0] <= 2, peak[0]
