"""Maintenance: the rescue of lost workers' jobs, and retention.

A worker that stops heartbeating leaves its jobs `running`. The rescuer's pass (`rescue`) ends
each stale attempt as the job rules' `after_rescue` says (cancelled if requested, discarded with
no attempt left, else available now), frees the keys' places it held, and repairs any key left
with parked jobs and a free slot (`parking.repair_parked`). A running row with no readable
heartbeat is stale too, or it would run never. Retention (`delete_finished`) deletes the oldest
final rows per state, and rate keys idle longer than their window, in bounded batches.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Mapping

from ...jobs import MAX_ERRORS_KEPT, JobState
from ...rules import after_rescue, rate_idle, unparks
from ..protocol import BackendEvent, JobFinalized, JobsAvailable
from ..rows import Damage, error_entry, read_errors, rescue_message
from .parking import repair_parked, unpark
from .rates import is_number
from .repair import Repairs

__all__ = ["Maintenance"]


def _rate_idle(last: Any, per: Any, now: float) -> bool:
    """`rules.rate_idle` of a stored rate record; one whose times cannot be read limits nothing
    either (it reads as no starts), so it is idle too."""
    return not (is_number(last) and is_number(per)) or rate_idle(float(last), float(per), now)


class Maintenance(Repairs):
    """`rescue` and `delete_finished`."""

    async def rescue(self, stale_before: float) -> list[int]:
        now = self.now()

        def body(conn: sqlite3.Connection) -> tuple[list[int], list[BackendEvent]]:
            # A running row with no readable heartbeat (NULL, or text written by hand) is stale
            # too: otherwise it would stay running for ever.
            rows = conn.execute(
                "SELECT id, queue, attempt, max_attempts, heartbeat_at, errors, cancel_requested, concurrency_key FROM nj_jobs"
                " WHERE state = 'running' AND (heartbeat_at < ? OR heartbeat_at IS NULL"
                "  OR typeof(heartbeat_at) NOT IN ('integer', 'real')) ORDER BY id",
                (stale_before,),
            ).fetchall()
            events: list[BackendEvent] = []
            freed: list[Any] = []
            for job_id, queue, attempt, max_attempts, beat, errors_json, cancel_requested, key in rows:
                if not (isinstance(attempt, int) and isinstance(max_attempts, int) and isinstance(queue, str)):
                    damage = [
                        Damage(column, value, expected)
                        for column, value, expected, ok in (
                            ("queue", queue, "text", isinstance(queue, str)),
                            ("attempt", attempt, "an integer", isinstance(attempt, int)),
                            ("max_attempts", max_attempts, "an integer", isinstance(max_attempts, int)),
                        )
                        if not ok
                    ]
                    events += self._set_aside(conn, job_id, damage, now)
                    continue
                message = rescue_message(beat)
                errors, _ = read_errors(errors_json)
                errors.append(error_entry(attempt, now, message))
                del errors[:-MAX_ERRORS_KEPT]
                nxt = after_rescue(
                    attempt=attempt, max_attempts=max_attempts, cancel_requested=bool(cancel_requested), now=now
                )
                if key is not None:
                    freed += [key] * unparks(JobState.RUNNING, nxt.state)
                if nxt.state.final:
                    conn.execute(
                        "UPDATE nj_jobs SET state = ?, finalized_at = ?, errors = ?, failed_attempts = failed_attempts + ?,"
                        " heartbeat_at = NULL, parked = 0 WHERE id = ?",
                        (nxt.state.value, now, json.dumps(errors), nxt.failed, job_id),
                    )
                    events.append(JobFinalized(job_id, nxt.state, message))
                    if key is not None:
                        events.append(JobsAvailable(queue))  # its slot is free
                else:
                    conn.execute(
                        "UPDATE nj_jobs SET state = ?, run_at = ?, errors = ?,"
                        " failed_attempts = failed_attempts + ?, heartbeat_at = NULL, parked = 0 WHERE id = ?",
                        (nxt.state.value, nxt.run_at, json.dumps(errors), nxt.failed, job_id),
                    )
                    events.append(JobsAvailable(queue))
            events += unpark(conn, freed)
            events += [JobsAvailable(q) for q in repair_parked(conn, now)]
            return [r[0] for r in rows], events

        rescued, events = await self._call(self._tx, body)
        self._emit(events)
        result: list[int] = rescued
        return result

    async def delete_finished(self, before: Mapping[JobState, float], limit: int) -> int:
        now = self.now()

        def body(conn: sqlite3.Connection) -> int:
            # Rate keys idle longer than their window limit nothing: the rule decides, called by
            # SQLite row by row, so the scan stops at `limit` as a statement's would.
            conn.create_function("nj_rate_idle", 3, _rate_idle, deterministic=True)
            conn.execute(
                "DELETE FROM nj_rate WHERE key IN (SELECT key FROM nj_rate WHERE nj_rate_idle(last, per, ?) LIMIT ?)",
                (now, limit),
            )
            deleted = 0
            for state, cutoff in sorted(before.items()):
                cur = conn.execute(
                    "DELETE FROM nj_jobs WHERE id IN (SELECT id FROM nj_jobs WHERE state = ? AND finalized_at < ?"
                    " ORDER BY finalized_at LIMIT ?)",
                    (JobState(state).value, cutoff, limit - deleted),
                )
                deleted += cur.rowcount
                if deleted >= limit:
                    break
            return deleted

        result: int = await self._call(self._tx, body)
        return result
