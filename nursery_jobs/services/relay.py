"""The outbox relay: events published in a transaction become their subscribers' jobs.

`nj.publish(conn, topic, payload)` writes an event row in the caller's transaction, so the event
exists exactly when the caller's own rows do. Every process runs a relay, with no leader: each
pass asks the backend (`Outbox.relay`) to claim at most `relay_batch` (200) rows of the topics
this app subscribes to, make their jobs with a `Router`, insert the jobs and delete the rows in
one short transaction. A 2,000-event import is ten such passes, never one long transaction, and
two relays claim disjoint rows (`FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite's one writer).

Why rows are claimed rather than read "after the last id relayed": ids are handed out when a
transaction inserts, not when it commits, so a cursor over them skips the event of a
transaction that commits after a later one's. A claimed row is deleted in the pass that made
its jobs; a pass cut anywhere rolls back and leaves every row for the next one.

The relay sleeps until a publish wakes it (in-process at once; from other processes by
PostgreSQL's NOTIFY) or `relay_interval` passes; it passes again at once while a pass comes
back full. It is the first service to stop at shutdown, before the queues stop claiming, so it
never inserts jobs that no worker of this process would claim; the rows it leaves stay for the
next start or another process.

A pass whose jobs do not fit a bounded queue (`max_length`) changes nothing: the backend
raises `QueueFull` naming the queue and the events stay in the outbox. The relay then passes
again at once with half as many rows (a queue with room for fewer jobs than a pass makes still
takes what fits), down to one; when even one event does not fit, the topics with a subscriber
on that queue are left out of the passes for `relay_interval`, so the other topics go on
relaying at once and the full queue's events are tried again a second later. The relay
never waits for room (it would hold every topic behind one queue, and the shutdown behind it).

Events of topics this app does not subscribe to are never claimed: several services may share
one database, each relaying its own topics. A topic's subscribers are the relaying app's: every
app that subscribes to a topic must declare the same subscribers for it (docs/outbox.md).
"""

from __future__ import annotations

import json
import logging
from typing import Callable, Mapping, Sequence

import trio

from ..app import EnqueueOptions, Subscription
from ..backends import Bounds, NewJob, Outbox, OutboxEvent
from ..errors import QueueFull
from ..infra.sync import Wakeup

__all__ = ["Relay", "Router"]

log = logging.getLogger("nursery_jobs")

_NO_OPTIONS = EnqueueOptions()


class Router:
    """The jobs of a batch of events, by the app's subscriptions (`Outbox.relay`'s `route`).

    Content never crashes the relay: a payload that is not JSON, a `filter` or `args` function
    that raises, args that do not fit the handler (`ArgsError`) each leave out that one job
    (every job of the event for an unreadable payload) with an error log naming the event,
    the topic, the kind and the reason; the event's other jobs are made and its row is deleted
    with them. Repeating the event would fail the same way: these are bugs to fix, not outages
    to wait out."""

    def __init__(self, subscriptions: Mapping[str, Sequence[Subscription]], now: Callable[[], float]) -> None:
        self._subs = {topic: tuple(subs) for topic, subs in subscriptions.items() if subs}
        self._now = now
        self.topics = sorted(self._subs)

    def topics_into(self, queue: str) -> set[str]:
        """The topics with a subscriber whose jobs go to `queue`."""
        return {topic for topic, subs in self._subs.items() if any(sub.kind.queue == queue for sub in subs)}

    def __call__(self, events: Sequence[OutboxEvent]) -> list[list[NewJob]]:
        now = self._now()
        out: list[list[NewJob]] = []
        for event in events:
            made: list[NewJob] = []
            out.append(made)
            for sub in self._subs.get(event.topic, ()):
                try:
                    payload = json.loads(event.payload_json)  # per subscriber: none sees another's changes
                    if sub.filter is not None and not sub.filter(payload):
                        continue
                    args = payload if sub.args is None else sub.args(payload)
                    made.append(sub.kind.new_job(args, _NO_OPTIONS, now))
                except Exception as exc:
                    log.error(
                        "outbox event %d (topic %r): no job of %s made: %s: %s",
                        event.id,
                        event.topic,
                        sub.kind.name,
                        type(exc).__name__,
                        exc,
                        extra={
                            "event": "outbox_job_dropped",
                            "outbox_event": event.id,
                            "topic": event.topic,
                            "kind": sub.kind.name,
                            "reason": f"{type(exc).__name__}: {exc}",
                        },
                    )
        return out


class Relay:
    name = "relay"

    def __init__(
        self, backend: Outbox, router: Router, *, batch: int, interval: float, bounds: Bounds | None = None
    ) -> None:
        self._backend = backend
        self._router = router
        self._bounds = dict(bounds) if bounds else None
        self._held: dict[str, float] = {}
        """Topics left out of the passes until a time (Trio's clock): they feed a full queue."""
        self._batch = batch
        self._interval = interval
        self._wakeup = Wakeup()
        self.passes = 0
        """Passes that claimed at least one row (for tests and benchmarks)."""

    def wake(self) -> None:
        """Events may be waiting: pass now (or right after the pass in progress)."""
        self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        topics, route, batch = self._router.topics, self._router, self._batch
        limit = batch
        while True:
            if self._held:
                active = self._active(topics)
                if not active:  # every topic feeds a full queue: wait for the first to be tried again
                    await trio.sleep(max(0.0, min(self._held.values()) - trio.current_time()))
                    continue
            else:
                active = topics
            try:
                if self._bounds:
                    claimed = await self._backend.relay(active, route, limit, self._bounds)
                else:
                    claimed = await self._backend.relay(active, route, limit)
            except QueueFull as full:
                if limit > 1:
                    limit //= 2  # what fits of the pass goes in at a smaller pass
                else:
                    self._hold(full, active)
                    limit = batch
                await trio.lowlevel.checkpoint()
                continue
            except Exception:
                log.exception(
                    "outbox relay pass failed (nothing of it was written); retrying in %g s",
                    self._interval,
                    extra={"event": "relay_failed"},
                )
                await trio.sleep(self._interval)
                continue
            if claimed:
                self.passes += 1
            if limit < batch:  # a bounded queue had less room than a whole pass: grow back
                limit = min(batch, limit * 2)
                if claimed:
                    await trio.lowlevel.checkpoint()
                    continue
            if claimed >= batch:
                await trio.lowlevel.checkpoint()  # a backend whose calls never yield (memory)
                continue
            with trio.move_on_after(self._interval):
                await self._wakeup.wait()

    def _active(self, topics: Sequence[str]) -> list[str]:
        now = trio.current_time()
        for topic, until in list(self._held.items()):
            if until <= now:
                del self._held[topic]
        return [t for t in topics if t not in self._held]

    def _hold(self, full: QueueFull, active: Sequence[str]) -> None:
        held = self._router.topics_into(full.queue) & set(active) or set(active)
        until = trio.current_time() + self._interval
        for topic in held:
            self._held[topic] = until
        log.warning(
            "outbox relay: queue %r is full (max_length %d); the events of %s stay in the outbox and are "
            "relayed again in %g s, the other topics go on",
            full.queue,
            full.max_length,
            ", ".join(sorted(held)),
            self._interval,
            extra={"event": "relay_queue_full", "queue": full.queue, "topics": sorted(held), "retry_in": self._interval},
        )
