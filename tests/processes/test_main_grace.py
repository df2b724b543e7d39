"""A real service process under SIGTERM: with `main_grace`, the request in flight is answered.

The service (`drain_service.py`) and the test share a SQLite file: the test reads the job the
request enqueued straight from the table after the process has exited.
"""

from __future__ import annotations

import signal
from pathlib import Path

from tests.processes.procutil import Store, assert_clean_exit, fetch_jobs, wait_until

SERVICE = str(Path(__file__).with_name("drain_service.py"))


def test_sigterm_lets_main_finish_its_request_within_main_grace(spawner, tmp_path):
    store = Store.sqlite(tmp_path / "jobs.db")
    proc = spawner.script(SERVICE, store.url, "10", "1.0", name="service")
    proc.wait_ready()
    proc.signal(signal.SIGTERM)  # the request is in flight: 1 s of work ahead of it
    assert proc.wait(20) == 0
    assert_clean_exit(proc)
    out = proc.stdout()
    assert "REQUEST CANCELLED" not in out
    answered = [line for line in out.splitlines() if line.startswith("ANSWERED ")]
    assert len(answered) == 1 and answered[0].endswith(" completed"), out
    assert out.index("ANSWERED") < out.index("MAIN RETURNED") < out.index("EXITED CLEANLY")
    job_id = int(answered[0].split()[1])
    assert fetch_jobs(store)[job_id].state == "completed"


def test_sigterm_cancels_a_main_that_outlasts_main_grace(spawner, tmp_path):
    store = Store.sqlite(tmp_path / "jobs.db")
    proc = spawner.script(SERVICE, store.url, "0.3", "60", name="service")
    proc.wait_ready()
    proc.signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert_clean_exit(proc)
    wait_until(lambda: "EXITED CLEANLY" in proc.stdout(), timeout=1, what="the last line")
    assert "REQUEST CANCELLED" in proc.stdout() and "ANSWERED" not in proc.stdout()
    assert "main did not return within main_grace (0.3 s)" in proc.stderr()
