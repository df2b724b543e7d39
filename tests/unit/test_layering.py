"""The package's layers, enforced: which part of nursery_jobs may import which.

Every import counts -- at module level, inside a function, under `TYPE_CHECKING` -- because a
circle closed by a type-only import is still a circle in the design. From the bottom up:

- `errors`, `infra` (the only owner of tasks; imports nothing of the library but `errors`)
- `jobs`, `config`, `cron`, `_context` (the vocabulary; ContextVars only)
- `rules` (the job rules: what a job's row may become, with no I/O)
- `backends` (the protocol by capability, the stores)
- `app` (declarations; builds the jobs a backend stores)
- `execution`, `coordination`, `services` (each part built with exactly what it uses), `cache`
- `client` (enqueue, get, wait, cancel, stats)
- `runtime` (the composition root), then `cli` and the package's `__init__`, and the testing kit
  (`testing`, `pytest_plugin`), which drives the runtime from above

A part may import its own layer's modules and any layer below, never one above; the import graph
has no cycle (a package's `__init__` and its modules included); and no layer imports a private
name (`_x`) of another.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "nursery_jobs"

# module prefix -> prefixes it may import (besides itself)
ALLOWED: dict[str, tuple[str, ...]] = {
    "nursery_jobs.errors": (),
    "nursery_jobs.infra": ("nursery_jobs.errors", "nursery_jobs.infra"),
    "nursery_jobs.jobs": ("nursery_jobs.errors",),
    "nursery_jobs.config": ("nursery_jobs.errors",),
    "nursery_jobs.cron": ("nursery_jobs.errors",),
    "nursery_jobs.rules": ("nursery_jobs.errors", "nursery_jobs.jobs", "nursery_jobs.config"),
    "nursery_jobs._context": ("nursery_jobs.errors", "nursery_jobs.infra", "nursery_jobs.jobs", "nursery_jobs.backends.protocol"),
    "nursery_jobs.backends": (
        "nursery_jobs.errors", "nursery_jobs.infra", "nursery_jobs.jobs", "nursery_jobs.config", "nursery_jobs.rules",
        "nursery_jobs.backends",
    ),
    "nursery_jobs.middleware": ("nursery_jobs.errors", "nursery_jobs.jobs", "nursery_jobs.config", "nursery_jobs.backends.protocol"),
    "nursery_jobs.app": (
        "nursery_jobs.errors", "nursery_jobs.jobs", "nursery_jobs.config", "nursery_jobs.cron", "nursery_jobs._context",
        "nursery_jobs.backends.protocol", "nursery_jobs.middleware",
    ),
    "nursery_jobs.execution": (
        "nursery_jobs.errors", "nursery_jobs.infra", "nursery_jobs.jobs", "nursery_jobs.config", "nursery_jobs._context",
        "nursery_jobs.rules", "nursery_jobs.backends", "nursery_jobs.middleware", "nursery_jobs.app", "nursery_jobs.execution",
    ),
    "nursery_jobs.coordination": (
        "nursery_jobs.errors", "nursery_jobs.infra", "nursery_jobs.jobs", "nursery_jobs.config", "nursery_jobs.rules",
        "nursery_jobs.backends", "nursery_jobs.coordination",
    ),
    "nursery_jobs.services": (
        "nursery_jobs.errors", "nursery_jobs.infra", "nursery_jobs.jobs", "nursery_jobs.config", "nursery_jobs.rules",
        "nursery_jobs.backends", "nursery_jobs.app", "nursery_jobs.execution.attempt", "nursery_jobs.services",
    ),
    "nursery_jobs.cache": (
        "nursery_jobs.errors", "nursery_jobs.infra", "nursery_jobs.jobs", "nursery_jobs.config", "nursery_jobs._context",
        "nursery_jobs.backends",
    ),
    "nursery_jobs.client": (
        "nursery_jobs.errors", "nursery_jobs.infra", "nursery_jobs.jobs", "nursery_jobs.config", "nursery_jobs.rules",
        "nursery_jobs.backends", "nursery_jobs.middleware", "nursery_jobs.app", "nursery_jobs.coordination",
    ),
    "nursery_jobs.runtime": ("nursery_jobs",),
    "nursery_jobs.contrib": ("nursery_jobs",),  # the extras: on top of the public API, imported by nothing
    "nursery_jobs.cli": ("nursery_jobs",),
    "nursery_jobs.testing": ("nursery_jobs",),  # the testing kit: above the runtime it drives
    "nursery_jobs.pytest_plugin": ("nursery_jobs",),
    "nursery_jobs": ("nursery_jobs",),  # the package's __init__: the public API
}  # fmt: skip


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _from_target(path: Path, node: ast.ImportFrom) -> str:
    """The module a `from ... import` in `path` reads from, its dots resolved."""
    if not node.level:
        return node.module or ""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    base = package.split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(path: Path) -> set[str]:
    """Every nursery_jobs module `path` imports, however and wherever it does."""
    name = _module_name(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("nursery_jobs"))
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(path, node)
            if not target.startswith("nursery_jobs"):
                continue
            found.add(target)
            for alias in node.names:  # `from . import aio`: a module, not a name
                candidate = f"{target}.{alias.name}"
                if (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").exists() or (
                    PACKAGE.parent / Path(*candidate.split(".")) / "__init__.py"
                ).exists():
                    found.add(candidate)
    found.discard(name)
    return found


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def _rule(module: str) -> tuple[str, tuple[str, ...]]:
    best = max((prefix for prefix in ALLOWED if module == prefix or module.startswith(prefix + ".")), key=len)
    return best, ALLOWED[best]


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_every_module_imports_only_its_own_layer_and_those_below() -> None:
    graph = _graph()
    assert "nursery_jobs.runtime" in graph and "nursery_jobs.infra.owner" in graph, sorted(graph)
    wrong = []
    for module, imported in sorted(graph.items()):
        own, allowed = _rule(module)
        for target in sorted(imported):
            if not _within(target, (own, *allowed)):
                wrong.append(f"{module} imports {target}")
    assert wrong == [], "\n".join(wrong)


def test_the_import_graph_has_no_cycle() -> None:
    graph = _graph()
    edges = {m: {t for t in ts if t in graph} for m, ts in graph.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, path: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle.extend(path[path.index(nxt) :] + [node, nxt] if nxt in path else [node, nxt])
                return True
            if nxt not in state and visit(nxt, path + [nxt]):
                return True
        state[node] = 2
        return False

    for module in sorted(edges):
        if module not in state and visit(module, [module]):
            break
    assert not cycle, " -> ".join(cycle)


def _private(name: str) -> bool:
    """A leading underscore, but not a dunder (`__version__` is every package's public name)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_layer_imports_a_private_name_of_another() -> None:
    """A name with a leading underscore is its layer's own: another layer uses the module
    through its public names only, so the private ones can change without looking outside."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            target = _from_target(path, node)
            if not target.startswith("nursery_jobs") or _rule(target)[0] == _rule(module)[0]:
                continue
            wrong += [f"{module} imports {target}.{a.name}" for a in node.names if _private(a.name)]
    assert wrong == [], "\n".join(wrong)


def test_the_check_sees_a_layer_broken() -> None:
    """A check that cannot fail is a toy: an import of the runtime from infra is found."""
    own, allowed = _rule("nursery_jobs.infra.threads")
    assert own == "nursery_jobs.infra" and not _within("nursery_jobs.runtime", (own, *allowed))
    assert not _within("nursery_jobs.client", ALLOWED["nursery_jobs.backends"])
