"""`nursery-jobs worker` as a real process, fed by `nursery-jobs enqueue` processes.

The worker runs from the repository's root on an SQLite file, takes its backend from
NURSERY_JOBS_BACKEND, and is stopped by SIGTERM: it must finish what it was given, log each
failed attempt as one record with its fields, keep passwords out of its output, and exit 0.
Every wait is bounded, and every process is killed at the end of its test whatever happened.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from .procutil import wait_until

ROOT = Path(__file__).resolve().parents[2]
EXE = os.path.join(os.path.dirname(sys.executable), "nursery-jobs")
APP = "tests/processes/cli_app.py:app"


class Worker:
    def __init__(self, popen: subprocess.Popen[bytes], err: Path) -> None:
        self.popen = popen
        self.err = err

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def records(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far (a torn last line is left for the next read)."""
        text = self.stderr()
        return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]

    def wait_for(self, what: str, found: Callable[[list[dict[str, Any]]], Any], timeout: float = 20.0) -> Any:
        def check() -> Any:
            if self.popen.poll() is not None:
                pytest.fail(f"the worker exited ({self.popen.returncode}) before {what}:\n{self.stderr()}")
            return found(self.records())

        return wait_until(check, timeout=timeout, what=f"{what}; worker stderr:\n{self.stderr()}")

    def stop(self, timeout: float = 20.0) -> int:
        self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker did not exit within {timeout:g} s of SIGTERM:\n{self.stderr()}")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "NURSERY_JOBS_BACKEND": f"sqlite:///{tmp_path / 'jobs.db'}",
        "CLI_APP_RECORD": str(tmp_path / "record.txt"),
    }


@pytest.fixture
def start_worker(tmp_path: Path, env: dict[str, str]) -> Iterator[Callable[..., Worker]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(*argv: str) -> Worker:
        err = tmp_path / f"worker-{len(started)}.err"
        with open(err, "wb") as ferr:
            popen = subprocess.Popen(
                [EXE, "worker", *argv], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=ferr, stderr=ferr
            )
        started.append(popen)
        return Worker(popen, err)

    yield start
    for popen in started:
        if popen.poll() is None:
            popen.kill()
        popen.wait(10)


def cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([EXE, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)


def enqueue(env: dict[str, str], *argv: str) -> int:
    done = cli(env, "enqueue", *argv)
    assert done.returncode == 0 and done.stderr == "", done
    return int(done.stdout)


def test_the_worker_runs_what_enqueue_gives_it_logs_each_failed_attempt_and_exits_0_on_sigterm(
    start_worker: Callable[..., Worker], env: dict[str, str], tmp_path: Path
) -> None:
    worker = start_worker(APP, "--log-format", "json", "--queues", "work")
    started = worker.wait_for("its start-up record", lambda rs: [r for r in rs if r.get("event") == "worker_started"])
    assert started[0]["queues"] == ["work"] and started[0]["backend"] == env["NURSERY_JOBS_BACKEND"]

    ok = enqueue(env, "record", "--args", '{"n": 7}', "--app", APP)
    failing = enqueue(env, "fail", "--args", '{"n": 1}', "--app", APP)
    leaky = enqueue(env, "leaky", "--app", APP)
    wait_until(
        lambda: (tmp_path / "record.txt").exists() and (tmp_path / "record.txt").read_text() == f"{ok} 7\n",
        timeout=20,
        what="the record job to run",
    )
    failed = worker.wait_for(
        "both attempts of the failing job to be logged",
        lambda rs: (f := [r for r in rs if r.get("event") == "attempt_failed"]) and len(f) == 2 and f,
    )
    worker.wait_for("the leaky job's record", lambda rs: [r for r in rs if r["logger"] == "cli_app"])

    assert worker.stop() == 0, worker.stderr()
    records = worker.records()  # every line is JSON (records() would have raised otherwise)
    first, last = failed
    for record, attempt in ((first, 1), (last, 2)):
        assert {k: record[k] for k in ("job_id", "kind", "queue", "attempt", "max_attempts")} == {
            "job_id": failing, "kind": "fail", "queue": "work", "attempt": attempt, "max_attempts": 2,
        }  # fmt: skip
        assert record["error"] == "ValueError: no luck with 1\nsecond line"
        assert isinstance(record["duration"], float) and record["duration"] >= 0
        assert "\n" not in record["message"] and f"job {failing} (fail, queue work) attempt {attempt} of 2" in record["message"]
    assert (first["level"], first["outcome"], first["retry_in"]) == ("warning", "retry", 0.05)
    assert (last["level"], last["outcome"], last["retry_in"]) == ("error", "discard", None)
    # Quiet otherwise: the jobs that succeeded wrote nothing of their own.
    assert not [r for r in records if r.get("job_id") in (ok, leaky) and r["logger"] == "nursery_jobs"]
    assert "Hunter2pw" not in worker.stderr() and "postgresql://svc:***@db.internal/app" in worker.stderr()
    assert records[-1]["event"] == "worker_stopped" and "Traceback" not in worker.stderr()


def test_the_example_module_runs_as_docs_cli_md_shows(start_worker: Callable[..., Worker], env: dict[str, str]) -> None:
    worker = start_worker("examples/service_jobs.py:app", "--grace", "5")
    wait_until(lambda: "worker_started" in worker.stderr() or " started: " in worker.stderr(), timeout=20, what="start-up")
    job_id = enqueue(env, "send_welcome", "--args", '{"user_id": 42}', "--app", "examples/service_jobs.py:app")
    wait_until(lambda: "welcome email sent to user 42" in worker.stderr(), timeout=20, what=f"job {job_id} to run")
    assert worker.stop() == 0, worker.stderr()
    lines = worker.stderr().splitlines()
    assert f"nursery_jobs: worker {worker.popen.pid} stopped" in lines[-1]
    assert all(" INFO " in line for line in lines), lines  # text format, and nothing failed


def test_a_bad_module_app_is_one_line_and_exit_code_2(env: dict[str, str]) -> None:
    done = cli(env, "worker", "tests/processes/cli_app.py:not_an_app")
    assert done.returncode == 2
    assert done.stderr == (
        "nursery-jobs worker: tests/processes/cli_app.py:not_an_app is not an nursery_jobs.App (its type is int)\n"
    )
    assert done.stdout == ""


def test_an_unreachable_backend_is_one_line_with_the_password_redacted(env: dict[str, str]) -> None:
    done = cli(env, "worker", APP, "--backend", "postgresql://svc:Hunter2pw@127.0.0.1:1/app")
    assert done.returncode == 1, done
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("nursery-jobs worker: cannot connect to PostgreSQL at ")
    assert "Hunter2pw" not in done.stderr and "postgresql://svc@127.0.0.1:1/app" in done.stderr
