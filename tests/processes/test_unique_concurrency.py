"""Unique jobs under concurrent enqueues from several backends at once -- separate connections,
as from separate processes: the database, not a check-then-insert, keeps one job per key."""

from __future__ import annotations

import random

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends.sqlite import SqliteBackend
from tests import pgutil

KEYS = 60
CALLERS = 3


def _app() -> nj.App:
    app = nj.App()

    @app.job()
    async def sync_account(ctx: nj.JobContext, account: int) -> None:
        pass

    return app


async def _race(backends: list[nj.Backend]) -> None:
    app = _app()
    got: dict[int, list[nj.JobId]] = {k: [] for k in range(KEYS)}

    async def caller(backend: nj.Backend, seed: int) -> None:
        order = list(range(KEYS))
        random.Random(seed).shuffle(order)
        # enqueue-only: nothing runs, so every key stays held for the whole race
        async with nj.open_runtime(app, backend=backend, queues=[]) as rt:
            for k in order:
                job_id = await rt.enqueue("sync_account", {"account": k}, unique_key=f"acct:{k}")
                got[k].append(job_id)

    async with trio.open_nursery() as nursery:
        for i, backend in enumerate(backends):
            nursery.start_soon(caller, backend, i)

    for k, ids in got.items():
        assert len(ids) == CALLERS
        assert len(set(ids)) == 1, f"key {k}: callers got different jobs {ids}"
        assert sum(not i.existing for i in ids) == 1, f"key {k}: {[i.existing for i in ids]}"
    counts = await backends[0].stats()
    assert sum(c.available for c in counts.values()) == KEYS


async def test_sqlite_keeps_one_job_per_key_under_concurrent_enqueues(tmp_path) -> None:
    path = str(tmp_path / "jobs.db")
    await _race([SqliteBackend(path, synchronous="NORMAL") for _ in range(CALLERS)])


async def test_postgres_keeps_one_job_per_key_under_concurrent_enqueues(pg_url) -> None:
    from nursery_jobs.backends.postgres import PostgresBackend

    schema = pgutil.new_schema(pg_url)
    backends = [PostgresBackend(pg_url, schema=schema) for _ in range(CALLERS)]
    try:
        await _race(backends)
    finally:
        for backend in backends:
            await backend.close()
