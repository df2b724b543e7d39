"""Real worker processes sharing one SQLite file, and the wake-ups between them."""

from __future__ import annotations

import json
import os
import signal

from nursery_jobs.infra.wake import registry_dir
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
    # The enqueuer creates the file before any worker serves it: they find its jobs by claiming.
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


def _sockets(path: str) -> list[str]:
    directory = registry_dir(path)
    assert directory is not None
    try:
        return sorted(name for name in os.listdir(directory) if name.endswith(".sock"))
    except FileNotFoundError:
        return []


def test_a_job_enqueued_by_another_process_starts_at_once_and_its_receipt_arrives(spawner, sqlite_store):
    """The worker polls every 30 s, and so does the web process's queue: within this test's
    bounds (10 s per receipt, well under 30 s from the worker's start-up claim), only a wake-up
    can start a job in the worker and bring its receipt to the enqueue-only process."""
    worker = spawner.worker(sqlite_store.url, "--poll-interval", "30", name="worker", drain=None)
    worker.wait_ready()
    result = spawner.run_worker_cli(
        "enqueue-wait", "--backend", sqlite_store.url, "--count", "5", "--poll-interval", "30", "--wait-timeout", "10",
        timeout=25,
    )  # fmt: skip
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{worker.describe()}"
    receipts = json.loads(next(x for x in result.stdout.splitlines() if x.startswith("RECEIPTS "))[9:])
    assert [r[1:3] for r in receipts] == [[True, "completed"]] * 5, f"{receipts}\n{worker.describe()}"
    starts = starts_by_job(read_executions(spawner.log_dir))
    assert sorted(starts) == sorted(r[0] for r in receipts)
    assert {s[0].pid for s in starts.values()} == {worker.pid}

    assert [n for n in _sockets(sqlite_store.path) if n.startswith(f"{worker.pid}-")], "the worker serves a socket"
    worker.signal(signal.SIGTERM)
    assert_clean_exit(worker, worker.wait(20))
    assert _sockets(sqlite_store.path) == [], "every process removes its socket file when it exits"


def test_a_killed_process_socket_is_removed_by_the_next_sender(spawner, sqlite_store):
    victim = spawner.worker(sqlite_store.url, "--poll-interval", "30", name="victim", drain=None)
    victim.wait_ready()
    mine = [n for n in _sockets(sqlite_store.path) if n.startswith(f"{victim.pid}-")]
    assert len(mine) == 1, _sockets(sqlite_store.path)
    victim.kill()  # SIGKILL: no clean-up
    assert _sockets(sqlite_store.path) == mine
    spawner.enqueue(sqlite_store.url, 1)  # its insert's wake-up meets ECONNREFUSED there
    assert _sockets(sqlite_store.path) == []
