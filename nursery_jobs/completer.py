"""The completer: writes attempt outcomes to the backend in batches.

Workers never write outcomes themselves: they `push` them here, which costs a list append and
an event. The completer wakes as soon as anything is pending and writes *everything* pending in
one `finish_many` call, so a busy queue gets large batches (one round trip for many outcomes) and
an idle queue gets its single outcome written at once -- there is no fixed flush tick. A request
that waits for a job's receipt waits for its outcome to be written, so a tick would add up to its
whole period to every such request (River's batch completer records outcomes every 250 ms, and
that cannot be configured).

Shutdown stops it last: after running jobs are finished or cancelled, `stop()` lets it drain
what is pending and return. `drain_inline` writes anything left over if the completer task itself
was cancelled from outside.
"""

from __future__ import annotations

from typing import Sequence

import trio

from ._faults import Faults
from .backends import Backend, Outcome
from .infra.sync import Wakeup

__all__ = ["Completer"]


class Completer:
    def __init__(self, backend: Backend, faults: Faults) -> None:
        self._backend = backend
        self._faults = faults
        self._pending: list[Outcome] = []
        self._event = Wakeup()
        self._stopping = False
        self._writing: Sequence[Outcome] = ()
        self._scope = trio.CancelScope()
        self.finished = trio.Event()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def push(self, outcome: Outcome) -> None:
        self._pending.append(outcome)
        self._event.set()

    def stop(self) -> None:
        self._stopping = True
        self._event.set()

    async def _write(self, batch: Sequence[Outcome]) -> None:
        if self._faults.completer_drops_batch and len(batch) > 1:
            return
        await self._backend.finish_many(batch)

    def abandon(self) -> list[int]:
        """Shutdown's last resort when the backend stopped answering: stop the completer where
        it is and return the job ids whose outcomes were not written (they stay running in a
        durable backend and are rescued after `rescue_after`)."""
        self._stopping = True
        self._scope.cancel()
        unwritten = [o.job_id for o in (*self._writing, *self._pending)]
        self._pending = []
        return unwritten

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            with self._scope:
                while True:
                    if not self._pending:
                        if self._stopping:
                            return
                        await self._event.wait()
                        continue
                    batch, self._pending = self._pending, []
                    self._writing = batch
                    await self._write(batch)
                    self._writing = ()
        finally:
            self.finished.set()

    async def drain_inline(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            self._writing = batch
            await self._write(batch)
            self._writing = ()
