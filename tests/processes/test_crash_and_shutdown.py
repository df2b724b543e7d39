"""Worker processes that die (SIGKILL) or are told to stop (SIGTERM), on each durable backend.

A SIGKILLed worker's running jobs are rescued by another process once their heartbeat is older
than `rescue_after` (the attempt counts); a SIGTERMed worker finishes what it can within the
grace, interrupts the rest and writes them back as available (the attempt is given back).
Either way nothing is lost, and only what was running when the process died runs twice.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import sys
import time
from pathlib import Path

import psycopg
import pytest
import trio

import nursery_jobs as nj
from tests.processes.procutil import (
    FAST_RESCUE,
    Store,
    assert_clean_exit,
    count_records,
    fetch_jobs,
    jobs_inserted_under_write_lock,
    poll_opts,
    read_executions,
    running_ids,
    starts_by_job,
    state_counts,
    wait_all_exit,
    wait_until,
)

# Sizes per backend: enough jobs that the kill lands mid-run, few enough to stay quick.
_LOAD = {"postgres": (5000, 3), "sqlite": (2000, 2)}  # (jobs, worker processes)


def test_sigkill_mid_run_loses_nothing_and_reruns_only_what_was_running(spawner, store):
    total, nworkers = _LOAD[store.kind]
    opts = ("--max-workers", "8", *poll_opts(store), *FAST_RESCUE)
    # The victim's jobs take 0.5 s each, so it always holds jobs mid-execution when it dies
    # (fast jobs finish in lock-step batches, and a kill could land between two batches).
    victim = spawner.worker(store.url, *opts, "--min-sleep", "0.5", name="victim", drain=1.0)
    workers = [victim] + [spawner.worker(store.url, *opts, name=f"w{i}", drain=1.0) for i in range(1, nworkers)]
    for proc in workers:
        proc.wait_ready()
    ids = spawner.enqueue(store.url, total, sleep=0.02)

    def victim_records(ev: str) -> set[int]:
        return {e.id for e in read_executions(spawner.log_dir) if e.pid == victim.pid and e.ev == ev}

    def victim_mid_run() -> bool:
        mine = [e for e in read_executions(spawner.log_dir, live=True) if e.pid == victim.pid]
        ended = {e.id for e in mine if e.ev == "end"}
        fresh = [e for e in mine if e.ev == "start" and e.id not in ended and time.time() - e.t < 0.3]
        return len(mine) >= 32 and bool(fresh)  # a second batch done, and a job just started

    wait_until(victim_mid_run, timeout=60, what="the victim to be mid-run", interval=0.01)
    snap = (
        psycopg.connect(store.conninfo or "", autocommit=True, connect_timeout=5)
        if store.kind == "postgres"
        else contextlib.nullcontext()
    )
    with snap as conn:  # opened before the kill: the timed window holds no connect
        killed_at = time.monotonic()  # before the signal: the victim's last heartbeat was no later
        victim.signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        running_at_kill = running_ids(store, conn)
        snapshot_took = time.monotonic() - killed_at
    # Taken before any rescue can happen (rescue_after 2 s from the last heartbeat, which is
    # at most 0.2 s before the kill: 1.8 s at the earliest): every job the victim held is still
    # `running` here (the other running ones belong to the live workers). The bound leaves a
    # loaded machine 1.5 s for the kill and the snapshot (0.5 s failed under load 6).
    assert snapshot_took < 1.5, "snapshot taken too late after the kill to trust"
    left_running = victim_records("start") - victim_records("end")
    assert left_running, "the kill interrupted no job: the test proved nothing"
    assert left_running <= running_at_kill

    restarted = spawner.worker(store.url, *opts, "--drain-from-start", name="restarted", drain=1.0)
    live = [*workers[1:], restarted]
    codes = wait_all_exit(live, timeout=90)
    for proc in live:
        assert_clean_exit(proc, codes[proc.name])

    jobs = fetch_jobs(store)
    assert set(jobs) == set(ids)
    assert state_counts(jobs) == {"completed": total}, "a job was lost or left unfinished"
    starts = starts_by_job(read_executions(spawner.log_dir))
    assert set(starts) == set(ids), "a job never ran"
    rerun = {i for i, s in starts.items() if len(s) > 1}
    rescued = {i for i, j in jobs.items() if j.errors}
    # Any job run twice was running when the victim died: its first execution is the victim's
    # (cut short, or finished but its outcome never written), the second a live worker's.
    assert rerun <= running_at_kill, f"re-run but not running at the kill: {sorted(rerun - running_at_kill)[:10]}"
    for i in rerun:
        first, *later = starts[i]
        assert first.pid == victim.pid and first.attempt == 1, starts[i]
        assert len(later) == 1 and later[0].pid != victim.pid and later[0].attempt == 2, starts[i]
    # Nothing the victim was in the middle of is lost: it ran again elsewhere.
    assert left_running <= rerun
    # The backend agrees: only jobs the victim held were rescued, each once, attempt counted.
    assert rerun <= rescued <= running_at_kill
    for i in rescued:
        assert jobs[i].attempt == 2, jobs[i]
        assert len(jobs[i].errors) == 1 and jobs[i].errors[0].startswith("rescued:"), jobs[i]
    for i in set(ids) - rescued:
        assert jobs[i].attempt == 1 and len(starts[i]) == 1, (jobs[i], starts[i])


def test_live_heartbeats_keep_long_jobs_from_being_rescued(spawner, store):
    """Jobs running 3x rescue_after in a live process are never taken away by the other one."""
    rescue = ("--heartbeat-interval", "0.2", "--rescue-after", "1", "--rescue-interval", "0.2")
    opts = ("--max-workers", "2", *poll_opts(store), *rescue)
    workers = [spawner.worker(store.url, *opts, name=f"w{i}", drain=0.5) for i in range(2)]
    for proc in workers:
        proc.wait_ready()
    ids = spawner.enqueue(store.url, 4, sleep=3.0)
    codes = wait_all_exit(workers, timeout=30)
    for proc in workers:
        assert_clean_exit(proc, codes[proc.name])
    jobs = fetch_jobs(store)
    assert [(jobs[i].state, jobs[i].attempt, jobs[i].errors) for i in ids] == [("completed", 1, ())] * 4
    starts = starts_by_job(read_executions(spawner.log_dir))
    assert {i: len(s) for i, s in starts.items()} == {i: 1 for i in ids}


def test_sigterm_past_grace_exits_on_time_and_the_jobs_run_again_at_once(spawner, store):
    grace = 2.0
    opts = ("--max-workers", "4", *poll_opts(store))
    worker = spawner.worker(store.url, *opts, "--grace", str(grace), name="first", drain=None)
    worker.wait_ready()
    ids = spawner.enqueue(store.url, 6, sleep=60)
    wait_until(lambda: count_records(spawner.log_dir, "start") >= 4, timeout=20, what="4 jobs running")
    time.sleep(0.3)  # no fifth job may start: four workers, all busy
    started = {e.id for e in read_executions(spawner.log_dir) if e.ev == "start"}
    assert len(started) == 4

    t0 = time.monotonic()
    worker.signal(signal.SIGTERM)
    rc = worker.wait(grace + 15)
    elapsed = time.monotonic() - t0
    assert_clean_exit(worker, rc)
    assert "STOPPED" in worker.stdout()
    assert grace - 0.1 <= elapsed <= grace + 3.0, f"exited {elapsed:.2f} s after SIGTERM with grace {grace} s"

    execs = read_executions(spawner.log_dir)
    assert {e.id for e in execs if e.ev == "cancelled"} == started
    assert not [e for e in execs if e.ev == "end"]
    jobs = fetch_jobs(store)
    for i in ids:
        j = jobs[i]
        # Written back by the graceful shutdown: available at once, attempt given back.
        assert (j.state, j.attempt, j.errors) == ("available", 0, ()), j
        assert j.interrupted == (1 if i in started else 0), j

    # A new process (rescue_after at its 60 s default: only the write-back can make them
    # runnable in time) picks all six up at once and completes them.
    second = spawner.worker(store.url, *opts, "--cap-sleep", "0", "--drain-from-start", name="second", drain=0.5)
    rc = second.wait(20)
    assert_clean_exit(second, rc)
    jobs = fetch_jobs(store)
    assert state_counts(jobs) == {"completed": 6}
    for i in ids:
        assert (jobs[i].attempt, jobs[i].errors) == (1, ()), jobs[i]
    reruns = [e for e in read_executions(spawner.log_dir) if e.pid == second.pid and e.ev == "start"]
    assert sorted(e.id for e in reruns) == sorted(ids)
    assert all(e.attempt == 1 for e in reruns)
    assert max(e.t for e in reruns) - min(e.t for e in reruns) < 2.0


def test_second_sigterm_skips_the_grace(spawner, store):
    opts = ("--max-workers", "2", *poll_opts(store))
    worker = spawner.worker(store.url, *opts, "--grace", "60", name="worker", drain=None)
    worker.wait_ready()
    ids = spawner.enqueue(store.url, 2, sleep=120)
    wait_until(lambda: count_records(spawner.log_dir, "start") >= 2, timeout=20, what="2 jobs running")

    t0 = time.monotonic()
    worker.signal(signal.SIGTERM)
    time.sleep(0.5)
    assert worker.popen.poll() is None, "the first SIGTERM must wait for the grace"
    worker.signal(signal.SIGTERM)
    rc = worker.wait(15)
    assert_clean_exit(worker, rc)
    assert time.monotonic() - t0 < 5.0
    jobs = fetch_jobs(store)
    assert [(jobs[i].state, jobs[i].attempt, jobs[i].interrupted) for i in ids] == [("available", 0, 1)] * 2


def test_sigterm_under_load_finishes_running_jobs_and_loses_nothing(spawner, store):
    """Short jobs under way when SIGTERM lands finish within the grace, their outcomes are all
    written, nothing is left running, and a second process runs the rest: each job exactly once."""
    grace = 5.0
    opts = ("--max-workers", "8", *poll_opts(store))
    worker = spawner.worker(store.url, *opts, "--grace", str(grace), name="first", drain=None)
    worker.wait_ready()
    ids = spawner.enqueue(store.url, 2000, sleep=0.01)
    wait_until(lambda: count_records(spawner.log_dir, "end") >= 300, timeout=30, what="300 jobs done", interval=0.02)

    t0 = time.monotonic()
    worker.signal(signal.SIGTERM)
    rc = worker.wait(grace + 15)
    elapsed = time.monotonic() - t0
    assert_clean_exit(worker, rc)
    assert elapsed < grace, f"took {elapsed:.2f} s although every running job takes 10 ms"

    execs = read_executions(spawner.log_dir)
    assert not [e for e in execs if e.ev == "cancelled"], "a 10 ms job was cut by a 5 s grace"
    ended = {e.id for e in execs if e.ev == "end"}
    jobs = fetch_jobs(store)
    assert {i for i, j in jobs.items() if j.state == "completed"} == ended, "an outcome was lost at shutdown"
    rest = [jobs[i] for i in ids if i not in ended]
    assert rest, "the worker finished everything before the signal: the test proved nothing"
    assert {(j.state, j.attempt) for j in rest} == {("available", 0)}, state_counts(jobs)

    second = spawner.worker(store.url, *opts, "--drain-from-start", name="second", drain=0.5)
    rc = second.wait(60)
    assert_clean_exit(second, rc)
    jobs = fetch_jobs(store)
    assert state_counts(jobs) == {"completed": 2000}
    assert {j.attempt for j in jobs.values()} == {1}
    starts = starts_by_job(read_executions(spawner.log_dir))
    assert set(starts) == set(ids)
    assert all(len(s) == 1 for s in starts.values()), "a job ran twice across a graceful restart"


def test_a_claim_in_flight_at_shutdown_gives_its_jobs_back(spawner, store):
    """SIGTERM lands while the worker's claim waits for the table's write lock (held by the test,
    which inserts three jobs in that same transaction). The claim then takes the jobs after the
    shutdown stopped claiming: they must be given back (available, attempt 0), not left running."""
    opts = ("--max-workers", "4", "--poll-interval", "0.1", "--grace", "5")
    worker = spawner.worker(store.url, *opts, name="first", drain=None)
    worker.wait_ready()
    # Let it settle into steady polling first. (Right after start-up, PostgreSQL's blocked claim
    # may run on a snapshot older than the test's commit, miss the jobs, and hide the bug.)
    time.sleep(1.0)
    with jobs_inserted_under_write_lock(store, 3):
        time.sleep(0.5)  # the worker polls every 0.1 s: its claim now waits for the lock
        worker.signal(signal.SIGTERM)
        time.sleep(0.5)  # its shutdown runs while the claim still waits
        assert worker.popen.poll() is None, "the worker exited while its claim was still in flight"
    rc = worker.wait(20)  # the claim gets the lock and the jobs; the worker must give them back
    assert_clean_exit(worker, rc)
    assert not read_executions(spawner.log_dir), "a job started after SIGTERM"
    jobs = fetch_jobs(store)
    assert sorted((j.state, j.attempt) for j in jobs.values()) == [("available", 0)] * 3, jobs


NURSERY_JOBS = str(Path(sys.executable).with_name("nursery-jobs"))
DELIVERY_APP = f"{Path(__file__).with_name('delivery_app.py')}:app"


def _deliveries_table(store: Store) -> str:
    """The service's own table, beside the jobs: where a delivery's row goes."""
    if store.kind == "postgres":
        assert store.conninfo is not None and store.schema is not None
        table = f'"{store.schema}".deliveries'
        with psycopg.connect(store.conninfo, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f"CREATE TABLE {table} (job_id bigint NOT NULL, n int NOT NULL)")
        return table
    assert store.path is not None
    conn = sqlite3.connect(store.path, timeout=10)
    try:
        conn.execute("CREATE TABLE deliveries (job_id INTEGER NOT NULL, n INTEGER NOT NULL)")
        conn.commit()
    finally:
        conn.close()
    return "deliveries"


def _delivered(store: Store, table: str) -> list[tuple[int, int]]:
    query = f"SELECT job_id, n FROM {table} ORDER BY job_id"
    if store.kind == "postgres":
        with psycopg.connect(store.conninfo or "", autocommit=True, connect_timeout=5) as conn:
            return [tuple(r) for r in conn.execute(query).fetchall()]
    conn = sqlite3.connect(store.path or "", timeout=10)
    try:
        return [tuple(r) for r in conn.execute(query).fetchall()]
    finally:
        conn.close()


def test_a_deploy_lets_running_jobs_record_their_delivery_and_enqueue_their_follow_up(spawner, store, tmp_path):
    """`nursery-jobs worker` gets SIGTERM while two deliveries are in flight: each then writes
    its row and enqueues its follow-up in `ctx.client.transaction()`, completes on its first
    attempt (no duplicate delivery), and the process exits 0 once they are done, within the
    grace. The follow-ups wait in the store for the next process."""
    from tests.processes import delivery_app

    grace = 20.0
    table = _deliveries_table(store)
    log = tmp_path / "deliveries.jsonl"

    async def enqueue() -> list[int]:
        async with nj.open_runtime(delivery_app.app, backend=store.url, queues=[]):
            return [await delivery_app.deliver.enqueue(n=n, table=table, log=str(log)) for n in range(2)]

    ids = trio.run(enqueue)
    worker = spawner.script(NURSERY_JOBS, "worker", DELIVERY_APP, "--backend", store.url, "--grace", str(grace), name="worker")

    def records() -> list[dict]:
        text = log.read_text() if log.exists() else ""
        return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]

    wait_until(lambda: len([r for r in records() if r["ev"] == "start"]) == 2, timeout=20, what="both deliveries running")
    signalled = time.time()
    worker.signal(signal.SIGTERM)
    rc = worker.wait(grace + 10)
    exited = time.time()
    assert_clean_exit(worker, rc)

    seen = records()
    assert sorted((r["ev"], r["id"], r["attempt"]) for r in seen) == sorted(
        (ev, i, 1) for i in ids for ev in ("start", "end")
    ), seen  # each ran once: no second attempt, so no second delivery
    ends = [r for r in seen if r["ev"] == "end"]
    assert all(r["closing"] for r in ends) and min(r["t"] for r in ends) > signalled  # written during the shutdown
    assert max(r["t"] for r in ends) < exited < signalled + grace  # the process waited for them, not for the grace
    assert _delivered(store, table) == [(i, n) for n, i in enumerate(ids)]
    jobs = fetch_jobs(store)
    for i in ids:
        assert (jobs[i].state, jobs[i].attempt, jobs[i].interrupted, jobs[i].errors) == ("completed", 1, 0, ()), jobs[i]
    follow_ups = sorted(r["follow_up"] for r in ends)
    assert sorted(set(jobs) - set(ids)) == follow_ups
    for i in follow_ups:
        assert (jobs[i].kind, jobs[i].state, jobs[i].attempt) == ("notify", "available", 0), jobs[i]
