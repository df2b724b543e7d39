"""Two real worker processes sharing one SQLite file."""

from __future__ import annotations

import signal

from tests.processes.procutil import (
    assert_clean_exit,
    count_records,
    fetch_jobs,
    read_executions,
    starts_by_job,
    state_counts,
    wait_all_exit,
    wait_until,
)


def test_two_processes_on_one_file_run_2000_jobs_exactly_once(spawner, sqlite_store):
    # The enqueuer creates the file; SQLite has no cross-process wake-ups, so the workers poll.
    ids = spawner.enqueue(sqlite_store.url, 2000, sleep=0.002)
    workers = [
        spawner.worker(sqlite_store.url, "--max-workers", "8", "--poll-interval", "0.1", name=f"w{i}", drain=1.0)
        for i in range(2)
    ]
    for proc in workers:
        proc.wait_ready()
    codes = wait_all_exit(workers, timeout=90)
    for proc in workers:
        assert_clean_exit(proc, codes[proc.name])
        assert "DRAINED" in proc.stdout()

    jobs = fetch_jobs(sqlite_store)
    assert set(jobs) == set(ids)
    assert state_counts(jobs) == {"completed": 2000}
    assert {j.attempt for j in jobs.values()} == {1}
    starts = starts_by_job(read_executions(spawner.log_dir))
    assert set(starts) == set(ids)
    doubles = {i: s for i, s in starts.items() if len(s) != 1}
    assert not doubles, f"jobs executed more than once: {dict(list(doubles.items())[:5])}"
    by_pid = {w.pid: sum(s[0].pid == w.pid for s in starts.values()) for w in workers}
    assert all(n > 0 for n in by_pid.values()), f"a worker got no job: {by_pid}"


def test_two_processes_open_a_new_file_at_once(spawner, sqlite_store):
    """Both create the schema on the same fresh file at the same moment; both must come up."""
    workers = [
        spawner.worker(sqlite_store.url, "--poll-interval", "0.1", name=f"w{i}", drain=None) for i in range(2)
    ]
    for proc in workers:
        proc.wait_ready()
    ids = spawner.enqueue(sqlite_store.url, 50)
    wait_until(lambda: count_records(spawner.log_dir, "end") >= 50, timeout=30, what="50 jobs done")
    for proc in workers:
        proc.signal(signal.SIGTERM)
    codes = wait_all_exit(workers, timeout=20)
    for proc in workers:
        assert_clean_exit(proc, codes[proc.name])
    assert state_counts(fetch_jobs(sqlite_store)) == {"completed": 50}
    assert sorted(starts_by_job(read_executions(spawner.log_dir))) == sorted(ids)
