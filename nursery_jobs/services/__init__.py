"""The runtime's background services, and the set that starts and stops them in order.

Each service is a small class with the settings and the narrow dependencies it uses (a backend,
the attempt registry, a few seconds of configuration), and one `run` coroutine that reports
started and then works until it is cancelled. A `ServiceSet` starts its services one after the
other, each in a cancel scope of its own, and `stop` cancels them in reverse order: what started
first stops last. Failures inside a service's loop are logged and retried by the service itself;
a crash that escapes `run` propagates from `open_runtime`, never swallowed.

- `backend.BackendService`: the backend's own work (PostgreSQL's LISTEN connection, SQLite's
  wake-up socket), started first and stopped last.
- `heartbeats.Heartbeats`: renews the running attempts' claims; cancels them as "lost" when it
  cannot. `heartbeats.CancelHints` reads back cancel requests that came as notifications.
- `rescuer.Rescuer`: makes other processes' stale running jobs runnable again.
- `retention.Retention`: deletes old final jobs in small batches.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import trio

from ..infra.owner import TaskOwner

__all__ = ["Service", "ServiceSet"]


class Service(Protocol):
    name: str

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Report started once ready, then work until cancelled."""
        ...


class ServiceSet:
    """Services started in order, each in its own cancel scope, and stopped in reverse."""

    def __init__(self, services: Sequence[Service]) -> None:
        self.services = list(services)
        self._scopes: list[trio.CancelScope] = []

    async def start(self, owner: TaskOwner) -> None:
        for service in self.services:
            scope = trio.CancelScope()
            self._scopes.append(scope)
            await owner.start(_scoped, service, scope, name=service.name)

    def stop(self) -> None:
        for scope in reversed(self._scopes):
            scope.cancel()


async def _scoped(
    service: Service, scope: trio.CancelScope, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    with scope:
        await service.run(task_status=task_status)
