"""The `nursery-jobs` command in this process: help texts, and every user error answered with one
line, the right exit code and no password; `enqueue` on an SQLite file.

The worker's real run (signals, exit code, logs) is tests/processes/test_worker_command.py.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from typing import Any, Iterator

import pytest

from nursery_jobs.cli import main

APP = "tests/processes/cli_app.py:app"
SECRET = "Hunter2pw"


@pytest.fixture(autouse=True)
def _keep_root_logging() -> Iterator[None]:
    """The worker configures the root logger, as a process's owner does: put pytest's back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _no_backend_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NURSERY_JOBS_BACKEND", raising=False)
    monkeypatch.delenv("NURSERY_JOBS_APP", raising=False)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str, command: str) -> str:
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith(f"nursery-jobs {command}: "), err
    assert "Traceback" not in err and SECRET not in err
    return err[len(f"nursery-jobs {command}: ") : -1]


# -- help --


@pytest.mark.parametrize(
    "argv, says",
    [
        ([], ["worker", "enqueue", "migrate", "NURSERY_JOBS_BACKEND"]),
        (["worker"], ["MODULE:APP", "--backend URL", "--queues A,B", "--grace SECONDS", "--log-level", "--log-format",
                      "SIGTERM", "exits 0", "env var: NURSERY_JOBS_BACKEND", "examples/service_jobs.py:app"]),
        (["enqueue"], ["KIND", "--args JSON", "--app MODULE:APP", "--delay SECONDS", "--priority N", "--queue NAME", "--unique-key KEY",
                       "print its id", "env var: NURSERY_JOBS_APP"]),
        (["migrate"], ["--database-url URL", "--schema NAME", "env var: NURSERY_JOBS_BACKEND"]),
    ],
)  # fmt: skip
def test_every_help_text_names_its_options_in_lines_a_terminal_shows(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: list[str]
) -> None:
    code, out, err = run(capsys, *argv, "--help")
    assert (code, err) == (0, "")
    flat = " ".join(out.split())
    for words in says:
        assert words in flat, f"{words!r} missing from:\n{out}"
    assert max(len(line) for line in out.splitlines()) <= 100, out
    assert run(capsys, *argv, "-h")[1] == out


# -- click's own usage errors: one line too, with where to look --


@pytest.mark.parametrize(
    "argv, command, says",
    [
        (["frobnicate"], "", "no such command 'frobnicate' (see 'nursery-jobs --help')"),
        (["worker", APP, "--backend", "memory://", "--log-level", "loud"], "worker",
         "invalid value for '--log-level': 'loud' is not one of 'debug', 'info', 'warning', 'error', 'critical' "
         "(see 'nursery-jobs worker --help')"),
        (["worker", APP, "--backend", "memory://", "--log-levl", "info"], "worker",
         "no such option '--log-levl'; did you mean '--log-level'? (see 'nursery-jobs worker --help')"),
        (["worker"], "worker", "missing argument 'MODULE:APP' (see 'nursery-jobs worker --help')"),
        (["enqueue", "k", "--backend", "sqlite:///x.db", "--delay", "soon"], "enqueue",
         "invalid value for '--delay': 'soon' is not a valid float (see 'nursery-jobs enqueue --help')"),
    ],
)  # fmt: skip
def test_a_usage_error_is_one_line_naming_the_help(capsys: pytest.CaptureFixture[str], argv: list[str], command: str, says: str) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err == f"nursery-jobs{' ' if command else ''}{command}: {says}\n"


def test_the_bare_command_shows_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys)
    assert code == 2 and "Commands:" in out + err and "worker" in out + err


# -- the worker's user errors, each one line --


@pytest.mark.parametrize(
    "spec, says",
    [
        ("no_such_module:app", "no module named 'no_such_module' (looked in "),
        ("no_such_pkg.jobs:app", "no module named 'no_such_pkg' (looked in "),
        ("tests/processes/no_file.py:app", "no file 'tests/processes/no_file.py'"),
        ("tests/processes/cli_app.py:apps", "module 'cli_app' has no attribute 'apps'; the App objects in it: app"),
        ("tests/processes/cli_app.py:not_an_app", "is not an nursery_jobs.App (its type is int)"),
        ("json:app", "module 'json' has no attribute 'app'; it defines no nursery_jobs.App"),
        (":app", "names no module; give MODULE:APP"),
    ],
)
def test_a_bad_module_app_names_what_could_not_be_found(capsys: pytest.CaptureFixture[str], spec: str, says: str) -> None:
    code, out, err = run(capsys, "worker", spec, "--backend", "memory://")
    assert code == 2 and out == ""
    assert says in one_line(err, "worker")


def test_app_defaults_to_the_attribute_named_app(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "worker", "tests/processes/cli_app.py", "--backend", "memory://", "--queues", "nope")
    assert code == 2 and "--queues names 'nope'" in one_line(err, "worker")


@pytest.mark.parametrize(
    "argv, code, says",
    [
        (["--queues", "work,bogus"], 2, "--queues names 'bogus', which the app does not declare; it declares: default, work, other"),
        (["--queues", " , "], 2, "names no queue"),
        (["--grace", "-1"], 2, "grace"),
        (["--backend", f"mysql://svc:{SECRET}@db/app"], 2, "unsupported backend URL scheme 'mysql' in 'mysql://svc:***@db/app'"),
        (["--backend", f"postgresql://svc:{SECRET}@127.0.0.1:1/app"], 1, "cannot connect to PostgreSQL at postgresql://svc@127.0.0.1:1/app"),
        (["--backend", f"postgresql://svc:{SECRET}@127.0.0.1/app?pool_size=x"], 2, "pool_size"),
    ],
)  # fmt: skip
def test_a_bad_option_or_backend_is_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], code: int, says: str) -> None:
    if "--backend" not in argv:
        argv = [*argv, "--backend", "memory://"]
    got, out, err = run(capsys, "worker", APP, *argv)
    assert got == code and out == ""
    assert says in one_line(err, "worker")


def test_a_resource_that_cannot_open_is_one_line_naming_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = run(capsys, "worker", "tests/processes/cli_app.py:broken", "--backend", f"sqlite:///{tmp_path / 'j.db'}")
    assert code == 1 and out == ""
    line = one_line(err, "worker")
    assert "'mailer'" in line and "smtp.internal:25 refused the connection" in line, line


def test_the_backend_is_required_and_read_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run(capsys, "worker", APP)
    assert code == 2 and "missing option '--backend'" in one_line(err, "worker") and "NURSERY_JOBS_BACKEND" in err
    monkeypatch.setenv("NURSERY_JOBS_BACKEND", f"mysql://svc:{SECRET}@db/app")
    code, _, err = run(capsys, "worker", APP)
    assert code == 2 and "'mysql://svc:***@db/app'" in one_line(err, "worker")


# -- enqueue --


def _rows(db: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT id, kind, queue, args, priority, max_attempts, state FROM nj_jobs ORDER BY id").fetchall()
    finally:
        conn.close()


def test_enqueue_prints_the_id_and_takes_the_kind_from_the_app(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "jobs.db"
    url = f"sqlite:///{db}"
    assert run(capsys, "enqueue", "record", "--args", '{"n": 1}', "--app", APP, "--backend", url) == (0, "1\n", "")
    assert run(capsys, "enqueue", "fail", "--args", '{"n": 2}', "--app", APP, "--backend", url, "--priority", "5") == (0, "2\n", "")
    assert run(capsys, "enqueue", "tidy", "--backend", url, "--queue", "other", "--max-attempts", "3") == (0, "3\n", "")
    assert run(capsys, "enqueue", "tidy", "--backend", url, "--delay", "60") == (0, "4\n", "")
    assert [(r[1], r[2], json.loads(r[3]), r[4], r[5], r[6]) for r in _rows(db)] == [
        ("record", "work", {"n": 1}, 0, 25, "available"),
        ("fail", "work", {"n": 2}, 5, 2, "available"),
        ("tidy", "other", {}, 0, 3, "available"),
        ("tidy", "default", {}, 0, 25, "scheduled"),
    ]


def test_enqueue_with_the_app_takes_the_kinds_attempts_unless_told_otherwise(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    assert run(capsys, "enqueue", "fail", "--args", '{"n": 1}', "--app", APP, "--backend", url) == (0, "1\n", "")
    assert run(capsys, "enqueue", "fail", "--args", '{"n": 1}', "--app", APP, "--backend", url, "--max-attempts", "7") == (0, "2\n", "")
    assert [(r[1], r[2], r[5]) for r in _rows(tmp_path / "jobs.db")] == [("fail", "work", 2), ("fail", "work", 7)]


def test_enqueue_with_a_unique_key_adds_one_job_while_it_is_pending(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    argv = ["enqueue", "tidy", "--backend", url, "--unique-key", "nightly", "--delay", "3600"]
    assert run(capsys, *argv) == (0, "1\n", "")
    code, out, err = run(capsys, *argv)
    assert (code, out) == (0, "1\n")
    assert one_line(err, "enqueue") == "job 1 holds unique key 'nightly' and is not final; nothing was added"
    assert len(_rows(tmp_path / "jobs.db")) == 1


def test_enqueue_reads_the_app_and_backend_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NURSERY_JOBS_BACKEND", f"sqlite:///{tmp_path / 'jobs.db'}")
    monkeypatch.setenv("NURSERY_JOBS_APP", APP)
    assert run(capsys, "enqueue", "record", "--args", '{"n": 1}') == (0, "1\n", "")
    code, _, err = run(capsys, "enqueue", "nope")
    assert code == 2 and "no job kind named 'nope'" in one_line(err, "enqueue")


@pytest.mark.parametrize(
    "argv, code, says",
    [
        (["record", "--args", "{n: 1}", "--app", APP], 2, "--args is not valid JSON"),
        (["record", "--args", "[1]", "--app", APP], 2, "--args must be a JSON object of keyword arguments, not list"),
        (["record", "--args", '{"m": 1}', "--app", APP], 2, "do not fit job 'record'"),
        (["recrod", "--args", '{"n": 1}', "--app", APP], 2, "no job kind named 'recrod'"),
        (["record", "--args", '{"n": 1}', "--app", APP, "--queue", "x"], 2, "--queue comes from the app's declaration"),
        (["record", "--args", '{"n": 1}', "--app", "tests/processes/cli_app.py:nope"], 2, "has no attribute 'nope'"),
        (["record", "--delay", "-1"], 2, "delay must be a finite number of seconds >= 0"),
        (["record", "--max-attempts", "0"], 2, "--max-attempts must be an int >= 1, not 0"),
        (["record", "--args", '{"n": 1}', "--app", APP, "--max-attempts", "0"], 2, "--max-attempts must be an int >= 1"),
        (["record", "--args", '{"n": 1e999}'], 2, "not JSON-serialisable"),
        (["record", "--backend", f"postgresql://svc:{SECRET}@127.0.0.1:1/app"], 1, "cannot connect to PostgreSQL"),
        (["record", "--backend", "memory://"], 2, "memory:// keeps jobs inside one process"),
    ],
)
def test_enqueue_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, says: str
) -> None:
    if "--backend" not in argv:
        argv = [*argv, "--backend", f"sqlite:///{tmp_path / 'jobs.db'}"]
    got, out, err = run(capsys, "enqueue", *argv)
    assert got == code and out == ""
    assert says in one_line(err, "enqueue")
    assert not (tmp_path / "jobs.db").exists() or _rows(tmp_path / "jobs.db") == []


def test_migrate_is_still_one_line_for_a_bad_url(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "migrate", "--database-url", f"postgresql://svc:S3CR%zz{SECRET}@127.0.0.1/x")
    assert code == 2 and out == ""
    assert "bad PostgreSQL URL" in one_line(err, "migrate")


def test_migrate_says_it_is_for_postgresql_and_that_sqlite_migrates_itself(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "migrate", "--database-url", "sqlite:///jobs.db")
    assert (code, err) == (0, "")
    assert out == (
        "nothing to migrate: an SQLite database creates and upgrades its own schema when a runtime opens it; "
        "`nursery-jobs migrate` is for PostgreSQL\n"
    )
    code, out, err = run(capsys, "migrate", "--database-url", f"mysql://svc:{SECRET}@db/app")
    assert (code, out) == (2, "")
    assert one_line(err, "migrate") == "migrate is for PostgreSQL (--database-url postgresql://user@host/db), not mysql://"


BOUNDED_APP = '''
import nursery_jobs as nj

app = nj.App()
app.queue("bounded", max_workers=1, max_length=1)


@app.job(queue="bounded")
async def item(ctx: nj.JobContext) -> None:
    pass
'''


def test_enqueue_into_a_full_bounded_queue_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = tmp_path / "bounded_app.py"
    module.write_text(BOUNDED_APP)
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    argv = ["enqueue", "item", "--app", f"{module}:app", "--backend", url]
    assert run(capsys, *argv) == (0, "1\n", "")
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "")
    assert "queue 'bounded' is full: its max_length is 1" in one_line(err, "enqueue")
    assert len(_rows(tmp_path / "jobs.db")) == 1
