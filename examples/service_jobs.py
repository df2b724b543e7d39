"""A service's jobs module, for the worker command: declarations only, no `main`.

    nursery-jobs migrate --database-url postgresql://app@db/app --schema jobs   # PostgreSQL only
    nursery-jobs worker examples/service_jobs.py:app --backend sqlite:///jobs.db
    nursery-jobs enqueue send_welcome --args '{"user_id": 42}' --app examples/service_jobs.py:app --backend sqlite:///jobs.db

The web process imports the same module and enqueues with ``await send_welcome.enqueue(user_id=42)``
inside its own `nj.run` (or `open_runtime(app, queues=[])` for a process that only enqueues).

Docs: docs/cli.md walks through running it.
"""

from __future__ import annotations

import logging

import trio

import nursery_jobs as nj

log = logging.getLogger("service")

app = nj.App()
app.queue("emails", max_workers=8, timeout=30)
app.queue("maintenance", max_workers=1, timeout=300)


@app.job(queue="emails", max_attempts=5)
async def send_welcome(ctx: nj.JobContext, user_id: int) -> None:
    """Send the welcome email (simulated). A failure is retried with backoff, up to 5 attempts."""
    await trio.sleep(0.01)  # the SMTP call goes here
    log.info("welcome email sent to user %d", user_id, extra={"job_id": ctx.id, "user_id": user_id})


@app.job(queue="maintenance")
async def purge_sessions(ctx: nj.JobContext, older_than_days: int = 30) -> None:
    """Delete expired sessions (simulated)."""
    await trio.sleep(0.01)
