"""A rate limit holds where the request goes out: at the handler's first line, across real
processes (docs/rate_limits.md, "What is limited").

Three `worker.py` processes, two workers each, share 50 jobs of 5 rate keys (`worker.RATE`: 5
starts per key per second) that each run 0.25 s: the keys could start 25 jobs a second, the 6
workers run 24, so the workers are busy at most slots. Each handler's first line writes
`time.time()` to the process's execution log. A job claimed for a worker still busy (claimed
ahead) would be counted at its claim and reach its handler up to a job later, next to the next
window's starts (measured before: 5 entries of a key within 0.65-0.75 s); a queue with a
rate-limited kind claims only for idle workers, so each handler starts right after its counted
start.
"""

from __future__ import annotations

import contextlib
import sqlite3

import psycopg

from tests.processes.procutil import Spawner, Store, assert_clean_exit, poll_opts, read_executions, wait_all_exit

JITTER = 0.005
"""Seconds a window of handler entries may fall short of `per`. Between a job's counted start
and its handler's first line lie its claim's commit and answer and the hand-off to an idle
worker (measured: a median of 1 ms on SQLite, 5-12 ms on PostgreSQL under a load of 15 on 2
cores, and every window of 5 entries at least 1.006 s long). What varies between two starts a
window apart is what the allowance covers: the scheduler, not a held job (which shows as a
quarter of a second, a job's length)."""


def _counted(store: Store) -> dict[int, float]:
    """Each job's counted start, as the database recorded it (`attempted_at`)."""
    if store.kind == "postgres":
        assert store.conninfo is not None and store.schema is not None
        with psycopg.connect(store.conninfo, autocommit=True, connect_timeout=5) as conn:
            query = psycopg.sql.SQL("SELECT id, attempted_at FROM {}.jobs").format(psycopg.sql.Identifier(store.schema))
            return {job_id: at for job_id, at in conn.execute(query).fetchall()}
    assert store.path is not None
    with contextlib.closing(sqlite3.connect(store.path, timeout=10)) as conn:
        return {job_id: at for job_id, at in conn.execute("SELECT id, attempted_at FROM nj_jobs")}


def _short_windows(times: list[float], limit: int, per: float) -> list[list[float]]:
    s = sorted(times)
    return [s[i : i + limit + 1] for i in range(len(s) - limit) if s[i] + per > s[i + limit]]


def test_three_processes_start_at_most_a_keys_rate_of_handlers_in_any_window(spawner: Spawner, store: Store) -> None:
    from tests.processes.worker import RATE

    keys = 5
    ids = spawner.enqueue(store.url, 10 * keys, sleep=0.25, rate_keys=keys)
    workers = [
        spawner.worker(store.url, "--max-workers", "2", *poll_opts(store), name=f"w{i}", drain=1.0) for i in range(3)
    ]
    codes = wait_all_exit(workers, timeout=60)
    for proc in workers:
        assert_clean_exit(proc, codes[proc.name])

    entries = [e for e in read_executions(spawner.log_dir) if e.ev == "start"]
    assert sorted(e.id for e in entries) == sorted(ids)  # each once
    counted = _counted(store)
    for key in range(keys):
        mine = [e for e in entries if e.n % keys == key]
        short = _short_windows([counted[e.id] for e in mine], RATE.limit, RATE.per)
        assert not short, f"key r{key}: {RATE.limit + 1} counted starts within {RATE.per:g} s: {short[:2]}"
        short = _short_windows([e.t for e in mine], RATE.limit, RATE.per - JITTER)
        late = sorted(round(e.t - counted[e.id], 4) for e in mine)[-3:]
        assert not short, (
            f"key r{key}: {RATE.limit + 1} handler entries within {RATE.per - JITTER:g} s: {short[:2]}"
            f" (latest entries after their counted start: {late} s)"
        )
    assert len({e.pid for e in entries}) >= 2  # the rate was shared across processes
