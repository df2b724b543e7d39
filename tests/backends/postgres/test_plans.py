"""The hot statements keep their plan whatever the table's statistics say.

The runtime prepares its statements and runs them on their generic plan (`POOL_SESSION`), made
from whatever statistics autovacuum last gathered. Each statement here is prepared exactly as
the backend sends it and explained on its generic plan, on an analyzed table of 1k, 100k and 1M
rows in production's shape (99 % completed, 1 % available) with thousands of rows `running`
that the statistics do not know about (they were analyzed before the rows started), and again
once the statistics do know. Every plan must reach its rows through the index meant for it and
never scan the table, read an index whole, merge-join, or loop one list against another. (The
failure this guards: the outcome statement looped 4,000 outcomes against 8,000 running rows
through the rescuer's index, 11 s, where the primary key takes 20 ms.)

A connection keeps its plans, so the same holds for plans made while the table held 0 or 200
rows and was analyzed in that state, then run once it has grown: the statements that update
rows they name take them by primary key (`id = ANY(...)`) and join no list against the table.

And the runtime really runs them that way: after a few calls, every statement of the backend's
pool connection shows generic plans only, so no claim is planned again per call.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

import psycopg
import pytest
import trio
from psycopg import sql

from nursery_jobs.backends import NewJob, Outcome, OutcomeKind
from nursery_jobs.backends.postgres import _QUERIES, POOL_SESSION, PostgresBackend, _attempt_keys, _int_array, _outcomes_json
from nursery_jobs.rules import PARK_AT_ONCE
from tests import pgutil

SIZES = [1_000, 100_000, 1_000_000]
RUNNING = 8_000
OUTCOMES = 4_000
CLAIM_LIMIT = 100


def _render(name: str, schema: str) -> str:
    query = _QUERIES[name].format(s=sql.Identifier(schema), seq=sql.Literal(f'"{schema}".jobs_id_seq'))
    return query.as_string(None)


def _to_dollars(text: str) -> tuple[str, list[str]]:
    """psycopg placeholders (%(name)s or %s) as $n, and the order of the names."""
    names: list[str] = []
    counter = iter(range(1, 1000))

    def named(m: re.Match[str]) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    if "%(" in text:
        return re.sub(r"%\((\w+)\)s", named, text), names
    return re.sub(r"%s", lambda m: f"${next(counter)}", text), names


def _walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from _walk(child)


def explain_generic(conn: psycopg.Connection[Any], name: str, schema: str, params: Any) -> dict[str, Any]:
    """EXPLAIN ANALYZE of statement `name` on its generic plan, with `params` (a list for
    positional placeholders, a dict for named ones; rolled back)."""
    text, names = _to_dollars(_render(name, schema))
    args = [params[n] for n in names] if isinstance(params, dict) else list(params)
    plan: Any = None
    with conn.transaction(force_rollback=True):  # the statement's effects are undone
        for setting, value in POOL_SESSION.items():
            conn.execute(f"SET LOCAL {setting} = {value}")
        # Typed as psycopg sends them (str as unknown: the query's own casts type it).
        types = ", ".join({float: "float8", int: "bigint"}.get(type(a), "unknown") for a in args)
        conn.execute(f"PREPARE plan_probe ({types}) AS {text}")
        literals = sql.SQL(", ").join(sql.Literal(a) for a in args)
        (plan,) = conn.execute(
            sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE plan_probe({})").format(literals)
        ).fetchone()  # type: ignore[misc]
        conn.execute("DEALLOCATE plan_probe")
    doc = plan if isinstance(plan, list) else json.loads(plan)
    return doc[0]  # type: ignore[no-any-return]


class Table:
    """One schema, grown through SIZES; rows: 99 % completed, 1 % available, then RUNNING more."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.schema = pgutil.new_schema(url)
        self.conn = psycopg.connect(url, autocommit=True)
        self.size = 0

    def grow(self, size: int) -> None:
        table = sql.SQL("{}.jobs").format(sql.Identifier(self.schema))
        self.conn.execute(
            sql.SQL(
                "INSERT INTO {} (kind, queue, args, state, max_attempts, priority, run_at, created_at, finalized_at)"
                " SELECT 'noop', 'q', '{{}}', CASE WHEN g %% 100 = 0 THEN 'available' ELSE 'completed' END, 25, 0,"
                "  g, g, CASE WHEN g %% 100 = 0 THEN NULL ELSE g END FROM generate_series(%s::bigint, %s::bigint) g"
            ).format(table),
            (self.size + 1, size),
        )
        self.size = size

    def analyze(self) -> None:
        self.conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(sql.Identifier(self.schema)))

    def start_running(self, n: int) -> list[int]:
        """Make `n` completed rows `running` (attempt 1, an old heartbeat): jobs in flight."""
        rows = self.conn.execute(
            sql.SQL(
                "UPDATE {}.jobs SET state = 'running', attempt = 1, heartbeat_at = 1.0, finalized_at = NULL"
                " WHERE id IN (SELECT id FROM {}.jobs WHERE state = 'completed' ORDER BY id LIMIT %s) RETURNING id"
            ).format(sql.Identifier(self.schema), sql.Identifier(self.schema)),
            (n,),
        ).fetchall()
        return sorted(r[0] for r in rows)

    def stop_running(self) -> None:
        self.conn.execute(
            sql.SQL("UPDATE {}.jobs SET state = 'completed', finalized_at = 2.0, heartbeat_at = NULL WHERE state = 'running'").format(
                sql.Identifier(self.schema)
            )
        )


@pytest.fixture(scope="module")
def table(pg_url: str) -> Iterator[Table]:
    t = Table(pg_url)
    try:
        yield t
    finally:
        t.conn.close()


def _statements(schema: str, running: list[int]) -> dict[str, list[Any]]:
    ids = running[:OUTCOMES]
    return {
        "claim": {"now": 1e12, "queue": "q", "limit": CLAIM_LIMIT},
        "claim_lean": {"now": 1e12, "queue": "q", "limit": CLAIM_LIMIT},
        "finish": {
            "ids": _int_array(ids),
            "outcomes": _outcomes_json([Outcome(i, 1, OutcomeKind.COMPLETED) for i in ids], 1e12),
            "now": 1e12,
            "jobs_channel": f"{schema}_jobs",
            "events_channel": f"{schema}_events",
        },
        "heartbeat": [1e12, _int_array(ids), _attempt_keys([(i, 1) for i in ids])],
        "rescue": {"before": 0.5, "now": 1e12},  # nothing stale: the scan must still not touch the table
        "cancel": {"id": running[0], "now": 1e12, "channel": f"{schema}_events", "jobs_channel": f"{schema}_jobs"},
        "delete_finished": {"states": "{completed,cancelled,discarded}", "befores": "{50.0,50.0,50.0}", "limit": 1000, "now": 1e12},
        "count_pending": {"queue": "q", "limit": 101},  # a bounded enqueue's count, under the queue's lock
    }


# Indexes each statement may use, and the ones it must use.
ALLOWED = {
    # Rate keys (migration 0010): the probe of a keyed row's record; and the probe of its key's
    # wake time, and the queue's earliest one (migration 0014).
    "claim": {"jobs_available", "jobs_waiting", "jobs_pkey", "jobs_running_key", "rate_keys_pkey", "rate_wakes_pkey"},
    # The lean claim: the queue's earliest waiting row and rate wake time, then its scan, with
    # the probe of a keyed row's running count.
    "claim_lean": {"jobs_available", "jobs_waiting", "jobs_pkey", "jobs_running_key", "rate_wakes_pkey"},
    "finish": {"jobs_pkey"},
    "heartbeat": {"jobs_pkey"},
    "rescue": {"jobs_running", "jobs_running_unbeaten", "jobs_pkey"},
    "cancel": {"jobs_pkey"},
    "delete_finished": {"jobs_finalized", "jobs_pkey", "rate_keys_pkey"},
    # The pending rows' partial indexes: unparked available, parked (migration 0012), waiting.
    "count_pending": {"jobs_available", "jobs_parked_queue", "jobs_waiting"},
}
UNCONDITIONED = {"jobs_running_unbeaten"}
"""The one index a statement may read whole: running rows without a heartbeat, normally none."""
REQUIRED = {
    "finish": {"jobs_pkey"},
    "heartbeat": {"jobs_pkey"},
    "claim": {"jobs_available"},
    "claim_lean": {"jobs_available"},
    "delete_finished": {"jobs_finalized"},
    "count_pending": {"jobs_available", "jobs_parked_queue", "jobs_waiting"},
}


def _check(name: str, plan: dict[str, Any], size: int, *, small_plan: bool = False) -> None:
    """Assert that `plan` of statement `name` on a table of `size` rows reaches its rows only
    through the indexes made for it. `small_plan`: the plan was made on a small table, so even
    a small `size` must not be read whole."""
    nodes = list(_walk(plan["Plan"]))
    on_jobs = [n for n in nodes if n.get("Relation Name") == "jobs"]
    used = {n["Index Name"] for n in nodes if "Index Name" in n}  # bitmap index scans name no relation
    scans = [n["Node Type"] for n in on_jobs]
    where = f"{name} at {size:,} rows: {scans} via {sorted(used)}"
    assert used <= ALLOWED[name], where
    if size >= 100_000 or small_plan:  # a table of a few pages is read whole, rightly
        assert "Seq Scan" not in scans, where
        assert REQUIRED.get(name, set()) <= used, where
    assert not any(n.get("Rows Removed by Join Filter", 0) for n in nodes), f"{where}: a join loops a list"
    assert not any(n["Node Type"] == "Merge Join" for n in nodes), f"{where}: a merge join walks an index whole"
    for n in nodes:
        if "Index Name" in n and n["Index Name"] not in UNCONDITIONED:
            assert "Index Cond" in n, f"{where}: {n['Index Name']} read whole"
        if n.get("Relation Name") == "jobs" and n.get("Actual Loops", 1) > 1:
            # A scan repeated per row of another list may only be a probe by that row's key.
            assert "Index Cond" in n, f"{where}: {n['Node Type']} of jobs looped {n['Actual Loops']} times"
    if name in ("claim", "claim_lean"):
        # The available rows come off `jobs_available` in claim order, as far as the claim may
        # read (its limit, PARK_AT_ONCE more, and the row that stops the scan; the lean claim
        # its limit): never all of them, collected by a bitmap scan and sorted.
        bound = CLAIM_LIMIT + PARK_AT_ONCE + 1 if name == "claim" else CLAIM_LIMIT
        for n in nodes:
            if n.get("Index Name") == "jobs_available":
                assert n["Node Type"] == "Index Scan", f"{where}: {n['Node Type']} of jobs_available"
                assert n["Actual Rows"] <= bound, f"{where}: jobs_available read {n['Actual Rows']} rows"
    # Each outcome or heartbeat costs a few buffers (its index probe, its row, the new row
    # version's index entries: ~15 measured), never a walk over other rows.
    if name in ("finish", "heartbeat"):
        hit = sum(n.get("Shared Hit Blocks", 0) + n.get("Shared Read Blocks", 0) for n in on_jobs)
        assert hit <= 30 * OUTCOMES, f"{where}: {hit} buffers for {OUTCOMES} rows"


@pytest.mark.parametrize("size", SIZES)
def test_every_hot_statement_keeps_its_plan_under_stale_and_fresh_statistics(table: Table, size: int) -> None:
    table.grow(size)
    table.analyze()  # statistics gathered with no row running
    running = table.start_running(min(RUNNING, size // 2))
    try:
        for name, args in _statements(table.schema, running).items():
            _check(name, explain_generic(table.conn, name, table.schema, args), size)
        table.analyze()  # and once the statistics know about the running rows
        for name, args in _statements(table.schema, running).items():
            _check(name, explain_generic(table.conn, name, table.schema, args), size)
    finally:
        table.stop_running()


def test_the_claim_reads_its_rows_in_order_when_a_tenth_of_the_table_is_available(pg_url: str) -> None:
    """A backlog beside the finished rows retention keeps: 100,000 `completed` rows, then
    10,000 `available` ones (9 %), analyzed; then halfway through a drain (2,000 taken and
    finished, their `jobs_available` entries dead at the front of the index, not vacuumed);
    then put back (the drained rows deleted, as many added) and vacuumed and analyzed again.
    At each moment the claim's generic plan must read the available rows in claim order and
    stop. (The failure this guards, issue 8's slow drain: priced as if it read every available
    row, the claim's scan cost within 1 % of a bitmap scan of them all and a sort, and on this
    shape the sort won: every claim of 96 read and sorted 100,000 rows on disk, ~100 ms, and
    the runtime drained 1,200 jobs/s against a hand-written loop's 15,000.)"""
    t = Table(pg_url)
    jobs = sql.SQL("{}.jobs").format(sql.Identifier(t.schema))
    try:
        t.conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(jobs))

        def add(n: int, state: str, run_at: float) -> None:
            t.conn.execute(
                sql.SQL(
                    "INSERT INTO {} (kind, queue, args, state, attempt, max_attempts, priority, run_at, created_at, finalized_at)"
                    " SELECT 'noop', 'q', '{{}}', %s, 0, 25, 0, %s + g, %s + g,"
                    "  CASE WHEN %s = 'completed' THEN %s + g END FROM generate_series(1, %s) g"
                ).format(jobs),
                (state, run_at, run_at, state, run_at, n),
            )

        add(100_000, "completed", 0.0)
        add(10_000, "available", 200_000.0)
        t.analyze()
        args = _statements(t.schema, [1])["claim"]

        def check() -> None:
            for name in ("claim", "claim_lean"):
                _check(name, explain_generic(t.conn, name, t.schema, args), 110_000)

        check()
        t.conn.execute(
            sql.SQL(
                "UPDATE {} SET state = 'completed', attempt = 1, finalized_at = 1.0 WHERE id IN (SELECT id FROM {}"
                " WHERE state = 'available' ORDER BY priority DESC, run_at, id LIMIT 2000)"
            ).format(jobs, jobs)
        )
        check()
        t.conn.execute(sql.SQL("DELETE FROM {} WHERE state = 'completed' AND finalized_at = 1.0").format(jobs))
        add(2_000, "available", 300_000.0)
        t.conn.execute(sql.SQL("VACUUM (ANALYZE, INDEX_CLEANUP ON) {}").format(jobs))
        check()
    finally:
        t.conn.close()


async def test_the_runtime_runs_its_statements_on_generic_plans(pg_url: str) -> None:
    backend = PostgresBackend(pg_url, schema=pgutil.new_schema(pg_url))
    await backend.open()
    try:
        for _ in range(6):
            await backend.insert_many([NewJob("noop", "q", "{}", 0, None, 25) for _ in range(3)])
            claimed = await backend.claim("q", 10)
            await backend.heartbeat([(j.id, j.attempt) for j in claimed.jobs])
            await backend.finish_many([Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in claimed.jobs])
            await backend.rescue(backend.now() - 3600)

        async def prepared(conn: Any) -> list[tuple[str, int, int]]:
            cur = await conn.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
            return list(await cur.fetchall())

        # claims and heartbeats run on the pool's asynchronous-commit connection, the rest on a durable one
        seen = await backend._run(prepared) + await backend._run(prepared, durable=False)
    finally:
        await backend.close()
    ours = [(text, generic, custom) for text, generic, custom in seen if "jobs" in text]
    assert ours, seen
    assert all(custom == 0 for _, _, custom in ours), [(t[:60], g, c) for t, g, c in ours]
    claims = [g for text, g, _ in ours if "FOR UPDATE SKIP LOCKED" in text and "claimed AS" in text]
    assert claims and max(claims) >= 3, ours  # prepared once, then reused (the lean claim; the full one runs less)
    beats = [g for text, g, _ in ours if text.lstrip().startswith("UPDATE") and "heartbeat_at = $1" in text]
    assert beats and max(beats) >= 3, ours
    _ = trio  # the module runs under pytest-trio


class CachedPlans:
    """Statements prepared on one connection and planned (generic plans, `POOL_SESSION`) while
    the table held `small_rows` rows and was analyzed in that state; autovacuum is off on the
    table, so no analyze can replan them behind the test's back."""

    def __init__(self, url: str, small_rows: int, names: list[str]) -> None:
        self.table = Table(url)
        self.conn = self.table.conn
        schema = self.table.schema
        self.conn.execute(sql.SQL("ALTER TABLE {}.jobs SET (autovacuum_enabled = false)").format(sql.Identifier(schema)))
        self.table.grow(small_rows)
        self.table.analyze()
        for setting, value in POOL_SESSION.items():
            self.conn.execute(f"SET {setting} = {value}")
        self.names = {name: _to_dollars(_render(name, schema))[1] for name in names}
        for name in names:
            text, _ = _to_dollars(_render(name, schema))
            args = self._args(name, _statements(schema, [1])[name])
            types = ", ".join({float: "float8", int: "bigint"}.get(type(a), "unknown") for a in args)
            self.conn.execute(f"PREPARE cached_{name} ({types}) AS {text}")
            with self.conn.transaction(force_rollback=True):  # the generic plan is made here, on the small table
                self.execute(name, _statements(schema, [1])[name])

    def _args(self, name: str, params: Any) -> list[Any]:
        return [params[n] for n in self.names[name]] if isinstance(params, dict) else list(params)

    def _call(self, name: str, params: Any) -> sql.Composed:
        literals = sql.SQL(", ").join(sql.Literal(a) for a in self._args(name, params))
        return sql.SQL("EXECUTE {}({})").format(sql.Identifier(f"cached_{name}"), literals)

    def execute(self, name: str, params: Any) -> list[tuple[Any, ...]]:
        """Run the cached statement for real."""
        return self.conn.execute(self._call(name, params)).fetchall()

    def explain(self, name: str, params: Any) -> dict[str, Any]:
        """EXPLAIN ANALYZE of the cached statement (rolled back)."""
        with self.conn.transaction(force_rollback=True):
            (plan,) = self.conn.execute(
                sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}").format(self._call(name, params))
            ).fetchone()  # type: ignore[misc]
        doc = plan if isinstance(plan, list) else json.loads(plan)
        return doc[0]  # type: ignore[no-any-return]


# The claim holds on a 0- and a 200-row table (on 200 rows it read its available rows through
# `jobs_due` and sorted them until migration 0005 dropped that index).
@pytest.mark.parametrize("small_rows", [0, 200])
def test_a_plan_made_when_the_table_was_small_still_holds_when_it_grows(pg_url: str, small_rows: int) -> None:
    """A pooled connection keeps its prepared plans: one made on a nearly empty or empty table
    (a fresh deploy; a queue drained and then analyzed by autovacuum) is still in use when a
    backlog of 200,000 jobs arrives, until autovacuum's next analyze. It must not have read the
    small table whole, nor joined a list against it. (The failure this guards: the claim, planned
    on an analyzed empty table, joined the picked ids against a full scan of the primary key,
    ~0.3 s per claim of 100 once 10,000 jobs were waiting.)"""
    cached = CachedPlans(pg_url, small_rows, ["claim", "claim_lean"])
    try:
        cached.table.grow(200_000)  # no analyze: the statistics still describe the small table
        running = cached.table.start_running(RUNNING)
        for name in ("claim", "claim_lean"):
            _check(name, cached.explain(name, _statements(cached.table.schema, running)[name]), 200_000)
    finally:
        cached.conn.close()


@pytest.mark.parametrize("small_rows", [0, 200])
def test_outcomes_heartbeats_rescues_cancels_and_retention_hold_a_plan_made_on_a_small_table(
    pg_url: str, small_rows: int
) -> None:
    """The same trap for every other hot statement: planned while the table held 0 or 200 rows,
    then run with 8,000 rows `running`, 4,000 outcomes and the heartbeat of the other 4,000.
    Each must reach its rows by the index made for it, whatever the plan was made on. (The
    failures this guards, each until the table's next analyze: the outcome and heartbeat
    statements walked the whole primary key for `running` rows and looped their id list
    against each, 7-18 s for 4,000 outcomes; the rescuer walked the whole primary key twice
    and a cancel once, 0.1-0.2 s a call at 200,000 rows, growing with the table.) And the
    statements still do what they did: each outcome lands under its attempt only, each
    heartbeat renews only the attempt it names."""
    names = ["finish", "heartbeat", "rescue", "cancel", "delete_finished", "count_pending"]
    cached = CachedPlans(pg_url, small_rows, names)
    table, conn = cached.table, cached.conn
    jobs = sql.SQL("{}.jobs").format(sql.Identifier(table.schema))
    try:
        table.grow(small_rows + 12_000)  # no analyze: the statistics still describe the small table
        running = table.start_running(RUNNING)
        params = _statements(table.schema, running)
        beats = running[OUTCOMES:]
        params["heartbeat"] = [1e12, _int_array(beats), _attempt_keys([(i, 1) for i in beats])]
        params["rescue"] = {"before": 2.0, "now": 1e12}  # every running row is stale
        for name in names:
            _check(name, cached.explain(name, params[name]), table.size, small_plan=True)

        # For real: outcomes for the first half (one under a stale attempt), heartbeats for the
        # second (one under a stale attempt), then the rescuer takes what was not renewed.
        stale_outcome, stale_beat = running[0], running[-1]
        outcomes = [Outcome(i, 2 if i == stale_outcome else 1, OutcomeKind.COMPLETED) for i in running[:OUTCOMES]]
        done = cached.execute("finish", dict(params["finish"], outcomes=_outcomes_json(outcomes, 1e12)))
        assert sorted(r[0] for r in done) == running[1:OUTCOMES]
        assert {r[2] for r in done} == {"completed"}
        pairs = [(i, 2 if i == stale_beat else 1) for i in beats]
        renewed = cached.execute("heartbeat", [1e12, _int_array(beats), _attempt_keys(pairs)])
        assert sorted(r[0] for r in renewed) == beats[:-1]
        rescued = cached.execute("rescue", params["rescue"])
        assert sorted(r[0] for r in rescued) == [stale_outcome, stale_beat]
        states = dict(
            conn.execute(
                sql.SQL("SELECT state, count(*) FROM {} WHERE id = ANY(%s) GROUP BY state").format(jobs), (running,)
            ).fetchall()
        )
        assert states == {"completed": OUTCOMES - 1, "running": RUNNING - OUTCOMES - 1, "available": 2}
        (cancel,) = cached.execute("cancel", dict(params["cancel"], id=beats[0]))
        assert cancel[:2] == ("running", "running") and cancel[4]
    finally:
        conn.close()


def test_the_claim_reads_its_own_index_on_a_table_never_analyzed(pg_url: str) -> None:
    """A fresh deploy: a backlog arrives before the table was ever analyzed (autovacuum is off
    on this one, so it cannot happen during the test). The planner then knows nothing of the
    rows and prices each index by its size alone. With `jobs_due` (queue, run_at) over every
    pending row (migration 0001; 0005 drops it), narrower than `jobs_available`, the claim's
    generic plan read the whole backlog of the `default` queue through it and sorted it for the
    best 10: 50,000 rows and ~1,000 buffers for a claim of 10 jobs. Only `jobs_available`
    holds the available rows now, in claim order."""
    fresh = Table(pg_url)
    try:
        jobs = sql.SQL("{}.jobs").format(sql.Identifier(fresh.schema))
        fresh.conn.execute(sql.SQL("ALTER TABLE {} SET (autovacuum_enabled = false)").format(jobs))
        fresh.conn.execute(
            sql.SQL(
                "INSERT INTO {} (kind, queue, args, state, max_attempts, priority, run_at, created_at)"
                " SELECT 'noop', 'default', '{{}}', 'available', 25, 0, g, g FROM generate_series(1, 50000) g"
            ).format(jobs)
        )
        plan = explain_generic(fresh.conn, "claim", fresh.schema, {"now": 1e12, "queue": "default", "limit": 10})
        nodes = list(_walk(plan["Plan"]))
        used = {n["Index Name"] for n in nodes if "Index Name" in n}
        read = [(n["Node Type"], n.get("Index Name"), n["Actual Rows"]) for n in nodes if n.get("Relation Name") == "jobs"]
        assert used <= ALLOWED["claim"] and "jobs_available" in used, read
        assert all(rows <= 100 for _, _, rows in read), f"the claim of 10 jobs read the backlog: {read}"
    finally:
        fresh.conn.close()


@pytest.mark.parametrize("size", [1_000, 200_000])
def test_the_claim_with_concurrency_keys_keeps_its_plan(pg_url: str, size: int) -> None:
    """Keyed backlogs (migration 0006): the available rows carry 1,000 keys, 500 of those keys
    have a job running. The claim passes over the busy keys with one probe of `jobs_running_key`
    per keyed row it meets, under a global limit or not, and `claim_picked_parking` (its locks, counts
    and update, called by the claim statement) touches a few buffers per job, never the table: with
    statistics gathered before any row ran and again after."""
    keyed = Table(pg_url)
    try:
        jobs = sql.SQL("{}.jobs").format(sql.Identifier(keyed.schema))
        keyed.grow(size)
        keyed.conn.execute(
            sql.SQL("UPDATE {} SET concurrency_key = 'k' || (id / 100 % 1000), max_concurrent = 1 WHERE state = 'available'").format(jobs)
        )
        keyed.analyze()
        running = keyed.start_running(min(RUNNING, size // 2))
        keyed.conn.execute(
            sql.SQL("UPDATE {} SET concurrency_key = 'k' || (id % 500), max_concurrent = 1 WHERE state = 'running'").format(jobs)
        )
        for fresh in (False, True):
            if fresh:
                keyed.analyze()
            for name, args in (("claim", {"now": 1e12, "queue": "q", "limit": CLAIM_LIMIT}),
                               ("claim_limited", {"now": 1e12, "queue": "q", "limit": CLAIM_LIMIT, "max_running": 1_000_000})):  # fmt: skip
                plan = explain_generic(keyed.conn, name, keyed.schema, args)
                _check("claim", plan, max(size, 100_000))
                (held,) = [n for n in _walk(plan["Plan"]) if n.get("Function Name") == "claim_picked_parking"]
                buffers = held.get("Shared Hit Blocks", 0) + held.get("Shared Read Blocks", 0)
                picked = max(held["Actual Rows"], 1)
                assert buffers <= 60 * picked, f"claim_picked_parking at {size:,} rows: {buffers} buffers for {picked} jobs"
    finally:
        keyed.conn.close()


@pytest.mark.parametrize("size", SIZES)
def test_the_lean_claim_keeps_its_plan_on_skewed_states(pg_url: str, size: int) -> None:
    """The lean claim (`claim_lean`) on tables whose pending rows are skewed, analyzed: 90 % of
    them scheduled for later (jobs_waiting large, none due), a few rate wake times of the
    queue, and a row whose key is full at the head of the available ones. It must read the queue's
    earliest waiting row and wake time by their indexes, the available rows off
    `jobs_available` in order, at most its limit of them, and claim nothing past the keyed row;
    and with a waiting row come due, read no available row at all (the full claim's work)."""
    skewed = Table(pg_url)
    try:
        s = sql.Identifier(skewed.schema)
        skewed.conn.execute(
            sql.SQL(
                "INSERT INTO {}.jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at, finalized_at)"
                " SELECT 'noop', 'q', '{{}}', CASE WHEN g %% 100 = 0 THEN 'available' WHEN g %% 10 = 0 THEN 'scheduled'"
                "  ELSE 'completed' END, 25, 0, CASE WHEN g %% 100 <> 0 AND g %% 10 = 0 THEN 1e12 + g ELSE g END, g,"
                "  CASE WHEN g %% 10 <> 0 THEN g END FROM generate_series(1, %s) g"
            ).format(s),
            (size,),
        )
        skewed.conn.execute(sql.SQL("INSERT INTO {}.rate_wakes SELECT 'q', 'r' || g, 2e12 + g FROM generate_series(1, 20) g").format(s))
        (head,) = skewed.conn.execute(
            sql.SQL("UPDATE {0}.jobs SET concurrency_key = 'k', max_concurrent = 1 WHERE id ="
                    " (SELECT id FROM {0}.jobs WHERE state = 'available' ORDER BY priority DESC, run_at, id OFFSET 5 LIMIT 1)"
                    " RETURNING id").format(s)  # fmt: skip
        ).fetchone()  # type: ignore[misc]
        # ... whose key is full (a job of it running): the lean prefix ends there.
        skewed.conn.execute(
            sql.SQL("INSERT INTO {}.jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at,"
                    " attempted_at, heartbeat_at, attempt, concurrency_key, max_concurrent)"
                    " VALUES ('noop', 'q', '{{}}', 'running', 25, 0, 0, 0, 1, 1, 1, 'k', 1)").format(s)  # fmt: skip
        )
        skewed.analyze()
        args = {"now": 1e12, "queue": "q", "limit": CLAIM_LIMIT}
        plan = explain_generic(skewed.conn, "claim_lean", skewed.schema, args)
        _check("claim_lean", plan, max(size, 100_000))
        (update,) = [n for n in _walk(plan["Plan"]) if n.get("Node Type") == "ModifyTable"]
        assert update["Actual Rows"] == 5, f"claimed {update['Actual Rows']} rows, not the 5 before the keyed row {head}"
        due = dict(args, now=1e12 + size)  # every scheduled row due
        nodes = list(_walk(explain_generic(skewed.conn, "claim_lean", skewed.schema, due)["Plan"]))
        assert [n["Actual Rows"] for n in nodes if n.get("Index Name") == "jobs_available"] in ([], [0]), nodes
        assert {n["Index Name"] for n in nodes if "Index Name" in n} <= ALLOWED["claim_lean"]
    finally:
        skewed.conn.close()
