"""The app of the deploy test (`nursery-jobs worker tests/processes/delivery_app.py:app`).

`deliver` is the idempotency recipe of docs/guarantees.md, caught by a deploy: its POST (a
sleep that lasts until the worker's SIGTERM, and a little more), then the delivery's row and a
follow-up job in one `ctx.client.transaction()`. It appends a JSON line to the file `log` names
when it starts and when it has committed (``{"ev", "id", "attempt", "t", "closing"}``, one
`os.write` each), so the test sends SIGTERM while it runs and sees that it finished. `table` is
where the row goes (``"schema.deliveries"`` on PostgreSQL).
"""

from __future__ import annotations

import json
import os
import time

import trio

import nursery_jobs as nj

app = nj.App()
app.queue("deliveries", max_workers=2, timeout=60)


@app.job(queue="deliveries")
async def notify(ctx: nj.JobContext, delivery: int) -> None:
    """The follow-up: no worker runs it in the test (it is enqueued during the shutdown)."""


def _record(log: str, ev: str, ctx: nj.JobContext, **more: object) -> None:
    line = {"ev": ev, "id": ctx.id, "attempt": ctx.attempt, "t": time.time(), "closing": ctx.client.closing, **more}
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


@app.job(queue="deliveries")
async def deliver(ctx: nj.JobContext, n: int, table: str, log: str) -> None:
    _record(log, "start", ctx)
    with trio.move_on_after(30):
        await ctx.client.shutdown_requested.wait()  # the POST is in flight when the deploy's SIGTERM comes
    await trio.sleep(0.3)  # and its answer takes a little longer
    mark = "%s" if ctx.client.backend.url.startswith("postgresql") else "?"
    async with ctx.client.transaction() as conn:
        await conn.execute(f"INSERT INTO {table} (job_id, n) VALUES ({mark}, {mark})", (ctx.id, n))
        follow_up = await notify.enqueue_tx(conn, delivery=ctx.id)
    _record(log, "end", ctx, follow_up=follow_up)
