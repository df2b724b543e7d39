"""The flake8 plugin ``NJS``: the same findings in editors. Advisory, never the gate.

The problem
-----------
Developers see flake8 diagnostics as they type; a spawn flagged in the editor is cheaper than one
flagged in CI. But flake8 has its own suppression machinery (``# noqa``, ``extend-ignore``,
``per-file-ignores``, ``# flake8: noqa``) that this lint's policy forbids, and flake8 does not read
``pyproject.toml``.

The naive approach, and why it fails
------------------------------------
Making the flake8 plugin the gate (as many lints do) hands every developer a one-comment
override. Re-implementing the checks for flake8 lets the two drift apart.

The algorithm chosen
--------------------
The plugin is a thin adapter over :func:`~nursery_jobs_lint.checker.check_source`:

* ``Plugin(tree, filename, lines)`` finds the nearest ``pyproject.toml`` above the file itself
  (cached per config file), reads ``[tool.nursery_jobs.lint]`` with the same validation, makes the
  path relative to that file's directory, and checks the source flake8 already read.
* It yields ``(line, column - 1, "NJSxxx message", type(self))``: flake8 adds 1 to the column,
  and our columns are already character based.
* An invalid configuration is reported as one NJS001 finding on line 1 ("cannot judge") rather
  than crashing flake8 in the middle of an editor session.

The registered prefix is ``NJS`` (≤3 letters, so flake8's ``^[A-Z]{1,3}[0-9]{0,3}$`` accepts it,
and full codes also pass flake8's ``ignore`` validation). Because flake8 honours ``# noqa`` on
its side, NJS002 in the CLI is what keeps such comments from passing CI.

What was left out
-----------------
No flake8 options (``add_options``/``parse_options``): the configuration lives in one place,
``pyproject.toml``, for the CLI and the plugin alike. No re-export following (that is the CLI's
full mode). flake8 itself stays an optional extra; this module imports nothing from it.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any

from . import __version__
from .checker import check_source
from .config import Config, ConfigError, find_config_file, load_config
from .discovery import relative_path

__all__ = ["Plugin"]

_CONFIG_CACHE: dict[pathlib.Path | None, Config | ConfigError] = {}


def _config_for(filename: str) -> tuple[Config | None, str]:
    """(config or None on error, path relative to the config's directory or the error text)."""
    path = pathlib.Path(filename)
    if not path.is_absolute():
        path = pathlib.Path.cwd() / path
    found = find_config_file(path.parent if path.parent.exists() else pathlib.Path.cwd())
    if found not in _CONFIG_CACHE:
        try:
            _CONFIG_CACHE[found] = (
                load_config(found) if found is not None else Config(root=pathlib.Path.cwd().resolve(), table_found=False)
            )
        except ConfigError as exc:
            _CONFIG_CACHE[found] = exc
    loaded = _CONFIG_CACHE[found]
    if isinstance(loaded, ConfigError):
        return None, str(loaded)
    return loaded, relative_path(path, loaded.root)


class Plugin:
    """flake8 tree plugin; flake8 passes ``tree``, ``filename`` and ``lines`` by parameter name."""

    name = "nursery-jobs-lint"
    version = __version__

    def __init__(self, tree: ast.AST, filename: str = "stdin", lines: Sequence[str] = ()) -> None:
        self.tree = tree
        self.filename = filename
        self.lines = list(lines)

    def run(self) -> Iterator[tuple[int, int, str, Any]]:
        config, relative = _config_for(self.filename)
        if config is None:
            yield 1, 0, f"NJS001 cannot judge this file: invalid configuration: {relative}", type(self)
            return
        source = "".join(self.lines)
        for finding in check_source(source, relative, config):
            yield finding.line, finding.col - 1, f"{finding.code} {finding.message}", type(self)
