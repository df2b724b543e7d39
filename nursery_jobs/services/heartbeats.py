"""Heartbeats: this process's claim on its running jobs, renewed, and given up in time.

Another process may rescue a job whose heartbeat is `rescue_after` old. So every
`heartbeat_interval` this service renews every attempt running here -- and every outcome the
completer has not written yet, whose row is still `running` in the backend: without that, a slow
write would let another process rescue, and run again, a job that is done. Once this process has
not renewed for half of `rescue_after` -- the calls failed, or one has not answered (a hung
connection) -- it cancels its running attempts as "lost" rather than let them run unowned: each
call is bounded by that deadline, not only checked when it returns. A heartbeat that reports an
attempt lost (rescued, or finished elsewhere) cancels it; one that reports a cancel request
cancels that attempt as "cancel".

`CancelHints` handles cancel requests that arrived as notifications from another process. They
are hints, not authority (PostgreSQL checks no privilege on NOTIFY: any session that can
connect may send one): it reads the hinted attempts' rows in one `heartbeat` call and cancels
only those whose row says so. A call that fails leaves the request to the next heartbeat, which
reads the same flag.
"""

from __future__ import annotations

import logging
from typing import Callable

import trio

from ..backends import Backend
from ..execution.attempt import AttemptRegistry
from ..infra.sync import Wakeup

__all__ = ["CancelHints", "Heartbeats"]

log = logging.getLogger("nursery_jobs")


class Heartbeats:
    name = "heartbeats"

    def __init__(
        self,
        backend: Backend,
        attempts: AttemptRegistry,
        unwritten: Callable[[], list[tuple[int, int]]],
        *,
        interval: float,
        rescue_after: float,
    ) -> None:
        self._backend = backend
        self._attempts = attempts
        self._unwritten = unwritten
        self._interval = interval
        self._rescue_after = rescue_after

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        attempts = self._attempts
        last_ok = trio.current_time()
        while True:
            await trio.sleep(self._interval)
            running = attempts.pairs() + self._unwritten()
            if not running:
                last_ok = trio.current_time()
                continue
            result = None
            with trio.move_on_at(last_ok + self._rescue_after / 2):
                try:
                    result = await self._backend.heartbeat(running)
                except Exception:
                    log.exception(
                        "heartbeat of %d running jobs failed",
                        len(running),
                        extra={"event": "heartbeat_failed", "job_ids": [i for i, _ in running]},
                    )
            now = trio.current_time()
            if result is None:
                if now - last_ok >= self._rescue_after / 2:
                    log.error(
                        "no heartbeat for %g s (rescue_after is %g s): cancelling this process's running jobs",
                        now - last_ok,
                        self._rescue_after,
                        extra={"event": "heartbeat_lost", "job_ids": [i for i, _ in running], "since": now - last_ok},
                    )
                    attempts.cancel("lost")
                continue
            last_ok = now
            for job_id, attempt_no in result.lost:
                found = attempts.get(job_id)
                if found is not None and found.job.attempt == attempt_no:
                    found.cancel("lost")
            for job_id in result.cancel:
                found = attempts.get(job_id)
                if found is not None:
                    found.cancel("cancel")


class CancelHints:
    name = "cancel-hints"

    def __init__(self, backend: Backend, attempts: AttemptRegistry) -> None:
        self._backend = backend
        self._attempts = attempts
        self._hinted: set[int] = set()
        self._wakeup = Wakeup()

    def hint(self, job_id: int) -> None:
        """A notification said `job_id`'s cancellation was requested: read its row soon. The
        set is bounded by the attempts running here (a flood of notifications adds nothing)."""
        if job_id in self._attempts and len(self._hinted) <= len(self._attempts):
            self._hinted.add(job_id)
            self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        attempts = self._attempts
        while True:
            await self._wakeup.wait()
            hinted, self._hinted = self._hinted, set()
            running = [(a.job.id, a.job.attempt) for i in sorted(hinted) if (a := attempts.get(i)) is not None]
            if not running:
                continue
            try:
                result = await self._backend.heartbeat(running)
            except Exception:
                log.warning(
                    "could not read back %d cancel requests; the next heartbeat will",
                    len(running),
                    exc_info=True,
                    extra={"event": "cancel_hints_failed", "job_ids": [i for i, _ in running]},
                )
                continue
            for job_id in result.cancel:
                found = attempts.get(job_id)
                if found is not None:
                    found.cancel("cancel")
