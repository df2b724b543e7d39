"""The project's text stands on its own: it states its reasons and points only at its own files.

A reader of the docs, a docstring or a comment has the repository and nothing else. A sentence
that sends them to a design note, a card or a file that was never committed ("the seed's rule",
`shared/design/...`, "/tmp/notes.md") gives them no reason at all, so every such reference is an
error here, and so is a relative Markdown link to a file that does not exist or an anchor that no
heading of that page makes.

Scanned: README.md, docs/*.md, benchmarks/**/*.md, pyproject.toml, and every .py file of
nursery_jobs/, nursery_jobs_lint/, examples/, benchmarks/ and tests/ (code, docstrings and comments alike),
except this file, which has to name what it forbids. Links to public web pages are not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THIS_FILE = Path(__file__).resolve()

MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").rglob("*.md"))]
SOURCES = [
    path
    for top in ("nursery_jobs", "nursery_jobs_lint", "examples", "benchmarks", "tests")
    for path in sorted((ROOT / top).rglob("*.py"))
    if path.resolve() != THIS_FILE
]
SCANNED = [*MARKDOWN, ROOT / "pyproject.toml", *SOURCES]

# Phrases that only make sense to someone holding documents the repository does not have.
OUTSIDE_REFERENCES = [
    (re.compile(r"(?<![\w.-])shared/", re.IGNORECASE), "a path under shared/, which is not in the repository"),
    (re.compile(r"\bseeds/", re.IGNORECASE), "a path under seeds/, which is not in the repository"),
    (re.compile(r"\bthe seeds?\b", re.IGNORECASE), '"the seed": state the reason itself'),
    (re.compile(r"\barchitecture card\b|\bthe card\b", re.IGNORECASE), '"the card": state the reason itself'),
    (re.compile(r"\bthe brief\b", re.IGNORECASE), '"the brief": state the reason itself'),
]
URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)
MD_MENTION = re.compile(r"(?<![\w.-])([\w./-]*[\w-]\.md)\b")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)


def repo_markdown_names() -> set[str]:
    """Base names of the Markdown files the repository holds (hidden directories, like a venv or
    a cache, are not the repository's)."""
    names = set()
    for path in ROOT.rglob("*.md"):
        if not any(part.startswith(".") for part in path.relative_to(ROOT).parts):
            names.add(path.name)
    return names


def line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def outside_references(text: str, here: Path, md_names: set[str]) -> list[tuple[int, str]]:
    """(line, what) for every reference in `text` (the text of file `here`) to something outside
    the repository."""
    found = []
    without_urls = URL.sub(lambda m: " " * len(m.group(0)), text)  # a public page is not ours to check
    for pattern, what in OUTSIDE_REFERENCES:
        for match in pattern.finditer(without_urls):
            found.append((line_of(text, match.start()), f"{match.group(0)!r}: {what}"))
    for match in MD_MENTION.finditer(without_urls):
        name = match.group(1)
        if name.startswith("/") or name.startswith("../"):
            exists = False
        elif "/" in name.strip("./"):
            exists = any(
                (base / name).is_file() and (base / name).resolve().is_relative_to(ROOT)
                for base in (ROOT, here.parent)
            )
        else:
            exists = name.lstrip("./") in md_names
        if not exists:
            found.append((line_of(text, match.start()), f"{name!r}: no such Markdown file in the repository"))
    return sorted(found)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    result = set()
    for match in HEADING.finditer(FENCE.sub("", markdown)):
        base = slug(match.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def broken_links(text: str, here: Path) -> list[tuple[int, str]]:
    """(line, what) for every relative link of Markdown `text` (the page `here`) whose file does
    not exist in the repository, or whose anchor no heading of its page makes."""
    found = []
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for match in LINK.finditer(prose):
        target = match.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # a web page or mail address, not a file of ours
        path_part, _, fragment = target.partition("#")
        page = (here.parent / path_part).resolve() if path_part else here.resolve()
        line = line_of(prose, match.start())
        if not page.is_relative_to(ROOT):
            found.append((line, f"{target!r} points outside the repository"))
        elif not page.exists():
            found.append((line, f"{target!r}: no such file in the repository"))
        elif fragment and page.suffix == ".md" and fragment not in anchors(page.read_text(encoding="utf-8")):
            found.append((line, f"{target!r}: {page.name} has no heading with that anchor"))
    return found


def test_the_scan_covers_the_project_text() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in SCANNED}
    assert {"README.md", "docs/design.md", "docs/backends.md", "nursery_jobs/config.py", "examples/quickstart.py"} <= names
    assert len(MARKDOWN) >= 10 and len(SOURCES) >= 50, (len(MARKDOWN), len(SOURCES))


@pytest.mark.parametrize("path", SCANNED, ids=[p.relative_to(ROOT).as_posix() for p in SCANNED])
def test_no_reference_to_files_outside_the_repository(path: Path) -> None:
    problems = outside_references(path.read_text(encoding="utf-8"), path, repo_markdown_names())
    rel = path.relative_to(ROOT).as_posix()
    assert not problems, "\n".join(f"{rel}:{line}: {what}" for line, what in problems)


@pytest.mark.parametrize("path", MARKDOWN, ids=[p.relative_to(ROOT).as_posix() for p in MARKDOWN])
def test_every_relative_link_reaches_a_file_of_the_repository(path: Path) -> None:
    problems = broken_links(path.read_text(encoding="utf-8"), path)
    rel = path.relative_to(ROOT).as_posix()
    assert not problems, "\n".join(f"{rel}:{line}: {what}" for line, what in problems)


def test_the_checks_catch_what_they_forbid() -> None:
    here = ROOT / "docs" / "page.md"
    names = repo_markdown_names()
    bad = (
        "The rule comes from shared/design/architecture.md.\n"
        "As the seed's design note says, and the architecture card too.\n"
        "See seeds/000 and /tmp/proc_bugs.md, or lint-and-properties.md 2.4.\n"
    )
    lines = [line for line, _ in outside_references(bad, here, names)]
    # line 1: shared/ and architecture.md; line 2: the seed, the card; line 3: seeds/, two .md files
    assert lines == [1, 1, 2, 2, 3, 3, 3], outside_references(bad, here, names)
    good = (
        "Half the pool stays for the service's requests (see docs/backends.md and RESULTS.md).\n"
        "A seeded RNG, `random.seed(0)`, https://example.org/shared/seeds/notes.md, docs/*.md.\n"
    )
    assert outside_references(good, here, names) == []

    links = (
        "[ok](backends.md#the-connection-budget) [ok](../README.md) [web](https://example.org/x.md)\n"
        "[gone](architecture.md) [out](../../shared/design/architecture.md) [anchor](backends.md#no-such)\n"
        "```text\n[inside a block](nowhere.md)\n```\n"
    )
    assert [line for line, _ in broken_links(links, here)] == [2, 2, 2], broken_links(links, here)
