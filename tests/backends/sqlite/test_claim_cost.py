"""What a keyed claim and its outcomes cost SQLite, counted, never timed: the statements run and
the virtual machine's steps (a progress handler called at every instruction).

The claim reads the due rows one at a time as the admission asks for them, and stops at the
row that fills it, counting the running jobs of each key it weighs once. Before, a claim read
its limit plus 1,000 more rows at once and ran one count statement per key among them: at 1,000 or 100,000 keys, about 15 statements per job it started,
most of what separated a keyed drain from an unlimited one (0.6 of its throughput). An outcome
unparks only for a key that has a parked job (read with the batch), and a single unpark names
its job with ``id = (...)``: ``id IN (...)`` fills a temporary b-tree per statement."""

from __future__ import annotations

import sqlite3
from typing import Any

import trio

from nursery_jobs.backends import NewJob, Outcome, OutcomeKind
from nursery_jobs.backends.sqlite import SqliteBackend


def keyed(key: str) -> NewJob:
    return NewJob("w", "q", "{}", 0, None, 3, concurrency_key=key, max_concurrent=1)


class Counted:
    """The statements and virtual machine steps of what runs on `backend`'s connection inside
    the block."""

    def __init__(self, backend: SqliteBackend) -> None:
        assert backend._conn is not None
        self.conn: sqlite3.Connection = backend._conn
        self.statements: list[str] = []
        self.steps = 0

    def _step(self) -> int:
        self.steps += 1
        return 0

    def __enter__(self) -> Counted:
        self.conn.set_trace_callback(self.statements.append)
        self.conn.set_progress_handler(self._step, 1)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.conn.set_trace_callback(None)
        self.conn.set_progress_handler(None, 1)


async def claim_behind(tmp_path: Any, name: str, behind: int) -> tuple[Counted, Counted, SqliteBackend]:
    """A file with 16 due jobs of 16 keys and `behind` more of as many other keys: the counts
    of a claim of 16 and of the outcomes of what it claimed."""
    backend = SqliteBackend(str(tmp_path / f"{name}.db"), clock=trio.current_time, wake=False)
    await backend.open()
    await backend.insert_many([keyed(f"k{n}") for n in range(16 + behind)])
    # Planned as on an analyzed file, where the claim walks `nj_jobs_claimable` in claim order
    # (never analyzed, SQLite sorts the queue's due rows first: every claim reads them all).
    assert backend._conn is not None
    backend._conn.execute("ANALYZE")
    with Counted(backend) as claim:
        got = await backend.claim("q", 16)
    assert len(got.jobs) == 16
    with Counted(backend) as finish:
        await backend.finish_many([Outcome(j.id, j.attempt, OutcomeKind.COMPLETED) for j in got.jobs])
    return claim, finish, backend


async def test_a_keyed_claim_costs_the_same_however_many_due_keys_wait_behind_it(tmp_path, autojump_clock) -> None:
    alone, alone_finish, a = await claim_behind(tmp_path, "alone", 0)
    crowded, crowded_finish, b = await claim_behind(tmp_path, "crowded", 2_000)
    await a.close()
    await b.close()
    # One count statement per key the admission weighs, none per row behind: the same
    # statements either way (before: 1,000 more, one per key of the rows read beyond the 16).
    counts = [s for s in crowded.statements if s.startswith("SELECT count(*)")]
    assert len(crowded.statements) == len(alone.statements) and len(counts) == 16
    # The rows behind the 16 are not read (before: 1,016 rows, about 20 times the steps).
    assert crowded.steps < 1.5 * alone.steps
    # No key had a parked job: the outcomes write no unpark (before: one statement per key).
    assert not [s for s in crowded_finish.statements if "SET parked = 0 WHERE id" in s]
    assert len(crowded_finish.statements) == len(alone_finish.statements)


async def test_an_outcome_brings_back_its_keys_parked_job_with_no_temporary_btree(tmp_path, autojump_clock) -> None:
    backend = SqliteBackend(str(tmp_path / "jobs.db"), clock=trio.current_time, wake=False)
    await backend.open()
    ids = [r.id for r in await backend.insert_many([keyed("k") for _ in range(3)])]
    (first,) = (await backend.claim("q", 10)).jobs  # the other two are parked
    with Counted(backend) as finish:
        await backend.finish_many([Outcome(first.id, first.attempt, OutcomeKind.COMPLETED)])
    after = [j.id for j in (await backend.claim("q", 10)).jobs]
    assert backend._conn is not None
    unparks = [s for s in finish.statements if "SET parked = 0 WHERE id" in s]
    built = [sum(1 for op in backend._conn.execute("EXPLAIN " + s) if op[1] == "OpenEphemeral") for s in unparks]
    await backend.close()
    assert after == [ids[1]]  # the key's best parked job came back, and only it
    assert built == [0]  # one unpark, no temporary b-tree (before: `id IN (...)`, one)
