"""docs/periodic.md and examples/maintenance.py: the declarations the page shows are valid, and
the example service runs its schedules (on virtual time, in this process)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import trio
import trio.testing

import nursery_jobs as nj

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "periodic.md"
EXAMPLE = ROOT / "examples" / "maintenance.py"


def _load_example() -> Any:
    spec = importlib.util.spec_from_file_location("maintenance_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pages_first_example_declares_what_it_says() -> None:
    code = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert code is not None
    namespace: dict[str, Any] = {}
    exec(compile(code.group(1), str(PAGE), "exec"), namespace)
    schedules = namespace["app"].periodic_schedules
    assert {name: (p.schedule, p.cron.timezone, p.missed) for name, p in schedules.items()} == {
        "purge_sessions": ("*/5 * * * *", "UTC", "skip"),
        "nightly_report": ("30 2 * * *", "Europe/Paris", "run_once"),
        "update_mirrors": ("@every 10m", "UTC", "skip"),
    }
    assert namespace["app"].kind("update_mirrors").queue == "maintenance"


def test_the_maintenance_example_runs_its_schedules(capsys: Any) -> None:
    example = _load_example()

    async def body() -> list[nj.PeriodicInfo]:
        async with nj.open_runtime(example.app) as rt:
            return await example.main(rt, 7.0)  # type: ignore[no-any-return]

    heartbeat, purge = trio.run(body, clock=trio.testing.MockClock(autojump_threshold=0))
    out = capsys.readouterr().out
    assert 3 <= out.count("heartbeat job") <= 4  # every other second for 7 s
    assert heartbeat.last_outcome is nj.JobState.COMPLETED and heartbeat.next_tick is not None
    assert purge.last_tick is None and purge.next_tick is not None and purge.next_tick.hour == 3
    assert "purge_old_sessions (30 3 * * *, Europe/Paris): last tick never" in out
