"""Rule fixtures (flake8-async "eval file" style) and the "every code is documented" check.

Each ``fixtures/njsXXX_positive*.py`` / ``njsXXX_negative*.py`` file is checked as if it lived at
``pkg/<name>.py`` (or at the path given by a ``# lint-fixture-path: ...`` line) with
``allow = ["pkg/infra/**"]``. The findings must be exactly the inline ``# error: NJSxxx[, ...]``
expectations, line by line (a code listed twice means two findings on that line). Negative
fixtures have no expectations, so they must be clean.
"""

from __future__ import annotations

import collections
import pathlib
import re

import pytest

from .lint_support import FIXTURES, REPO, main
from nursery_jobs_lint.checker import check_source
from nursery_jobs_lint.config import Config
from nursery_jobs_lint.rules import RULES

_EXPECT = re.compile(r"#\s*error:\s*(?P<codes>NJS\d{3}(?:\s*,\s*NJS\d{3})*)")
_PATH = re.compile(r"^#\s*lint-fixture-path:\s*(\S+)", re.MULTILINE)


def expectations(text: str) -> collections.Counter[tuple[int, str]]:
    expected: collections.Counter[tuple[int, str]] = collections.Counter()
    for number, line in enumerate(text.splitlines(), 1):
        match = _EXPECT.search(line)
        if match:
            for code in re.split(r"\s*,\s*", match.group("codes")):
                expected[(number, code)] += 1
    return expected


def fixture_config(name: str) -> Config:
    select = ("NJS901",) if name.startswith("njs901") else ()
    return Config(root=pathlib.Path("."), allow=("pkg/infra/**",), tests=("tests/**",), extend_select=select)


FIXTURE_FILES = sorted(FIXTURES.glob("njs*.py"))


@pytest.mark.parametrize("fixture", FIXTURE_FILES, ids=[f.stem for f in FIXTURE_FILES])
def test_fixture(fixture: pathlib.Path) -> None:
    text = fixture.read_text(encoding="utf-8")
    path_match = _PATH.search(text)
    path = path_match.group(1) if path_match else f"pkg/{fixture.stem}.py"
    findings = check_source(fixture.read_bytes(), path, fixture_config(fixture.stem))
    got = collections.Counter((f.line, f.code) for f in findings)
    expected = expectations(text)
    assert got == expected, "\n".join(
        ["unexpected: " + f.format() for f in findings if got[(f.line, f.code)] > expected[(f.line, f.code)]]
        + [f"missing: line {line} {code}" for (line, code), n in (expected - got).items()]
    )
    if "negative" in fixture.stem:
        assert not expected, "negative fixtures carry no expectations"
    else:
        code = fixture.stem.split("_")[0].upper()
        assert code in {c for _, c in expected}, f"positive fixture never expects its own code {code}"


def test_fixture_names_are_rule_codes() -> None:
    # the fixtures are exempt as tests in the real config; test_fixture is what judges them
    assert FIXTURE_FILES and all(f.stem.split("_")[0].upper() in RULES for f in FIXTURE_FILES)


@pytest.mark.parametrize("code", sorted(RULES))
def test_every_code_has_fixtures_explain_and_docs(code: str, capsys: pytest.CaptureFixture[str]) -> None:
    rule = RULES[code]
    stem = code.lower()
    assert (FIXTURES / f"{stem}_positive.py").is_file(), f"missing fixtures/{stem}_positive.py"
    assert (FIXTURES / f"{stem}_negative.py").is_file(), f"missing fixtures/{stem}_negative.py"

    assert main(["--explain", code]) == 0
    explained = capsys.readouterr().out
    assert explained.startswith(f"{code} {rule.name}")
    assert rule.example in explained and "Instead:" in explained

    docs = (REPO / "docs" / "lint.md").read_text(encoding="utf-8")
    heading = re.search(rf"^#+ .*\b{code}\b.*$", docs, re.MULTILINE)
    assert heading, f"docs/lint.md has no heading for {code}"
    assert rule.name in heading.group(0), f"docs/lint.md heading for {code} does not name {rule.name}"


def test_list_rules_lists_every_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list-rules"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(RULES)


def test_explain_unknown_code_is_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--explain", "NJS999"]) == 2
    assert "unknown rule" in capsys.readouterr().err
