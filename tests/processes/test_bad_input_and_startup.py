"""Rows the worker cannot run are discarded with a recorded error and the worker goes on; a
backend it cannot use at start-up is a clear, quick, non-zero exit."""

from __future__ import annotations

import time

import pytest

from tests.processes.procutil import (
    assert_clean_exit,
    fetch_jobs,
    read_executions,
    starts_by_job,
)

BAD_ROWS = [
    ("no_such_kind", '{"n": 1}'),  # no @app.job registers it
    ("record", "[1, 2]"),  # args that are not a JSON object
    ("record", '"just a string"'),
    ("record", "{not json"),  # both durable backends store the args as text
    ("record", '{"n": 1, "unexpected": 2}'),  # valid JSON that no call of the handler can bind
    ("record", '{"n": "x"}'),  # binds, but not to the handler's annotation (n: int)
]


@pytest.mark.parametrize("store_name", ["pg_store", "sqlite_store"])
def test_unrunnable_rows_are_discarded_with_an_error_and_the_worker_goes_on(spawner, store_name, request):
    store = request.getfixturevalue(store_name)
    raw = list(BAD_ROWS)
    # Good jobs before and after the bad rows: the worker must not stop at them.
    before = spawner.enqueue(store.url, 10)
    bad = spawner.enqueue(store.url, 0, raw=raw)
    after = spawner.enqueue(store.url, 10, first=10)

    worker = spawner.worker(store.url, "--poll-interval", "0.1", "--drain-from-start", name="worker", drain=0.5)
    rc = worker.wait(30)
    assert_clean_exit(worker, rc)

    jobs = fetch_jobs(store)
    for i in before + after:
        assert (jobs[i].state, jobs[i].attempt) == ("completed", 1), jobs[i]
    assert sorted(starts_by_job(read_executions(spawner.log_dir))) == sorted(before + after)
    for i, (kind, args_json) in zip(bad, raw):
        job = jobs[i]
        assert job.state == "discarded", job
        assert len(job.errors) == 1, job  # discarded on the first attempt, not retried
        if kind == "no_such_kind":
            assert "unknown job kind 'no_such_kind'" in job.errors[0], job
        elif "unexpected" in args_json:
            assert "do not fit the handler" in job.errors[0], job
        elif '"x"' in args_json:
            assert "do not fit the handler: job 'record': argument 'n' must be int, not 'x'" in job.errors[0], job
        elif args_json.startswith("{"):
            assert "could not be decoded" in job.errors[0], job
        else:
            assert "not a JSON object" in job.errors[0], job


def _run_expecting_failure(spawner, url: str, bound: float = 15.0) -> tuple[int, str]:
    t0 = time.monotonic()
    result = spawner.run_worker_cli("work", "--backend", url, "--log-dir", str(spawner.log_dir), timeout=60)
    elapsed = time.monotonic() - t0
    assert result.returncode != 0, result
    assert elapsed < bound, f"took {elapsed:.1f} s to give up"
    assert "READY" not in result.stdout
    return result.returncode, result.stderr


def _unreachable_url() -> str:
    return "postgresql://postgres@127.0.0.1:1/x"


def _missing_schema_url(pg_url: str) -> str:
    sep = "&" if "?" in pg_url else "?"
    return f"{pg_url}{sep}schema=never_migrated"


def test_unreachable_database_at_startup_is_a_quick_clear_error(spawner):
    _, stderr = _run_expecting_failure(spawner, _unreachable_url())
    assert "BackendUnavailable" in stderr, stderr
    assert "cannot connect to PostgreSQL" in stderr, stderr


def test_missing_schema_at_startup_tells_to_migrate(spawner, pg_url):
    _, stderr = _run_expecting_failure(spawner, _missing_schema_url(pg_url))
    assert "ConfigError" in stderr, stderr
    assert "'never_migrated' does not exist" in stderr, stderr
    assert "nursery-jobs migrate" in stderr, stderr


@pytest.mark.parametrize("which", ["unreachable", "missing_schema"])
def test_startup_error_reaches_the_service_as_the_library_error_itself(spawner, which, request):
    """worker.py catches `nj.NurseryJobsError` around `nj.run` and prints one line (exit 2), as a
    service would; that works only if `nj.run` raises the error itself, as `open_runtime` does,
    not wrapped in the runtime's exception groups (it once was, and the service's `except`
    missed it)."""
    url = _unreachable_url() if which == "unreachable" else _missing_schema_url(request.getfixturevalue("pg_url"))
    code, stderr = _run_expecting_failure(spawner, url)
    expected = "worker: BackendUnavailable: cannot connect" if which == "unreachable" else "worker: ConfigError: "
    assert code == 2 and stderr.strip().splitlines()[-1].startswith(expected), stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
