"""examples/fenced_writes.py: run as a user runs it (a subprocess, on the embedded memory
backend, then on SQLite), and in this process on virtual time, where the store it writes to is
checked: the second holder's report stands, and the first holder's write, which ran after the
second holder had written, was refused for its smaller token."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.examples_kit import EXAMPLES, load_example, run_example_script, run_main_on_virtual_time

EXAMPLE = EXAMPLES / "fenced_writes.py"
PAGE = Path(__file__).resolve().parents[2] / "docs" / "locks.md"


def test_the_pages_fencing_excerpt_is_the_examples_code() -> None:
    section = PAGE.read_text().split("## Fencing tokens", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"^```python\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert block in EXAMPLE.read_text()


def test_the_late_write_of_the_first_holder_is_refused_for_its_token() -> None:
    example = load_example(EXAMPLE, "fenced_writes_example")
    store = run_main_on_virtual_time(example)
    assert store.report == "report by holder 2"
    [(body, token)] = store.refused
    assert body == "report by holder 1" and token < store.fence


def test_the_fenced_writes_example_runs_as_a_script(tmp_path: Path) -> None:
    for backend in ("memory://", f"sqlite:///{tmp_path / 'jobs.db'}"):
        out = run_example_script(EXAMPLE, "--backend", backend).stdout
        assert "'report by holder 2' with token 2: stored" in out, out
        assert "'report by holder 1' with token 1: refused (the store has seen token 2)" in out, out
        assert out.splitlines()[-1] == "the report: 'report by holder 2' (token 2)", out
