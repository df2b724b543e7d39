"""A SQLite file of an older schema version is upgraded in place when opened: version 1 (no
limits), version 2 (concurrency keys, no rate keys), version 3 (no parked flag), version 4
(no rate parking) and version 5 (indexes over lists of states) all become version 6, keep their
jobs, take rate-keyed jobs at once, park a full key's backlog, and park a backlog over its rate."""

from __future__ import annotations

import sqlite3

import pytest
import trio

from nursery_jobs.backends import NewJob
from nursery_jobs.backends.sqlite import SCHEMA_VERSION, SqliteBackend


def _downgrade(path: str, version: int) -> None:
    """The file as that version left it: its columns, its version number, one pending job."""
    conn = sqlite3.connect(path)
    try:
        for name, columns, where in _V5_INDEXES:  # back before version 6: lists of states
            conn.execute(f"DROP INDEX {name}")
            conn.execute(f"CREATE {'UNIQUE ' if name == 'nj_jobs_unique' else ''}INDEX {name} ON nj_jobs {columns} WHERE {where}")
        if version == 5:
            _add_old_job(conn, version)
            return
        conn.execute("DROP INDEX nj_jobs_rate_parked")  # back before version 5: no rate parking
        conn.execute("DROP TABLE nj_rate_wake")
        conn.execute("ALTER TABLE nj_jobs DROP COLUMN rate_wait")
        if version <= 3:
            conn.execute("DROP INDEX nj_jobs_claimable")  # back before version 4: no parked flag
            conn.execute("DROP INDEX nj_jobs_parked")
            conn.execute("ALTER TABLE nj_jobs DROP COLUMN parked")
            conn.execute(
                "CREATE INDEX nj_jobs_claim ON nj_jobs (queue, priority DESC, run_at, id)"
                " WHERE state IN ('available', 'scheduled', 'retryable')"
            )
        if version <= 2:
            conn.execute("ALTER TABLE nj_jobs DROP COLUMN rate_key")
            conn.execute("ALTER TABLE nj_jobs DROP COLUMN rate_limit")
            conn.execute("ALTER TABLE nj_jobs DROP COLUMN rate_per")
            conn.execute("DROP TABLE nj_rate")
        if version == 1:
            conn.execute("DROP INDEX nj_jobs_running_key")
            conn.execute("ALTER TABLE nj_jobs DROP COLUMN concurrency_key")
            conn.execute("ALTER TABLE nj_jobs DROP COLUMN max_concurrent")
        _add_old_job(conn, version)
    finally:
        conn.close()


_PENDING_LIST = "state IN ('available', 'scheduled', 'retryable')"
_V5_INDEXES = (
    ("nj_jobs_due", "(queue, run_at)", _PENDING_LIST),
    ("nj_jobs_finalized", "(state, finalized_at)", "state IN ('completed', 'discarded', 'cancelled')"),
    ("nj_jobs_unique", "(unique_key)", "unique_key IS NOT NULL AND state NOT IN ('completed', 'discarded', 'cancelled')"),
    ("nj_jobs_claimable", "(queue, priority DESC, run_at, id)", f"{_PENDING_LIST} AND parked = 0"),
)
"""The indexes over states as versions 1 to 5 wrote them (the claim's from version 4 on)."""


def _add_old_job(conn: sqlite3.Connection, version: int) -> None:
    conn.execute("UPDATE nj_meta SET value = ? WHERE key = 'schema_version'", (str(version),))
    conn.execute(
        "INSERT INTO nj_jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at)"
        " VALUES ('old', 'q', '{}', 'available', 3, 0, 0, 0)"
    )
    conn.commit()


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
async def test_an_older_file_is_upgraded_and_takes_rate_keyed_jobs(tmp_path, version: int, autojump_clock) -> None:
    path = str(tmp_path / "jobs.db")
    backend = SqliteBackend(path, clock=trio.current_time)
    await backend.open()
    await backend.close()
    _downgrade(path, version)

    backend = SqliteBackend(path, clock=trio.current_time)
    await backend.open()
    try:
        await backend.insert_many([NewJob("new", "q", "{}", 0, None, 3, None, None, None, "k", 1, 60.0) for _ in range(2)])
        first = await backend.claim("q", 10)
        second = await backend.claim("q", 10)
        await trio.sleep(60)
        third = await backend.claim("q", 10)
    finally:
        await backend.close()
    conn = sqlite3.connect(path)
    try:
        (stored,) = conn.execute("SELECT value FROM nj_meta WHERE key = 'schema_version'").fetchone()
        (records,) = conn.execute("SELECT count(*) FROM nj_rate").fetchone()
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        listed = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql LIKE '% IN (%'")]
    finally:
        conn.close()
    assert SCHEMA_VERSION == 6 and stored == "6"
    assert listed == [] and {name for name, _, _ in _V5_INDEXES} <= indexes  # made again, without lists
    assert sorted(j.kind for j in first.jobs) == ["new", "old"]  # the old job, and one start of the key
    assert second.jobs == [] and second.next_due is not None  # the key's second job waits for its slot, parked
    assert [j.kind for j in third.jobs] == ["new"]  # brought back at the slot
    assert records == 1 and "nj_jobs_rate_parked" in indexes


@pytest.mark.parametrize("version", [2, 3, 4, 5])
async def test_an_older_file_is_upgraded_and_its_keyed_jobs_run_in_order(tmp_path, version: int, autojump_clock) -> None:
    """Keyed jobs stored before the parked flag: a claim passes over (parks) the full key's
    backlog, and the key's next job comes back when the first one's worker is rescued."""
    path = str(tmp_path / "jobs.db")
    backend = SqliteBackend(path, clock=trio.current_time)
    await backend.open()
    ids = [r.id for r in await backend.insert_many([NewJob("w", "q", "{}", 0, None, 5, None, "k", 1) for _ in range(3)])]
    await backend.close()
    _downgrade(path, version)

    backend = SqliteBackend(path, clock=trio.current_time)
    await backend.open()
    try:
        first = sorted(j.id for j in (await backend.claim("q", 10)).jobs)
        passed = [j.id for j in (await backend.claim("q", 10)).jobs]
        await trio.sleep(10)
        await backend.rescue(backend.now() - 1)  # the first one's worker is gone: back in line as of now
        second = sorted(j.id for j in (await backend.claim("q", 10)).jobs)
    finally:
        await backend.close()
    conn = sqlite3.connect(path)
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    conn.close()
    assert {"nj_jobs_claimable", "nj_jobs_parked"} <= indexes and "nj_jobs_claim" not in indexes
    old = ids[-1] + 1  # the unkeyed job the older file held, rescued with the first one
    assert first == [ids[0], old] and passed == [] and second == [ids[1], old]


async def test_a_file_made_before_fencing_tokens_gets_them_when_opened(tmp_path, autojump_clock) -> None:
    """`nj_lock_fence` is created with the other tables (IF NOT EXISTS, no version change): a
    file an older version made, its lock held, draws tokens from 1 once opened."""
    path = str(tmp_path / "jobs.db")
    backend = SqliteBackend(path, clock=trio.current_time)
    await backend.open()
    await backend.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE nj_lock_fence")
    conn.execute("INSERT INTO nj_locks (name, owner, expires_at) VALUES ('held', 'an-older-runtime', 1e18)")
    conn.commit()
    conn.close()

    backend = SqliteBackend(path, clock=trio.current_time)
    await backend.open()
    try:
        assert await backend.acquire_lock("held", "me", 30) is None
        assert await backend.acquire_lock("free", "me", 30) == 1
        assert await backend.acquire_lock("free", "me", 30) == 2
    finally:
        await backend.close()
