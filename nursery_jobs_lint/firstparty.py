"""Following first-party re-exports, so infra can export wrappers but not raw primitives.

The problem
-----------
Infra is allowed to import ``threading``; job code is not. If infra writes
``from threading import Thread`` and job code writes ``from nursery_jobs.infra.x import Thread``,
the job file never mentions ``threading`` and a per-file checker passes it, although the job now
starts raw threads. The same holds for ``x = trio.lowlevel`` in infra and ``x.spawn_system_task``
in a job, or ``nursery_jobs/__init__.py`` re-exporting ``trio.open_nursery``.

The naive approach, and why it fails
------------------------------------
"Ban importing from infra" forbids exactly what infra is for: job code must call infra's
wrappers (``run_blocking``, the owner's scope). "Import the module and look at the object"
executes first-party code (and trio, and psycopg) inside a linter that must start in
milliseconds and import nothing but the standard library; it would also make the verdict depend
on the environment.

The algorithm chosen
--------------------
Statically, in full mode only (the CLI run in CI, which sees the whole tree): for a qualified
name such as ``nursery_jobs.infra.x.Thread`` take the longest prefix that is a module file under
``roots`` (``nursery_jobs/infra/x.py`` or ``.../x/__init__.py``), parse it once (cached), and look
up the next component among that module's *module-level* bindings with the same
:class:`~nursery_jobs_lint.scopes.Resolver` the checker uses. An import or alias binding yields
new qualified names (``threading.Thread``); a ``def`` or ``class`` yields nothing, which is how a
wrapper stops the chase. Names bound nowhere are looked up through the module's star imports.
Follow at most three hops (the specification's bound), breadth first, ignoring names already
seen, so cycles between modules terminate.

The checker adds the results to the candidates of every reference and import, so the import site
in job code gets NJS201 ("brings in banned 'threading.Thread' through a first-party re-export")
and each use gets the ordinary finding.

What was left out
-----------------
File mode (pre-commit) does not follow, so that a hook run on three changed files does not parse
the world and stays deterministic for those files; CI's full run is the gate. No following of
attributes of first-party *objects* (``owner.pool.submit``): only module-level names.
"""

from __future__ import annotations

import pathlib

from .checker import parse_quietly
from .config import Config
from .scopes import Binder, Resolver

__all__ = ["FirstParty"]

MAX_DEPTH = 3


class FirstParty:
    """Re-export follower for one project (``config.root`` + ``config.roots``)."""

    def __init__(self, config: Config, max_depth: int = MAX_DEPTH) -> None:
        self.config = config
        self.max_depth = max_depth
        self._files: dict[str, pathlib.Path | None] = {}
        self._resolvers: dict[str, Resolver | None] = {}
        self._hops: dict[str, frozenset[str]] = {}
        self._expanded: dict[str, frozenset[str]] = {}

    def module_file(self, module: str) -> pathlib.Path | None:
        if module in self._files:
            return self._files[module]
        found: pathlib.Path | None = None
        parts = module.split(".")
        for root in self.config.roots:
            base = self.config.root / root
            for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
                if candidate.is_file():
                    found = candidate
                    break
            if found:
                break
        self._files[module] = found
        return found

    def _resolver(self, module: str) -> Resolver | None:
        if module in self._resolvers:
            return self._resolvers[module]
        resolver: Resolver | None = None
        path = self.module_file(module)
        if path is not None:
            try:
                tree = parse_quietly(path.read_bytes(), str(path))
                binder = Binder(tree, module, path.name == "__init__.py")
                resolver = Resolver(binder, self.config.name_regex)
            except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
                resolver = None
        self._resolvers[module] = resolver
        return resolver

    def _one_hop(self, name: str) -> frozenset[str]:
        cached = self._hops.get(name)
        if cached is not None:
            return cached
        result: set[str] = set()
        parts = name.split(".")
        for split in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:split])
            if self.module_file(module) is None:
                continue
            attr, rest = parts[split], parts[split + 1 :]
            if self.module_file(f"{module}.{attr}") is not None:
                break  # a submodule, not a re-export
            resolver = self._resolver(module)
            if resolver is None:
                break
            scope = resolver.binder.module
            bindings = scope.bindings.get(attr)
            targets: set[str] = set()
            if bindings:
                for binding in bindings:
                    targets |= resolver.binding_candidates(binding)
            else:
                targets = {f"{star}.{attr}" for star in scope.star_imports}
            suffix = "".join("." + p for p in rest)
            result = {target + suffix for target in targets if target}
            break
        frozen = frozenset(result)
        self._hops[name] = frozen
        return frozen

    def expand(self, name: str) -> set[str]:
        """Qualified names that ``name`` re-exports, up to ``max_depth`` hops (excluding itself)."""
        cached = self._expanded.get(name)
        if cached is not None:
            return set(cached)
        seen = {name}
        frontier = {name}
        for _ in range(self.max_depth):
            step: set[str] = set()
            for current in frontier:
                step |= self._one_hop(current)
            step -= seen
            if not step:
                break
            seen |= step
            frontier = step
        seen.discard(name)
        self._expanded[name] = frozenset(seen)
        return seen
