"""`ScheduleStore`: a tick's job is enqueued once, ticks only move forward, and any number of
instances on one store (as processes sharing a database) enqueue exactly one job per tick."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import JobsAvailable, ScheduleState
from nursery_jobs.services.periodic import Scheduler

from .common import Q, listen, new, opened


async def _total(backend: nj.Backend) -> int:
    c = (await backend.stats()).get(Q)
    return 0 if c is None else c.available + c.scheduled + c.running + c.completed


@pytest.fixture(autouse=True)
def _stores_schedules(make_backend) -> None:
    """A capability of its own: a backend without it is not held to it (the runtime refuses
    schedules on it; the package's backends all have it: `tests/unit/test_periodic.py`)."""
    if not isinstance(make_backend(), nj.backends.ScheduleStore):
        pytest.skip("this backend does not implement ScheduleStore")


async def test_a_tick_enqueues_its_job_once_and_ticks_only_move_forward(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        assert isinstance(backend, nj.backends.ScheduleStore)
        events = listen(backend)
        assert await backend.schedule_states(["s", "other"]) == {}
        first = await backend.enqueue_tick("s", 600.0, new(args='{"n": 1}'))
        assert first is not None and not first.existing
        job = await backend.get_job(first.id)
        assert (job.kind, job.queue, job.args, job.state) == ("work", Q, {"n": 1}, nj.JobState.AVAILABLE)
        assert events.of(JobsAvailable) == [JobsAvailable(Q)]
        assert await backend.schedule_states(["s", "other"]) == {"s": ScheduleState(600.0, first.id)}
        events.clear()
        assert await backend.enqueue_tick("s", 600.0, new()) is None  # the same tick: taken
        assert await backend.enqueue_tick("s", 540.0, new()) is None  # an earlier one: never
        assert events == [] and await _total(backend) == 1
        later = await backend.enqueue_tick("s", 660.5, new())
        assert later is not None and later.id != first.id
        other = await backend.enqueue_tick("other", 540.0, new())  # schedules are apart
        assert other is not None
        states = await backend.schedule_states(["s", "other"])
        assert states == {"s": ScheduleState(660.5, later.id), "other": ScheduleState(540.0, other.id)}
        assert await _total(backend) == 3


async def test_a_tick_whose_job_finds_its_unique_key_held_is_taken_with_no_new_job(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        assert isinstance(backend, nj.backends.ScheduleStore)
        (holder,) = await backend.insert_many([new(unique_key="k")])
        result = await backend.enqueue_tick("s", 60.0, new(unique_key="k"))
        assert result == (holder.id, True)
        assert (await backend.schedule_states(["s"]))["s"].last_tick == 60.0
        assert await backend.enqueue_tick("s", 60.0, new()) is None
        assert await _total(backend) == 1


async def test_concurrent_ticks_from_several_instances_enqueue_one_job_each(store, autojump_clock) -> None:
    backends = [store.open() for _ in range(3)]
    for backend in backends:
        await backend.open()
    try:
        results: dict[float, list[int]] = {}

        async def ticker(backend: nj.Backend) -> None:
            assert isinstance(backend, nj.backends.ScheduleStore)
            for tick in range(1, 9):
                got = await backend.enqueue_tick("s", float(tick), new())
                if got is not None:
                    results.setdefault(float(tick), []).append(got.id)

        async with trio.open_nursery() as nursery:
            for backend in backends:
                nursery.start_soon(ticker, backend)
        assert sorted(results) == [float(t) for t in range(1, 9)]
        assert all(len(ids) == 1 for ids in results.values()), results
        assert await _total(backends[0]) == 8
    finally:
        for backend in backends:
            await backend.close()


def _periodic(schedule: str) -> nj.app.Periodic:
    app = nj.App()
    app.queue(Q, max_workers=1)

    @app.periodic(schedule)
    @app.job(name="work", queue=Q)
    async def work(ctx: nj.JobContext) -> None:
        pass

    return app.periodic_schedules["work"]


async def test_schedulers_on_every_instance_of_a_store_enqueue_exactly_one_job_per_tick(
    test_backend, request, autojump_clock
) -> None:
    """The runtime's schedulers, no leader: N of them, one per instance when the store is shared
    (else all on the one instance, as runtimes sharing a memory backend). Every tick taken is
    taken once, and makes one job. (Whether every tick is taken depends on virtual time not
    jumping while a query runs on a thread: exact tick points are P12's, on the deterministic
    backends.)"""
    made = test_backend.new_store(request)
    one = made.open()
    backends = [made.open() for _ in range(2)] + [one] if made.shared else [one]
    schedule = _periodic("*/2 * * * * *")  # every other second
    taken: list[float] = []

    def recording(enqueue_tick: Any) -> Any:
        async def wrapper(name: str, tick: float, job: Any) -> Any:
            result = await enqueue_tick(name, tick, job)
            if result is not None:
                taken.append(tick)
            return result

        return wrapper

    for backend in backends:
        await backend.open()
        backend.enqueue_tick = recording(backend.enqueue_tick)  # type: ignore[attr-defined]
    try:
        schedulers = [
            Scheduler(backend, [schedule], closing=lambda: False)  # type: ignore[arg-type]
            for backend in backends
            for _ in range(3 if len(backends) == 1 else 1)
        ]
        start = one.now() - one.wall_offset()
        async with trio.open_nursery() as nursery:
            for s in schedulers:
                await nursery.start(s.run)
            await trio.sleep(20.5)
            nursery.cancel_scope.cancel()
        end = one.now() - one.wall_offset()
        assert taken and len(taken) == len(set(taken)), taken  # no tick twice
        assert all(t % 2 == 0 and start < t <= end for t in taken)
        assert await _total(one) == len(taken)
        (state,) = (await one.schedule_states(["work"])).values()  # type: ignore[attr-defined]
        assert state.last_tick == max(taken)
    finally:
        for backend in backends:
            await backend.close()
