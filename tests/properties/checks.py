"""Comparisons of one finished example against the reference model, shared by several
properties. Each takes the property id it reports failures under."""

from __future__ import annotations

from collections import Counter

from .audit import expect
from .harness import Example


def starts_match(ex: Example, prop: str, *, ordered_single_worker: bool = False) -> None:
    """Every attempt started at the model's time, with the model's attempt number."""
    real = [(t, n, a) for t, n, a, _k in ex.world.starts()]
    model = [(t, n, a) for t, n, a, _k in ex.model.starts]
    for q in ex.queues:
        mine = {n for n, spec in ex.world.specs.items() if spec.queue == q.name}
        r = [s for s in real if s[1] in mine]
        m = [s for s in model if s[1] in mine]
        if not (ordered_single_worker and q.max_workers == 1):
            r, m = sorted(r), sorted(m)
        expect(r == m, prop, f"queue {q.name} (max_workers={q.max_workers}) starts (t, job, attempt):\n  real  {r}\n  model {m}")


def ends_match(ex: Example, prop: str) -> None:
    """Every attempt ended at the model's time."""
    real = sorted((t, n, a) for t, n, a, _k, _how in ex.world.ends())
    model = sorted((t, n, a) for t, n, a, _result in ex.model.ends)
    expect(real == model, prop, f"attempt ends (t, job, attempt):\n  real  {real}\n  model {model}")


def final_states_match(ex: Example, prop: str, jobs: set[int] | None = None) -> None:
    for n, job in sorted(ex.jobs_at_end.items()):
        if jobs is not None and n not in jobs:
            continue
        mjob = ex.model.jobs[n]
        if mjob.final:
            expect(
                job.state.value == mjob.state,
                prop,
                f"job {n} (id {job.id}) ended {job.state.value}, the model says {mjob.state} at t={mjob.finalized_at}",
            )
        else:
            expect(not job.state.final, prop, f"job {n} is {job.state.value}, the model says it is still {mjob.state}")


def errors_match(ex: Example, prop: str, jobs: set[int] | None = None) -> None:
    for n, job in sorted(ex.jobs_at_end.items()):
        if jobs is not None and n not in jobs:
            continue
        real = [(e.attempt, e.at, e.message) for e in job.errors]
        model = ex.model.jobs[n].errors
        expect(real == model, prop, f"job {n} errors (attempt, at, message):\n  real  {real}\n  model {model}")


def attempts_match(ex: Example, prop: str) -> None:
    for n, job in sorted(ex.jobs_at_end.items()):
        expect(
            job.attempt == ex.model.jobs[n].attempt,
            prop,
            f"job {n} has spent {job.attempt} attempts, the model says {ex.model.jobs[n].attempt}",
        )


def one_terminal_record_each(ex: Example, prop: str) -> None:
    """Jepsen's total-queue accounting over job ids: accepted = terminal records, as multisets."""
    accepted = Counter(ex.world.id_of.values())
    terminal = Counter(job_id for _t, job_id, _state in ex.world.finals if job_id in ex.world.n_of)
    unexpected = sorted(job_id for _t, job_id, _state in ex.world.finals if job_id not in ex.world.n_of)
    lost = sorted(job_id for job_id in accepted if terminal[job_id] == 0 and ex.model.jobs[ex.world.n_of[job_id]].final)
    duplicated = sorted(job_id for job_id, c in terminal.items() if c > 1)
    expect(not unexpected, prop, f"terminal records for ids never accepted: {unexpected}")
    expect(not lost, prop, f"accepted jobs with no terminal record (lost): {lost}")
    expect(not duplicated, prop, f"jobs with more than one terminal record: {duplicated}")
