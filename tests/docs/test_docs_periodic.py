"""docs/periodic.md and examples/maintenance.py: the declarations the page shows are valid, and
the example service runs its schedules (on virtual time, in this process)."""

from __future__ import annotations

import re
from typing import Any

import nursery_jobs as nj
from tests.docs.examples_kit import EXAMPLES, ROOT, load_example, run_main_on_virtual_time

PAGE = ROOT / "docs" / "periodic.md"
EXAMPLE = EXAMPLES / "maintenance.py"


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
    example = load_example(EXAMPLE, "maintenance_example")
    heartbeat, purge = run_main_on_virtual_time(example, 7.0)
    out = capsys.readouterr().out
    assert 3 <= out.count("heartbeat job") <= 4  # every other second for 7 s
    assert heartbeat.last_outcome is nj.JobState.COMPLETED and heartbeat.next_tick is not None
    assert purge.last_tick is None and purge.next_tick is not None and purge.next_tick.hour == 3
    assert "purge_old_sessions (30 3 * * *, Europe/Paris): last tick never" in out
