"""P13 -- graceful shutdown, in order and on time.

How: the harness's command loop with frequent shutdowns (each followed by a restart on the same
backend), grace G = k + 0.25, an optional second signal (`rt.skip_grace()` from a probe task at
t0 + k + 0.125), hung and long jobs, and a probe task that races the shutdown with enqueues.
Right after each `open_runtime` block exits:
- it exited at exactly the model's time: when the last attempt ended, or at t0 + G (or the skip)
  if some were still running -- never later;
- no attempt started after t0 (claiming stopped) and every attempt ended at the model's time;
- the completer was flushed before the close: no job is left `running` in the backend;
- the attempts cut by the grace are exactly the model's, are `available` again with the attempt
  given back, are listed in `rt.interrupted` and counted by `stats().interrupted_attempts`.
After the run: every enqueue later than t0 was refused with `RuntimeClosed`, each racing enqueue
that was accepted ran at most once and is completed or still claimable, and the total-queue
accounting of P03 holds across the restarts.
Mutant: `Faults(unbounded_grace=True)` (shutdown waits for running jobs without the bound).
"""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

import nursery_jobs as nj
from tests.properties.faults import NO_FAULTS, Faults

from .audit import expect
from .checks import ends_match, final_states_match, one_terminal_record_each
from .harness import Config, Example, MEMORY, ShutdownRecord, Store, examples
from .model import DISCARD, HANG, OK, RAISE, SNOOZE

CONFIG = Config(
    max_duration=5,
    outcomes=(OK, RAISE, SNOOZE, DISCARD, HANG, HANG),
    last_outcomes=(OK, RAISE, DISCARD, HANG),
    graces=(0, 3),
    skip=True,
    probe_submitters=True,
    weights=(("advance", 3), ("enqueue", 4), ("burst", 1), ("cancel", 1), ("shutdown", 3)),
)
MUTANT = Faults(unbounded_grace=True)


async def shutdown_in_order_and_on_time(ex: Example, rec: ShutdownRecord) -> None:
    expect(
        rec.real_exit == rec.model_exit,
        "P13",
        f"shutdown at t0={rec.t0} with grace {rec.grace} (skip {rec.skip}) and {sorted(rec.running_at_t0)} "
        f"running exited at {rec.real_exit}, expected {rec.model_exit}",
    )
    late = [s for s in ex.world.starts() if rec.t0 < s[0] <= rec.real_exit]
    expect(not late, "P13", f"attempts started after the shutdown began at t0={rec.t0}: {late}")
    cut = {n for t, n, _a, result in ex.model.ends if result == "interrupted" and rec.t0 <= t <= rec.model_exit}
    rt = rec.runtime
    expect(
        sorted(rt.interrupted) == sorted(ex.world.id_of[n] for n in cut),
        "P13",
        f"rt.interrupted={rt.interrupted}, the model cut jobs {sorted(cut)}",
    )
    for n, job_id in sorted(ex.world.id_of.items()):
        job = await ex.backend.get_job(job_id)
        expect(job.state is not nj.JobState.RUNNING, "P13", f"job {n} is still 'running' after the runtime closed")
        if n in cut:
            expect(
                (job.state, job.attempt) == (nj.JobState.AVAILABLE, ex.model.jobs[n].attempt),
                "P13",
                f"job {n} was cut by the grace: expected available with attempt {ex.model.jobs[n].attempt}, "
                f"got {job.state.value} {job.attempt}",
            )
    stats = await rt.stats()
    for q in ex.queues:
        expect(
            stats[q.name].interrupted_attempts == ex.model.interrupted[q.name],
            "P13",
            f"stats of {q.name}: interrupted_attempts={stats[q.name].interrupted_attempts}, model {ex.model.interrupted[q.name]}",
        )


def racing_enqueues_were_refused_or_kept(ex: Example) -> None:
    t0s = [rec.t0 for rec in ex.shutdowns]
    for at, job_id in ex.submissions:
        if at not in t0s:
            expect(job_id is None, "P13", f"an enqueue at t={at}, after the shutdown began, was accepted as job {job_id}")
    runs = Counter(ex.world.probes_run)
    for job_id, job in ex.probe_jobs_at_end.items():
        expect(runs[job_id] <= 1, "P13", f"racing job {job_id} ran {runs[job_id]} times")
        ok = (job.state, runs[job_id]) in ((nj.JobState.COMPLETED, 1), (nj.JobState.AVAILABLE, 0))
        expect(ok, "P13", f"racing job {job_id} accepted at a shutdown is {job.state.value} after {runs[job_id]} runs")


def check(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    ex = Example(data, faults, CONFIG, store=store)
    ex.on_shutdown.append(shutdown_in_order_and_on_time)
    ex.run()
    racing_enqueues_were_refused_or_kept(ex)
    ends_match(ex, "P13")
    one_terminal_record_each(ex, "P13")
    final_states_match(ex, "P13")


@settings(max_examples=examples(100))
@given(data=st.data(), _sched=st.random_module())
def test_p13_graceful_shutdown(data: st.DataObject, _sched: object) -> None:
    check(data)
