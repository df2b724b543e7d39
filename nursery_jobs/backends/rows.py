"""Reading the rows of a durable backend, which the runtime did not necessarily write itself.

An operator's `UPDATE` in a shell, a restore from a damaged backup, a tool that writes the
table directly: a durable backend's rows can hold what this library would never write. SQLite
has no check constraints, so `state` may be `'bogus'`, `priority` or `run_at` TEXT; on both
durable backends the `errors` column may be any JSON, and a `running` row may have no
heartbeat. The rule: **a row the runtime cannot read hurts only itself.** Every reader here
returns a value and a list of what it found damaged; it never raises. The backends then:

- set aside a pending or running row whose scheduling columns (`state`, `kind`, `queue`,
  `attempt`, `max_attempts`, `priority`, `run_at`, `created_at`) cannot be read: it is
  discarded, its unreadable columns are reset, an error on the job names the column and the
  value found, and a warning is logged naming the id and the column. Every other row goes on;
- repair an unreadable `errors` column or entry in place: each unreadable entry is replaced by a
  note quoting it, and the job goes on (its history is damaged, not its work);
- show a final row's unreadable columns as defaults in `get_job` (nothing to set aside).

The SQL backends share these readers, so one damage is read the same way everywhere.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping, Sequence

import attrs

from ..jobs import MAX_ERRORS_KEPT, Job, JobError, JobState, clean_text, decode_args
from .protocol import ClaimedJob, QueueCounts

__all__ = [
    "Damage",
    "SET_ASIDE_COLUMNS",
    "STATES",
    "counts_from_rows",
    "error_entry",
    "job_from_row",
    "read_claimed",
    "read_errors",
    "rescue_message",
    "set_aside_message",
]

STATES: Mapping[str, JobState] = {s.value: s for s in JobState}

SET_ASIDE_COLUMNS = frozenset({"state", "kind", "queue", "attempt", "max_attempts", "priority", "run_at", "created_at"})
"""Columns without which a job cannot be claimed, run or rescued: a pending or running row with
one of them unreadable is set aside (discarded)."""


@attrs.frozen
class Damage:
    """One unreadable value: which column, what it held, what it should have held."""

    column: str
    value: Any
    expected: str

    def describe(self) -> str:
        return f"column {self.column} holds {_quote(self.value)}, not {self.expected}"


def _quote(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:  # a value whose repr fails: only its type can be named
        text = f"<{type(value).__name__}>"
    return clean_text(text, 200)


def set_aside_message(damage: Sequence[Damage]) -> str:
    """The error recorded on a job that was set aside."""
    what = "; ".join(d.describe() for d in damage)
    return clean_text(
        f"nursery_jobs: set aside, the row could not be read ({what}); the job was discarded: "
        "fix the row's columns and enqueue the job again"
    )


def error_entry(attempt: int, at: float, message: str, traceback: str | None = None) -> dict[str, Any]:
    """One entry of the `errors` column, as every durable backend stores it."""
    return {"attempt": attempt, "at": at, "message": message, "traceback": traceback}


def rescue_message(heartbeat_at: Any) -> str:
    """The error recorded on a job rescued from a worker that stopped heartbeating."""
    if _is_number(heartbeat_at):
        return f"rescued: its worker stopped heartbeating at {heartbeat_at:.3f} (worker lost)"
    return "rescued: its running row had no readable heartbeat (worker lost)"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_errors(raw: Any) -> tuple[list[dict[str, Any]], Damage | None]:
    """The entries of an `errors` column (JSON text on SQLite, decoded jsonb on PostgreSQL),
    at most `MAX_ERRORS_KEPT`, each a well-formed entry; an unreadable column or entry becomes
    a note quoting it. Never raises."""
    if raw is None:
        return [], None
    value = raw
    if isinstance(raw, (str, bytes)):
        try:
            value = json.loads(raw)
        except (ValueError, TypeError, RecursionError):
            damage = Damage("errors", raw, "a JSON list of errors")
            return [_note(damage)], damage
    if not isinstance(value, list):
        damage = Damage("errors", value, "a JSON list of errors")
        return [_note(damage)], damage
    out: list[dict[str, Any]] = []
    found: Damage | None = None
    for entry in value[-MAX_ERRORS_KEPT:]:
        if (
            isinstance(entry, dict)
            and _is_int(entry.get("attempt"))
            and _is_number(entry.get("at"))
            and isinstance(entry.get("message"), str)
            and (entry.get("traceback") is None or isinstance(entry.get("traceback"), str))
        ):
            out.append(error_entry(entry["attempt"], entry["at"], entry["message"], entry.get("traceback")))
        else:
            found = Damage("errors", entry, "an error entry {attempt, at, message, traceback}")
            out.append(_note(found))
    return out, found


def _note(damage: Damage) -> dict[str, Any]:
    return error_entry(0, 0.0, f"nursery_jobs: an unreadable entry of this job's errors was replaced: {damage.describe()}")


def job_errors(entries: Iterable[Mapping[str, Any]]) -> tuple[JobError, ...]:
    return tuple(JobError(e["attempt"], e["at"], e["message"], e.get("traceback")) for e in entries)


# Column order both SQL backends select for get_job:
# id, kind, queue, args (JSON text), state, attempt, max_attempts, priority, run_at, created_at,
# attempted_at, finalized_at, errors (raw), unique_key.


def job_from_row(row: Sequence[Any]) -> tuple[Job, list[Damage]]:
    """A `Job` from a durable backend's row (the column order above), and what in it was
    unreadable (shown as a default: state `discarded`, numbers 0, names as text)."""
    damage: list[Damage] = []

    def text(i: int, column: str) -> str:
        value = row[i]
        if isinstance(value, str):
            return value
        damage.append(Damage(column, value, "text"))
        return clean_text(str(value), 200)

    def integer(i: int, column: str, default: int) -> int:
        value = row[i]
        if _is_int(value):
            return int(value)
        damage.append(Damage(column, value, "an integer"))
        return default

    def number(i: int, column: str, optional: bool) -> Any:
        value = row[i]
        if _is_number(value) or (optional and value is None):
            return None if value is None else float(value)
        damage.append(Damage(column, value, "a number of seconds"))
        return None if optional else 0.0

    state = STATES.get(row[4]) if isinstance(row[4], str) else None
    if state is None:
        damage.append(Damage("state", row[4], "a job state"))
        state = JobState.DISCARDED
    try:
        args = decode_args(row[3]) if isinstance(row[3], str) else {}
    except ValueError:
        args = {}  # undecodable args: the claim discards the job with the decode error
    entries, errors_damage = read_errors(row[12])
    if errors_damage is not None:
        damage.append(errors_damage)
    unique_key = row[13] if row[13] is None or isinstance(row[13], str) else None
    job = Job(
        id=int(row[0]),
        kind=text(1, "kind"),
        queue=text(2, "queue"),
        args=args,
        state=state,
        attempt=integer(5, "attempt", 0),
        max_attempts=integer(6, "max_attempts", 1),
        priority=integer(7, "priority", 0),
        run_at=number(8, "run_at", False),
        created_at=number(9, "created_at", False),
        attempted_at=number(10, "attempted_at", True),
        finalized_at=number(11, "finalized_at", True),
        errors=job_errors(entries),
        unique_key=unique_key,
    )
    return job, damage


def read_claimed(row: Sequence[Any]) -> ClaimedJob | list[Damage]:
    """A claimed row ``(id, kind, queue, args, attempt, max_attempts, priority, run_at, ...)`` as a
    `ClaimedJob`, or what in it cannot be read (a `run_at` that is not a number is NaN: it only
    times the wait)."""
    damage = [
        Damage(column, row[i], expected)
        for i, column, expected, ok in (
            (1, "kind", "text", isinstance(row[1], str)),
            (2, "queue", "text", isinstance(row[2], str)),
            (4, "attempt", "an integer", _is_int(row[4])),
            (5, "max_attempts", "an integer", _is_int(row[5])),
            (6, "priority", "an integer", _is_int(row[6])),
        )
        if not ok
    ]
    if damage:
        return damage
    args = row[3] if isinstance(row[3], str) else ""  # not text: the worker discards it as undecodable
    run_at = float(row[7]) if isinstance(row[7], (int, float)) and not isinstance(row[7], bool) else math.nan
    return ClaimedJob(row[0], row[1], row[2], args, row[4], row[5], row[6], run_at)


def counts_from_rows(rows: Iterable[Sequence[Any]]) -> dict[str, QueueCounts]:
    """Per-queue counts from ``(queue, state, count, sum(failed), sum(interrupted))`` rows; a
    state that is not a job state is left out (the backend sets such rows aside first)."""
    acc: dict[str, dict[str, int]] = {}
    for queue, state, count, failed, interrupted in rows:
        c = acc.setdefault(str(queue), {"failed": 0, "interrupted": 0})
        if state in STATES:
            c[state] = c.get(state, 0) + int(count)
        c["failed"] += int(failed) if _is_number(failed) else 0
        c["interrupted"] += int(interrupted) if _is_number(interrupted) else 0
    return {
        name: QueueCounts(
            available=c.get("available", 0),
            scheduled=c.get("scheduled", 0),
            running=c.get("running", 0),
            retryable=c.get("retryable", 0),
            completed=c.get("completed", 0),
            discarded=c.get("discarded", 0),
            cancelled=c.get("cancelled", 0),
            failed=c["failed"],
            interrupted=c["interrupted"],
        )
        for name, c in sorted(acc.items())
    }
