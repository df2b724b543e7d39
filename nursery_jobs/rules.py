"""The job rules: every change a job's row makes, decided in one place, with no I/O.

A job's life is a handful of transitions: a claim makes it `running` and counts an attempt; an
outcome ends the attempt (completed, retried, snoozed, discarded, cancelled, or interrupted by a
shutdown); the rescuer ends the attempt of a worker that stopped heartbeating; a cancel ends a
pending job or asks a running one to stop. Each backend stores these changes in its own way (a
dict, an `UPDATE ... RETURNING`), but *what* the change is -- the next state, whether the
attempt is given back, what counts as a failure, when a pending cancel request wins -- is
decided here, once:

- `after_outcome` turns an attempt's outcome into the row's next values. A retry, snooze or
  interruption of a job whose cancellation was requested while it ran ends it `cancelled`
  instead (the request must not be lost because the attempt happened to end another way); a
  snooze and an interruption give the attempt back; an outcome with an error on a retry or a
  discard counts a failed attempt.
- `after_rescue` does the same for an attempt whose worker was lost: the attempt counts as
  failed (the worker may have done part of the work), a job with no attempt left is discarded,
  a job whose cancellation was requested ends cancelled.
- `on_cancel` says what `cancel` does in each state.
- `admit` says which due jobs a claim may start under the per-key and per-queue limits: the
  one decision "may this job start", which every backend takes inside its claim (memory and
  SQLite call it on the candidates in claim order; PostgreSQL runs the same rule as SQL under
  per-key locks, `claim_picked_parking` in `backends/pg_migrations/0014_rate_parking.sql`; `key_admits` is
  its per-key rule alone, for a claim that weighs one job at a time). A job's slot is its `running`
  row: there is no other record to free, so a job that leaves `running` by any transition
  above (an outcome, a rescue) frees it in the same write.
- `unparks` and `parked_can_start` say when a key's *parked* jobs come back. A due job that a
  claim passes over because its key is at its limit is parked: it stays `available`, but
  claims no longer read it (on memory, its heap entry is set aside under its key; on SQLite
  and PostgreSQL, a flag that keeps it out of the claim's index). So a claim's cost does not
  grow with the backlog of full keys. Each change that frees a place brings back the key's
  best parked job, in claim order: a job leaving `running` (its slot), and a cancelled
  pending job that was not parked or one parked for its rate (it may be the one a freed slot
  brought back). A rescue
  pass repairs any key left with parked jobs and a free slot (`parked_can_start`), so
  nothing can keep a key parked for ever.
- `rate_slot` says whether a job under a rate limit may start now, given its rate key's recorded
  starts, and if not when its next slot comes; `admit_rated` applies it with the concurrency
  limits, `rate_log` says what a key's record becomes after a claim (its starts of the last
  window, at most `cap`), and `rate_idle` when the record may go. Jobs of one key may carry
  different rates: each is held to its own, and the key's record is kept for the largest limit
  and window weighed against it (`Admission.rate_sized`), trimmed once per claim. A claim
  weighs a key at `rate_time`, never before the key's latest recorded start, so the record
  stays in time order whichever claim's clock read later. PostgreSQL runs the same rule in
  `claim_picked_parking` (migration 0014, after `claim_picked`, replaced in 0015 and 0018;
  `rate_slot` and `rate_record` from migration 0010, replaced in 0018).
- `rate_release` says how many of a key's jobs parked for its rate come back when its next slot
  comes. A due job refused for its rate is parked too (on SQLite and PostgreSQL a flag that
  keeps it out of the claim's index, and the key's wake time in the queue), so a key over its
  rate with a large backlog costs later claims nothing; when the wake time comes, the claim
  first brings back the key's best parked jobs, as many as the window admits now and no more,
  and sets the wake to the next slot of the first one it kept. So each parked job is written
  twice (parked, back), never once per window, and the key's jobs come back in claim order.
  PostgreSQL restates it in `rate_release` (migration 0014).
- `check_room` says whether an enqueue into a queue declared with `max_length` may go in:
  `PENDING` (available, scheduled, retryable) is what counts toward the length, counted with
  the call's own new jobs; every backend counts inside the insert's transaction, serialized
  per queue, and asks this one function.

The memory and SQLite backends call these functions per row. PostgreSQL writes a whole batch in
one statement, so its SQL is *generated* from `OUTCOME_TABLE` (`sql_case`), and the contract
suite checks every backend against the same functions for every (outcome, starting row)
combination (`tests/contract/`).

Every value here is a plain tuple or enum: a transition is computed per job on the hot path.
"""

from __future__ import annotations

import enum
from typing import Iterable, Mapping, NamedTuple, Sequence

from .errors import QueueFull
from .jobs import JobState

__all__ = [
    "CANCEL_WINS",
    "CancelAction",
    "Next",
    "OUTCOME_TABLE",
    "OutcomeKind",
    "PARK_AT_ONCE",
    "PENDING",
    "Rule",
    "Admission",
    "admit",
    "admit_rated",
    "after_outcome",
    "after_rescue",
    "check_batch",
    "check_room",
    "key_admits",
    "on_cancel",
    "on_failure",
    "parked_can_start",
    "rate_idle",
    "rate_log",
    "rate_release",
    "rate_slot",
    "rate_time",
    "unparks",
]


class OutcomeKind(enum.Enum):
    """How an attempt ended, as the executor saw it."""

    COMPLETED = "completed"
    RETRY = "retry"
    SNOOZE = "snooze"
    DISCARD = "discard"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    """Shutdown cut the attempt: the attempt is given back and the job becomes available."""


class Rule(NamedTuple):
    """What one outcome does to a running row (see `OUTCOME_TABLE`)."""

    due: JobState
    """The next state when the job may run again now (or for good, if final)."""
    later: JobState
    """The next state when it runs again later (its `run_at` is in the future)."""
    give_back: bool
    """The attempt does not count: `attempt` goes back down by one."""
    run_at: str
    """"outcome" (the outcome's own time, never before now), "now", or "keep"."""
    counts_failure: bool
    """With an error, this attempt counts towards `failed_attempts`."""
    interrupted: bool
    """Counts towards `interrupted`."""

    @property
    def final(self) -> bool:
        return self.due.final


_A, _S, _RT = JobState.AVAILABLE, JobState.SCHEDULED, JobState.RETRYABLE
_DONE, _DISC, _CANC = JobState.COMPLETED, JobState.DISCARDED, JobState.CANCELLED

OUTCOME_TABLE: dict[OutcomeKind, Rule] = {
    OutcomeKind.COMPLETED: Rule(_DONE, _DONE, False, "keep", False, False),
    OutcomeKind.RETRY: Rule(_A, _RT, False, "outcome", True, False),
    OutcomeKind.SNOOZE: Rule(_A, _S, True, "outcome", False, False),
    OutcomeKind.DISCARD: Rule(_DISC, _DISC, False, "keep", True, False),
    OutcomeKind.CANCELLED: Rule(_CANC, _CANC, False, "keep", False, False),
    OutcomeKind.INTERRUPTED: Rule(_A, _A, True, "now", False, True),
}
"""Outcome -> what it does to the row, when no cancellation was requested."""

CANCEL_WINS = frozenset({OutcomeKind.RETRY, OutcomeKind.SNOOZE, OutcomeKind.INTERRUPTED})
"""Outcomes that would run the job again: a requested cancellation ends it instead."""


class Next(NamedTuple):
    """A row's values after a transition (only what changes)."""

    state: JobState
    attempt_delta: int
    """0, or -1 when the attempt is given back."""
    run_at: float | None
    """The new `run_at`, or None to keep it."""
    failed: int
    """Added to `failed_attempts` (0 or 1)."""
    interrupted: int
    """Added to `interrupted` (0 or 1)."""

    @property
    def final(self) -> bool:
        return self.state.final


def effective_kind(kind: OutcomeKind, cancel_requested: bool) -> OutcomeKind:
    """The outcome as the job ends it: a pending cancel request turns one that would run the
    job again into a cancellation."""
    return OutcomeKind.CANCELLED if cancel_requested and kind in CANCEL_WINS else kind


def after_outcome(
    kind: OutcomeKind, *, cancel_requested: bool, has_error: bool, run_at: float | None, now: float
) -> Next:
    """The running row's next values when its attempt ends with `kind`.

    `run_at` is the outcome's own time for a retry or a snooze (None: now); it is never before
    `now`. `has_error`: the outcome carries an error (it is appended to the job's errors by the
    backend, which keeps the latest `MAX_ERRORS_KEPT`)."""
    rule = OUTCOME_TABLE[effective_kind(kind, cancel_requested)]
    failed = 1 if has_error and OUTCOME_TABLE[kind].counts_failure else 0
    if rule.run_at == "keep":
        return Next(rule.due, -1 if rule.give_back else 0, None, failed, 1 if rule.interrupted else 0)
    if rule.run_at == "now" or run_at is None or run_at <= now:
        when = now
    else:
        when = run_at
    state = rule.due if when <= now else rule.later
    return Next(state, -1 if rule.give_back else 0, when, failed, 1 if rule.interrupted else 0)


def on_failure(*, attempt: int, max_attempts: int) -> OutcomeKind:
    """A failed attempt (an error, a timeout): retried while attempts are left, else discarded."""
    return OutcomeKind.DISCARD if attempt >= max_attempts else OutcomeKind.RETRY


def after_rescue(*, attempt: int, max_attempts: int, cancel_requested: bool, now: float) -> Next:
    """A running row whose worker stopped heartbeating: the attempt counts as failed (the
    worker may have done part of the work), then the failure rule applies."""
    if cancel_requested:
        return Next(_CANC, 0, None, 1, 0)
    if on_failure(attempt=attempt, max_attempts=max_attempts) is OutcomeKind.DISCARD:
        return Next(_DISC, 0, None, 1, 0)
    return Next(_A, 0, now, 1, 0)


class CancelAction(enum.Enum):
    NONE = "none"
    """Final already: left alone (`cancel` returns its state)."""
    REQUEST = "request"
    """Running: the request is recorded; the attempt is cancelled wherever it runs."""
    CANCEL = "cancel"
    """Pending: cancelled now, it never starts."""


def on_cancel(state: JobState) -> CancelAction:
    if state.final:
        return CancelAction.NONE
    if state is JobState.RUNNING:
        return CancelAction.REQUEST
    return CancelAction.CANCEL


def key_admits(running: int, limit: int | None) -> bool:
    """Whether a job may start under its concurrency key's limit when `running` of the key's
    jobs run (counting those the same claim started before it), `limit` its own
    `max_concurrent`: the per-key rule of `admit`. A claim that weighs one keyed job at a time
    (memory) asks this directly rather than building `admit`'s candidates per job."""
    return running < (limit or 1)


def admit(
    candidates: Iterable[tuple[str | None, int | None]],
    running: Mapping[str, int],
    *,
    want: int,
    queue_running: int = 0,
    max_running: int | None = None,
) -> list[int]:
    """Which candidates a claim starts: their indexes, ascending.

    `candidates` are due jobs in claim order, each as (concurrency key, its `max_concurrent`);
    `running` counts the `running` jobs of each key (a key absent: none), `queue_running` those
    of the queue, when `max_running` (the queue's `global_max_workers`) is set. A candidate
    starts if fewer than its own limit of its key's jobs run, counting the ones started before
    it in this claim, and fewer than `max_running` of the queue's; a candidate held back is
    skipped (it stays pending, no attempt is spent) and the next one is considered, so a full
    key never holds back another. At most `want` start. Reads `candidates` lazily and stops
    as soon as `want` started or the queue is full."""
    return admit_rated(
        ((key, limit, None, None, None) for key, limit in candidates),
        running,
        {},
        want=want,
        queue_running=queue_running,
        max_running=max_running,
        now=0.0,
    ).started


Candidate = tuple[str | None, int | None, str | None, int | None, float | None]
"""A due job as a claim weighs it: (concurrency key, max_concurrent, rate key, rate limit, rate
window in seconds)."""


class Admission(NamedTuple):
    started: list[int]
    """The indexes of the candidates the claim starts, ascending."""
    rate_next: float | None
    """The earliest time a candidate refused for its rate gets a slot (None: none was)."""
    rate_started: dict[str, int]
    """Starts this claim makes per rate key: each is recorded at the key's `rate_time`."""
    rate_sized: dict[str, tuple[int, float]]
    """Per rate key, the largest limit and the longest window of the candidates weighed against
    its rate (started or refused): the key's record is kept for at least these (`rate_log`'s
    `cap` and `per`), so a job refused here is refused again by the record written after it."""


def admit_rated(
    candidates: Iterable[Candidate],
    running: Mapping[str, int],
    starts: Mapping[str, Sequence[float]],
    *,
    want: int,
    now: float,
    queue_running: int = 0,
    max_running: int | None = None,
) -> Admission:
    """`admit` with rate limits too: `starts` holds each rate key's recorded starts, ascending
    (a key absent: none; see `rate_log`). A candidate with a rate key starts only if its
    concurrency limit admits it and `rate_slot` says its rate does, counting the starts this
    claim made before it (each at the key's `rate_time`); a candidate refused for its rate is
    skipped like one refused for its key, and the earliest time such a candidate gets a slot
    is reported, so the caller sleeps exactly until then.

    Jobs of one rate key may carry different rates (two kinds sharing a key): each is weighed
    by its own limit and window over the key's starts, and the largest limit and window weighed
    per key come back in `rate_sized`, which the caller folds into the key's record (its `cap`
    and `per`, even when the key started nothing in this claim) before it trims it, at the
    claim's end, never between two candidates of one claim."""
    started: list[int] = []
    rated: dict[str, int] = {}
    sized: dict[str, tuple[int, float]] = {}
    if want <= 0 or (max_running is not None and queue_running >= max_running):
        return Admission(started, None, rated, sized)
    room = want if max_running is None else min(want, max_running - queue_running)
    taken: dict[str, int] = {}
    rate_next: float | None = None
    for i, (key, limit, rkey, rlimit, rper) in enumerate(candidates):
        n = 0
        if key is not None:
            got = taken.get(key)
            n = running.get(key, 0) if got is None else got
            if not key_admits(n, limit):
                continue
        if rkey is not None:
            rlimit, rper = rlimit or 1, rper or 0.0
            size = sized.get(rkey)
            sized[rkey] = (rlimit, rper) if size is None else (max(size[0], rlimit), max(size[1], rper))
            slot = rate_slot(starts.get(rkey, ()), rlimit, rper, now, rated.get(rkey, 0))
            if slot is not None:
                if rate_next is None or slot < rate_next:
                    rate_next = slot
                continue
            rated[rkey] = rated.get(rkey, 0) + 1
        if key is not None:
            taken[key] = n + 1
        started.append(i)
        if len(started) >= room:
            break
    return Admission(started, rate_next, rated, sized)


def rate_time(starts: Sequence[float], now: float) -> float:
    """The time a claim weighs a rate key at, and records its starts of the key at: `now`, the
    claim's time once it holds the key's lock (SQLite reads its clock under the write lock;
    PostgreSQL moves the client's time on by the wait for the key's lock), or the key's
    latest recorded start when that is later. Clocks differ (hosts; a client that read its
    clock before its statement reached the server): another claim whose time was later may
    have taken the lock first and trimmed the record to its own window. Weighed at the earlier
    `now`, this claim would count too few starts (the trimmed ones are still in its window)
    and append starts out of time order, which every `rate_slot` after it reads wrongly. A
    start never really happens before one whose commit it waited for, so the later time is
    also the truer one."""
    return starts[-1] if starts and starts[-1] > now else now


def rate_slot(starts: Sequence[float], limit: int, per: float, now: float, added: int = 0) -> float | None:
    """None if a job limited to `limit` starts per `per` seconds may start at `now` (at the
    key's `rate_time`), given its key's recorded starts (`starts`, ascending; at least the
    latest `limit` of them) and `added` more made then by the same claim; otherwise the time
    its next slot comes: when the `limit`-th latest start leaves the window. A start at `s`
    holds its slot during [s, s + per), so any half-open window of `per` seconds holds at most
    `limit` starts."""
    if starts and starts[-1] > now:
        now = starts[-1]  # `rate_time`, inline: this runs per candidate
    if added >= limit:
        return now + per
    need = limit - added  # the start whose age decides
    if len(starts) < need:
        return None
    slot = starts[-need] + per
    return slot if slot > now else None


def rate_release(starts: Sequence[float], parked: Iterable[tuple[int, float]], now: float) -> tuple[int, float | None]:
    """How many of a key's parked jobs come back at `now`, and the key's next wake time: the
    parked jobs are read lazily in claim order as (rate limit, window), and each comes back
    while `rate_slot` admits it, counting those before it (each would start at `now`); the
    first it refuses stays, with every one behind it, and its slot is the wake time (None:
    every one came back). The caller releases each job when it asks for the next one, so the
    refused job is never taken from `parked`."""
    back = 0
    for limit, per in parked:
        slot = rate_slot(starts, limit, per, now, back)
        if slot is not None:
            return back, slot
        back += 1
    return back, None


def rate_log(starts: Sequence[float], added: int, now: float, cap: int, per: float) -> list[float]:
    """A key's record after a claim made `added` starts at `now` (at the key's `rate_time`):
    its latest `cap` starts that are less than `per` seconds old (`cap`, `per`: the largest
    limit and window its jobs carried), all that `rate_slot` ever reads. So a record holds at
    most `cap` starts, in time order, and no more than the key really made in the last window:
    a rate never reached costs no more than the traffic."""
    now = rate_time(starts, now)
    n = len(starts)
    old = 0
    while old < n and starts[old] + per <= now:  # ascending: the expired ones come first
        old += 1
    if added >= cap:
        return [now] * cap
    return [*starts[max(old, n + added - cap) :], *([now] * added)]


def rate_idle(last_start: float, per: float, now: float) -> bool:
    """A key whose latest start is `per` seconds old (`per`: the longest window its jobs
    carried) constrains no start any more: its record may be dropped."""
    return last_start + per <= now


def unparks(before: JobState, after: JobState, *, parked: bool = False, parks: bool = False) -> int:
    """How many of its key's parked jobs a keyed job's change from `before` to `after` brings
    back into claim order: one when it leaves `running` (its slot is free), one when an
    available job that was not parked is cancelled (it may have been the job a freed slot brought back),
    one when a job that was not parked is parked for its rate (`parks`: the same, and it leaves
    claim order without starting), else none. `parked`: the job itself was parked (a parked job
    holds no place)."""
    if before is JobState.RUNNING and after is not JobState.RUNNING:
        return 1
    if parked:
        return 0
    if parks or (before is JobState.AVAILABLE and after is JobState.CANCELLED):
        return 1
    return 0


PARK_AT_ONCE = 1000
"""A claim reads at most this many due jobs beyond the number it was asked for, passing over
(and parking) those of full keys and those refused for their rate: a large backlog is parked
over several claims, each a bounded statement or transaction, never in one that writes all of
it."""


def parked_can_start(running: int, limit: int | None) -> bool:
    """The repair's test: a key with `running` jobs running and parked jobs whose best one has
    `limit` (None: 1) has a free slot, so that job must come back into claim order."""
    return key_admits(running, limit)


PENDING = (JobState.AVAILABLE, JobState.SCHEDULED, JobState.RETRYABLE)
"""The states that count toward a queue's `max_length`: jobs waiting to start. A running job
does not count: it has left the queue for a worker (as an item a Gitea worker popped has left
its queue), the workers' limits already bound how many run, and a job starting is what makes
room for a waiting enqueue."""


def check_room(queue: str, pending: int, max_length: int | None) -> None:
    """`QueueFull` unless `pending` jobs of `queue` (counted with the call's own new jobs in;
    a job deduplicated into an existing one by its unique key is not new) fit `max_length`
    (None: no bound). The one rule of a bounded queue; every backend calls it inside the
    transaction that inserted the jobs, which it rolls back on `QueueFull`."""
    if max_length is not None and pending > max_length:
        raise QueueFull(
            f"queue {queue!r} is full: its max_length is {max_length}, and with this call's new jobs {pending} "
            "would wait to start",
            queue=queue,
            max_length=max_length,
            pending=pending,
        )


def check_batch(queue: str, size: int, max_length: int | None) -> None:
    """`QueueFull` at once for a batch of `size` new jobs of `queue` that could never fit its
    `max_length`, even into an empty queue: waiting for room would be waiting for nothing."""
    if max_length is not None and size > max_length:
        raise QueueFull(
            f"a batch of {size} jobs can never fit queue {queue!r}, whose max_length is {max_length}; enqueue it "
            f"in batches of at most {max_length}, or raise max_length",
            queue=queue,
            max_length=max_length,
            pending=size,
        )


def sql_case(column: str, *, kind: str = "o.kind", cancel: str = "j.cancel_requested") -> str:
    """A SQL expression for `column` of the row after an outcome, generated from
    `OUTCOME_TABLE`, for the backends that write a batch in one statement. `column` is one of
    "state", "give_back", "run_at", "failed", "interrupted", "final"; the expression reads the
    outcome's kind, run_at ("o.run_at") and error ("o.error") and the row's cancel flag, and the
    statement's ``%(now)s``."""
    branches = []
    for k in OutcomeKind:
        for requested in (False, True):
            eff = effective_kind(k, requested)
            rule = OUTCOME_TABLE[eff]
            if column == "state":
                if rule.due is rule.later:
                    value = f"'{rule.due.value}'"
                elif rule.run_at == "now":
                    value = f"'{rule.due.value}'"
                else:
                    value = f"CASE WHEN o.run_at <= %(now)s THEN '{rule.due.value}' ELSE '{rule.later.value}' END"
            elif column == "give_back":
                value = "1" if rule.give_back else "0"
            elif column == "run_at":
                value = {"keep": "j.run_at", "now": "%(now)s", "outcome": "o.run_at"}[rule.run_at]
            elif column == "failed":
                value = "CASE WHEN o.error IS NOT NULL THEN 1 ELSE 0 END" if OUTCOME_TABLE[k].counts_failure else "0"
            elif column == "interrupted":
                value = "1" if rule.interrupted else "0"
            elif column == "final":
                value = "true" if rule.final else "false"
            else:
                raise ValueError(f"no rule for column {column!r}")
            condition = f"{kind} = '{k.value}' AND {'' if requested else 'NOT '}{cancel}"
            branches.append((condition, value))
    # Collapse: when both branches of a kind agree, the cancel flag does not matter for it.
    out: list[str] = []
    for k in OutcomeKind:
        (c_no, v_no), (c_yes, v_yes) = [b for b in branches if b[0].startswith(f"{kind} = '{k.value}'")]
        if v_no == v_yes:
            out.append(f"WHEN {kind} = '{k.value}' THEN {v_no}")
        else:
            out.append(f"WHEN {c_no} THEN {v_no} WHEN {c_yes} THEN {v_yes}")
    return "CASE " + " ".join(out) + " END"
