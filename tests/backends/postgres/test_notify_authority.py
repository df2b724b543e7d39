"""A notification is a hint to re-read the row, never an authority.

PostgreSQL checks no privilege on NOTIFY: any session that can connect to the database -- a
role with no right on the jobs table at all -- can send `NOTIFY <schema>_events, 'c:<id>'` or
`'f:<id>'`. Such a message may make the runtime read a row sooner; it may never cancel a job or
end a wait that the table does not back.
"""

from __future__ import annotations

import psycopg
import trio

import nursery_jobs as nj
from nursery_jobs.backends.postgres import PostgresBackend
from tests import pgutil


def _spoof(url: str, channel: str, payload: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))


async def test_a_forged_cancel_notification_does_not_cancel_a_running_job(pg_url):
    schema = pgutil.new_schema(pg_url)
    app = nj.App()
    started = trio.Event()
    ended: list[str] = []

    @app.job(timeout=None)
    async def long(ctx: nj.JobContext) -> None:
        started.set()
        try:
            await trio.sleep(3600)
        finally:
            ended.append(str(ctx.cancel_reason))

    backend = PostgresBackend(pg_url, schema=schema, poll_interval=0.1)
    async with nj.open_runtime(app, backend=backend, grace=0) as rt:
        job_id = await long.enqueue()
        with trio.fail_after(10):
            await started.wait()
        for _ in range(3):
            await trio.to_thread.run_sync(_spoof, pg_url, f"{schema}_events", f"c:{job_id}")
        await trio.sleep(1.0)  # time for the notification to arrive and the row to be read back
        assert ended == [] and (await rt.get_job(job_id)).state is nj.JobState.RUNNING

        # The real request, through the table, still works from any process.
        other = PostgresBackend(pg_url, schema=schema)
        await other.open()
        try:
            assert await other.cancel(job_id) is nj.JobState.RUNNING
        finally:
            await other.close()
        receipt = await rt.wait(job_id, timeout=10)
    assert receipt.state is nj.JobState.CANCELLED and ended == ["cancel"]


async def test_a_forged_finished_notification_does_not_end_a_wait(pg_url):
    schema = pgutil.new_schema(pg_url)
    app = nj.App()

    @app.job(timeout=None)
    async def slow(ctx: nj.JobContext) -> None:
        await trio.sleep(2.0)

    async with nj.open_runtime(app, backend=PostgresBackend(pg_url, schema=schema)) as rt:
        job_id = await slow.enqueue()

        async def forge() -> None:
            await trio.sleep(0.3)
            await trio.to_thread.run_sync(_spoof, pg_url, f"{schema}_events", f"f:{job_id}")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(forge)
            t0 = trio.current_time()
            receipt = await rt.wait(job_id, timeout=10)
            waited = trio.current_time() - t0
    assert receipt.done and receipt.state is nj.JobState.COMPLETED
    assert waited > 1.5  # not ended by the forged message at ~0.3 s


def test_a_notification_with_digits_int_refuses_is_dropped_not_raised() -> None:
    """Any session can NOTIFY: a payload whose "ids" are characters `str.isdigit` accepts but
    `int` refuses (superscripts) is ignored, id by id, rather than raising in the listener."""
    backend = PostgresBackend("postgresql://nobody@127.0.0.1:1/none", schema="s")
    events: list[object] = []
    backend.add_listener(events.append)
    backend._on_notify("s_events", "f:²,7,³", 0)
    backend._on_notify("s_events", "c:¹,8", 0)
    assert [(type(e).__name__, e[0]) for e in events] == [("JobFinalized", 7), ("CancelRequested", 8)]
