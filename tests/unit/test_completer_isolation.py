"""The completer never fails on content: one outcome the backend refuses never drops the others
of its batch, and is itself written with a note saying what was replaced."""

from __future__ import annotations

from typing import Any, Sequence

import pytest
import trio
import trio.testing

import nursery_jobs as nj
from nursery_jobs.backends import Outcome


class Picky(nj.MemoryBackend):
    """Refuses any batch holding an error message with "POISON" in it, as PostgreSQL refuses a
    NUL; records every batch it was asked to write."""

    def __init__(self, refuse_bare: bool = False) -> None:
        super().__init__()
        self.batches: list[list[int]] = []
        self.refuse_bare = refuse_bare

    async def finish_many(self, outcomes: Sequence[Outcome]) -> None:
        self.batches.append([o.job_id for o in outcomes])
        if any(o.error is not None and "POISON" in o.error.message for o in outcomes):
            raise ValueError("invalid byte sequence in message")
        if self.refuse_bare and any(o.job_id == 3 for o in outcomes):
            raise ValueError("this row refuses every write")
        await super().finish_many(outcomes)


def _app(go: trio.Event) -> nj.App:
    app = nj.App()
    app.queue("q", max_workers=8, timeout=None)

    @app.job(queue="q", max_attempts=1)
    async def work(ctx: nj.JobContext, message: str | None) -> None:
        await go.wait()  # all end at once: one batch
        if message is not None:
            raise ValueError(message)

    return app


async def _run(backend: Picky, messages: list[Any]) -> list[nj.Job]:
    go = trio.Event()
    async with nj.open_runtime(_app(go), backend=backend) as rt:
        ids = [await rt.enqueue("work", {"message": m}) for m in messages]
        while (await rt.stats())["q"].running < len(ids):
            await trio.sleep(0.01)
        go.set()
        for job_id in ids:
            await rt.wait(job_id, timeout=10)
        return [await rt.get_job(i) for i in ids]


async def test_a_refused_outcome_is_isolated_and_written_with_a_note(autojump_clock: trio.testing.MockClock, caplog):
    backend = Picky()
    messages = [None, "fine", "POISON here", None, None, "also fine", None, None]
    jobs = await _run(backend, messages)
    assert [j.state for j in jobs] == [
        nj.JobState.COMPLETED if m is None else nj.JobState.DISCARDED for m in messages
    ]
    assert jobs[1].errors[-1].message == "ValueError: fine"
    note = jobs[2].errors[-1].message
    assert note.startswith("nursery_jobs: the backend could not store this attempt's outcome (ValueError: invalid byte")
    assert "POISON" not in note and jobs[2].errors[-1].traceback is None
    assert max(len(b) for b in backend.batches) == 8  # one batch first, then halves around the refusal
    assert any("written with a note" in r.getMessage() and "job 3" in r.getMessage() for r in caplog.records)


async def test_an_outcome_no_write_can_store_is_a_backend_failure(autojump_clock: trio.testing.MockClock):
    backend = Picky(refuse_bare=True)
    with pytest.RaisesGroup(pytest.RaisesExc(ValueError, match="refuses every write"), flatten_subgroups=True):
        await _run(backend, [None, None, None, None])
