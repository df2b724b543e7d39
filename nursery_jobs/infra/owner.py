"""Owned, named, introspectable nurseries: the one way the library starts tasks.

A `TaskOwner` wraps a Trio nursery. It adds a name to every task it starts (so a stuck shutdown
can say *what* is stuck), counts what it owns, and keeps Trio's rule that a child's error
propagates to the owner: a crash in a runtime service cancels the tree and surfaces from
`open_runtime`, it is never swallowed. The one exception is `spawn_detached`, for work whose
failure must not take its owner down (it logs and absorbs the error instead); runtime services
never use it.

`open_children` gives a job attempt its own nursery, opened inside the attempt's cancel scope,
so a timeout, a remote cancel or a shutdown that ends the attempt ends its children too.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

import trio

__all__ = ["ChildTasks", "TaskOwner", "open_children", "open_owner"]

log = logging.getLogger("nursery_jobs")


class TaskOwner:
    """A named nursery. Start tasks with `spawn` (fire into the scope) or `start` (wait until
    the task reports it is ready)."""

    def __init__(self, name: str, nursery: trio.Nursery) -> None:
        self.name = name
        self._nursery = nursery

    def __repr__(self) -> str:
        return f"<TaskOwner {self.name!r} tasks={self.task_names()}>"

    @property
    def cancel_scope(self) -> trio.CancelScope:
        return self._nursery.cancel_scope

    def task_names(self) -> list[str]:
        return sorted(t.name for t in self._nursery.child_tasks)

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str) -> None:
        self._nursery.start_soon(fn, *args, name=f"{self.name}/{name}")

    async def start(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str) -> Any:
        return await self._nursery.start(fn, *args, name=f"{self.name}/{name}")

    def spawn_detached(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str) -> None:
        """Start a task whose `Exception`s are logged and absorbed instead of propagated.

        For best-effort work only (a cache warm-up); never for a service the runtime relies on.
        Cancellation and BaseExceptions still propagate.
        """

        async def absorbing() -> None:
            try:
                await fn(*args)
            except Exception:
                log.exception(
                    "detached task %s/%s failed; its error was absorbed",
                    self.name,
                    name,
                    extra={"event": "task_failed", "task": f"{self.name}/{name}"},
                )

        self.spawn(absorbing, name=name)


@asynccontextmanager
async def open_owner(name: str) -> AsyncIterator[TaskOwner]:
    """A `TaskOwner` for the duration of the block; leaving it waits for the owned tasks."""
    async with trio.open_nursery() as nursery:
        yield TaskOwner(name, nursery)


class ChildTasks:
    """A job attempt's children: `spawn(fn, *args)` runs `fn` concurrently inside the attempt."""

    def __init__(self, owner: TaskOwner) -> None:
        self._owner = owner

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None) -> None:
        self._owner.spawn(fn, *args, name=name or str(getattr(fn, "__name__", "child")))


@asynccontextmanager
async def open_children(job_name: str) -> AsyncIterator[ChildTasks]:
    """The child nursery of one attempt: its tasks end with the attempt's scope."""
    async with open_owner(job_name) as owner:
        yield ChildTasks(owner)
