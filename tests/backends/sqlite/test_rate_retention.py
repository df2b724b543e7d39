"""SQLite's retention drops a rate key's record exactly when `transitions.rate_idle` says it
limits nothing, at most `limit` of them, and a record it cannot read; and it asks the rule,
so a changed rule changes what it drops (a restated rule would not follow)."""

from __future__ import annotations

import contextlib
import json
import random
import sqlite3
from typing import Callable

import pytest

import nursery_jobs.backends.sqlite.maintenance as sqlite_backend
from nursery_jobs import rules as transitions
from nursery_jobs.backends.sqlite import SqliteBackend

NOW = 1000.0
PERS = (1.0, 2.5, 5.0, 10.0)


async def _dropped(path: str, records: dict[str, tuple[object, object]], limit: int) -> set[str]:
    backend = SqliteBackend(path, clock=lambda: NOW)
    await backend.open()
    try:
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute("DELETE FROM nj_rate")
            conn.executemany(
                "INSERT INTO nj_rate (key, starts, cap, per, last) VALUES (?, ?, 1, ?, ?)",
                [(k, json.dumps([]), per, last) for k, (last, per) in records.items()],
            )
        await backend.delete_finished({}, limit)
        with contextlib.closing(sqlite3.connect(path)) as conn:
            kept = {k for (k,) in conn.execute("SELECT key FROM nj_rate")}
    finally:
        await backend.close()
    return set(records) - kept


def _records(rng: random.Random) -> dict[str, tuple[object, object]]:
    records: dict[str, tuple[object, object]] = {}
    for i in range(rng.randint(0, 10)):
        per = rng.choice(PERS)
        last = NOW - per if rng.random() < 0.3 else NOW + 0.5 * rng.randint(-30, 4)  # exactly its window old, or not
        records[f"k{i}"] = (last, per)
    return records


@pytest.mark.parametrize("seed", range(3))
async def test_retention_drops_the_records_rate_idle_calls_idle(tmp_path, seed: int) -> None:
    rng = random.Random(seed)
    path = str(tmp_path / "jobs.db")
    for _ in range(15):
        records = _records(rng)
        limit = rng.randint(1, 12)
        idle = {k for k, (last, per) in records.items() if transitions.rate_idle(last, per, NOW)}  # type: ignore[arg-type]
        dropped = await _dropped(path, records, limit)
        assert dropped <= idle and len(dropped) == min(limit, len(idle)), (records, limit, dropped)


async def test_a_record_whose_times_cannot_be_read_is_dropped(tmp_path) -> None:
    dropped = await _dropped(str(tmp_path / "jobs.db"), {"bad": ("soon", 1.0), "busy": (NOW, 5.0)}, 10)
    assert dropped == {"bad"}


@pytest.mark.parametrize(
    "planted",
    [lambda last, per, now: last + per < now, lambda last, per, now: True],
    ids=["idle-only-after-the-window", "always-idle"],
)
async def test_retention_follows_a_change_planted_in_the_rule(
    tmp_path, monkeypatch, planted: Callable[[float, float, float], bool]
) -> None:
    records: dict[str, tuple[object, object]] = {"edge": (NOW - 5.0, 5.0), "busy": (NOW - 1.0, 5.0)}
    before = await _dropped(str(tmp_path / "a.db"), records, 10)
    monkeypatch.setattr(sqlite_backend, "rate_idle", planted)
    after = await _dropped(str(tmp_path / "b.db"), records, 10)
    assert before == {"edge"}
    assert after == {k for k, (last, per) in records.items() if planted(last, per, NOW)} != before  # type: ignore[arg-type]
