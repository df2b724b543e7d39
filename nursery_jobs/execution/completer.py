"""The completer: writes attempt outcomes to the backend in batches.

Workers never write outcomes themselves: they `push` them here, which costs a list append and
an event. The completer wakes as soon as anything is pending and writes *everything* pending in
one `finish_many` call, so a busy queue gets large batches (one round trip for many outcomes) and
an idle queue gets its single outcome written at once -- there is no fixed flush tick. A request
that waits for a job's receipt waits for its outcome to be written, so a tick would add up to its
whole period to every such request (River's batch completer records outcomes every 250 ms, and
that cannot be configured).

Backpressure. An outcome not yet written is a job still `running` in the database, so the
completer tells each queue when its outcomes are written (`push(outcome, owner)`, then
`owner.outcomes_written(n)`), and a queue stops claiming while more than `max(max_workers, 32)`
of its outcomes wait to be written (`QueueExecutor.outcome_slack`). A slow write can then never grow the number
of running rows, and with it the cost of the next write: on an analyzed table at 32 workers,
finished-but-unwritten jobs once held no worker slot, the fetcher kept claiming, and each batch
came slower and larger until shutdown could not flush it. A batch is also capped at
`MAX_BATCH` outcomes, so no single statement grows without bound.

Shutdown stops it last: after running jobs are finished or cancelled, `stop()` lets it drain
what is pending and return. `drain_inline` writes anything left over if the completer task itself
was cancelled from outside.

The completer never fails on content. A batch the backend refuses for anything but being
unavailable (`BackendUnavailable` stops the runtime, as before) is split in halves until the
outcomes that cannot be written are found; every other outcome of the batch is written. An
outcome that still cannot be written is written again with its error text replaced by a note
that says what happened, then, if even that fails, without any error text; if that fails too,
the backend itself is failing and its error stops the runtime. Writes are fenced by the attempt
number, so writing an outcome twice is harmless.
"""

from __future__ import annotations

import logging
from typing import Protocol, Sequence

import trio

from ..backends import Backend, Outcome, OutcomeKind
from ..errors import BackendUnavailable
from ..infra.sync import Wakeup
from ..jobs import JobError, clean_text, describe_exception

__all__ = ["Completer"]

log = logging.getLogger("nursery_jobs")

MAX_BATCH = 1_000
"""Outcomes written by one `finish_many` call at most."""


class OutcomeOwner(Protocol):
    """Who is told when its outcomes are written (a queue's executor)."""

    def outcomes_written(self, n: int) -> None: ...


class Completer:
    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._pending: list[Outcome] = []
        self._owners: list[OutcomeOwner | None] = []
        """Parallel to `_pending`: whom to tell when each outcome is written."""
        self._event = Wakeup()
        self._stopping = False
        self._writing: Sequence[Outcome] = ()
        self._scope = trio.CancelScope()
        self.finished = trio.Event()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def unwritten(self) -> list[tuple[int, int]]:
        """(job id, attempt) of every outcome not written yet (pending or being written): rows
        still `running` in the backend, which the heartbeats keep renewing."""
        return [(o.job_id, o.attempt) for o in (*self._writing, *self._pending)]

    def push(self, outcome: Outcome, owner: OutcomeOwner | None = None) -> None:
        self._pending.append(outcome)
        self._owners.append(owner)
        self._event.set()

    def _take(self) -> tuple[list[Outcome], list[OutcomeOwner | None]]:
        if len(self._pending) <= MAX_BATCH:
            batch, self._pending = self._pending, []
            owners, self._owners = self._owners, []
        else:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            owners, self._owners = self._owners[:MAX_BATCH], self._owners[MAX_BATCH:]
        return batch, owners

    @staticmethod
    def _written(owners: list[OutcomeOwner | None]) -> None:
        if not owners:
            return
        first = owners[0]
        if owners.count(first) == len(owners):  # one queue's batch, the common case (counted in C, not a generator)
            if first is not None:
                first.outcomes_written(len(owners))
            return
        counts: dict[OutcomeOwner, int] = {}
        for owner in owners:
            if owner is not None:
                counts[owner] = counts.get(owner, 0) + 1
        for owner, n in counts.items():
            owner.outcomes_written(n)

    def stop(self) -> None:
        self._stopping = True
        self._event.set()

    async def _write(self, batch: Sequence[Outcome]) -> None:
        try:
            await self._backend.finish_many(batch)
        except BackendUnavailable:
            raise
        except Exception as exc:
            log.warning(
                "completer: the backend refused a batch of %d outcomes (%s); writing them in smaller "
                "batches to find the ones it cannot store",
                len(batch),
                clean_text(describe_exception(exc), 500),
                extra={"event": "outcomes_refused", "job_ids": [o.job_id for o in batch], "backend": self._backend.url},
            )
            await self._isolate(batch, exc)

    async def _isolate(self, batch: Sequence[Outcome], exc: Exception) -> None:
        if len(batch) == 1:
            await self._replace(batch[0], exc)
            return
        mid = len(batch) // 2
        for half in (batch[:mid], batch[mid:]):
            try:
                await self._backend.finish_many(half)
            except BackendUnavailable:
                raise
            except Exception as again:
                await self._isolate(half, again)

    async def _replace(self, out: Outcome, exc: Exception) -> None:
        """Write `out` without the content the backend refused: first with its error text
        replaced by a note naming the refusal, then with no error text at all."""
        at = out.error.at if out.error is not None else self._backend.now()
        note = clean_text(
            f"nursery_jobs: the backend could not store this attempt's outcome "
            f"({describe_exception(exc)}); its error text was replaced by this note",
            1_000,
        ).encode("ascii", "backslashreplace").decode("ascii")
        replaced = out._replace(error=JobError(out.attempt, at, note))
        bare = out._replace(error=None) if out.kind is not OutcomeKind.COMPLETED else replaced
        for attempt in (replaced, bare):
            try:
                await self._backend.finish_many([attempt])
            except BackendUnavailable:
                raise
            except Exception as last:
                exc = last
                continue
            log.error(
                "completer: job %d's outcome (%s) could not be stored as it was and was written with a note "
                "instead: %s",
                out.job_id,
                out.kind.value,
                note,
                extra={"event": "outcome_replaced", "job_id": out.job_id, "outcome": out.kind.value, "error": note},
            )
            return
        # Not even an outcome with no text could be written: that is the backend failing, not
        # content, and it stops the runtime like any backend failure.
        log.error(
            "completer: job %d's outcome (%s) could not be written even without any error text (%s)",
            out.job_id,
            out.kind.value,
            clean_text(describe_exception(exc), 500),
            extra={"event": "outcome_unwritable", "job_id": out.job_id, "outcome": out.kind.value, "backend": self._backend.url},
        )
        raise exc

    def abandon(self) -> list[int]:
        """Shutdown's last resort when the backend stopped answering: stop the completer where
        it is and return the job ids whose outcomes were not written (they stay running in a
        durable backend and are rescued after `rescue_after`)."""
        self._stopping = True
        self._scope.cancel()
        unwritten = [o.job_id for o in (*self._writing, *self._pending)]
        self._pending = []
        self._owners = []
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
                    batch, owners = self._take()
                    self._writing = batch
                    await self._write(batch)
                    self._writing = ()
                    self._written(owners)
        finally:
            self.finished.set()

    async def drain_inline(self) -> None:
        while self._pending:
            batch, owners = self._take()
            self._writing = batch
            await self._write(batch)
            self._writing = ()
            self._written(owners)
