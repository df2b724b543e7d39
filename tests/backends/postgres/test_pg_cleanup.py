"""The suite's throwaway PostgreSQL databases (tests/pgutil.py) are dropped however the run
ends, and a new session drops the leftovers of runs that are gone, never what a live run holds.

The run-ending cases are small pytest sessions in a subprocess, with this suite's conftest as a
plugin: their `pg_url` is their own (`nj_test_<their pid>`), never this session's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg
import pytest

from tests import pgutil

ROOT = Path(__file__).resolve().parents[3]

PLANTED = textwrap.dedent(
    """
    import os
    import pathlib
    import signal
    import time


    def test_holds_the_database(pg_url):
        pathlib.Path(os.environ["NJ_PLANTED_READY"]).write_text(pg_url)
        if os.environ["NJ_PLANTED_MODE"] == "fail":
            assert False, "the planted failure"
        if os.environ.get("NJ_PLANTED_DEAF"):
            # A worker that cannot act on xdist's interrupt in time (a loaded machine): its
            # controller kills it, with its database still there.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Until the parent signals, in short sleeps: a signal that lands just before a
        # blocking call is only handled when the call returns (CPython checks for signals
        # between bytecodes), so one long sleep could hold it for ten minutes.
        for _ in range(6000):
            time.sleep(0.1)
    """
)


def _wait_for(path: Path, proc: subprocess.Popen[str], bound: float = 60) -> str:
    end = time.monotonic() + bound
    while time.monotonic() < end:
        if path.exists() and path.read_text():
            return path.read_text()
        if proc.poll() is not None:
            raise AssertionError(f"the planted session exited early:\n{proc.communicate()[0]}")
        time.sleep(0.05)
    raise AssertionError("the planted session never reached its test")


def run_planted(tmp_path: Path, mode: str, *options: str, deaf: bool = False) -> tuple[str, str]:
    """Run the planted session and end it by `mode` ("fail" or a signal name); return the URL
    of the database it made and its output. `deaf`: the planted test ignores SIGINT."""
    (tmp_path / "test_planted.py").write_text(PLANTED)
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NJ_PLANTED_READY": str(ready), "NJ_PLANTED_MODE": mode}
    if deaf:
        env["NJ_PLANTED_DEAF"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q", *options, "test_planted.py"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        url = _wait_for(ready, proc)
        if mode != "fail":
            proc.send_signal(getattr(signal, mode))
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return url, out


def exists(name: str) -> bool:
    return name in pgutil.database_names(name)


@pytest.mark.parametrize("mode", ["fail", "SIGINT", "SIGTERM", "SIGHUP"])
def test_the_session_database_is_dropped_however_the_run_ends(mode, tmp_path, pg_url):
    url, out = run_planted(tmp_path, mode)
    name = url.rpartition("/")[2]
    assert name == f"nj_test_{name.split('_')[2]}" and name != pg_url.rpartition("/")[2]
    assert "1 failed" in out if mode == "fail" else "KeyboardInterrupt" in out, out
    assert not exists(name), f"{mode}: {name} was left behind:\n{out}"


@pytest.mark.parametrize("worker", ["interrupted", "killed"])
def test_a_signalled_parallel_run_drops_the_database_of_its_worker(worker, tmp_path, pg_url):
    """The suite runs in xdist workers: a SIGTERM to the run (the controller) still drops the
    database the worker made (`nj_test_<worker pid>`), by the worker's own teardown or, when
    xdist had to kill the worker before that ended (as a loaded machine made it do now and then),
    by the controller once its workers are down (tests/pgutil.py, drop_of_gone_workers)."""
    url, out = run_planted(tmp_path, "SIGTERM", "-n", "1", deaf=worker == "killed")
    name = url.rpartition("/")[2]
    assert name.startswith("nj_test_") and name != pg_url.rpartition("/")[2], out
    assert not exists(name), f"{name} was left behind:\n{out}"


def test_a_killed_run_leaves_its_database_and_the_next_session_drops_it(no_other_sweeps, tmp_path, pg_url):
    url, out = run_planted(tmp_path, "SIGKILL")
    name = url.rpartition("/")[2]
    try:
        assert exists(name)  # nothing runs after a SIGKILL
        assert name in pgutil.drop_leftovers()
        assert not exists(name)
        assert exists(pg_url.rpartition("/")[2])  # this live session's own database stays
    finally:
        pgutil.drop_database(url)


def _create(name: str, comment: str | None) -> None:
    with pgutil.admin_connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
        if comment is not None:
            conn.execute(f"COMMENT ON DATABASE \"{name}\" IS '{comment}'")


def _wait_until_gone(backend_pid: int, bound: float = 60) -> None:
    end = time.monotonic() + bound
    with pgutil.admin_connect() as conn:
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend_pid,)).fetchone():
            assert time.monotonic() < end, f"session {backend_pid} still on the server {bound:g} s after its client closed"
            time.sleep(0.05)


def test_the_sweep_never_drops_what_a_live_or_unknown_run_holds(no_other_sweeps, pg_url):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    pid = holder.pid
    tagged, untagged, elsewhere = f"nj_test_{pid}", f"nj_test_{pid}_docs", f"nj_bench_pg_{pid}"
    try:
        _create(tagged, pgutil.owner_tag(pid))
        _create(untagged, None)
        other_boot = pgutil.owner_tag(pid).replace("boot=", "boot=0-", 1)
        _create(elsewhere, other_boot)  # made on another host (or boot): its pids mean nothing here
        pgutil.drop_leftovers()
        assert all(exists(n) for n in (tagged, untagged, elsewhere)), "dropped a live run's database"

        holder.kill()
        holder.wait(timeout=30)
        with psycopg.connect(pg_url.rpartition("/")[0] + f"/{untagged}", autocommit=True) as user:
            # the owner is gone, but someone uses the untagged one: it is not a leftover
            dropped = pgutil.drop_leftovers()
            assert tagged in dropped and untagged not in dropped and exists(untagged)
            # A session outlives its client's close until the server process exits: at once
            # when idle, but on a loaded machine after the next sweep had already looked (a full
            # run saw the untagged one still in use there). One busy in a statement outlives
            # it every time, so the sweep is asked again only once the server says it is gone.
            session = user.info.backend_pid
            user.pgconn.send_query(b"SELECT pg_sleep(1)")
            user.close()  # the client goes, the statement runs on
        assert untagged not in pgutil.drop_leftovers() and exists(untagged), "dropped a database still in use"
        _wait_until_gone(session)
        assert untagged in pgutil.drop_leftovers()
        assert exists(elsewhere) and not exists(tagged) and not exists(untagged)
    finally:
        holder.kill()
        holder.wait(timeout=30)
        with pgutil.admin_connect() as conn:
            for name in (tagged, untagged, elsewhere):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_reused_pid_does_not_keep_a_leftover(no_other_sweeps, pg_url):
    # The tag holds the start time: the same pid, started at another time, is another process.
    name = f"nj_test_{os.getpid()}_reused"
    tag = pgutil.owner_tag()
    start = tag.rpartition("start=")[2]
    try:
        _create(name, tag.replace(f"start={start}", f"start={int(start) - 1}"))
        assert name in pgutil.drop_leftovers()
    finally:
        with pgutil.admin_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
