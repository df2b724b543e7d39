"""The job rules PostgreSQL decides in SQL, each checked against its Python rule on random rows.

Each `check_*` below builds one random state (rows of jobs with their states, attempts, cancel
requests, keys, limits, parked flags; rate records and wake times), runs the backend's own
statement or the schema's own function on it, applies the rule of `transitions` to the same
rows, and returns every difference it finds (an empty list: the two agree). The state is
written, changed and rolled back in one transaction on the caller's connection, so the schema
is left as it was.

The Python side of each check takes its rule as a keyword argument (the rule of `transitions`
by default) and the SQL side its statement (the backend's, rendered for the schema, by
default): `test_rules_in_sql.py` runs each check on the real pair, and again with a change
planted in either side, which it must find. Times are on a half-second grid, so every
comparison is exact and the boundaries (a slot exactly at the claim's time, a record exactly
its window old) come up.

What is compared is the rule's output only: the next state and counters of each row, which
parked jobs come back (the key's best ones in claim order: priority descending, run_at, id),
the wake times, the records, the count a bounded queue weighs. Errors, notifications and
events are the contract suite's (tests/contract/).
"""

from __future__ import annotations

import collections
import random
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import psycopg
from psycopg import sql

from nursery_jobs.backends import Outcome, OutcomeKind
from nursery_jobs import rules
from nursery_jobs.backends.postgres import _QUERIES, _int_array, _outcomes_json
from nursery_jobs.errors import QueueFull
from nursery_jobs.jobs import JobError, JobState

NOW = 1000.0
QUEUES = ("q", "r")
KEYS = (None, "a", "b", "c")
RATE_KEYS = (None, "r1", "r2")
PERS = (1.0, 2.5, 5.0, 10.0)
_PENDING_STATES = ("available", "scheduled", "retryable")
_FINAL_STATES = ("completed", "discarded", "cancelled")


class Row(NamedTuple):
    """A job's row as the rules see it (the columns a rule reads or writes)."""

    id: int
    queue: str
    state: str
    attempt: int
    max_attempts: int
    priority: int
    run_at: float
    finalized_at: float | None
    heartbeat_at: float | None
    failed_attempts: int
    interrupted: int
    cancel_requested: bool
    concurrency_key: str | None
    max_concurrent: int | None
    parked: bool
    rate_wait: bool
    rate_key: str | None
    rate_limit: int | None
    rate_per: float | None


COLUMNS = Row._fields[1:]
_TYPES = ("text", "text", "int", "int", "int", "float8", "float8", "float8", "int", "int", "bool", "text", "int",
          "bool", "bool", "text", "int", "float8")  # fmt: skip

Rows = dict[int, Row]


def statement(name: str, schema: str) -> bytes:
    """The backend's statement `name`, as it sends it to `schema`."""
    ident = sql.Identifier(schema)
    seq = sql.Literal(f'"{schema}".jobs_id_seq')
    fences = sql.Literal(f'"{schema}".lock_fences')
    return _QUERIES[name].format(s=ident, seq=seq, fences=fences, schema_text=sql.Literal(schema)).as_bytes(None)


def plant(conn: psycopg.Connection[Any], schema: str, function: str, old: str, new: str) -> None:
    """Replace `function` of `schema` with its live definition where `old` reads `new` (every
    occurrence): a planted change in the SQL side of a rule. `old` must be there."""
    (definition,) = conn.execute(
        "SELECT pg_get_functiondef(p.oid) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = %s AND p.proname = %s",
        (schema, function),
    ).fetchone()  # type: ignore[misc]
    assert old in definition, f"{old!r} is not in {schema}.{function}: the plant would change nothing"
    conn.execute(definition.replace(old, new))
    conn.commit()


def _grid(rng: random.Random, lo: int, hi: int) -> float:
    return NOW + 0.5 * rng.randint(lo, hi)


def random_job(rng: random.Random, *, states: Sequence[str] | None = None) -> dict[str, Any]:
    """A job's columns: any state, with the values a row in that state can carry (and a few
    it rarely does: a running row with no heartbeat, a pending one with a cancel request)."""
    state = rng.choice(states or ("available",) * 4 + ("running",) * 4 + ("scheduled", "retryable") + _FINAL_STATES)
    key = rng.choice(KEYS)
    rkey = rng.choice(RATE_KEYS) if rng.random() < 0.4 else None
    running = state == "running"
    parked = state == "available" and rng.random() < 0.5
    return {
        "queue": rng.choice(QUEUES),
        "state": state,
        "attempt": rng.randint(1, 4) if running else rng.randint(0, 4),
        "max_attempts": rng.randint(1, 4),
        "priority": rng.randint(0, 2),
        "run_at": _grid(rng, -20, 4),
        "finalized_at": _grid(rng, -40, -1) if state in _FINAL_STATES else None,
        "heartbeat_at": (None if rng.random() < 0.1 else _grid(rng, -40, 0)) if running else None,
        "failed_attempts": rng.randint(0, 2),
        "interrupted": rng.randint(0, 1),
        "cancel_requested": rng.random() < (0.4 if running else 0.05),
        "concurrency_key": key,
        "max_concurrent": None if key is None or rng.random() < 0.2 else rng.randint(1, 3),
        "parked": parked,
        "rate_wait": parked and rkey is not None and rng.random() < 0.5 or parked and rng.random() < 0.05,
        "rate_key": rkey,
        "rate_limit": None if rkey is None else rng.randint(1, 3),
        "rate_per": None if rkey is None else rng.choice(PERS),
    }


def with_parked(rng: random.Random, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`jobs` and a few more parked jobs of one key, most waiting for its slot: so a change
    that frees a place (or two) finds jobs to bring back, in an order that matters."""
    key = rng.choice(KEYS[1:])
    for _ in range(rng.randint(0, 4)):
        job = random_job(rng, states=("available",))
        rkey = rng.choice(RATE_KEYS[1:])
        job.update(concurrency_key=key, max_concurrent=rng.randint(1, 3), parked=True, rate_wait=rng.random() < 0.3,
                   rate_key=rkey, rate_limit=rng.randint(1, 3), rate_per=rng.choice(PERS))  # fmt: skip
        jobs.append(job)
    return jobs


def insert(conn: psycopg.Connection[Any], schema: str, jobs: Sequence[dict[str, Any]]) -> list[int]:
    """The jobs' rows, in order; their ids."""
    arrays = [[j[c] for j in jobs] for c in COLUMNS]
    casts = ", ".join(f"%s::{t}[]" for t in _TYPES)
    rows = conn.execute(
        f'INSERT INTO "{schema}".jobs (kind, args, created_at, {", ".join(COLUMNS)})'
        f" SELECT 'k', '{{}}', 0, {', '.join(COLUMNS)} FROM unnest({casts}) WITH ORDINALITY"
        f" AS u({', '.join(COLUMNS)}, o) ORDER BY o RETURNING id",
        arrays,
    ).fetchall()
    return [r[0] for r in rows]


def read(conn: psycopg.Connection[Any], schema: str) -> Rows:
    return {
        r[0]: Row(*r)
        for r in conn.execute(f'SELECT id, {", ".join(COLUMNS)} FROM "{schema}".jobs ORDER BY id').fetchall()
    }


def rate_records(conn: psycopg.Connection[Any], schema: str) -> dict[str, tuple[list[float], int, float, float]]:
    rows = conn.execute(f'SELECT key, starts, cap, per, last FROM "{schema}".rate_keys')
    return {k: (list(s), c, p, last) for k, s, c, p, last in rows}


def rate_wakes(conn: psycopg.Connection[Any], schema: str) -> dict[tuple[str, str], float]:
    return {(q, k): w for q, k, w in conn.execute(f'SELECT queue, key, wake FROM "{schema}".rate_wakes')}


def _claim_order(row: Row) -> tuple[int, float, int]:
    return -row.priority, row.run_at, row.id


def waits_for_slot(row: Row) -> bool:
    """Parked for its concurrency key's slot (not for its rate): what a freed slot brings back."""
    return row.state == "available" and row.parked and not row.rate_wait


def bring_back(rows: Rows, freed: collections.Counter[str]) -> list[int]:
    """Each key's best `freed[key]` jobs parked for its slot, in claim order, back in `rows`;
    their ids."""
    back: list[int] = []
    for key, n in freed.items():
        parked = sorted((r for r in rows.values() if r.concurrency_key == key and waits_for_slot(r)), key=_claim_order)
        for r in parked[:n]:
            rows[r.id] = r._replace(parked=False)
            back.append(r.id)
    return back


def diff(what: str, got: Any, want: Any, case: Any) -> list[str]:
    return [] if got == want else [f"{what}: SQL {got!r}, rule {want!r}; case {case!r}"]


def diff_rows(got: Rows, want: Rows, case: Any) -> list[str]:
    out: list[str] = []
    for i in sorted(set(got) | set(want)):
        if got.get(i) != want.get(i):
            out.append(f"row {i}: SQL {got.get(i)!r}, rule {want.get(i)!r}")
    return out + ([f"case {case!r}"] if out else [])


# -- rescue: `after_rescue`, and `unparks` for each row it moves out of `running` --


def check_rescue(
    conn: psycopg.Connection[Any],
    schema: str,
    rng: random.Random,
    *,
    after_rescue: Callable[..., rules.Next] = rules.after_rescue,
    unparks: Callable[..., int] = rules.unparks,
    query: bytes | None = None,
) -> list[str]:
    jobs = with_parked(rng, [random_job(rng) for _ in range(rng.randint(1, 14))])
    insert(conn, schema, jobs)
    start = read(conn, schema)
    before = NOW - 5
    rows = conn.execute(query or statement("rescue", schema), {"before": before, "now": NOW}).fetchall()
    got = read(conn, schema)
    conn.rollback()
    want = dict(start)
    freed: collections.Counter[str] = collections.Counter()
    rescued: dict[int, str] = {}
    for r in start.values():
        if r.state != "running" or (r.heartbeat_at is not None and r.heartbeat_at >= before):
            continue
        nxt = after_rescue(attempt=r.attempt, max_attempts=r.max_attempts, cancel_requested=r.cancel_requested, now=NOW)
        want[r.id] = r._replace(
            state=nxt.state.value,
            attempt=r.attempt + nxt.attempt_delta,
            run_at=r.run_at if nxt.run_at is None else nxt.run_at,
            finalized_at=NOW if nxt.state.final else None,
            heartbeat_at=None,
            failed_attempts=r.failed_attempts + nxt.failed,
            interrupted=r.interrupted + nxt.interrupted,
            parked=False,
        )
        rescued[r.id] = nxt.state.value
        if r.concurrency_key is not None:
            freed[r.concurrency_key] += unparks(JobState.RUNNING, nxt.state, parked=r.parked)
    back = bring_back(want, freed)
    case = (jobs, "rescue")
    return (
        diff_rows(got, want, case)
        + diff("rescued", {r[0]: r[2] for r in rows if r[0] is not None}, rescued, case)
        + diff("queues woken", {r[1] for r in rows if r[0] is None}, {want[i].queue for i in back}, case)
    )


# -- cancel: `on_cancel`, and `unparks` for the cancelled job --


def check_cancel(
    conn: psycopg.Connection[Any],
    schema: str,
    rng: random.Random,
    *,
    on_cancel: Callable[[JobState], rules.CancelAction] = rules.on_cancel,
    unparks: Callable[..., int] = rules.unparks,
    query: bytes | None = None,
) -> list[str]:
    jobs = with_parked(rng, [random_job(rng) for _ in range(rng.randint(1, 12))])
    ids = insert(conn, schema, jobs)
    # Half the time a keyed available job not parked: the one whose cancel hands its key's place on.
    keyed = [i for i, j in zip(ids, jobs) if j["concurrency_key"] is not None and j["state"] == "available" and not j["parked"]]
    target = rng.choice(keyed if keyed and rng.random() < 0.5 else ids)
    start = read(conn, schema)
    params = {"id": target, "now": NOW, "channel": "nj_rules_events", "jobs_channel": "nj_rules_jobs"}
    before_state, after_state, _message, _notified, changed, unparked, queue = conn.execute(
        query or statement("cancel", schema), params
    ).fetchone()  # type: ignore[misc]
    got = read(conn, schema)
    conn.rollback()
    r = start[target]
    want = dict(start)
    state = JobState(r.state)
    action = on_cancel(state)
    after = state
    if action is rules.CancelAction.REQUEST:
        want[target] = r._replace(cancel_requested=True)
    elif action is rules.CancelAction.CANCEL:
        after = JobState.CANCELLED
        want[target] = r._replace(state=after.value, finalized_at=NOW)
    freed: collections.Counter[str] = collections.Counter()
    if r.concurrency_key is not None:
        freed[r.concurrency_key] = unparks(state, after, parked=r.parked)
    back = bring_back(want, freed)
    case = (jobs, "cancel", target)
    return (
        diff_rows(got, want, case)
        + diff("states", (before_state, after_state), (state.value, after.value), case)
        + diff("changed", changed, want[target] != r, case)
        + diff("brought back", unparked, len(back), case)
        + diff("queue told", queue, min((want[i].queue for i in back), default=r.queue), case)
    )


# -- outcomes: `after_outcome` (the statement is generated from it) and `unparks` --


def check_finish(
    conn: psycopg.Connection[Any],
    schema: str,
    rng: random.Random,
    *,
    after_outcome: Callable[..., rules.Next] = rules.after_outcome,
    unparks: Callable[..., int] = rules.unparks,
    query: bytes | None = None,
) -> list[str]:
    jobs = with_parked(rng, [random_job(rng) for _ in range(rng.randint(1, 14))])
    insert(conn, schema, jobs)
    start = read(conn, schema)
    outcomes = []
    for r in start.values():
        if rng.random() < 0.8:
            kind = rng.choice(list(OutcomeKind))
            run_at = _grid(rng, -4, 8) if kind in (OutcomeKind.RETRY, OutcomeKind.SNOOZE) and rng.random() < 0.8 else None
            error = JobError(r.attempt, NOW, "boom") if rng.random() < 0.5 else None
            stale = rng.random() < 0.15
            outcomes.append(Outcome(r.id, r.attempt + (1 if stale else 0), kind, run_at, error))
    if not outcomes:
        conn.rollback()
        return []
    params = {
        "ids": _int_array([o.job_id for o in outcomes]),
        "outcomes": _outcomes_json(outcomes, NOW),
        "now": NOW,
        "jobs_channel": "nj_rules_jobs",
        "events_channel": "nj_rules_events",
    }
    rows = conn.execute(query or statement("finish", schema), params).fetchall()
    got = read(conn, schema)
    conn.rollback()
    want = dict(start)
    freed: collections.Counter[str] = collections.Counter()
    for o in outcomes:
        r = start[o.job_id]
        if r.state != "running" or r.attempt != o.attempt:
            continue
        nxt = after_outcome(o.kind, cancel_requested=r.cancel_requested, has_error=o.error is not None, run_at=o.run_at, now=NOW)
        want[r.id] = r._replace(
            state=nxt.state.value,
            attempt=r.attempt + nxt.attempt_delta,
            run_at=r.run_at if nxt.run_at is None else nxt.run_at,
            finalized_at=NOW if nxt.state.final else None,
            heartbeat_at=None,
            failed_attempts=r.failed_attempts + nxt.failed,
            interrupted=r.interrupted + nxt.interrupted,
            parked=False,
        )
        if r.concurrency_key is not None:
            freed[r.concurrency_key] += unparks(JobState.RUNNING, nxt.state, parked=r.parked)
    back = bring_back(want, freed)
    case = (jobs, outcomes)
    return diff_rows(got, want, case) + diff(
        "queues woken", {r[1] for r in rows if r[0] is None}, {want[i].queue for i in back}, case
    )


# -- unparking itself: each key's best parked jobs waiting for its slot, as many as asked --


def check_unpark(
    conn: psycopg.Connection[Any],
    schema: str,
    rng: random.Random,
    *,
    best: Callable[[Rows, collections.Counter[str]], list[int]] = bring_back,
) -> list[str]:
    """`unpark_keys_queues` (called by the outcome, rescue and cancel statements) and
    `unpark_keys` (by `rate_park`): the same jobs back, one queue per job."""
    jobs = [random_job(rng, states=("available",) * 6 + ("running", "scheduled", "completed")) for _ in range(rng.randint(1, 16))]
    jobs = with_parked(rng, jobs)
    insert(conn, schema, jobs)
    start = read(conn, schema)
    keys = [k for k in KEYS[1:] if rng.random() < 0.7]
    counts = [rng.randint(0, 3) for _ in keys]
    via_count = rng.random() < 0.5
    if via_count:
        (n,) = conn.execute(f'SELECT "{schema}".unpark_keys(%s::text[], %s::int[])', (keys, counts)).fetchone()  # type: ignore[misc]
        queues = None
    else:
        queues = sorted(q for (q,) in conn.execute(
            f'SELECT q FROM "{schema}".unpark_keys_queues(%s::text[], %s::int[]) AS q', (keys, counts)))  # fmt: skip
    got = read(conn, schema)
    conn.rollback()
    want = dict(start)
    back = best(want, collections.Counter(dict(zip(keys, counts))))
    case = (jobs, keys, counts)
    told = diff("brought back", n, len(back), case) if via_count else diff("queues", queues, sorted(want[i].queue for i in back), case)
    return diff_rows(got, want, case) + told


# -- a bounded queue's room: `PENDING` counted, `check_room` deciding --


def check_room(
    conn: psycopg.Connection[Any],
    schema: str,
    rng: random.Random,
    *,
    pending: Iterable[JobState] = rules.PENDING,
    room: Callable[[str, int, int | None], None] = rules.check_room,
    query: bytes | None = None,
) -> list[str]:
    jobs = [random_job(rng) for _ in range(rng.randint(0, 14))]
    insert(conn, schema, jobs)
    start = read(conn, schema)
    max_length = rng.randint(0, 8)
    params = {"queue": "q", "limit": max_length + 1}
    (counted,) = conn.execute(query or statement("count_pending", schema), params).fetchone()  # type: ignore[misc]
    conn.rollback()
    states = {s.value for s in pending}
    exact = sum(1 for r in start.values() if r.queue == "q" and r.state in states)

    def fits(n: int) -> bool:
        try:
            room("q", n, max_length)
        except QueueFull:
            return False
        return True

    case = (jobs, max_length)
    out = diff("fits", fits(counted), fits(exact), case)
    if exact <= max_length:  # below the bound the count is exact; above it, only "too many" is
        out += diff("pending", counted, exact, case)
    return out


# -- the rate window: `rate_release`, the parking of jobs refused for their rate, retention --


def _rate_state(conn: psycopg.Connection[Any], schema: str, rng: random.Random) -> None:
    """Records for some rate keys (ascending starts, some after NOW) and wake times for some
    (queue, key) pairs, some come."""
    for key in RATE_KEYS[1:]:
        if rng.random() < 0.8:
            starts = sorted(_grid(rng, -24, 4) for _ in range(rng.randint(0, 4)))
            conn.execute(
                f'INSERT INTO "{schema}".rate_keys (key, starts, cap, per, last) VALUES (%s, %s, %s, %s, %s)',
                (key, starts, max(len(starts), rng.randint(1, 4)), rng.choice(PERS), starts[-1] if starts else _grid(rng, -30, 0)),
            )
        for queue in QUEUES:
            if rng.random() < 0.6:
                conn.execute(
                    f'INSERT INTO "{schema}".rate_wakes (queue, key, wake) VALUES (%s, %s, %s)', (queue, key, _grid(rng, -6, 6))
                )


def _rate_parked_job(rng: random.Random, queue: str) -> dict[str, Any]:
    job = random_job(rng, states=("available",))
    job["queue"] = queue if rng.random() < 0.8 else job["queue"]
    key = rng.choice(RATE_KEYS[1:])
    parked = rng.random() < 0.7
    return {**job, "rate_key": key, "rate_limit": rng.randint(1, 3), "rate_per": rng.choice(PERS), "parked": parked,
            "rate_wait": parked and rng.random() < 0.8}  # fmt: skip


def check_rate_release(
    conn: psycopg.Connection[Any],
    schema: str,
    rng: random.Random,
    *,
    rate_release: Callable[..., tuple[int, float | None]] = rules.rate_release,
) -> list[str]:
    _rate_state(conn, schema, rng)
    queue = rng.choice(QUEUES)
    jobs = [_rate_parked_job(rng, queue) for _ in range(rng.randint(1, 14))] + [random_job(rng) for _ in range(rng.randint(0, 4))]
    insert(conn, schema, jobs)
    start, records, wakes = read(conn, schema), rate_records(conn, schema), rate_wakes(conn, schema)
    released, next_wake = conn.execute(
        f'SELECT released, next_wake FROM "{schema}".rate_release(%s, %s)', (queue, NOW)
    ).fetchone()  # type: ignore[misc]
    got, got_wakes = read(conn, schema), rate_wakes(conn, schema)
    conn.rollback()
    want, want_wakes = dict(start), dict(wakes)
    total = 0
    for (q, key), wake in wakes.items():
        if q != queue or wake > NOW:
            continue
        parked = sorted(
            (r for r in start.values() if r.queue == q and r.rate_key == key and r.state == "available" and r.parked and r.rate_wait),
            key=_claim_order,
        )
        starts = records[key][0] if key in records else []
        back, slot = rate_release(starts, ((r.rate_limit or 1, r.rate_per) for r in parked), NOW)
        for r in parked[:back]:
            want[r.id] = r._replace(parked=False, rate_wait=False)
        total += back
        if slot is None:
            del want_wakes[(q, key)]
        else:
            want_wakes[(q, key)] = slot
    case = (jobs, records, wakes, queue)
    return (
        diff_rows(got, want, case)
        + diff("wakes", got_wakes, want_wakes, case)
        + diff("released", released, total, case)
        + diff("next wake", next_wake, min((w for (q, _), w in want_wakes.items() if q == queue), default=None), case)
    )


def check_rate_park(
    conn: psycopg.Connection[Any],
    schema: str,
    rng: random.Random,
    *,
    admit_rated: Callable[..., rules.Admission] = rules.admit_rated,
    unparks: Callable[..., int] = rules.unparks,
) -> list[str]:
    """`rate_park(ids, queue, now)`: of the jobs a claim of `queue` passed over for their rate,
    those still due, pending and unparked that their rate refuses now (`admit_rated` on the job
    alone), or whose key's wake time in the queue has come (they queue behind the key's parked
    ones), are parked for their rate; the key's wake is kept at the earliest of their slots (a
    come wake: now), its record sized for them (`rate_sized`), and each one with a concurrency
    key hands its key's place on (`unparks`)."""
    _rate_state(conn, schema, rng)
    jobs = [random_job(rng, states=_PENDING_STATES + ("available",) * 3 + ("running",)) for _ in range(rng.randint(1, 12))]
    queue = rng.choice(QUEUES)
    for j in jobs:
        if rng.random() < 0.7:
            j.update(rate_key=rng.choice(RATE_KEYS[1:]), rate_limit=rng.randint(1, 3), rate_per=rng.choice(PERS))
        if rng.random() < 0.7:
            j["queue"] = queue
    jobs = with_parked(rng, jobs)
    ids = insert(conn, schema, jobs)
    start, records, wakes = read(conn, schema), rate_records(conn, schema), rate_wakes(conn, schema)
    passed = [i for i in ids if rng.random() < 0.7]
    (armed,) = conn.execute(f'SELECT "{schema}".rate_park(%s::bigint[], %s, %s)', (passed, queue, NOW)).fetchone()  # type: ignore[misc]
    got, got_records, got_wakes = read(conn, schema), rate_records(conn, schema), rate_wakes(conn, schema)
    conn.rollback()
    want, want_records, want_wakes = dict(start), dict(records), dict(wakes)
    slots: dict[str, float] = {}
    sized: dict[str, tuple[int, float]] = {}
    freed: collections.Counter[str] = collections.Counter()
    for i in passed:
        r = start[i]
        if r.queue != queue or r.state not in _PENDING_STATES or r.parked or r.run_at > NOW or r.rate_key is None:
            continue
        if r.rate_per is None:
            continue
        rkey = r.rate_key
        verdict = admit_rated([(None, None, rkey, r.rate_limit, r.rate_per)], {}, {rkey: records.get(rkey, ([],))[0]}, want=1, now=NOW)
        come = (queue, rkey) in wakes and wakes[(queue, rkey)] <= NOW
        if verdict.started and not come:
            continue
        slot = NOW if verdict.started or verdict.rate_next is None else verdict.rate_next
        want[i] = r._replace(state="available", parked=True, rate_wait=True)
        slots[rkey] = min(slot, slots.get(rkey, slot))
        most, longest = sized.get(rkey, (1, 0.0))
        sized[rkey] = max(most, r.rate_limit or 1), max(longest, r.rate_per)
        if r.concurrency_key is not None:
            freed[r.concurrency_key] += unparks(JobState(r.state), JobState.AVAILABLE, parked=False, parks=True)
    for rkey, slot in slots.items():
        want_wakes[(queue, rkey)] = min(slot, want_wakes.get((queue, rkey), slot))
        if rkey in want_records:
            starts, cap, per, last = want_records[rkey]
            want_records[rkey] = (starts, max(cap, sized[rkey][0]), max(per, sized[rkey][1]), last)
    bring_back(want, freed)
    case = (jobs, records, wakes, queue, passed)
    return (
        diff_rows(got, want, case)
        + diff("wakes", got_wakes, want_wakes, case)
        + diff("records", got_records, want_records, case)
        + diff("armed", armed, min((want_wakes[(queue, k)] for k in slots), default=None), case)
    )


def check_rate_idle(
    conn: psycopg.Connection[Any],
    schema: str,
    rng: random.Random,
    *,
    rate_idle: Callable[[float, float, float], bool] = rules.rate_idle,
    query: bytes | None = None,
) -> list[str]:
    """Retention (`delete_finished`) drops a rate key's record when `rate_idle` says it
    constrains nothing, at most `limit` of them, and never another."""
    records = {}
    for i in range(rng.randint(0, 12)):
        starts = sorted(_grid(rng, -30, 4) for _ in range(rng.randint(0, 3)))
        per = rng.choice(PERS)
        if rng.random() < 0.3:
            starts = [*[t for t in starts if t < NOW - per], NOW - per]  # exactly its window old
        last = starts[-1] if starts and rng.random() < 0.8 else _grid(rng, -30, 4)
        records[f"k{i}"] = (starts, rng.randint(1, 3), per, last)
        conn.execute(f'INSERT INTO "{schema}".rate_keys (key, starts, cap, per, last) VALUES (%s, %s, %s, %s, %s)',
                     (f"k{i}", *records[f"k{i}"]))  # fmt: skip
    limit = rng.randint(1, 10)
    params = {"states": [], "befores": [], "limit": limit, "now": NOW}
    conn.execute(query or statement("delete_finished", schema), params)
    got = rate_records(conn, schema)
    conn.rollback()
    idle = {k for k, (_, _, per, last) in records.items() if rate_idle(last, per, NOW)}
    dropped = set(records) - set(got)
    case = (records, limit)
    return diff("dropped", dropped <= idle and len(dropped) == min(limit, len(idle)), True, (dropped, idle, case))


# -- the rescuer's repair: `parked_can_start` --


def check_repair(
    conn: psycopg.Connection[Any],
    schema: str,
    rng: random.Random,
    *,
    parked_can_start: Callable[[int, int | None], bool] = rules.parked_can_start,
) -> list[str]:
    """`repair_parked()`: per concurrency key with jobs parked for its slot, the best one comes
    back if `parked_can_start` says the key has a free slot for it; a parked job with no key
    always comes back (nothing limits it); a rate flag with no rate key means nothing (such a
    job is parked for its slot, and its flag is cleared when it comes back); each (queue, rate
    key) with jobs parked for their rate and no wake time wakes now."""
    _rate_state(conn, schema, rng)
    jobs = [random_job(rng, states=("available",) * 3 + ("running",)) for _ in range(rng.randint(1, 16))]
    for j in jobs:
        if j["state"] == "available" and rng.random() < 0.7:
            j["parked"] = True
            j["rate_wait"] = j["rate_key"] is not None and rng.random() < 0.4 or rng.random() < 0.05
    insert(conn, schema, jobs)
    start, wakes = read(conn, schema), rate_wakes(conn, schema)
    queues = sorted(q for (q,) in conn.execute(f'SELECT queue FROM "{schema}".repair_parked()'))
    got, got_wakes = read(conn, schema), rate_wakes(conn, schema)
    conn.rollback()
    want, want_wakes = dict(start), dict(wakes)
    told: list[str] = []

    def for_slot(r: Row) -> bool:
        return r.state == "available" and r.parked and (not r.rate_wait or r.rate_key is None)

    for r in start.values():
        if for_slot(r) and r.concurrency_key is None:
            want[r.id] = r._replace(parked=False, rate_wait=False)
            told.append(r.queue)
    for key in KEYS[1:]:
        parked = sorted((r for r in start.values() if r.concurrency_key == key and for_slot(r)), key=_claim_order)
        if not parked:
            continue
        running = sum(1 for r in start.values() if r.concurrency_key == key and r.state == "running")
        head = parked[0]
        if parked_can_start(running, head.max_concurrent):
            want[head.id] = head._replace(parked=False, rate_wait=False)
            told.append(head.queue)
    for q, rkey in sorted({(r.queue, r.rate_key) for r in start.values()
                           if r.state == "available" and r.parked and r.rate_wait and r.rate_key is not None}):  # fmt: skip
        if (q, rkey) not in want_wakes:
            want_wakes[(q, rkey)] = 0.0
            told.append(q)
    case = (jobs, wakes)
    return diff_rows(got, want, case) + diff("wakes", got_wakes, want_wakes, case) + diff("queues", queues, sorted(told), case)


# -- the claim's parking: `key_admits` --


def check_claim_parks(
    conn: psycopg.Connection[Any],
    schema: str,
    rng: random.Random,
    *,
    key_admits: Callable[[int, int | None], bool] = rules.key_admits,
    query: bytes | None = None,
) -> list[str]:
    """The claim statement parks each keyed job its scan passes over because its key does not
    admit it (`key_admits` on the key's running jobs): the scan reads the due unparked jobs in
    claim order up to the one after its `limit`-th admissible one. (Which jobs start is
    `claim_picked`'s, against `admit`: test_keyed_admission.py.)"""
    jobs = [random_job(rng, states=("available",) * 3 + ("running",) * 2 + ("completed",)) for _ in range(rng.randint(1, 16))]
    for j in jobs:
        j.update(rate_key=None, rate_limit=None, rate_per=None, rate_wait=False)
    insert(conn, schema, jobs)
    start = read(conn, schema)
    limit = rng.randint(1, 4)
    conn.execute(query or statement("claim", schema), {"now": NOW, "queue": "q", "limit": limit}).fetchall()
    got = read(conn, schema)
    conn.rollback()
    running = collections.Counter(r.concurrency_key for r in start.values() if r.state == "running")
    due = sorted((r for r in start.values() if r.queue == "q" and r.state == "available" and not r.parked and r.run_at <= NOW),
                 key=_claim_order)  # fmt: skip
    parked, free = set(), 0
    for r in due:
        admits = r.concurrency_key is None or key_admits(running[r.concurrency_key], r.max_concurrent)
        free += admits
        if free > limit:
            break
        if not admits:
            parked.add(r.id)
    case = (jobs, limit)
    return diff("parked", {i for i, r in got.items() if r.parked and not start[i].parked}, parked, case)


CHECKS: dict[str, Callable[..., list[str]]] = {
    "claim_parks": check_claim_parks,
    "rescue": check_rescue,
    "cancel": check_cancel,
    "finish": check_finish,
    "unpark": check_unpark,
    "room": check_room,
    "rate_release": check_rate_release,
    "rate_park": check_rate_park,
    "rate_idle": check_rate_idle,
    "repair": check_repair,
}


def run(check: Callable[..., list[str]], pg_url: str, schema: str, seed: int, cases: int, **planted: Any) -> list[str]:
    """`check` on `cases` random states; the differences of the first case that had any."""
    rng = random.Random(seed)
    with psycopg.connect(pg_url) as conn:
        for _ in range(cases):
            found = check(conn, schema, rng, **planted)
            if found:
                return found
    return []
