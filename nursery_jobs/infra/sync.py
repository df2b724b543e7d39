"""Reusable hand-offs for the executor and the completer, built on Trio's lowest-level wait.

A worker waits for its next job once per job, and the fetcher and the completer wait for work
once per batch. Building a fresh `trio.Event` for each wait (an event, a set of waiters, a
KI-protected `set`) is a measurable share of a no-op job, so each waiter owns one long-lived
object instead: `Mailbox` carries one item to one consumer, `Wakeup` is a reusable flag one task
sleeps on. Both park the waiting task with `wait_task_rescheduled` and wake it with `reschedule`
-- the primitives `trio.Event` itself is built from -- which is why they live in infra, the only
package allowed to touch `trio.lowlevel`'s scheduling calls.

Both are cancel-safe: a waiter cancelled while parked unregisters itself (its abort function),
and an item put after that stays in the mailbox for the owner to take back (`take_nowait`).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import outcome
import trio

__all__ = ["Mailbox", "Wakeup"]

T = TypeVar("T")


class Mailbox(Generic[T]):
    """One consumer `get`s; a producer `put`s at most one item before the consumer takes it."""

    __slots__ = ("_task", "_item", "_full", "last")

    def __init__(self) -> None:
        self._task: trio.lowlevel.Task | None = None
        self._item: T | None = None
        self._full = False
        self.last: T | None = None
        """The item put most recently, kept after the consumer took it: a worker's box tells
        the blocked-loop watchdog which job the worker ran last, even once its attempt ended."""

    def put(self, item: T | None) -> None:
        self.last = item
        task = self._task
        if task is not None:
            self._task = None
            trio.lowlevel.reschedule(task, outcome.Value(item))
        else:
            self._item = item
            self._full = True

    def take_nowait(self) -> T | None:
        """The item if one is waiting (and empty the box), else None."""
        item, self._item, self._full = self._item, None, False
        return item

    async def get(self) -> T | None:
        """The next item; parks until one is put. A checkpoint either way."""
        if self._full:
            await trio.lowlevel.checkpoint()  # before taking it: a cancellation leaves it here
            return self.take_nowait()
        self._task = trio.lowlevel.current_task()

        def abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
            self._task = None
            return trio.lowlevel.Abort.SUCCEEDED

        item: T | None = await trio.lowlevel.wait_task_rescheduled(abort)
        return item


class Wakeup:
    """A reusable flag for one waiting task: `set` wakes it (or leaves the flag up for its next
    `wait`); `wait` returns at once, after a checkpoint, if the flag is up, and lowers it."""

    __slots__ = ("_task", "_flag")

    def __init__(self) -> None:
        self._task: trio.lowlevel.Task | None = None
        self._flag = False

    def set(self) -> None:
        task = self._task
        if task is not None:
            self._task = None
            trio.lowlevel.reschedule(task)
        else:
            self._flag = True

    async def wait(self) -> None:
        if self._flag:
            self._flag = False
            await trio.lowlevel.checkpoint()
            return
        self._task = trio.lowlevel.current_task()

        def abort(_raise_cancel: Any) -> trio.lowlevel.Abort:
            self._task = None
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
