"""Rows the runtime cannot read: set aside, or repaired.

A file may be written by something else (a hand edit, another tool), and no content of a row may
crash a worker. A row whose columns the runtime cannot read (`backends.rows` says which) is set
aside: discarded, its unreadable columns reset so that it can be read from then on, an error entry
naming what was found, and its key's place freed as any job leaving `running` frees it. A row
whose error list alone cannot be read keeps its state, the list replaced by a note. Each is done
once, in the transaction that found it, and logged.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from typing import Any

from ...jobs import MAX_ERRORS_KEPT, JobState
from ...rules import unparks
from ..protocol import BackendEvent, JobFinalized
from ..rows import SET_ASIDE_COLUMNS, STATES, Damage, error_entry, read_errors, set_aside_message
from .connection import SqliteBase
from .parking import unpark

__all__ = ["Repairs"]

log = logging.getLogger("nursery_jobs")

_FINAL = ("completed", "discarded", "cancelled")


class Repairs(SqliteBase):
    """`_set_aside` (in the caller's transaction) and `_repair` (one of its own)."""

    def _set_aside(self, conn: sqlite3.Connection, job_id: int, damage: list[Damage], now: float) -> list[BackendEvent]:
        """Discard a row the runtime cannot read, in the caller's transaction: its unreadable
        columns are reset so that it can be read from now on, and an error names what was found
        (see `backends.rows`). A keyed row that held a slot (one the claim had just started) brings
        back its key's best parked job (`rules.unparks`), as any job leaving `running` does.
        Returns its JobFinalized, then the wake-up of each queue a job came back to."""
        found = conn.execute("SELECT errors, state, concurrency_key, parked FROM nj_jobs WHERE id = ?", (job_id,)).fetchone()
        entries, _ = read_errors(found[0] if found else None)
        message = set_aside_message(damage)
        entries = [*entries, error_entry(0, now, message)][-MAX_ERRORS_KEPT:]
        conn.execute(
            "UPDATE nj_jobs SET state = 'discarded', finalized_at = ?1, heartbeat_at = NULL, errors = ?2,"
            " kind = CAST(kind AS TEXT), queue = CAST(queue AS TEXT),"
            " attempt = CASE WHEN typeof(attempt) = 'integer' THEN attempt ELSE 0 END,"
            " max_attempts = CASE WHEN typeof(max_attempts) = 'integer' THEN max_attempts ELSE 1 END,"
            " priority = CASE WHEN typeof(priority) = 'integer' THEN priority ELSE 0 END,"
            " run_at = CASE WHEN typeof(run_at) IN ('integer', 'real') THEN run_at ELSE ?1 END,"
            " created_at = CASE WHEN typeof(created_at) IN ('integer', 'real') THEN created_at ELSE ?1 END,"
            " failed_attempts = CASE WHEN typeof(failed_attempts) = 'integer' THEN failed_attempts ELSE 0 END,"
            " interrupted = CASE WHEN typeof(interrupted) = 'integer' THEN interrupted ELSE 0 END,"
            " unique_key = CASE WHEN typeof(unique_key) IN ('null', 'text') THEN unique_key END, parked = 0"
            " WHERE id = ?3",
            (now, json.dumps(entries), job_id),
        )
        before = STATES.get(found[1]) if found and isinstance(found[1], str) else None
        woken: list[BackendEvent] = []
        if before is not None and found[2] is not None:
            woken += unpark(conn, [found[2]] * unparks(before, JobState.DISCARDED, parked=bool(found[3])))
        log.warning(
            "SQLite %r: job %d set aside (discarded), its row could not be read: %s",
            self.path,
            job_id,
            "; ".join(d.describe() for d in damage),
            extra={"event": "row_set_aside", "job_id": job_id, "backend": self.url},
        )
        return [JobFinalized(job_id, JobState.DISCARDED, message), *woken]

    async def _repair(self, job_id: int, state: Any, damage: list[Damage]) -> None:
        now = self.now()
        pending = not (isinstance(state, str) and state in _FINAL)
        set_aside = [d for d in damage if d.column in SET_ASIDE_COLUMNS]

        def body(conn: sqlite3.Connection) -> list[BackendEvent]:
            if pending and set_aside:
                return self._set_aside(conn, job_id, set_aside, now)
            if any(d.column == "errors" for d in damage):
                (raw,) = conn.execute("SELECT errors FROM nj_jobs WHERE id = ?", (job_id,)).fetchone() or (None,)
                entries, found = read_errors(raw)
                if found is not None:
                    conn.execute("UPDATE nj_jobs SET errors = ? WHERE id = ?", (json.dumps(entries), job_id))
                    log.warning(
                        "SQLite %r: job %d: %s; replaced by a note",
                        self.path,
                        job_id,
                        found.describe(),
                        extra={"event": "row_repaired", "job_id": job_id, "backend": self.url},
                    )
            return []

        self._emit(await self._call(self._tx, body))
