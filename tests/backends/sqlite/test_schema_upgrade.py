"""A file made by an older nursery_jobs is upgraded in place when opened: version 2 (the
concurrency key) gets the parked flag of a full key's jobs (3) and the claim's new index, and
the jobs it held keep their place."""

from __future__ import annotations

import sqlite3

import trio

from nursery_jobs.backends import NewJob
from nursery_jobs.backends.sqlite import SCHEMA_VERSION, SqliteBackend


def _as_version_2(path: str) -> None:
    """The file as version 2 wrote it: no parked flag, the claim's index over every pending row."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP INDEX nj_jobs_claimable")
    conn.execute("DROP INDEX nj_jobs_parked")
    conn.execute("ALTER TABLE nj_jobs DROP COLUMN parked")
    conn.execute(
        "CREATE INDEX nj_jobs_claim ON nj_jobs (queue, priority DESC, run_at, id)"
        " WHERE state IN ('available', 'scheduled', 'retryable')"
    )
    conn.execute("UPDATE nj_meta SET value = '2' WHERE key = 'schema_version'")
    conn.close()


async def test_a_version_2_file_is_upgraded_and_its_keyed_jobs_run_in_order(tmp_path, autojump_clock) -> None:
    path = str(tmp_path / "jobs.db")
    backend = SqliteBackend(path, clock=trio.current_time)
    await backend.open()
    ids = [r.id for r in await backend.insert_many([NewJob("w", "q", "{}", 0, None, 5, None, "k", 1) for _ in range(3)])]
    await backend.close()
    _as_version_2(path)

    backend = SqliteBackend(path, clock=trio.current_time)
    await backend.open()
    try:
        first = [j.id for j in (await backend.claim("q", 10)).jobs]
        passed = [j.id for j in (await backend.claim("q", 10)).jobs]
        await trio.sleep(10)
        await backend.rescue(backend.now() - 1)  # the first one's worker is gone: back in line as of now
        second = [j.id for j in (await backend.claim("q", 10)).jobs]
    finally:
        await backend.close()
    conn = sqlite3.connect(path)
    (version,) = conn.execute("SELECT value FROM nj_meta WHERE key = 'schema_version'").fetchone()
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    conn.close()
    assert version == str(SCHEMA_VERSION) == "3"
    assert {"nj_jobs_claimable", "nj_jobs_parked"} <= indexes and "nj_jobs_claim" not in indexes
    assert first == [ids[0]] and passed == [] and second == [ids[1]]
