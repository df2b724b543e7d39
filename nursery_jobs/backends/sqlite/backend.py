"""`SqliteBackend`: the concerns put together, its life, and its wake-ups.

The class is its concerns' classes combined (each a module of this package, each a subclass of
`connection.SqliteBase`, which holds the state they share). What is left here is what belongs to
the whole: closing both connections, and the wake-ups.

Wake-ups. In one process every event is delivered in-process, at once. Between the processes of
one host that share the file, `infra.wake` carries them: each process's `serve` binds a datagram
socket in a registry directory beside the file, and after each commit that made jobs available,
finalized jobs or requested a cancellation, the backend sends a datagram to the other processes'
sockets (`_emit`). A receiver turns it into the hints a PostgreSQL notification gives --
`JobsAvailable(queue)`, `JobFinalized(id, None)`, `CancelRequested(id, verified=False)` -- and
re-reads the database; a process that works no queue hears finalizations only. The poll
(`poll_interval`, 1 s) stays as the fallback for a datagram lost to a full socket buffer, and for
processes on other hosts, which SQLite does not support well anyway. ``?wake=off`` (``wake=False``)
turns the sockets off: poll only.
"""

from __future__ import annotations

import trio

from ...infra.wake import Wake
from ..protocol import BackendEvent, CancelRequested, JobFinalized, JobsAvailable, OutboxPublished
from .cache import SqliteCacheStore
from .claim import Claims
from .connection import current_transaction
from .coordination import Coordination
from .maintenance import Maintenance
from .outcomes import Outcomes
from .reads import Reads

__all__ = ["SqliteBackend"]


class SqliteBackend(Coordination, Claims, Outcomes, Maintenance, Reads):
    """Jobs in one SQLite file, shared safely by every process that opens it."""

    poll_interval: float | None = 1.0
    never_yields = False

    def _on_wake(self, wake: Wake) -> None:
        """Another process's datagram: hints only, each one leads to a re-read of the database."""
        events: list[BackendEvent] = [JobsAvailable(q) for q in wake.queues]
        events += [JobFinalized(i, None) for i in wake.finalized]
        events += [CancelRequested(i, False) for i in wake.cancel]
        if wake.outbox:
            events.append(OutboxPublished())
        self._deliver(events)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self._wake is None:
            task_status.started()  # every wake-up is delivered in-process; nothing to run
            await trio.sleep_forever()
        # A process with no queue workers (a web process that only enqueues and waits) has no
        # fetcher to wake and no job to cancel: it hears finalizations only.
        await self._wake.serve(self._on_wake, works=self._workers != 0, task_status=task_status)

    def check_budget(self, workers: int) -> None:
        self._workers = workers if self._workers is None else max(self._workers, workers)

    def cache_store(self) -> SqliteCacheStore:
        if self._cache is None:
            self._cache = SqliteCacheStore(
                self.path,
                clock=self._clock,
                limiter=self._limiter,
                busy_timeout=self._busy_timeout,
                outage_timeout=self.outage_timeout,
                blocking=self._blocking_io,
                backend_open=lambda: self._conn is not None,
                in_transaction=lambda: current_transaction.get() is self,
            )
        return self._cache

    async def close(self) -> None:
        if self._wake is not None:
            self._wake.close()
        if self._cache is not None:
            await self._cache.close()
        conn, self._conn = self._conn, None
        if conn is not None:
            async with self._lock:
                await self._io(conn.close)
        tx_conn, self._tx_conn = self._tx_conn, None
        if tx_conn is not None:
            async with self._tx_lock:
                await self._tx_io(tx_conn.close)
