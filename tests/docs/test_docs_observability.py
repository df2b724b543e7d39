"""The pages of `PAGES` (middleware, metrics, tracing) open with a complete program: each is run
here as a user runs it, a subprocess that must exit 0, and what it prints is the page's
```text block right after it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["middleware.md", "metrics.md", "tracing.md"]
RUN_TIMEOUT = 60  # a bound for a loaded 2-core machine, not a speed claim
OPENING = re.compile(r"```python\n(.*?)```\n\n```text\n(.*?)```", re.DOTALL)


@pytest.mark.parametrize("page", PAGES)
def test_the_page_opens_with_a_program_that_prints_what_the_page_shows(page: str, tmp_path: Path) -> None:
    text = (ROOT / "docs" / page).read_text()
    found = OPENING.search(text)
    assert found is not None, f"docs/{page} does not open with a ```python block and its ```text output"
    assert text.index("```python") == found.start(), f"docs/{page}: the first code block is not its example"
    script = tmp_path / "example.py"
    script.write_text(found.group(1))
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stdout == found.group(2)
