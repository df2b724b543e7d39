"""The suite is laid out by rule: each folder's __init__.py says, in one sentence, what goes in it.

A test file at the top level of tests/, or in a folder that states no rule, has no place a reader
can check it against, so it is an error here. The top level keeps conftest.py and the helpers
several folders share; every folder holding a test file is a package whose docstring is its rule.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# The folders the suite is laid out in (a new one is added here, with its rule, on purpose).
FOLDERS = {
    "unit", "contract", "conformance", "properties", "backends", "backends/sqlite",
    "backends/postgres", "processes", "docs", "lint",
}


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)


def _rule(folder: Path) -> str | None:
    init = folder / "__init__.py"
    if not init.is_file():
        return None
    return ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))


def _one_sentence(text: str) -> bool:
    # One sentence: ends with a full stop, and no full stop followed by a new sentence inside.
    return text.endswith(".") and not re.search(r"[.!?]\s+[A-Z]", text[:-1])


def test_no_test_file_sits_at_the_top_level() -> None:
    loose = [p.name for p in _test_files() if p.parent == TESTS]
    assert not loose, f"{loose} sit at the top level of tests/: move each into the folder whose rule it fits"


def test_every_test_file_sits_in_a_folder_of_the_layout() -> None:
    folders = {p.parent for p in _test_files()} - {TESTS}
    assert folders, "no test files found: the check would prove nothing"
    for folder in sorted(folders):
        relative = folder.relative_to(TESTS).as_posix()
        # A subfolder of a rule's folder (fixtures and the like) falls under that folder's rule.
        enclosing = [relative.rsplit("/", n)[0] for n in range(relative.count("/") + 1)]
        assert any(name in FOLDERS for name in enclosing), (
            f"tests/{relative}/ is not one of the suite's folders {sorted(FOLDERS)}: "
            "move its files into the folder whose rule they fit, or add the folder to FOLDERS with a rule"
        )


def test_every_folder_of_the_layout_has_a_one_sentence_rule() -> None:
    for name in sorted(FOLDERS):
        rule = _rule(TESTS / name)
        assert rule, f"tests/{name}/__init__.py has no docstring: write one sentence saying what goes there"
        assert _one_sentence(" ".join(rule.split())), (
            f"tests/{name}/__init__.py's rule is not one sentence: {rule!r}"
        )
