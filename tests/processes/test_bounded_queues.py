"""A bounded queue across real processes: three enqueuers on one store never make the queue
longer than its `max_length` (PostgreSQL: the per-queue advisory lock; SQLite: the write lock)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.processes.procutil import Spawner, Store, assert_clean_exit, fetch_jobs, state_counts, wait_all_exit

ENQUEUER = str(Path(__file__).with_name("bounded_enqueuer.py"))


def test_three_processes_never_exceed_max_length(spawner: Spawner, store: Store) -> None:
    max_length, each = 150, 100
    start_at = time.time() + 4.0  # after every process has opened its runtime
    procs = [
        spawner.script(ENQUEUER, store.url, str(max_length), str(each), str(start_at), name=f"e{i}") for i in range(3)
    ]
    codes = wait_all_exit(procs, timeout=60)
    accepted = refused = 0
    for proc in procs:
        assert_clean_exit(proc, codes[proc.name])
        line = next(x for x in proc.stdout().splitlines() if x.startswith("ACCEPTED "))
        _, a, _, r = line.split()
        accepted += int(a)
        refused += int(r)
    # No worker runs, so the queue only grows: ending at max_length means it never passed it.
    assert (accepted, refused) == (max_length, 3 * each - max_length)
    jobs = fetch_jobs(store)
    assert state_counts(jobs) == {"available": max_length}
