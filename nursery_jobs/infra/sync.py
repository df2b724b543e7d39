"""A reusable one-slot hand-off for the executor's workers.

A worker that waits for its next job used to build a fresh `trio.Event` (an event, a parking lot,
an ordered dict) per job; a `Mailbox` lives as long as its worker and is refilled for every job.
It is here because it parks on `trio.lowlevel.ParkingLot`, which only infra may touch.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import trio

__all__ = ["Mailbox"]

T = TypeVar("T")


class Mailbox(Generic[T]):
    """One consumer `get`s; producers `put` at most one item before the consumer takes it."""

    __slots__ = ("_lot", "_item", "_full")

    def __init__(self) -> None:
        self._lot = trio.lowlevel.ParkingLot()
        self._item: T | None = None
        self._full = False

    def put(self, item: T | None) -> None:
        self._item = item
        self._full = True
        self._lot.unpark()

    def take_nowait(self) -> T | None:
        """The item if one is waiting (and empty the box), else None."""
        item, self._item, self._full = self._item, None, False
        return item

    async def get(self) -> T | None:
        """The next item; parks until one is put. A checkpoint either way."""
        if self._full:
            await trio.lowlevel.checkpoint()
        else:
            await self._lot.park()
        item, self._item, self._full = self._item, None, False
        return item
