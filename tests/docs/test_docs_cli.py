"""docs/cli.md and docs/coming-from.md hold: the excerpt is the example's code, every option of
every command and every log event is on the page, and the nursery_jobs code of the comparison
runs and does what the page says."""

from __future__ import annotations

import ast
import re
import types
from pathlib import Path

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.cli import cli

ROOT = Path(__file__).resolve().parents[2]
CLI_PAGE = (ROOT / "docs" / "cli.md").read_text()
COMING_FROM = (ROOT / "docs" / "coming-from.md").read_text()
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def test_the_pages_excerpt_is_the_example_modules_code() -> None:
    [excerpt] = BLOCK.findall(CLI_PAGE)
    assert excerpt in (ROOT / "examples" / "service_jobs.py").read_text()


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_option_of_every_command_is_on_the_page(command: str) -> None:
    assert f"## `nursery-jobs {command}" in CLI_PAGE
    for param in cli.commands[command].params:
        for flag in param.opts:
            if flag.startswith("--"):
                assert f"`{flag}" in CLI_PAGE, f"{command} {flag} is not on docs/cli.md"
        if param.envvar:
            assert f"`{param.envvar}`" in CLI_PAGE


def _events() -> set[str]:
    """Every `"event": "..."` the package's log calls write (a name in a variable is the
    failed-attempt record's choice of two, and `extra["event"] = "..."` the watchdog's)."""
    found = set()
    for path in (ROOT / "nursery_jobs").rglob("*.py"):
        text = path.read_text()
        found.update(re.findall(r'extra\["event"\] = "(\w+)"', text))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value == "event":
                        if isinstance(value, ast.Constant):
                            found.add(value.value)
                        else:
                            found.update({"attempt_failed", "job_discarded"})
    return found


def test_every_log_event_is_in_the_pages_table() -> None:
    events = _events()
    assert {"attempt_failed", "worker_started", "blocked_loop", "backend_retry"} <= events
    missing = sorted(e for e in events if f"`{e}`" not in CLI_PAGE)
    assert missing == [], f"events not in docs/cli.md's table: {missing}"


async def test_the_nightly_schedule_of_the_comparison_makes_one_purge_per_night(
    autojump_clock: trio.testing.MockClock,
) -> None:
    code = BLOCK.findall(COMING_FROM)[0]
    module = types.ModuleType("coming_from_nursery_jobs")
    exec(compile(code, "docs/coming-from.md", "exec"), module.__dict__)
    schedule = module.app.periodic_schedules["purge_sessions"]
    assert (schedule.schedule, schedule.cron.timezone) == ("0 3 * * *", "Europe/Paris")
    async with nj.open_runtime(module.app, queues=[]) as rt, nj.open_runtime(module.app, backend=rt.backend, queues=[]):
        await trio.sleep(86400 + 60)  # a night, two processes on one store
        stats = await rt.stats()
    assert stats["maintenance"].queued == 1