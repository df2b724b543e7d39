"""Fixtures the PostgreSQL backend's tests share."""

from __future__ import annotations

import pytest

import nursery_jobs.infra.pg as pg


@pytest.fixture
def waits(monkeypatch) -> list[int]:
    """Round trips, counted at the bridge: every time psycopg waits for the server is one
    `TrioConnection.wait`."""
    count = [0]
    original = pg.TrioConnection.wait

    async def counted(self, gen, *args, **kwargs):
        count[0] += 1
        return await original(self, gen, *args, **kwargs)

    monkeypatch.setattr(pg.TrioConnection, "wait", counted)
    return count
