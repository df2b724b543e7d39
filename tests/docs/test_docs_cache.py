"""docs/cache.md: the page's first program runs and prints what the page shows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cache.md"


def test_the_pages_example_prints_what_the_page_shows(tmp_path: Path) -> None:
    found = re.search(r"```python\n(.*?)```\n\n```text\n(.*?)```", PAGE.read_text(), re.S)
    assert found is not None
    program, shown = found.groups()
    script = tmp_path / "cache_example.py"
    script.write_text(program)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == shown
