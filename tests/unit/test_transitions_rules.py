"""The job rules as the docs state them, written out by hand.

The contract suite checks every backend against `transitions`; this file checks `transitions`
against the rules a user reads in docs/concepts.md and docs/guarantees.md, so a changed rule is
a failing test here, not a silently changed expectation everywhere.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from nursery_jobs import JobState
from nursery_jobs.rules import (
    CancelAction,
    Next,
    OutcomeKind,
    after_outcome,
    after_rescue,
    on_cancel,
    rate_idle,
    rate_log,
    rate_release,
    rate_slot,
    rate_time,
    sql_case,
    unparks,
)

NOW = 100.0


def outcome(kind: OutcomeKind, *, cancel: bool = False, error: bool = False, run_at: float | None = None) -> Next:
    return after_outcome(kind, cancel_requested=cancel, has_error=error, run_at=run_at, now=NOW)


def test_completed_discarded_and_cancelled_are_final_and_keep_the_attempt():
    assert outcome(OutcomeKind.COMPLETED) == Next(JobState.COMPLETED, 0, None, 0, 0)
    assert outcome(OutcomeKind.DISCARD, error=True) == Next(JobState.DISCARDED, 0, None, 1, 0)
    assert outcome(OutcomeKind.CANCELLED) == Next(JobState.CANCELLED, 0, None, 0, 0)


def test_a_retry_counts_a_failure_and_waits_for_its_backoff():
    assert outcome(OutcomeKind.RETRY, error=True, run_at=NOW + 10) == Next(JobState.RETRYABLE, 0, NOW + 10, 1, 0)
    assert outcome(OutcomeKind.RETRY, error=True, run_at=NOW) == Next(JobState.AVAILABLE, 0, NOW, 1, 0)
    assert outcome(OutcomeKind.RETRY, error=True, run_at=NOW - 5) == Next(JobState.AVAILABLE, 0, NOW, 1, 0)  # never in the past


def test_a_snooze_gives_the_attempt_back_and_is_no_failure():
    assert outcome(OutcomeKind.SNOOZE, run_at=NOW + 2) == Next(JobState.SCHEDULED, -1, NOW + 2, 0, 0)
    assert outcome(OutcomeKind.SNOOZE, run_at=NOW) == Next(JobState.AVAILABLE, -1, NOW, 0, 0)


def test_an_interruption_gives_the_attempt_back_and_the_job_is_available_at_once():
    assert outcome(OutcomeKind.INTERRUPTED) == Next(JobState.AVAILABLE, -1, NOW, 0, 1)


@pytest.mark.parametrize("kind", [OutcomeKind.RETRY, OutcomeKind.SNOOZE, OutcomeKind.INTERRUPTED])
def test_a_requested_cancel_wins_over_any_outcome_that_would_run_the_job_again(kind):
    got = outcome(kind, cancel=True, error=kind is OutcomeKind.RETRY, run_at=NOW + 10)
    assert got.state is JobState.CANCELLED and got.attempt_delta == 0 and got.interrupted == 0
    assert got.failed == (1 if kind is OutcomeKind.RETRY else 0)  # the failed attempt still counts


@pytest.mark.parametrize("kind", [OutcomeKind.COMPLETED, OutcomeKind.DISCARD])
def test_an_attempt_that_ends_the_job_anyway_keeps_its_own_outcome(kind):
    assert outcome(kind, cancel=True).state is outcome(kind).state


def test_a_rescued_attempt_counts_as_failed():
    assert after_rescue(attempt=1, max_attempts=3, cancel_requested=False, now=NOW) == Next(JobState.AVAILABLE, 0, NOW, 1, 0)
    assert after_rescue(attempt=3, max_attempts=3, cancel_requested=False, now=NOW) == Next(JobState.DISCARDED, 0, None, 1, 0)
    assert after_rescue(attempt=1, max_attempts=3, cancel_requested=True, now=NOW) == Next(JobState.CANCELLED, 0, None, 1, 0)


def test_cancel_per_state():
    assert {s: on_cancel(s) for s in JobState} == {
        JobState.AVAILABLE: CancelAction.CANCEL,
        JobState.SCHEDULED: CancelAction.CANCEL,
        JobState.RETRYABLE: CancelAction.CANCEL,
        JobState.RUNNING: CancelAction.REQUEST,
        JobState.COMPLETED: CancelAction.NONE,
        JobState.DISCARDED: CancelAction.NONE,
        JobState.CANCELLED: CancelAction.NONE,
    }


def test_the_generated_sql_covers_every_outcome():
    for column in ("state", "give_back", "run_at", "failed", "interrupted", "final"):
        text = sql_case(column)
        assert all(f"o.kind = '{k.value}'" in text for k in OutcomeKind), column
    with pytest.raises(ValueError):
        sql_case("priority")


# -- rate limits, as docs/rate_limits.md states them --


def test_a_rate_admits_a_start_while_fewer_than_the_limit_are_less_than_per_seconds_old():
    assert rate_slot([], 2, 10.0, NOW) is None
    assert rate_slot([NOW - 3], 2, 10.0, NOW) is None
    assert rate_slot([NOW - 4, NOW - 3], 2, 10.0, NOW) == NOW + 6  # the older leaves the window then
    assert rate_slot([NOW - 10, NOW - 3], 2, 10.0, NOW) is None  # a start holds its slot for [s, s + per)


def test_the_starts_a_claim_makes_count_before_the_next_candidate():
    assert rate_slot([NOW - 4], 3, 10.0, NOW, added=1) is None
    assert rate_slot([NOW - 4], 3, 10.0, NOW, added=2) == NOW + 6
    assert rate_slot([], 2, 10.0, NOW, added=2) == NOW + 10


def test_a_record_keeps_the_latest_starts_of_its_last_window_at_most_cap():
    assert rate_log([NOW - 20, NOW - 5, NOW - 1], 1, NOW, 3, 10.0) == [NOW - 5, NOW - 1, NOW]
    assert rate_log([NOW - 5, NOW - 1], 2, NOW, 3, 10.0) == [NOW - 1, NOW, NOW]
    assert rate_log([NOW - 1], 5, NOW, 3, 10.0) == [NOW, NOW, NOW]
    assert rate_idle(NOW - 10, 10.0, NOW) and not rate_idle(NOW - 9.5, 10.0, NOW)


def test_a_claim_whose_time_is_before_the_keys_latest_start_is_weighed_at_that_start():
    """Rate(2, per=1): two starts at 1.15; a claim at 2.15 starts one and trims both (they
    leave the window then). A claim whose time is 2.10, later at the lock, would see one start
    at its own time where its window holds three, and append its start out of order."""
    log = rate_log([1.15, 1.15], 1, 2.15, 2, 1.0)
    assert log == [2.15] and rate_time(log, 2.10) == 2.15 and rate_time(log, 2.2) == 2.2
    assert rate_slot(log, 2, 1.0, 2.10) is None  # one slot left at 2.15 ...
    assert rate_slot(log, 2, 1.0, 2.10, added=1) == 3.15  # ... and the next one a window after it
    assert rate_log(log, 1, 2.10, 2, 1.0) == [2.15, 2.15]  # recorded then, in time order


def test_a_window_after_a_burst_holds_the_limit_where_gcra_would_hold_more():
    """The docs' example: Rate(2, per=10). GCRA with a burst of 2 admits 0, 0 and 5; the log
    refuses the third start until 10."""
    log: list[float] = []
    starts = []
    for t in (0.0, 0.0, 5.0, 10.0):
        if rate_slot(log, 2, 10.0, t) is None:
            log = rate_log(log, 1, t, 2, 10.0)
            starts.append(t)
    assert starts == [0.0, 0.0, 10.0]


def test_rate_release_brings_back_as_many_parked_jobs_as_the_window_admits_and_no_more() -> None:
    """Starts at 0, 0 and 5 under 3 per 10 s, at 10: two slots are open (the two starts at 0
    left the window), so two parked jobs come back and the third waits for 15; the parked jobs
    are read only as far as the one kept."""
    read: list[int] = []

    def parked() -> Iterator[tuple[int, float]]:
        for n in range(5):
            read.append(n)
            yield 3, 10.0

    assert rate_release([0.0, 0.0, 5.0], parked(), 10.0) == (2, 15.0)
    assert read == [0, 1, 2]
    assert rate_release([0.0, 0.0, 5.0], iter([(3, 10.0)]), 10.0) == (1, None)
    assert rate_release([], iter([]), 10.0) == (0, None)


def test_a_place_in_claim_order_given_up_brings_back_one_parked_job_of_its_key() -> None:
    """A slot freed, or a place in claim order a freed slot may have given: leaving `running`,
    a cancel of an available job that was not parked, or a job parked for its rate."""
    A, R, S = JobState.AVAILABLE, JobState.RUNNING, JobState.SCHEDULED
    for after in (A, JobState.COMPLETED, JobState.DISCARDED, JobState.CANCELLED, JobState.RETRYABLE, S):
        assert unparks(R, after) == 1
    assert unparks(R, R) == 0
    assert unparks(A, JobState.CANCELLED) == 1
    assert unparks(A, JobState.CANCELLED, parked=True) == 0  # a parked job held no place
    assert unparks(S, JobState.CANCELLED) == 0
    assert unparks(A, A, parks=True) == 1 and unparks(S, A, parks=True) == 1
    assert unparks(A, A) == 0
