"""Attempts ended: outcomes in batches, cancel requests, heartbeats.

Every write is conditional on the attempt the worker claimed (the fencing token), so a late
worker can never overwrite a job that moved on. An outcome batch is one read of its rows and one
`executemany` per kind of write, whatever its size; what each outcome makes of a row is the job
rules' (`rules.after_outcome`), applied row by row. A job leaving `running` frees its key's
place: the key's best parked job comes back in the same transaction (`parking.unpark`).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Sequence

from ...errors import JobNotFound
from ...jobs import MAX_ERRORS_KEPT, JobState
from ...rules import CancelAction, after_outcome, on_cancel, unparks
from ..protocol import BackendEvent, CancelRequested, HeartbeatResult, JobFinalized, JobsAvailable, Outcome
from ..rows import STATES, Damage, error_entry, read_errors
from .connection import IDS_PER_STATEMENT
from .parking import HAS_PARKED, unpark
from .repair import Repairs

__all__ = ["Outcomes"]


class Outcomes(Repairs):
    """`finish_many`, `cancel`, `heartbeat`."""

    async def finish_many(self, outcomes: Sequence[Outcome]) -> None:
        now = self.now()

        def body(conn: sqlite3.Connection) -> list[BackendEvent]:
            # One read for the whole batch and one executemany per kind of write: a batch of
            # outcomes costs a few statements, not two per job.
            current: dict[int, tuple[Any, ...]] = {}
            ids = [out.job_id for out in outcomes]
            for i in range(0, len(ids), IDS_PER_STATEMENT):
                chunk = ids[i : i + IDS_PER_STATEMENT]
                for row in conn.execute(
                    f"SELECT id, queue, state, attempt, cancel_requested, errors, concurrency_key, {HAS_PARKED}"
                    f" FROM nj_jobs WHERE id IN ({','.join('?' * len(chunk))})",
                    chunk,
                ):
                    current[row[0]] = row[1:]
            events: list[BackendEvent] = []
            finals: list[tuple[Any, ...]] = []
            again: list[tuple[Any, ...]] = []
            freed: list[Any] = []
            for out in outcomes:
                row = current.get(out.job_id)
                if row is None:
                    continue
                queue, state, attempt, cancel_requested, errors_json, key, has_parked = row
                if state != "running" or attempt != out.attempt:
                    continue  # stale: the job moved on without this worker
                current[out.job_id] = (queue, "done", *row[2:])  # once per batch
                errors, _ = read_errors(errors_json)
                if out.error is not None:
                    e = out.error
                    errors.append(error_entry(e.attempt, e.at, e.message, e.traceback))
                    del errors[:-MAX_ERRORS_KEPT]
                nxt = after_outcome(
                    out.kind,
                    cancel_requested=bool(cancel_requested),
                    has_error=out.error is not None,
                    run_at=out.run_at,
                    now=now,
                )
                errors_text = json.dumps(errors) if errors else None
                if has_parked:  # read before this batch's writes, none of which parks a job
                    freed += [key] * unparks(JobState.RUNNING, nxt.state)
                if nxt.state.final:
                    finals.append((nxt.state.value, now, errors_text, nxt.failed, out.job_id))
                    events.append(JobFinalized(out.job_id, nxt.state, errors[-1]["message"] if errors else None))
                    if key is not None:
                        events.append(JobsAvailable(queue))  # its slot is free
                    continue
                assert nxt.run_at is not None
                again.append(
                    (nxt.state.value, -nxt.attempt_delta, nxt.run_at, errors_text, nxt.failed, nxt.interrupted, out.job_id)
                )
                events.append(JobsAvailable(queue, None if nxt.state is JobState.AVAILABLE else nxt.run_at))
                if key is not None and nxt.state is not JobState.AVAILABLE:
                    events.append(JobsAvailable(queue))  # its slot is free
            if finals:
                conn.executemany(
                    "UPDATE nj_jobs SET state = ?, finalized_at = ?, errors = ?, failed_attempts = failed_attempts + ?,"
                    " heartbeat_at = NULL, parked = 0 WHERE id = ?",
                    finals,
                )
            if again:
                conn.executemany(
                    "UPDATE nj_jobs SET state = ?, attempt = attempt - ?, run_at = ?, errors = ?,"
                    " failed_attempts = failed_attempts + ?, interrupted = interrupted + ?, heartbeat_at = NULL,"
                    " parked = 0 WHERE id = ?",
                    again,
                )
            events += unpark(conn, freed)
            return events

        events: list[BackendEvent] = await self._call(self._tx, body)
        self._emit(list(dict.fromkeys(events)))  # a batch's rows share their queues' wake-ups

    async def cancel(self, job_id: int) -> JobState:
        now = self.now()

        def body(conn: sqlite3.Connection) -> tuple[JobState, list[BackendEvent]]:
            row = conn.execute(
                "SELECT state, errors, concurrency_key, parked, queue FROM nj_jobs WHERE id = ?", (job_id,)
            ).fetchone()
            if row is None:
                raise JobNotFound(f"no job with id {job_id} in {self.url}")
            state = STATES.get(row[0]) if isinstance(row[0], str) else None
            if state is None:
                return JobState.DISCARDED, self._set_aside(conn, job_id, [Damage("state", row[0], "a job state")], now)
            action = on_cancel(state)
            if action is CancelAction.NONE:
                return state, []
            if action is CancelAction.REQUEST:
                cur = conn.execute("UPDATE nj_jobs SET cancel_requested = 1 WHERE id = ? AND cancel_requested = 0", (job_id,))
                return state, [CancelRequested(job_id)] if cur.rowcount else []
            conn.execute("UPDATE nj_jobs SET state = 'cancelled', finalized_at = ?, parked = 0 WHERE id = ?", (now, job_id))
            errors, _ = read_errors(row[1])
            events: list[BackendEvent] = [JobFinalized(job_id, JobState.CANCELLED, errors[-1]["message"] if errors else None)]
            if row[2] is not None:  # its key's next job may take its place
                events += unpark(conn, [row[2]] * unparks(state, JobState.CANCELLED, parked=bool(row[3])))
            return JobState.CANCELLED, events

        state, events = await self._call(self._tx, body)
        self._emit(events)
        result: JobState = state
        return result

    async def heartbeat(self, running: Sequence[tuple[int, int]]) -> HeartbeatResult:
        now = self.now()

        def body(conn: sqlite3.Connection) -> HeartbeatResult:
            result = HeartbeatResult([], [])
            for job_id, attempt in running:
                row = conn.execute(
                    "UPDATE nj_jobs SET heartbeat_at = ? WHERE id = ? AND state = 'running' AND attempt = ?"
                    " RETURNING cancel_requested",
                    (now, job_id, attempt),
                ).fetchone()
                if row is None:
                    result.lost.append((job_id, attempt))
                elif row[0]:
                    result.cancel.append(job_id)
            return result

        if not running:
            return HeartbeatResult([], [])
        result: HeartbeatResult = await self._call(self._tx, body)
        return result
