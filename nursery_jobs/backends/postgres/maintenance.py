"""Maintenance: the rescue of lost workers' jobs, the repair of parked keys, retention.

A worker that stops heartbeating (its process killed, its host gone) leaves its jobs `running`.
The rescuer's pass (`rescue`) takes every running row whose heartbeat is older than the bound in
one statement, and ends each attempt as the job rules' `after_rescue` says (restated in SQL there:
cancelled if requested, discarded with no attempt left, else available now), freeing the keys'
slots it held. The other processes hear of it by NOTIFY before the repair runs, so a repair that
fails cannot lose the wake-ups. The repair that follows brings back the parked jobs of any
key left with a free slot -- normally none: only something but this runtime writing the rows can
leave one. Retention (`delete_finished`) deletes the oldest final rows per state, and rate keys
idle longer than their window, in bounded batches by primary key.
"""

from __future__ import annotations

import logging
from typing import Mapping

from ...errors import BackendError, BackendUnavailable
from ...jobs import JobState
from ..protocol import BackendEvent, JobFinalized, JobsAvailable
from .connection import PostgresBase, execute, fetch_all, fetch_one

__all__ = ["Maintenance"]

log = logging.getLogger("nursery_jobs")

_NOTIFY_IDS_PER_PAYLOAD = 400  # NOTIFY payloads are limited to 8000 bytes


class Maintenance(PostgresBase):
    """`rescue` and `delete_finished`."""

    async def _notify(self, ids: list[int], queues: list[str], kind: str) -> None:
        channels: list[str] = []
        payloads: list[str] = []
        for i in range(0, len(ids), _NOTIFY_IDS_PER_PAYLOAD):
            channels.append(self._events_channel)
            payloads.append(f"{kind}:" + ",".join(map(str, ids[i : i + _NOTIFY_IDS_PER_PAYLOAD])))
        for queue in queues:
            channels.append(self._jobs_channel)
            payloads.append(queue)
        await self._run(
            lambda c: execute(c, "SELECT pg_notify(ch, p) FROM unnest(%s::text[], %s::text[]) AS t(ch, p)", (channels, payloads))
        )

    async def rescue(self, stale_before: float) -> list[int]:
        now = self.now()
        q = self._q["rescue"]
        rows = await self._run(lambda c: fetch_all(c, q, {"before": stale_before, "now": now}))
        events: list[BackendEvent] = []
        finalized: list[int] = []
        queues: set[str] = set()
        for job_id, queue, state, message, key in rows:
            if job_id is None or state == "available":  # (no id: a queue a freed slot let a job back into)
                queues.add(queue)
                events.append(JobsAvailable(queue))
            else:
                finalized.append(job_id)
                events.append(JobFinalized(job_id, JobState(state), message))
                if key is not None:
                    queues.add(queue)  # its slot is free
                    events.append(JobsAvailable(queue))
        # The rescued jobs' wake-ups go out before the repair, so a repair that fails cannot
        # lose them.
        if rows:
            await self._notify(finalized, sorted(queues), "f")
        self._emit(list(dict.fromkeys(events)))
        # The repair of keys left parked with a free slot (migrations 0011, 0012): nothing to do
        # unless something but this runtime wrote the rows. A repair that fails (a statement
        # timeout on a huge parked backlog) is logged and left to the next pass; the rescue
        # stands.
        try:
            repaired = sorted({queue for (queue,) in await self._run(lambda c: fetch_all(c, self._q["repair_parked"]))})
        except (BackendError, BackendUnavailable) as exc:
            log.warning(
                "PostgreSQL repair of parked concurrency keys failed (%s); the next rescue pass tries again",
                exc,
                extra={"event": "repair_failed", "backend": self.url},
            )
            repaired = []
        if repaired:
            await self._notify([], repaired, "f")
            self._emit([JobsAvailable(queue) for queue in repaired])
        return sorted(r[0] for r in rows if r[0] is not None)

    async def delete_finished(self, before: Mapping[JobState, float], limit: int) -> int:
        q = self._q["delete_finished"]
        states = [JobState(s).value for s in before]
        cutoffs = list(before.values())
        params = {"states": states, "befores": cutoffs, "limit": limit, "now": self.now()}
        row = await self._run(lambda c: fetch_one(c, q, params))
        return int(row[0]) if row else 0
