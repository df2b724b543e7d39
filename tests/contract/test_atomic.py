"""`JobStore.never_yields`, the checkpoints and cancel-atomicity.

"Every method is a Trio checkpoint unless `never_yields`" (no call ever yields, so none can be
cut). Each async method is called directly under Trio's own checkpoint assertions, so a backend
that claims never to yield and yields (a cancellation could cut its call in half) fails, and so
does one that neither claims it nor checkpoints (a loop of its calls would starve every other
task). Then `insert_many` and `cancel` are cut by a cancellation at each scheduling point: a
call that raised `Cancelled` must have changed nothing."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs.backends import Backend, Outcome, OutcomeKind

from .common import Q, new, opened, running


def test_the_backend_has_the_protocols_attributes(make_backend) -> None:
    backend = make_backend()
    assert isinstance(backend, Backend)
    assert isinstance(backend.url, str) and "://" in backend.url
    assert backend.poll_interval is None or backend.poll_interval > 0
    assert isinstance(backend.never_yields, bool)


def _calls(backend: nj.Backend, job_id: int, attempt: int) -> list[tuple[str, Callable[[], Awaitable[Any]]]]:
    now = backend.now()
    return [
        ("insert_many", lambda: backend.insert_many([new()])),
        ("insert_many (empty)", lambda: backend.insert_many([])),
        ("claim", lambda: backend.claim(Q, 1)),
        ("claim (nothing)", lambda: backend.claim("empty", 1)),
        ("heartbeat", lambda: backend.heartbeat([(job_id, attempt)])),
        ("cancel", lambda: backend.cancel(job_id)),
        ("finish_many", lambda: backend.finish_many([Outcome(job_id, attempt, OutcomeKind.COMPLETED)])),
        ("rescue", lambda: backend.rescue(now - 1000)),
        ("get_job", lambda: backend.get_job(job_id)),
        ("stats", lambda: backend.stats()),
        ("delete_finished", lambda: backend.delete_finished({nj.JobState.COMPLETED: now + 1}, 10)),
    ]


async def test_every_call_checkpoints_unless_the_backend_never_yields(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        job_id, attempt = await running(backend)
        wrong = []
        for name, call in _calls(backend, job_id, attempt):
            check = trio.testing.assert_no_checkpoints() if backend.never_yields else trio.testing.assert_checkpoints()
            try:
                with check:
                    await call()
            except AssertionError:
                wrong.append(name)
    assert wrong == [], f"{'yield' if backend.never_yields else 'do not checkpoint'}: {wrong}"



async def _cut(call: Callable[[], Awaitable[Any]], after: int) -> bool:
    """Run `call` in a scope another task cancels after `after` scheduling rounds; True if it
    returned, False if it raised Cancelled."""
    returned = False
    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as scope:

            async def canceller() -> None:
                for _ in range(after):
                    await trio.lowlevel.checkpoint()
                scope.cancel()

            nursery.start_soon(canceller)
            await call()
            returned = True
    return returned


CUTS = [0, 1, 2, 3, 5, 8]


@pytest.mark.parametrize("after", CUTS)
async def test_an_insert_cut_by_a_cancellation_either_happened_or_did_not(make_backend, autojump_clock, after: int) -> None:
    """Cancel-atomic: `Client.enqueue` makes this one call unshielded and promises "cancelled:
    not enqueued; returned: enqueued once", so the call itself must raise Cancelled only if it
    changed nothing."""
    async with opened(make_backend) as backend:
        returned = await _cut(lambda: backend.insert_many([new(), new()]), after)
        stats = await backend.stats()
    assert (stats[Q].available if stats else 0) == (2 if returned else 0)


@pytest.mark.parametrize("after", CUTS)
async def test_a_cancel_cut_by_a_cancellation_either_happened_or_did_not(make_backend, autojump_clock, after: int) -> None:
    async with opened(make_backend) as backend:
        pending = (await backend.insert_many([new(delay=100, now=backend.now())]))[0].id
        job_id, _ = await running(backend)
        events: list[Any] = []
        backend.add_listener(events.append)
        cut_pending = await _cut(lambda: backend.cancel(pending), after)
        cut_running = await _cut(lambda: backend.cancel(job_id), after)
        states = [(await backend.get_job(i)).state for i in (pending, job_id)]
        requested = (await backend.heartbeat([(job_id, 1)])).cancel == [job_id]
    assert states[0] is (nj.JobState.CANCELLED if cut_pending else nj.JobState.SCHEDULED)
    assert states[1] is nj.JobState.RUNNING and requested is cut_running
    assert len(events) == cut_pending + cut_running
