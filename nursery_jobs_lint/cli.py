"""``nursery-jobs-lint``: the gate. Full mode for CI, file mode for pre-commit, exit codes 0/1/2.

The problem
-----------
A checker is only a gate if its verdict is unambiguous and cannot be quietly weakened. Three
outcomes must never be confused: "clean", "violations", and "I could not judge" (bad config, a
stale allow entry, no files, not a git repository, a crash). Tools that fold the third into the
first ("no files matched, exit 0") turn a misconfiguration into a permanent green light.

The naive approach, and why it fails
------------------------------------
"Exit 1 if anything was printed" (flake8-async's standalone runner) cannot tell a violation
from a crash. An ``--exit-zero`` or ``--ignore`` flag, however handy, is one CI edit away from
disabling the gate without touching the reviewed ``allow`` list. Letting pre-commit's file list
stand in for the whole repository skips every repository-level check.

The algorithm chosen
--------------------
* Exit codes (ruff/SQLFluff convention): 0 no violations; 1 one or more violations (NJS001
  included); 2 no verdict (usage or config error, stale ``allow``/``tests`` entry, zero files in
  full mode, not a git work tree, internal error with a traceback on stderr).
* Full mode (no paths): the files git knows (see :mod:`~nursery_jobs_lint.discovery`) under
  ``include``; first-party re-exports are followed; every ``allow`` and ``tests`` glob must match
  at least one of those files, and at least one file must be judged.
* File mode (paths): the given files, still filtered by ``include``/``allow``/``tests`` (like
  ruff's and black's ``force-exclude``), so pre-commit cannot widen what is judged.
* Output on stdout, nothing when clean: ``path:line:col: CODE message`` sorted by (path, line,
  col, code), paths relative to the config file's directory with ``/``, 1-based character
  columns; or JSON, or GitHub workflow commands. One summary line on stderr.
* Informational flags that need no project: ``--list-rules``, ``--explain CODE``,
  ``--self-test``; ``--show-config`` prints the effective, validated table.

What was left out
-----------------
No ``--exit-zero``, ``--ignore``, ``--select``, ``--fix``, caching or parallelism: a full run over
this repository takes well under a second of CPU, and every knob here would be a way around the
reviewed ``allow`` list.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import traceback
from collections.abc import Sequence

from . import __version__
from .checker import Finding, check_source
from .config import OUTSIDE, TEST, Config, ConfigError, classify, find_config_file, load_config
from .discovery import DiscoveryError, expand_paths, git_files
from .firstparty import FirstParty
from .rules import RULES
from .selftest import run_self_test

__all__ = ["main", "run"]

PROG = "nursery-jobs-lint"
EXIT_CLEAN, EXIT_VIOLATIONS, EXIT_NO_VERDICT = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_NO_VERDICT, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description=(
            "Reject nurseries, tasks, threads, processes, event loops and out-of-scope callbacks started "
            "outside the allowed (infra) paths. With no PATH: full mode over the git work tree (the CI gate). "
            "With PATHs: file mode (pre-commit)."
        ),
        epilog="Exit codes: 0 no violations, 1 violations, 2 no verdict (config/usage error, stale allow entry, "
        "nothing to check, not a git repository, internal error).",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files or directories to check (file mode)")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file with [tool.nursery_jobs.lint] (default: nearest pyproject.toml upward)",
    )
    parser.add_argument("--show-config", action="store_true", help="print the effective configuration and exit")
    parser.add_argument("--list-rules", action="store_true", help="list every rule code and exit")
    parser.add_argument("--explain", metavar="CODE", help="explain one rule (e.g. NJS102) and exit")
    parser.add_argument(
        "--output-format", choices=("text", "json", "github"), default="text", help="output format (default: text)"
    )
    parser.add_argument("--self-test", action="store_true", help="run the built-in must-catch corpus and exit")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the exit code."""
    try:
        return run(argv)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_NO_VERDICT
    except Exception:  # the "internal error" row of the exit-code table
        traceback.print_exc()
        print(f"{PROG}: internal error (exit 2, no verdict); please report the traceback above", file=sys.stderr)
        return EXIT_NO_VERDICT


def run(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list_rules:
        return _list_rules()
    if args.explain:
        return _explain(args.explain)
    if args.self_test:
        passed, lines = run_self_test()
        for line in lines:
            print(line, file=sys.stdout if passed else sys.stderr)
        return EXIT_CLEAN if passed else EXIT_NO_VERDICT
    try:
        config = _load(args.config)
    except ConfigError as exc:
        return _no_verdict(str(exc))
    if args.show_config:
        print(_render_config(config))
        return EXIT_CLEAN
    try:
        if args.paths:
            return _file_mode(config, args.paths, args.output_format)
        return _full_mode(config, args.output_format)
    except (ConfigError, DiscoveryError) as exc:
        return _no_verdict(str(exc))


def _no_verdict(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return EXIT_NO_VERDICT


def _load(explicit: str | None) -> Config:
    if explicit is not None:
        path = pathlib.Path(explicit)
        if not path.is_file():
            raise ConfigError(f"--config {explicit}: no such file")
        return load_config(path)
    found = find_config_file(pathlib.Path.cwd())
    if found is None:
        raise ConfigError("no pyproject.toml found here or in any parent directory; pass --config FILE")
    return load_config(found)


# -- modes ------------------------------------------------------------------------------


def _full_mode(config: Config, output_format: str) -> int:
    files = [path for path in git_files(config.root) if classify(path, config) != OUTSIDE]
    judged = [path for path in files if classify(path, config) != TEST]
    if not judged:
        raise ConfigError(
            f"nothing to check: no Python files under include ({', '.join(config.include)}) outside tests in "
            f"the git work tree at {config.root}"
        )
    stale = [
        f"{key} entry {glob!r}"
        for key in ("allow", "tests")
        for glob in getattr(config, key)
        if not any(glob in config.matches(key, path) for path in files)
    ]
    if stale:
        verb = "matches" if len(stale) == 1 else "match"
        raise ConfigError(
            f"stale configuration: {'; '.join(stale)} {verb} no Python file under include; "
            "remove the entry or fix the path (every allow entry is reviewed, so it must point at real code)"
        )
    follower = FirstParty(config)
    return _judge(config, judged, output_format, follower.expand)


def _file_mode(config: Config, paths: list[str], output_format: str) -> int:
    files = expand_paths(paths, config.root)
    judged = [path for path in files if classify(path, config) not in (OUTSIDE, TEST)]
    return _judge(config, judged, output_format, None)


def _judge(config: Config, paths: list[str], output_format: str, expand: object) -> int:
    findings: list[Finding] = []
    for path in paths:
        try:
            source = (config.root / path).read_bytes()
        except OSError as exc:
            raise DiscoveryError(f"cannot read {path}: {exc.strerror or exc}") from None
        findings.extend(check_source(source, path, config, expand=expand))  # type: ignore[arg-type]
    findings.sort()
    _emit(findings, output_format)
    files_with = len({f.path for f in findings})
    if findings:
        noun = "violation" if len(findings) == 1 else "violations"
        print(
            f"{PROG}: {len(findings)} {noun} in {files_with} file{'s' if files_with != 1 else ''} "
            f"({len(paths)} file{'s' if len(paths) != 1 else ''} checked)",
            file=sys.stderr,
        )
        return EXIT_VIOLATIONS
    print(f"{PROG}: no violations ({len(paths)} file{'s' if len(paths) != 1 else ''} checked)", file=sys.stderr)
    return EXIT_CLEAN


# -- output -----------------------------------------------------------------------------


def _emit(findings: list[Finding], output_format: str) -> None:
    out = sys.stdout
    if output_format == "json":
        payload = [
            {
                "path": f.path,
                "line": f.line,
                "column": f.col,
                "code": f.code,
                "name": f.name,
                "message": f.message,
            }
            for f in findings
        ]
        out.write(json.dumps(payload, indent=2) + "\n")
        return
    for f in findings:
        if output_format == "github":
            out.write(
                f"::error file={_gh_property(f.path)},line={f.line},col={f.col},"
                f"title={_gh_property(f'{f.code} {f.name}')}::{_gh_data(f.message)}\n"
            )
        else:
            out.write(f.format() + "\n")


def _gh_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_property(text: str) -> str:
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


def _list_rules() -> int:
    width = max(len(rule.name) for rule in RULES.values())
    for code, rule in RULES.items():
        flags = []
        if rule.opt_in:
            flags.append("opt-in")
        if rule.applies_in_allow:
            flags.append("also in allow")
        suffix = f" [{', '.join(flags)}]" if flags else ""
        print(f"{code}  {rule.name:<{width}}  {rule.summary}{suffix}")
    return EXIT_CLEAN


def _explain(code: str) -> int:
    rule = RULES.get(code.strip().upper())
    if rule is None:
        return _no_verdict(f"unknown rule {code!r}; see --list-rules")
    flags = []
    if rule.opt_in:
        flags.append("opt-in: enable with extend-select")
    if rule.applies_in_allow:
        flags.append("also applies inside allow paths")
    print(f"{rule.code} {rule.name}" + (f" ({'; '.join(flags)})" if flags else ""))
    print()
    print(rule.summary[0].upper() + rule.summary[1:] + ".")
    print()
    print(f"Example that fires:  {rule.example}")
    print()
    print(rule.explain)
    return EXIT_CLEAN


def _render_config(config: Config) -> str:
    def value(v: object) -> str:
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {json.dumps(x)}" for k, x in v.items()) + "}"
        return json.dumps(v)

    source = str(config.source) if config.source else "<built-in>"
    lines = [f"# effective configuration from {source}" + ("" if config.table_found else " (no table: defaults)")]
    lines.append(f"# paths are relative to {config.root}")
    lines.append("[tool.nursery_jobs.lint]")
    for key, item in config.to_table().items():
        lines.append(f"{key} = {value(item)}")
    lines.append(f"# banned modules (built-in + extend): {', '.join(config.banned_modules)}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
