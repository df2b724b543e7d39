"""`Notifier`, called directly: listeners get every later event, in order, synchronously;
`serve` reports started, carries wake-ups between instances that share a store, and ends when
cancelled. Which events each `JobStore` method emits is checked beside each method's own
tests; here, the delivery itself."""

from __future__ import annotations

import trio

import nursery_jobs as nj
from nursery_jobs.backends import CancelRequested, JobFinalized, JobsAvailable, Outcome, OutcomeKind

from .common import Q, listen, new, opened, running


async def test_every_listener_gets_every_event_in_order_before_the_call_returns(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        first, second = listen(backend), listen(backend)
        (res,) = await backend.insert_many([new()])
        assert first == second == [JobsAvailable(Q)]  # delivered already: synchronously
        (job,) = (await backend.claim(Q, 1)).jobs
        assert await backend.cancel(job.id) is nj.JobState.RUNNING
        assert first[-1] == CancelRequested(job.id)
        await backend.finish_many([Outcome(job.id, job.attempt, OutcomeKind.CANCELLED)])
        assert first[-1] == JobFinalized(job.id, nj.JobState.CANCELLED, None)
    assert first == second == [JobsAvailable(Q), CancelRequested(res.id), JobFinalized(res.id, nj.JobState.CANCELLED, None)]


async def test_a_removed_listener_gets_nothing_more_and_the_others_go_on(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        kept, removed = listen(backend), listen(backend)
        await backend.insert_many([new()])
        backend.remove_listener(removed.append)
        await backend.insert_many([new(queue="other")])
    assert kept == [JobsAvailable(Q), JobsAvailable("other")] and removed == [JobsAvailable(Q)]


async def test_events_go_only_to_listeners_added_before_them(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        await backend.insert_many([new()])
        late = listen(backend)
        job_id, attempt = await running(backend, queue="later")
    assert late == [JobsAvailable("later")] and job_id > 0 and attempt == 1


async def test_serve_reports_started_keeps_the_backend_usable_and_ends_when_cancelled(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.serve)
            events = listen(backend)
            (res,) = await backend.insert_many([new()])
            assert (await backend.get_job(res.id)).state is nj.JobState.AVAILABLE
            assert JobsAvailable(Q) in events
            nursery.cancel_scope.cancel()
        # and it can be served again (a runtime restarted on the same instance)
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.serve)
            nursery.cancel_scope.cancel()


async def test_serve_carries_a_wake_up_from_another_instance_on_the_same_store(store, autojump_clock) -> None:
    """A process that inserts wakes the others: as a hint (`JobsAvailable` of the queue),
    never as a change to a job."""
    writer, reader = store.open(), store.open()
    await writer.open()
    await reader.open()
    try:
        heard = trio.Event()
        events: list[object] = []

        def on_event(event: object) -> None:
            events.append(event)
            if isinstance(event, JobsAvailable) and event.queue == Q:
                heard.set()

        reader.add_listener(on_event)
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.serve)
            await writer.insert_many([new()])
            with trio.fail_after(30):
                await heard.wait()
            nursery.cancel_scope.cancel()
        assert not [e for e in events if isinstance(e, (JobFinalized, CancelRequested)) and getattr(e, "verified", True)]
    finally:
        await writer.close()
        await reader.close()
