"""Storage behind one protocol: the protocol by capability (`protocol`), the backends by URL
scheme (`registry`), and the backends themselves: `memory` (the embedded default), `sqlite` (one
host, durable), `postgres` (many processes, many hosts). `rows` reads durable rows the runtime
did not write itself. What a row becomes is not decided here: every backend applies the job
rules of `nursery_jobs.rules`, which the executor reads too.
"""

from __future__ import annotations

from .protocol import (
    Backend,
    BackendEvent,
    Bounds,
    CacheEntry,
    CacheFlights,
    CacheStore,
    Caching,
    CancelRequested,
    ClaimedJob,
    ClaimResult,
    HeartbeatResult,
    InsertResult,
    JobFinalized,
    JobsAvailable,
    JobStore,
    Listener,
    NewJob,
    Notifier,
    Outbox,
    OutboxEvent,
    OutboxPublished,
    Outcome,
    OutcomeKind,
    LockStore,
    QueueCounts,
    ScheduleState,
    ScheduleStore,
    TransactionalEnqueue,
)
from .registry import open_backend, register

__all__ = [
    "Backend",
    "BackendEvent",
    "Bounds",
    "CacheEntry",
    "CacheFlights",
    "CacheStore",
    "Caching",
    "CancelRequested",
    "ClaimResult",
    "ClaimedJob",
    "HeartbeatResult",
    "InsertResult",
    "JobFinalized",
    "JobStore",
    "JobsAvailable",
    "Listener",
    "NewJob",
    "Notifier",
    "Outbox",
    "OutboxEvent",
    "OutboxPublished",
    "Outcome",
    "OutcomeKind",
    "LockStore",
    "QueueCounts",
    "ScheduleState",
    "ScheduleStore",
    "TransactionalEnqueue",
    "open_backend",
    "register",
]
