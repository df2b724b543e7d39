"""The rescuer: running jobs whose worker stopped heartbeating become runnable again.

Every `rescue_interval` (the first at start-up), any process -- enqueue-only ones too -- asks the
backend to rescue running jobs whose heartbeat is older than `rescue_after`: the attempt counts
as failed (the worker may have done part of the work), and the job is available again, or
discarded if it had no attempt left, or cancelled if its cancellation was requested
(`rules.after_rescue`). A crashed process's jobs are runnable again at most about
`rescue_after + rescue_interval` after its last heartbeat. Failures are logged and tried again.
"""

from __future__ import annotations

import logging

import trio

from typing import Callable, Sequence

from ..backends import Backend

__all__ = ["Rescuer"]

log = logging.getLogger("nursery_jobs")


class Rescuer:
    name = "rescuer"

    def __init__(
        self,
        backend: Backend,
        *,
        interval: float,
        rescue_after: float,
        on_rescued: Callable[[Sequence[int]], None] | None = None,
    ) -> None:
        self._backend = backend
        self._interval = interval
        self._rescue_after = rescue_after
        self._on_rescued = on_rescued
        """Told the ids of each pass's rescued jobs (the middleware's `jobs_rescued`)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        backend = self._backend
        while True:
            try:
                rescued = await backend.rescue(backend.now() - self._rescue_after)
            except Exception:
                log.exception(
                    "rescue of stale running jobs failed; retrying in %g s",
                    self._interval,
                    extra={"event": "rescue_failed", "backend": backend.url},
                )
            else:
                if rescued:
                    log.warning(
                        "rescued %d jobs whose worker stopped heartbeating: %s",
                        len(rescued),
                        rescued,
                        extra={"event": "jobs_rescued", "job_ids": rescued, "backend": backend.url},
                    )
                    if self._on_rescued is not None:
                        self._on_rescued(rescued)
            await trio.sleep(self._interval)
