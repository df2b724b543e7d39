"""A damaged row hurts only itself (durable backends: their rows can be written by others).

An operator's UPDATE, a damaged restore, another tool: whatever a row holds, the runtime never
crashes on it and every other row goes on. A pending or running row whose scheduling columns
cannot be read is set aside (discarded, with an error naming the column, and a warning naming
the id); an unreadable error history is replaced by a note; a running row with no heartbeat is
rescued like any other. (The memory backend's rows are only ever written by itself.)
"""

from __future__ import annotations

import logging

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import NewJob
from tests.registry import Damage


def _app() -> nj.App:
    app = nj.App()
    app.queue("q", max_workers=2, timeout=None)

    @app.job(queue="q", max_attempts=3, retry=nj.RetryPolicy(base=1.0, factor=1.0, cap=1.0, jitter=0.0))
    async def work(ctx: nj.JobContext, n: int) -> None:
        if ctx.attempt == 1 and n == 1:
            raise ValueError("first attempt fails")

    return app


@pytest.mark.parametrize("which", range(3))
async def test_an_unreadable_error_history_does_not_block_rescue(make_backend, damage: Damage, autojump_clock, which):
    bad = damage.bad_errors[which]
    backend = make_backend()
    app = _app()
    async with nj.open_runtime(app, backend=backend, queues=[]) as rt:
        ids = await rt.enqueue_many("work", [{"n": 0}, {"n": 0}, {"n": 0}])
        claimed = await backend.claim("q", 3)  # a worker that then crashed
        assert [j.id for j in claimed.jobs] == ids
        damage.write(backend, ids[1], "errors = ?", (bad,))
        rescued = await backend.rescue(backend.now() + 1)
        jobs = [await rt.get_job(i) for i in ids]
    assert rescued == ids
    assert [j.state for j in jobs] == [nj.JobState.AVAILABLE] * 3
    messages = [e.message for e in jobs[1].errors]
    assert any("unreadable entry of this job's errors was replaced" in m for m in messages), messages
    assert messages[-1].startswith("rescued: its worker stopped heartbeating"), messages


@pytest.mark.parametrize("which", range(3))
async def test_an_unreadable_error_history_on_a_pending_row_does_not_crash_the_runtime(
    make_backend, damage: Damage, autojump_clock, which
):
    bad = damage.bad_errors[which]
    backend = make_backend()
    app = _app()
    async with nj.open_runtime(app, backend=backend, queues=[]) as rt:
        job_id = await rt.enqueue("work", {"n": 1})
        damage.write(backend, job_id, "errors = ?", (bad,))
    async with nj.open_runtime(app, backend=backend) as rt:
        receipt = await rt.wait(job_id, timeout=30)
        job = await rt.get_job(job_id)
    assert receipt.state is nj.JobState.COMPLETED, job
    assert job.attempt == 2 and job.errors[-1].message == "ValueError: first attempt fails"


async def test_a_running_row_with_no_heartbeat_is_rescued(make_backend, damage: Damage, autojump_clock):
    backend = make_backend()
    async with nj.open_runtime(_app(), backend=backend, queues=[]) as rt:
        job_id = await rt.enqueue("work", {"n": 0})
        await backend.claim("q", 1)
        damage.write(backend, job_id, "heartbeat_at = NULL", ())
        assert await backend.rescue(backend.now() - 3600) == [job_id]
        job = await rt.get_job(job_id)
    assert job.state is nj.JobState.AVAILABLE
    assert job.errors[-1].message == "rescued: its running row had no readable heartbeat (worker lost)"


async def test_stored_args_that_do_not_fit_the_handler_are_discarded_at_once(make_backend, damage: Damage, autojump_clock):
    backend = make_backend()
    app = _app()
    async with nj.open_runtime(app, backend=backend, queues=[]) as enqueuer:
        misfit = await enqueuer.enqueue("work", {"n": 5})
        undecodable = await enqueuer.enqueue("work", {"n": 6})
    damage.write(backend, misfit, "args = ?", ('{"n": 5, "extra": true}',))
    damage.write(backend, undecodable, "args = ?", ("{not json",))
    async with nj.open_runtime(app, backend=backend) as rt:
        later = await rt.enqueue("work", {"n": 7})
        receipts = [await rt.wait(i, timeout=30) for i in (misfit, undecodable, later)]
        jobs = [await rt.get_job(i) for i in (misfit, undecodable)]
    assert [r.state for r in receipts] == [nj.JobState.DISCARDED, nj.JobState.DISCARDED, nj.JobState.COMPLETED]
    assert [j.attempt for j in jobs] == [1, 1]  # not retried max_attempts times
    assert "job args do not fit the handler" in jobs[0].errors[-1].message and "extra" in jobs[0].errors[-1].message
    assert "job args could not be decoded" in jobs[1].errors[-1].message


# -- a backend whose columns hold any type (SQLite has no check constraints) --


@pytest.mark.parametrize(
    ("assignment", "value", "column"),
    [
        ("state = ?", "bogus", "state"),
        ("priority = ?", "high", "priority"),
        ("kind = ?", b"work", "kind"),
        ("run_at = ?", "tomorrow", "run_at"),
        ("max_attempts = ?", 2.5, "max_attempts"),
    ],
)
async def test_a_row_with_unreadable_columns_is_set_aside_and_the_rest_goes_on(
    make_backend, damage: Damage, autojump_clock, caplog, assignment, value, column
):
    if not damage.untyped:
        pytest.skip("this backend's columns hold only their own type")
    backend = make_backend()
    app = _app()
    caplog.set_level(logging.WARNING, logger="nursery_jobs")
    async with nj.open_runtime(app, backend=backend, queues=[]) as rt:
        ids = await rt.enqueue_many("work", [{"n": 0}, {"n": 0}, {"n": 0}])
        damage.write(backend, ids[1], assignment, (value,))
    async with nj.open_runtime(app, backend=backend) as rt:
        for i in (ids[0], ids[2]):
            assert (await rt.wait(i, timeout=30)).state is nj.JobState.COMPLETED
        await trio.sleep(1)
        stats = (await rt.stats())["q"]
        bad = await rt.get_job(ids[1])
        again = await rt.get_job(ids[1])
    assert bad.state is nj.JobState.DISCARDED and bad == again
    assert f"set aside, the row could not be read (column {column} holds {value!r}" in bad.errors[-1].message
    assert stats.completed == 2 and stats.discarded == 1 and stats.queued == 0
    warnings = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert len(warnings) == 1 and f"job {ids[1]} set aside" in warnings[0] and column in warnings[0], warnings





async def test_a_keyed_row_set_aside_by_the_claim_frees_its_keys_slot(make_backend, damage: Damage, autojump_clock):
    """The claim starts the key's first job, parks the second (the key looks full), then finds
    the first one's kind unreadable and sets it aside: the slot it held is free again in the same
    write, so the next claim starts the second job, with no rescue pass in between."""
    if not damage.untyped:
        pytest.skip("this backend's columns hold only their own type")
    backend = make_backend()
    await backend.open()
    try:
        first, second = [
            r.id for r in await backend.insert_many([NewJob("keyed", "q", "{}", 0, None, 5, None, "k", 1) for _ in range(2)])
        ]
        damage.write(backend, first, "kind = ?", (b"keyed",))
        before = await backend.claim("q", 10)
        after = await backend.claim("q", 10)
        bad = await backend.get_job(first)
    finally:
        await backend.close()
    assert before.jobs == [] and bad.state is nj.JobState.DISCARDED
    assert [j.id for j in after.jobs] == [second]


# A job marked parked by hand (or by an older runtime) that no claim would read and no freed
# slot or rate window would bring back: the rescuer's pass does (the backend alone, with no
# runtime whose own rescuer could pass first), and the next claim starts it.
_LEFT_PARKED = {
    # its key's slot is free: nothing of the key runs
    "key with a free slot": (NewJob("keyed", "q", "{}", 0, None, 5, None, "k", 1), "parked = ?", (True,)),
    # no key: no key's freed slot would ever bring it back
    "no key": (NewJob("plain", "q", "{}", 0, None, 5, None), "parked = ?", (True,)),
    # parked for its rate, with no wake time for its key: the pass wakes the key
    "rate with no wake time": (
        NewJob("rated", "q", "{}", 0, None, 5, None, None, None, "r", 1, 60.0),
        "parked = ?, rate_wait = ?",
        (True, True),
    ),
    # marked waiting for a rate it does not have: the pass clears the meaningless flag
    "rate flag, no rate key": (NewJob("keyed", "q", "{}", 0, None, 5, None, "k", 1), "parked = ?, rate_wait = ?", (True, True)),
}


@pytest.mark.parametrize("case", list(_LEFT_PARKED))
async def test_a_row_left_parked_is_repaired_by_the_rescue_pass(make_backend, damage: Damage, autojump_clock, case):
    new, columns, values = _LEFT_PARKED[case]
    backend = make_backend()
    await backend.open()
    try:
        (job,) = await backend.insert_many([new])
        damage.write(backend, job.id, columns, values)
        before = await backend.claim("q", 10)
        await backend.rescue(backend.now() - 60)
        after = await backend.claim("q", 10)
    finally:
        await backend.close()
    assert before.jobs == [] and [j.id for j in after.jobs] == [job.id]
