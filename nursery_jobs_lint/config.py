"""Configuration: the ``[tool.nursery_jobs.lint]`` table, validated before anything is judged.

The problem
-----------
The lint's verdict depends on three path lists: what is scanned (``include``), who may own tasks
(``allow``) and what is a test (``tests``). A mistake in any of them changes the verdict without
changing a line of code: a typo in a key (``alow``) or a glob that no longer matches anything
(the package moved) quietly turns the gate off or on for the wrong files.

The naive approach, and why it fails
------------------------------------
"Read the table with ``.get()`` and sensible defaults" is how most tools do it, and it is exactly
how a typo silently disables a check: ``alow = [...]`` is ignored, the default applies, and the
reviewer who approved ``alow`` believes something that is not true. Likewise ``fnmatch`` for
globs: its ``*`` crosses ``/`` and it has no ``**``, so ``nursery_jobs/*`` would allow files in
every subpackage, and an unbalanced ``[`` is taken literally instead of rejected.

What this module does
---------------------
* Every key is known; an unknown key, a value of the wrong type, an invalid glob or an invalid
  regex raises :class:`ConfigError` (the CLI turns it into exit code 2, "no verdict").
* Defaults fail closed: a missing ``allow`` means nothing is allowed; a missing table means the
  whole project (``include = ["."]``) is judged with no exceptions.
* Globs are gitignore-like and compiled once to regular expressions: ``*`` and ``?`` stay inside
  one path segment, ``**`` is a whole segment matching zero or more directories, ``[...]`` is a
  character class (``[!...]`` negates). A pattern also matches everything below a matching
  directory, so ``allow = ["nursery_jobs/infra"]`` means the package, not just a file of that name.
  Paths are always relative to the directory holding the config file, with ``/`` separators.
* :func:`classify` puts a path in exactly one bucket: outside ``include`` (never judged), test
  (never judged), allowed (only the runtime invariants NJS001/NJS104), or judged (every rule).
  Tests win over allow: "tests are excepted" is the stronger statement.
* :func:`module_name` maps a path to its dotted module name under the configured ``roots``, which
  relative imports and re-export following need.

Stale-entry checks (an ``allow``/``tests`` glob that matches no file) need the file list, so they
live in the CLI's full mode, not here.

What was left out
-----------------
No ``select``/``ignore``/``per-file-ignores`` keys: the only way to stop a finding is to move the
code into ``allow``, which is reviewed. No config inheritance or ``extends``. No ``tomli``
fallback: the package requires Python 3.11 and imports only the standard library.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import tomllib
from typing import Any

from .rules import DEFAULT_BANNED_MODULES, OPT_IN, RULES

__all__ = [
    "Config",
    "ConfigError",
    "DEFAULT_NURSERY_NAME_REGEX",
    "compile_glob",
    "find_config_file",
    "load_config",
    "config_from_table",
    "classify",
    "module_name",
]

DEFAULT_NURSERY_NAME_REGEX = r"(?i)(^|_)(nursery|task_?group|tg)$"
TABLE_PATH = ("tool", "nursery_jobs", "lint")

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


class ConfigError(Exception):
    """The configuration cannot be used; the lint gives no verdict (exit code 2)."""


@dataclasses.dataclass(frozen=True)
class Config:
    """A validated ``[tool.nursery_jobs.lint]`` table.

    ``root`` is the directory the paths are relative to (the config file's directory); ``source``
    is the file it came from, or None for a built-in configuration (self-test, unit tests).
    """

    root: pathlib.Path
    source: pathlib.Path | None = None
    include: tuple[str, ...] = (".",)
    allow: tuple[str, ...] = ()
    tests: tuple[str, ...] = ()
    roots: tuple[str, ...] = (".",)
    extend_banned_modules: tuple[str, ...] = ()
    extend_banned_names: tuple[tuple[str, str], ...] = ()
    nursery_name_regex: str = DEFAULT_NURSERY_NAME_REGEX
    extend_select: tuple[str, ...] = ()
    table_found: bool = True

    def __post_init__(self) -> None:
        # Compile eagerly: a bad glob or regex is a construction error, not a use-time surprise.
        try:
            compiled_regex = re.compile(self.nursery_name_regex)
        except re.error as exc:
            raise ConfigError(
                f"nursery-name-regex {self.nursery_name_regex!r} is not a valid regular expression: {exc}"
            ) from None
        object.__setattr__(self, "_name_regex", compiled_regex)
        for key, globs in (("include", self.include), ("allow", self.allow), ("tests", self.tests)):
            object.__setattr__(
                self, "_" + key + "_re", tuple(compile_glob(g, key=key, is_include=key == "include") for g in globs)
            )

    # -- derived views -------------------------------------------------------------------

    @property
    def name_regex(self) -> re.Pattern[str]:
        return self._name_regex  # type: ignore[attr-defined,no-any-return]

    @property
    def banned_modules(self) -> tuple[str, ...]:
        return DEFAULT_BANNED_MODULES + tuple(m for m in self.extend_banned_modules if m not in DEFAULT_BANNED_MODULES)

    @property
    def banned_names(self) -> dict[str, str]:
        return dict(self.extend_banned_names)

    @property
    def selected_opt_in(self) -> frozenset[str]:
        return frozenset(self.extend_select)

    @property
    def allow_text(self) -> str:
        return ", ".join(self.allow) if self.allow else "nowhere"

    def matches(self, key: str, path: str) -> list[str]:
        """The ``key`` globs (include/allow/tests) that match ``path``."""
        compiled = getattr(self, "_" + key + "_re")
        return [glob for glob, regex in zip(getattr(self, key), compiled) if regex.match(path)]

    def to_table(self) -> dict[str, Any]:
        """The effective table, as it would be written in pyproject.toml."""
        return {
            "include": list(self.include),
            "allow": list(self.allow),
            "tests": list(self.tests),
            "roots": list(self.roots),
            "extend-banned-modules": list(self.extend_banned_modules),
            "extend-banned-names": dict(self.extend_banned_names),
            "nursery-name-regex": self.nursery_name_regex,
            "extend-select": list(self.extend_select),
        }


# -- globs ------------------------------------------------------------------------------


def compile_glob(pattern: str, *, key: str = "glob", is_include: bool = False) -> re.Pattern[str]:
    """Compile a gitignore-like glob to a regex that matches a path or anything below it.

    Raises :class:`ConfigError` naming the bad pattern: empty, absolute, containing a backslash,
    an empty or ``..`` segment, ``**`` mixed with other characters in one segment, or an
    unbalanced ``[``.
    """
    if not isinstance(pattern, str):
        raise ConfigError(f"{key} entries must be strings, not {pattern!r}")
    original = pattern
    if pattern in (".", "./") and is_include:
        return re.compile(r"(?s).*")
    if pattern.startswith("./"):
        pattern = pattern[2:]
    pattern = pattern.rstrip("/") if pattern != "/" else pattern

    def bad(why: str) -> ConfigError:
        return ConfigError(f"{key} entry {original!r} is not a valid glob: {why}")

    if not pattern:
        raise bad("it is empty")
    if pattern.startswith("/"):
        raise bad("paths are relative to the config file's directory; drop the leading '/'")
    if "\\" in pattern:
        raise bad("use '/' as the path separator")
    segments = pattern.split("/")
    parts: list[str] = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "":
            raise bad("it has an empty path segment ('//')")
        if segment in (".", ".."):
            raise bad(f"'{segment}' segments are not allowed")
        if segment == "**":
            # zero or more whole directories (or, at the end, everything below)
            parts.append(r"(?:.*)" if last else r"(?:[^/]+/)*")
            continue
        if "**" in segment:
            raise bad("'**' must be a whole path segment, as in 'a/**/b'")
        parts.append(_segment_regex(segment, bad) + ("" if last else "/"))
    body = "".join(parts)
    return re.compile(r"(?s)" + body + r"(?:/.*)?\Z")


def _segment_regex(segment: str, bad: Any) -> str:
    out: list[str] = []
    i = 0
    while i < len(segment):
        ch = segment[i]
        if ch == "*":
            out.append(r"[^/]*")
        elif ch == "?":
            out.append(r"[^/]")
        elif ch == "[":
            end = segment.find("]", i + 2 if segment[i + 1 : i + 2] in ("!", "]") else i + 1)
            if end == -1:
                raise bad("unbalanced '['")
            inner = segment[i + 1 : end]
            if inner.startswith("!"):
                inner = "^" + inner[1:]
            if inner in ("", "^"):
                raise bad("empty character class")
            out.append("[" + inner.replace("\\", "\\\\") + "]")
            i = end
        elif ch == "]":
            raise bad("unbalanced ']'")
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


# -- loading ----------------------------------------------------------------------------


def find_config_file(start: pathlib.Path) -> pathlib.Path | None:
    """The nearest ``pyproject.toml`` at or above ``start``."""
    start = start.resolve()
    for directory in (start, *start.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_config(path: pathlib.Path) -> Config:
    """Read and validate ``[tool.nursery_jobs.lint]`` from the TOML file at ``path``."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    table: Any = data
    for part in TABLE_PATH:
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [{'.'.join(TABLE_PATH)}] must be a table")
        table = table.get(part)
        if table is None:
            break
    if table is None:
        return config_from_table({}, root=path.parent.resolve(), source=path.resolve(), table_found=False)
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [{'.'.join(TABLE_PATH)}] must be a table")
    return config_from_table(table, root=path.parent.resolve(), source=path.resolve())


_KEYS = (
    "include",
    "allow",
    "tests",
    "roots",
    "extend-banned-modules",
    "extend-banned-names",
    "nursery-name-regex",
    "extend-select",
)


def config_from_table(
    table: dict[str, Any],
    *,
    root: pathlib.Path,
    source: pathlib.Path | None = None,
    table_found: bool = True,
) -> Config:
    """Validate a parsed table and build a :class:`Config`. Raises :class:`ConfigError`."""
    where = f"[{'.'.join(TABLE_PATH)}]"
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        hints = []
        for key in unknown:
            close = [k for k in _KEYS if _similar(key, k)]
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(
            f"unknown key{'s' if len(unknown) > 1 else ''} in {where}: {', '.join(hints)}; "
            f"known keys: {', '.join(_KEYS)}"
        )

    def str_list(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = table.get(key, list(default))
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where} {key} must be a list of strings, not {value!r}")
        return tuple(value)

    include = str_list("include", (".",))
    if not include:
        raise ConfigError(f"{where} include is empty: nothing would ever be judged")
    allow = str_list("allow", ())
    tests = str_list("tests", ())
    roots = str_list("roots", (".",))
    for entry in roots:
        normalized = entry[2:] if entry.startswith("./") else entry
        if entry.startswith("/") or "\\" in entry or ".." in normalized.split("/") or not entry:
            raise ConfigError(f"{where} roots entry {entry!r} must be a relative directory path")
        if not (root / entry).is_dir():
            raise ConfigError(f"{where} roots entry {entry!r} is not a directory under {root}")
    banned_modules = str_list("extend-banned-modules", ())
    for module in banned_modules:
        if not _DOTTED.match(module):
            raise ConfigError(f"{where} extend-banned-modules entry {module!r} is not a dotted module name")
    names = table.get("extend-banned-names", {})
    if not isinstance(names, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in names.items()):
        raise ConfigError(f"{where} extend-banned-names must be a table of name = \"message\", not {names!r}")
    for name in names:
        if not _DOTTED.match(name) or "." not in name:
            raise ConfigError(f"{where} extend-banned-names key {name!r} is not a fully qualified dotted name")
    regex = table.get("nursery-name-regex", DEFAULT_NURSERY_NAME_REGEX)
    if not isinstance(regex, str):
        raise ConfigError(f"{where} nursery-name-regex must be a string, not {regex!r}")
    select = str_list("extend-select", ())
    for code in select:
        if code not in RULES:
            raise ConfigError(
                f"{where} extend-select entry {code!r} is not a rule code; opt-in rules: {', '.join(sorted(OPT_IN))}"
            )
        if code not in OPT_IN:
            raise ConfigError(
                f"{where} extend-select entry {code!r} is always on; extend-select only takes opt-in rules "
                f"({', '.join(sorted(OPT_IN))})"
            )
    return Config(
        root=root,
        source=source,
        include=include,
        allow=allow,
        tests=tests,
        roots=roots,
        extend_banned_modules=banned_modules,
        extend_banned_names=tuple(sorted(names.items())),
        nursery_name_regex=regex,
        extend_select=select,
        table_found=table_found,
    )


def _similar(a: str, b: str) -> bool:
    a, b = a.lower().replace("_", "-"), b.lower().replace("_", "-")
    if a == b:
        return True
    if abs(len(a) - len(b)) > 2:
        return False
    # bounded edit distance, small strings only
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1] <= 2


# -- paths ------------------------------------------------------------------------------

OUTSIDE = "outside"
TEST = "test"
ALLOWED = "allowed"
JUDGED = "judged"


def classify(path: str, config: Config) -> str:
    """Which rules apply to ``path`` (relative, ``/``-separated): one of the four buckets."""
    if path.startswith("../") or path == ".." or path.startswith("/"):
        return OUTSIDE
    if not config.matches("include", path):
        return OUTSIDE
    if config.matches("tests", path):
        return TEST
    if config.matches("allow", path):
        return ALLOWED
    return JUDGED


def module_name(path: str, config: Config) -> tuple[str, bool] | None:
    """``(dotted module name, is_package)`` for ``path`` under the longest matching root."""
    best: str | None = None
    for root in config.roots:
        normalized = root[2:] if root.startswith("./") else root
        normalized = normalized.rstrip("/")
        if normalized in ("", "."):
            relative = path
        elif path.startswith(normalized + "/"):
            relative = path[len(normalized) + 1 :]
        else:
            continue
        if best is None or len(relative) < len(best):
            best = relative
    if best is None:
        return None
    if best.endswith(".pyi"):
        best = best[:-4]
    elif best.endswith(".py"):
        best = best[:-3]
    parts = best.split("/")
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts), is_package
