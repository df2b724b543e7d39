"""What a write of a job row costs SQLite beyond the row and its index entries: no temporary
b-tree. SQLite evaluates each partial index's condition for the old and the new row of every
write that touches its columns, and a condition with a constant list of more than two values
(``state IN ('available', 'scheduled', 'retryable')``) builds a temporary b-tree each time
(``OpenEphemeral``, a page cache allocated and freed): schema 5 built eight per job an outcome
or a claim wrote. Counted in the statements' programs (``EXPLAIN``), never timed. And the
statements of the claim, the outcomes and the inserts still read through their indexes, so the
conditions they repeat word for word match the indexes' (a mismatch would be a table scan)."""

from __future__ import annotations

import sqlite3

import trio

from nursery_jobs.backends import NewJob, Outcome, OutcomeKind
from nursery_jobs.backends.sqlite import SqliteBackend


def _built(conn: sqlite3.Connection, sql: str, params: tuple[object, ...] = ()) -> int:
    """How many temporary b-trees the statement's program opens."""
    return sum(1 for op in conn.execute("EXPLAIN " + sql, params) if op[1] == "OpenEphemeral")


async def test_writing_a_job_row_builds_no_temporary_btree(tmp_path) -> None:
    path = str(tmp_path / "jobs.db")
    backend = SqliteBackend(path, wake=False)
    await backend.open()
    await backend.close()
    conn = sqlite3.connect(path)
    try:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(nj_jobs)") if r[1] != "id"]
        # Every column assigned, so SQLite keeps up every index and evaluates every condition.
        built = {
            "update": _built(conn, f"UPDATE nj_jobs SET {', '.join(f'{c} = ?' for c in columns)} WHERE id = ?", (None,) * (len(columns) + 1)),
            "insert": _built(conn, f"INSERT INTO nj_jobs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", (None,) * len(columns)),
            "delete": _built(conn, "DELETE FROM nj_jobs WHERE id = ?", (None,)),
        }  # fmt: skip
    finally:
        conn.close()
    assert built == {"update": 0, "insert": 0, "delete": 0}  # schema 5: 8, 4 and 4


async def test_the_claim_outcomes_and_inserts_read_through_their_indexes(tmp_path, autojump_clock) -> None:
    path = str(tmp_path / "jobs.db")
    backend = SqliteBackend(path, clock=trio.current_time, wake=False)
    await backend.open()
    traced: list[str] = []
    assert backend._conn is not None
    backend._conn.set_trace_callback(traced.append)
    try:
        await backend.insert_many([NewJob("w", "q", "{}", 0, None, 3, None, None, None, "k", 1, 60.0) for _ in range(3)])
        await backend.insert_many([NewJob("w", "q", "{}", 0, None, 3, "u", None) for _ in range(2)])  # one per unique key
        await backend.insert_many([NewJob("w", "q", "{}", 0, None, 3, None, None) for _ in range(3)], {"q": 100})
        first = await backend.claim("q", 3)  # one of the rate key, the rest parked
        await backend.finish_many([Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in first.jobs])
        second = await backend.claim("q", 10)
        await backend.finish_many([Outcome(j.id, j.attempt, OutcomeKind.RETRY, backend.now()) for j in second.jobs])
        await trio.sleep(60)
        third = await backend.claim("q", 10)  # the key's wake time: its next job comes back, beside the retries
    finally:
        backend._conn.set_trace_callback(None)
    conn = backend._conn
    scans: dict[str, list[str]] = {}
    for sql in dict.fromkeys(traced):
        if "nj_jobs" in sql and sql.split()[0] in ("SELECT", "UPDATE", "DELETE", "INSERT"):
            plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql)]
            if any(step.startswith("SCAN nj_jobs") for step in plan):
                scans[sql] = plan
    await backend.close()
    assert [len(c.jobs) for c in (first, second, third)] == [3, 2, 3]  # the work happened (unique key: one job)
    assert scans == {}
