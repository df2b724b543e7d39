"""An outcome is always written, whatever the handler raised.

Error text is the one piece of content a handler hands the runtime on every failure, and a
database refuses some of it: PostgreSQL cannot store NUL in text or jsonb, nor a lone surrogate
(an undecodable file name from `os.listdir`) in UTF-8; a 20 MB message would be stored whole on
every attempt. Every backend stores the same cleaned text (`nursery_jobs.jobs.clean_text`), and
a job keeps a bounded history of its errors.
"""

from __future__ import annotations

import trio

import nursery_jobs as nj
from nursery_jobs.jobs import MAX_ERRORS_KEPT, MAX_MESSAGE, MAX_TRACEBACK

ONCE = nj.RetryPolicy(base=1.0, factor=1.0, cap=1.0, jitter=0.0)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


async def test_text_a_database_cannot_hold_is_stored_escaped_and_the_batch_is_written(make_backend, autojump_clock):
    app = nj.App()
    app.queue("q", max_workers=8, timeout=None)
    go = trio.Event()

    @app.job(queue="q", max_attempts=1)
    async def fail(ctx: nj.JobContext, text: str, discard: bool) -> None:
        await go.wait()  # every job ends at the same instant: their outcomes share one batch
        if discard:
            raise nj.Discard(text)
        raise ValueError(text)

    @app.job(queue="q")
    async def fine(ctx: nj.JobContext) -> None:
        await go.wait()

    cases = [
        ("header PK\x03\x04\x00", False),
        ("file \udcff.txt in /data", False),
        ("reason with \x00 NUL", True),
    ]
    async with nj.open_runtime(app, backend=make_backend()) as rt:
        failing = [await fail.enqueue(text=t, discard=d) for t, d in cases]
        passing = await fine.enqueue_many([{}, {}, {}])
        while (await rt.stats())["q"].running < 6:
            await trio.sleep(0.01)
        go.set()
        receipts = [await rt.wait(i, timeout=30) for i in failing + passing]
        jobs = [await rt.get_job(i) for i in failing]
    assert [r.state for r in receipts] == [nj.JobState.DISCARDED] * 3 + [nj.JobState.COMPLETED] * 3
    assert [j.errors[-1].message for j in jobs] == [
        "ValueError: header PK\x03\x04\\x00 [nursery_jobs: 1 NUL(s) escaped]",
        "ValueError: file \\udcff.txt in /data [nursery_jobs: 1 lone surrogate(s) escaped]",
        "reason with \\x00 NUL [nursery_jobs: 1 NUL(s) escaped]",
    ]
    assert receipts[0].error == jobs[0].errors[-1].message
    assert "\\x00" in jobs[0].errors[-1].traceback and "\x00" not in jobs[0].errors[-1].traceback


async def test_an_exception_whose_str_raises_is_a_failure_like_any_other(make_backend, autojump_clock):
    app = nj.App()

    @app.job(max_attempts=2, retry=ONCE)
    async def odd(ctx: nj.JobContext) -> None:
        raise Unprintable()

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        receipt = await rt.wait(await odd.enqueue(), timeout=30)
        job = await rt.get_job(receipt.job_id)
    assert receipt.state is nj.JobState.DISCARDED and job.attempt == 2
    assert [e.message for e in job.errors] == ["Unprintable: <unprintable Unprintable: str() raised RuntimeError>"] * 2
    assert "Unprintable" in job.errors[0].traceback


async def test_a_huge_message_is_cut_and_the_error_history_is_bounded(make_backend, autojump_clock):
    app = nj.App()
    huge = "x" * 20_000_000

    @app.job(max_attempts=MAX_ERRORS_KEPT + 3, retry=ONCE)
    async def loud(ctx: nj.JobContext) -> None:
        if ctx.attempt == 1:
            raise ValueError(huge)
        raise ValueError(f"attempt {ctx.attempt}")

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        receipt = await rt.wait(await loud.enqueue(), timeout=60)
        job = await rt.get_job(receipt.job_id)
    assert receipt.state is nj.JobState.DISCARDED and job.attempt == MAX_ERRORS_KEPT + 3
    # the latest MAX_ERRORS_KEPT errors, in order
    assert [e.attempt for e in job.errors] == list(range(4, MAX_ERRORS_KEPT + 4))
    assert job.errors[-1].message == f"ValueError: attempt {MAX_ERRORS_KEPT + 3}"


async def test_a_huge_message_is_stored_cut_with_its_head_and_tail(make_backend, autojump_clock):
    app = nj.App()

    @app.job(max_attempts=1)
    async def loud(ctx: nj.JobContext) -> None:
        raise ValueError("BEGIN" + "x" * 20_000_000 + "END")

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        receipt = await rt.wait(await loud.enqueue(), timeout=60)
        job = await rt.get_job(receipt.job_id)
    (error,) = job.errors
    assert error.message.startswith("ValueError: BEGINxxx") and "END [nursery_jobs: cut to 4,096 of" in error.message
    assert len(error.message) < MAX_MESSAGE + 100
    assert error.traceback is not None and len(error.traceback) < MAX_TRACEBACK + 100
    assert error.traceback.startswith("Traceback")


async def test_a_retry_policy_that_validates_computes_every_delay(make_backend, autojump_clock):
    app = nj.App()
    starts = []

    @app.job(max_attempts=6, retry=nj.RetryPolicy(base=0.5, factor=1e200, cap=2.0, jitter=0.0))
    async def steep(ctx: nj.JobContext) -> None:
        starts.append(trio.current_time())
        raise ValueError("again")

    async with nj.open_runtime(app, backend=make_backend()) as rt:
        receipt = await rt.wait(await steep.enqueue(), timeout=60)
    assert receipt.state is nj.JobState.DISCARDED
    gaps = [round(b - a, 3) for a, b in zip(starts, starts[1:])]
    assert gaps == [0.5, 2.0, 2.0, 2.0, 2.0]  # factor ** 2 overflows a float: the cap, not a crash
