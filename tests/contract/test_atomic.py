"""`JobStore.atomic` and the checkpoints: "every method is a Trio checkpoint unless `atomic`";
`atomic` means no call ever yields, so a caller need not shield it. Each async method is called
directly under Trio's own checkpoint assertions, so a backend that claims atomicity and yields
(a cancellation could cut its call in half) fails, and so does one that neither claims it nor
checkpoints (a loop of its calls would starve every other task)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

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
    assert isinstance(backend.atomic, bool)


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


async def test_every_call_checkpoints_unless_the_backend_is_atomic(make_backend, autojump_clock) -> None:
    async with opened(make_backend) as backend:
        job_id, attempt = await running(backend)
        wrong = []
        for name, call in _calls(backend, job_id, attempt):
            check = trio.testing.assert_no_checkpoints() if backend.atomic else trio.testing.assert_checkpoints()
            try:
                with check:
                    await call()
            except AssertionError:
                wrong.append(name)
    assert wrong == [], f"{'yield' if backend.atomic else 'do not checkpoint'}: {wrong}"

