"""The runtime's log records: one per failed or discarded attempt with its fields, none for what
succeeds, structured fields on every call; and the worker's text and JSON formatters."""

from __future__ import annotations

import ast
import json
import logging
from pathlib import Path

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.app import EnqueueOptions
from nursery_jobs.cli.logs import JsonFormatter, TextFormatter

PACKAGE = Path(nj.__file__).parent
LEVELS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


def test_every_log_call_of_the_package_carries_structured_fields_with_an_event_name() -> None:
    calls, bare = 0, []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if not (isinstance(node.func.value, ast.Name) and node.func.value.id == "log" and node.func.attr in LEVELS):
                continue
            calls += 1
            extra = next((k.value for k in node.keywords if k.arg == "extra"), None)
            named = isinstance(extra, ast.Dict) and any(
                key is None or (isinstance(key, ast.Constant) and key.value == "event") for key in extra.keys
            )  # a `**spread` (the watchdog's) carries its event from where the dict is built
            if not named:
                bare.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert calls > 20, "the check found too few log calls to prove anything"
    assert bare == [], f"log calls without extra={{'event': ...}}: {bare}"


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "nursery_jobs" and getattr(r, "event", "").startswith(("attempt", "job_"))]


async def test_each_failed_attempt_is_one_record_with_its_fields_and_success_is_quiet(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nursery_jobs")
    app = nj.App()
    app.queue("q", max_workers=2, timeout=1)

    @app.job(queue="q", max_attempts=2, retry=nj.RetryPolicy(base=3, factor=1, cap=3, jitter=0))
    async def flaky(ctx: nj.JobContext, n: int) -> None:
        await trio.sleep(0.25)
        raise KeyError(f"missing {n}\nreally")

    @app.job(queue="q", max_attempts=1)
    async def slow(ctx: nj.JobContext) -> None:
        await trio.sleep(5)

    @app.job(queue="q")
    async def picky(ctx: nj.JobContext) -> None:
        raise nj.Discard("not for us")

    @app.job(queue="q")
    async def fine(ctx: nj.JobContext) -> None:
        await trio.sleep(0.1)

    async with nj.open_runtime(app, grace=0) as rt:
        ids = [await rt.enqueue(kind, args) for kind, args in (("flaky", {"n": 1}), ("slow", {}), ("picky", {}), ("fine", {}))]
        for job_id in ids:
            assert (await rt.wait(job_id, timeout=30)).done
    flaky_id, slow_id, picky_id, fine_id = ids
    records = {(r.job_id, r.attempt): r for r in _records(caplog)}  # type: ignore[attr-defined]
    assert sorted(records) == [(flaky_id, 1), (flaky_id, 2), (slow_id, 1), (picky_id, 1)]  # none for `fine`
    first, last = records[(flaky_id, 1)], records[(flaky_id, 2)]
    fields = ("event", "kind", "queue", "max_attempts", "error", "outcome", "retry_in")
    assert {f: getattr(first, f) for f in fields} == {
        "event": "attempt_failed", "kind": "flaky", "queue": "q", "max_attempts": 2,
        "error": "KeyError: 'missing 1\\nreally'", "outcome": "retry", "retry_in": 3.0,
    }  # fmt: skip
    assert first.duration == pytest.approx(0.25) and first.levelno == logging.WARNING  # type: ignore[attr-defined]
    assert first.getMessage() == (
        f"job {flaky_id} (flaky, queue q) attempt 1 of 2 failed after 0.25 s: KeyError: 'missing 1\\nreally'; "
        "retrying in 3 s"
    )
    assert (last.levelno, last.outcome, last.retry_in) == (logging.ERROR, "discard", None)  # type: ignore[attr-defined]
    assert last.getMessage().endswith("; no attempt left: discarded")
    timed_out = records[(slow_id, 1)]
    assert timed_out.error == "timed out after 1 s" and timed_out.duration == pytest.approx(1.0)  # type: ignore[attr-defined]
    assert timed_out.getMessage().endswith("attempt 1 of 1 failed after 1 s: timed out after 1 s; no attempt left: discarded")
    discarded = records[(picky_id, 1)]
    assert (discarded.event, discarded.levelno, discarded.error) == ("job_discarded", logging.WARNING, "not for us")  # type: ignore[attr-defined]
    assert "was discarded by its handler after" in discarded.getMessage()


async def test_a_job_that_cannot_run_is_one_error_record(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    app = nj.App()
    async with nj.open_runtime(app, grace=0) as rt:
        # Stored by a process whose app knows a kind this one does not (a deploy in progress).
        other = nj.App()
        other.job()(_gone)
        [(job_id, _)] = await rt.backend.insert_many([other.kind("_gone").new_job({}, EnqueueOptions(), rt.now())])
        assert (await rt.wait(job_id, timeout=10)).state is nj.JobState.DISCARDED
    [record] = _records(caplog)
    assert (record.levelno, record.event, record.job_id, record.kind) == (logging.ERROR, "job_discarded", job_id, "_gone")  # type: ignore[attr-defined]
    assert "could not run" in record.getMessage() and "unknown job kind '_gone'" in record.getMessage()


async def _gone(ctx: nj.JobContext) -> None:
    """Declared only by the other app."""


def _record(msg: str, *args: object, exc: bool = False, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("nursery_jobs", logging.WARNING, __file__, 1, msg, args, None)
    if exc:
        try:
            raise ValueError("inner")
        except ValueError:
            import sys

            record.exc_info = sys.exc_info()
    record.__dict__.update(extra)
    return record


def test_the_json_formatter_writes_one_object_per_line_with_every_field() -> None:
    line = JsonFormatter().format(_record("job %d failed", 7, exc=True, event="attempt_failed", job_id=7, when=object(), error="a\nb"))
    assert "\n" not in line
    out = json.loads(line)
    assert out["message"] == "job 7 failed" and out["level"] == "warning" and out["logger"] == "nursery_jobs"
    assert (out["event"], out["job_id"], out["error"]) == ("attempt_failed", 7, "a\nb")
    assert out["when"].startswith("<object object") and "ValueError: inner" in out["exception"]
    assert out["time"].endswith("Z") and "T" in out["time"]
    for standard in ("args", "msg", "levelno", "pathname", "exc_info"):
        assert standard not in out


def test_both_formats_keep_the_database_name_and_redact_the_password() -> None:
    url = "postgresql://svc:Hunter2pw@db.internal:5432/app?schema=jobs"
    record = _record("cannot reach %s", url, event="backend_retry", backend=url)
    for formatter in (JsonFormatter(), TextFormatter()):
        line = formatter.format(record)
        assert "Hunter2pw" not in line and "postgresql://svc:***@db.internal:5432/app?schema=jobs" in line
    assert TextFormatter().format(record).endswith(" WARNING nursery_jobs: cannot reach postgresql://svc:***@db.internal:5432/app?schema=jobs")
