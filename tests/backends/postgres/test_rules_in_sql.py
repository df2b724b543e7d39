"""Every job rule PostgreSQL decides in SQL decides as its Python rule, and a change to either
side turns this red.

The outcome statement is generated from `transitions.OUTCOME_TABLE` (`sql_case`, checked here
end to end with the unparking it triggers); the rest of what the statements and functions
decide is SQL written again: the rescue (`after_rescue`), the cancel (`on_cancel`), the claim's
parking of what its scan passes over (`key_admits`), the unparking of a key's parked jobs
(`unparks`, and which ones come back: `unpark_keys_queues` / `unpark_keys`), a bounded queue's
count (`PENDING`, for `check_room`), the rate window's release (`rate_release`) and parking
(`rate_slot` through `admit_rated`, `rate_sized`, `unparks`), retention's idle rate keys
(`rate_idle`) and the rescuer's repair (`parked_can_start`). Each is run on random states
against its rule (`rules_sql.py`); the claim's admission and rate steps, and `rate_slot` and
the record `rate_log` describes, have their own files (`test_keyed_admission.py`,
`test_rate_admission.py`).

Then each is run with a change planted in the Python rule and, separately, in the SQL (the
backend's statement edited as it is sent, or the schema's function replaced by CREATE OR
REPLACE), and must find a difference: so the guarantee that a planted change turns the suite
red is held by the suite itself.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg
import pytest

from nursery_jobs import rules
from nursery_jobs.jobs import JobState
from tests import pgutil

from . import rules_sql
from .rules_sql import CHECKS, run, statement

CASES = 1000 if os.environ.get("NURSERY_JOBS_HYPOTHESIS_PROFILE") == "nightly" else 100
"""Random states per check (the nightly profile runs ten times as many)."""


@pytest.mark.parametrize("name", list(CHECKS))
def test_the_sql_decides_as_the_rule(pg_url: str, name: str) -> None:
    schema = pgutil.new_schema(pg_url)
    assert run(CHECKS[name], pg_url, schema, seed=sum(map(ord, name)), cases=CASES) == []


# -- planted changes: each must be found --

_R, _C = JobState.RUNNING, JobState.CANCELLED


def _rescue_counts_no_failure(**kw: Any) -> rules.Next:
    return rules.after_rescue(**kw)._replace(failed=0)


def _rescue_discards_late(*, attempt: int, max_attempts: int, cancel_requested: bool, now: float) -> rules.Next:
    return rules.after_rescue(attempt=attempt, max_attempts=max_attempts + 1, cancel_requested=cancel_requested, now=now)


def _unparks_two(before: JobState, after: JobState, **kw: Any) -> int:
    return 2 * rules.unparks(before, after, **kw)


def _cancel_frees_nothing(before: JobState, after: JobState, **kw: Any) -> int:
    return 0 if after is _C and before is not _R else rules.unparks(before, after, **kw)


def _parking_frees_nothing(before: JobState, after: JobState, *, parked: bool = False, parks: bool = False) -> int:
    return rules.unparks(before, after, parked=parked)


def _cancel_ends_a_running_job(state: JobState) -> rules.CancelAction:
    return rules.CancelAction.CANCEL if state is _R else rules.on_cancel(state)


def _snooze_keeps_the_attempt(*args: Any, **kw: Any) -> rules.Next:
    return rules.after_outcome(*args, **kw)._replace(attempt_delta=0)


def _worst_first(rows: rules_sql.Rows, freed: Any) -> list[int]:
    back: list[int] = []
    for key, n in freed.items():
        parked = sorted((r for r in rows.values() if r.concurrency_key == key and rules_sql.waits_for_slot(r)),
                        key=lambda r: (r.priority, r.run_at, r.id))  # fmt: skip
        for r in parked[:n]:
            rows[r.id] = r._replace(parked=False)
            back.append(r.id)
    return back


def _release_one_more(starts: Any, parked: Any, now: float) -> tuple[int, float | None]:
    back, slot = rules.rate_release(starts, parked, now)
    return (back + 1, slot) if slot is not None else (back, slot)


def _rate_never_refuses(candidates: Any, *args: Any, **kw: Any) -> rules.Admission:
    return rules.Admission([0], None, {}, {})


PYTHON_PLANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("rescue-counts-no-failure", "rescue", {"after_rescue": _rescue_counts_no_failure}),
    ("rescue-discards-an-attempt-late", "rescue", {"after_rescue": _rescue_discards_late}),
    ("rescue-frees-two", "rescue", {"unparks": _unparks_two}),
    ("cancel-ends-a-running-job", "cancel", {"on_cancel": _cancel_ends_a_running_job}),
    ("cancel-frees-nothing", "cancel", {"unparks": _cancel_frees_nothing}),
    ("snooze-keeps-the-attempt", "finish", {"after_outcome": _snooze_keeps_the_attempt}),
    ("outcome-frees-two", "finish", {"unparks": _unparks_two}),
    ("unpark-worst-first", "unpark", {"best": _worst_first}),
    ("running-counts-toward-the-length", "room", {"pending": (*rules.PENDING, JobState.RUNNING)}),
    ("scheduled-does-not-count", "room", {"pending": (JobState.AVAILABLE, JobState.RETRYABLE)}),
    ("release-one-more", "rate_release", {"rate_release": _release_one_more}),
    ("rate-never-refuses", "rate_park", {"admit_rated": _rate_never_refuses}),
    ("parking-frees-nothing", "rate_park", {"unparks": _parking_frees_nothing}),
    ("idle-only-after-the-window", "rate_idle", {"rate_idle": lambda last, per, now: last + per < now}),
    ("repair-at-a-full-key", "repair", {"parked_can_start": lambda running, limit: running <= (limit or 1)}),
    ("claim-admits-a-full-key", "claim_parks", {"key_admits": lambda running, limit: running <= (limit or 1)}),
]


@pytest.mark.parametrize("check, planted", [p[1:] for p in PYTHON_PLANTS], ids=[p[0] for p in PYTHON_PLANTS])
def test_a_change_planted_in_the_rule_is_found(pg_url: str, check: str, planted: dict[str, Any]) -> None:
    schema = pgutil.new_schema(pg_url)
    assert run(CHECKS[check], pg_url, schema, seed=1, cases=CASES, **planted)


STATEMENT_PLANTS: list[tuple[str, str, str, str, str]] = [
    # (id, check, statement, old, new)
    ("rescue-counts-no-failure", "rescue", "rescue", "failed_attempts = j.failed_attempts + 1", "failed_attempts = j.failed_attempts"),
    ("rescue-discards-an-attempt-late", "rescue", "rescue", "WHEN j.attempt >= j.max_attempts THEN 'discarded'",
     "WHEN j.attempt > j.max_attempts THEN 'discarded'"),
    ("rescue-frees-two", "rescue", "rescue", "count(*)::int AS n FROM upd", "(count(*) + 1)::int AS n FROM upd"),
    ("cancel-ends-a-running-job", "cancel", "cancel", "state = CASE WHEN cur.state = 'running' THEN 'running'",
     "state = CASE WHEN cur.state = 'running' THEN 'cancelled'"),
    ("cancel-of-a-parked-job-frees", "cancel", "cancel", "cur.state = 'available' AND NOT cur.parked", "cur.state = 'available'"),
    ("outcome-frees-two", "finish", "finish", "count(*)::int AS n FROM upd", "(count(*) + 1)::int AS n FROM upd"),
    ("parked-do-not-count", "room", "count_pending", "AND parked LIMIT", "AND parked AND false LIMIT"),
    ("idle-only-after-the-window", "rate_idle", "delete_finished", "per <= %(now)s", "per < %(now)s"),
    ("scan-admits-a-full-key", "claim_parks", "claim", "< coalesce(a.max_concurrent, 1)", "<= coalesce(a.max_concurrent, 1)"),
    ("park-only-over-the-limit", "claim_parks", "claim", ">= p.most", "> p.most"),
]  # fmt: skip


@pytest.mark.parametrize("check, name, old, new", [p[1:] for p in STATEMENT_PLANTS], ids=[p[0] for p in STATEMENT_PLANTS])
def test_a_change_planted_in_a_statement_is_found(pg_url: str, check: str, name: str, old: str, new: str) -> None:
    schema = pgutil.new_schema(pg_url)
    query = statement(name, schema)
    assert old.encode() in query, f"{old!r} is not in the {name} statement: the plant would change nothing"
    assert run(CHECKS[check], pg_url, schema, seed=1, cases=CASES, query=query.replace(old.encode(), new.encode()))


FUNCTION_PLANTS: list[tuple[str, str, str, str, str]] = [
    # (id, check, function, old, new)
    ("unpark-worst-first", "unpark", "unpark_keys_queues", "ORDER BY r.priority DESC", "ORDER BY r.priority"),
    ("unpark-a-rate-parked-job", "unpark", "unpark_keys_queues", " AND NOT r.rate_wait", ""),
    ("rescue-unparks-worst-first", "rescue", "unpark_keys_queues", "ORDER BY r.priority DESC", "ORDER BY r.priority"),
    ("release-counts-no-release", "rate_release", "rate_release", "p_now, back)", "p_now, 0)"),
    ("release-past-the-first-refused", "rate_release", "rate_release", "EXIT WHEN slot IS NOT NULL", "CONTINUE WHEN slot IS NOT NULL"),
    ("park-ignores-a-come-wake", "rate_park", "rate_park", "(c.slot IS NOT NULL OR c.waits)", "(c.slot IS NOT NULL)"),
    ("park-sizes-no-record", "rate_park", "rate_park", "cap = greatest(r.cap, m.lim)", "cap = r.cap"),
    ("parking-frees-nothing", "rate_park", "rate_park", "PERFORM {s}.unpark_keys(ck, n);", "NULL;"),
    ("repair-at-a-full-key", "repair", "repair_parked", "< head.most", "<= head.most"),
]  # fmt: skip


@pytest.mark.parametrize("check, function, old, new", [p[1:] for p in FUNCTION_PLANTS], ids=[p[0] for p in FUNCTION_PLANTS])
def test_a_change_planted_in_a_function_is_found(pg_url: str, check: str, function: str, old: str, new: str) -> None:
    schema = pgutil.new_schema(pg_url)
    with psycopg.connect(pg_url) as conn:
        rules_sql.plant(conn, schema, function, old.replace("{s}", f'"{schema}"'), new)
    assert run(CHECKS[check], pg_url, schema, seed=1, cases=CASES)
