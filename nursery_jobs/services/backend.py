"""The backend's own service: `Backend.serve` (PostgreSQL's LISTEN connection, SQLite's wake-up
socket), started before anything that needs wake-ups and stopped last."""

from __future__ import annotations

import trio

from ..backends import Backend

__all__ = ["BackendService"]


class BackendService:
    name = "backend"

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._backend.serve(task_status=task_status)
