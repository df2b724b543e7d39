"""The checker: one file's source in, sorted findings out. Shared by the CLI and the flake8 plugin.

The problem
-----------
Given one Python file, its path and the configuration, list every place where the file starts
activity the runtime does not own, each with a location an editor can jump to and a message that
says what to do instead. The same function must serve the CLI (the gate), the pre-commit hook and
the flake8 plugin (editor hints), so that they can never disagree about a file.

The naive approach, and why it fails
------------------------------------
A plain ``ast.NodeVisitor`` that looks at ``Call`` nodes misses every spawn that is not called on
the spot (``functools.partial(n.start_soon, f)``, ``spawn = n.start_soon``, a decorator, a base
class) and reports ``threading.Thread`` three times (for ``threading``, for the attribute, for the
call). A recursive visitor also dies with ``RecursionError`` on machine-generated code. And
``col_offset`` is a UTF-8 *byte* offset: on ``x = "é"; n.start_soon(f)`` it says 10 where an
editor counts 9 characters, so every column after a non-ASCII character would be wrong.

The algorithm chosen
--------------------
1. Decode with the file's declared encoding and parse with :func:`ast.parse`. Any failure
   (syntax, encoding, NUL bytes, nesting too deep) is NJS001: a file that cannot be judged fails.
2. Build the scope tree (:class:`~nursery_jobs_lint.scopes.Binder`) and walk the node list it
   recorded, iteratively. Per node:

   * a *maximal* Name/Attribute chain (one that is not the ``.value`` of a larger loaded
     Attribute) is resolved to its candidate qualified names, and every candidate is matched
     against the rule tables: each reference is reported once, at the start of the chain;
   * every loaded Attribute whose name is a spawn method is NJS102, gated ones only on a receiver
     of the right kind;
   * calls are inspected for reflection (NJS003/NJS004) and for thread abandonment (NJS104);
   * imports are judged at the import site (NJS201, NJS005, and any table hit on the imported
     name), with ``if TYPE_CHECKING:`` exempt from NJS201 only;
   * ``await x.start(f)`` on an untyped receiver is the opt-in NJS901.

   References inside annotations skip NJS202 (type-only use of a banned module is harmless when
   its import sits under TYPE_CHECKING) but nothing else: NJS107 is about annotations on purpose.
3. Filter by the file's bucket: allowed paths keep only NJS001/NJS104; opt-in rules need
   ``extend-select``.
4. Scan comments with :mod:`tokenize` for suppression attempts (NJS002). Bare ``# noqa`` counts
   only where it would silence an NJS finding, using flake8's own line ranges (a comment applies
   to every line of a multi-line string or backslash continuation it ends).
5. Convert byte offsets to 1-based character columns by decoding the line prefix, sort by
   (line, column, code), drop exact duplicates.

What was left out
-----------------
No caching across runs (a full repository is checked in well under a second per hundred files),
no autofix, no partial results for unparsable files.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import re
import tokenize
import warnings
from collections.abc import Callable

from .config import JUDGED, OUTSIDE, TEST, Config, classify, module_name
from .rules import (
    LOOP_NAMES,
    ABANDON_KEYWORDS,
    ALWAYS_IN_ALLOW,
    ATTRGETTER_FUNCTIONS,
    DISTINCTIVE_SPAWN_ATTRS,
    GATED_SPAWN_ATTRS,
    GETATTR_FUNCTIONS,
    IMPORT_FUNCTIONS,
    OPT_IN,
    PARTIAL_FUNCTIONS,
    RULES,
    THREAD_RUN_SYNC,
    WATCHED_MODULES,
    dotted_match,
    qualified_matches,
)
from .scopes import Binder, Resolver

__all__ = ["Finding", "check_source", "decode_source", "parse_quietly"]


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    """One violation. ``line`` and ``col`` are 1-based; ``col`` counts characters."""

    path: str
    line: int
    col: int
    code: str
    message: str

    @property
    def name(self) -> str:
        return RULES[self.code].name

    def format(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"


class _Unjudgeable(Exception):
    def __init__(self, line: int, col: int, why: str) -> None:
        super().__init__(why)
        self.line, self.col, self.why = line, col, why


def decode_source(source: str | bytes) -> str:
    """Decode bytes the way Python would (coding cookie, BOM); raise _Unjudgeable on failure."""
    if isinstance(source, str):
        return source
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
        return source.decode(encoding)
    except (SyntaxError, LookupError) as exc:
        raise _Unjudgeable(1, 1, f"bad encoding declaration: {exc}") from None
    except UnicodeDecodeError as exc:
        line = source[: exc.start].count(b"\n") + 1
        raise _Unjudgeable(line, 1, f"cannot decode as {exc.encoding}: {exc.reason}") from None


def check_source(
    source: str | bytes,
    path: str,
    config: Config,
    *,
    expand: Callable[[str], set[str]] | None = None,
    bucket: str | None = None,
) -> list[Finding]:
    """Check one file and return its findings, sorted by (line, col, code).

    ``path`` is relative to ``config.root`` with ``/`` separators; it decides which rules apply
    (``include``/``allow``/``tests``) and the module name for relative imports. ``expand``
    follows first-party re-exports (full mode). ``bucket`` overrides the path classification.
    Never raises for any input text: what cannot be judged is NJS001.
    """
    bucket = bucket or classify(path, config)
    if bucket in (OUTSIDE, TEST):
        return []
    try:
        text = decode_source(source)
        lines = _split_lines(text)
        try:
            tree = parse_quietly(text, path)
        except SyntaxError as exc:
            raise _Unjudgeable(exc.lineno or 1, _syntax_col(exc, lines), f"SyntaxError: {exc.msg}") from None
        except (ValueError, RecursionError, MemoryError) as exc:
            raise _Unjudgeable(1, 1, f"{type(exc).__name__}: {exc}") from None
        try:
            raw = _Visitor(tree, path, config, expand).run()
        except RecursionError:
            raise _Unjudgeable(1, 1, "nesting too deep to analyse") from None
    except _Unjudgeable as exc:
        message = f"cannot parse this file ({exc.why}); a file that cannot be judged fails: fix the syntax or encoding"
        return [Finding(path, exc.line, exc.col, "NJS001", message)]

    selected = config.selected_opt_in
    kept = [
        f
        for f in raw
        if (bucket == JUDGED or f[2] in ALWAYS_IN_ALLOW) and (f[2] not in OPT_IN or f[2] in selected)
    ]
    if bucket == JUDGED:
        kept += _suppression_findings(text, lines, kept, config)
    findings = {Finding(path, line, _char_col(lines, line, col), code, message) for line, col, code, message in kept}
    return sorted(findings)


def parse_quietly(source: str | bytes, filename: str) -> ast.Module:
    """:func:`ast.parse` without the SyntaxWarnings the compiler emits for odd code (``1()``):
    they would be printed against the lint's own run, or raised under ``-W error``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source, filename=filename)


# -- locations --------------------------------------------------------------------------


def _split_lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _char_col(lines: list[str], line: int, byte_col: int) -> int:
    """1-based character column for a 0-based UTF-8 byte offset on 1-based ``line``."""
    if 1 <= line <= len(lines):
        prefix = lines[line - 1].encode("utf-8", "surrogatepass")[: max(byte_col, 0)]
        return len(prefix.decode("utf-8", "replace")) + 1
    return max(byte_col, 0) + 1


def _syntax_col(exc: SyntaxError, lines: list[str]) -> int:
    # SyntaxError.offset is already 1-based characters (for str input)
    return max(exc.offset or 1, 1)


def _location(node: ast.AST, anchor: dict[int, ast.AST]) -> tuple[int, int]:
    target = anchor.get(id(node), node)
    return getattr(target, "lineno", 1), getattr(target, "col_offset", 0)


# -- the visitor ------------------------------------------------------------------------

RawFinding = tuple[int, int, str, str]  # line, byte col, code, message

# A reference that is only a type cannot open a nursery or use a module at run time. NJS107 (the
# raw type) and everything else still apply inside annotations.
_NOT_IN_ANNOTATIONS = frozenset({"NJS202", "NJS101"})


def _short(node: ast.AST, limit: int = 40) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # unparse of odd trees is best effort
        return "<expr>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _Visitor:
    def __init__(self, tree: ast.Module, path: str, config: Config, expand: Callable[[str], set[str]] | None) -> None:
        named = module_name(path, config)
        module, is_package = named if named else (None, False)
        self.binder = Binder(tree, module, is_package)
        self.resolver = Resolver(self.binder, config.name_regex, expand)
        self.expand = expand
        self.config = config
        self.allowed = f"(allowed: {config.allow_text})"
        self.banned_modules = config.banned_modules
        self.banned_names = config.banned_names
        self.findings: list[RawFinding] = []

    def report(self, node: ast.AST, code: str, message: str, *, allowed: bool = True) -> None:
        line, col = _location(node, self.binder.anchor)
        if allowed:
            message = f"{message} {self.allowed}"
        self.findings.append((line, col, code, message))

    def run(self) -> list[RawFinding]:
        for node in self.binder.visited:
            if isinstance(node, (ast.Name, ast.Attribute)):
                if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                    self.check_spawn_attribute(node)
                if self.is_maximal_load(node):
                    self.check_reference(node)
            elif isinstance(node, ast.Call):
                self.check_call(node)
            elif isinstance(node, ast.Await):
                self.check_await(node)
            elif isinstance(node, ast.Import):
                self.check_import(node)
            elif isinstance(node, ast.ImportFrom):
                self.check_import_from(node)
        return self.findings

    def is_maximal_load(self, node: ast.Name | ast.Attribute) -> bool:
        if not isinstance(node.ctx, ast.Load):
            return False
        parent = self.binder.parent.get(id(node))
        return not (isinstance(parent, ast.Attribute) and parent.value is node and isinstance(parent.ctx, ast.Load))

    # -- references -----------------------------------------------------------------------

    def names_for(self, node: ast.AST) -> set[str]:
        return self.resolver.resolve_full(node)

    def check_reference(self, node: ast.Name | ast.Attribute) -> None:
        in_annotation = id(node) in self.binder.annotation_ids
        seen: set[str] = set()
        for name in sorted(self.names_for(node)):
            for code, detail in qualified_matches(name, self.banned_modules):
                if code in seen or (code in _NOT_IN_ANNOTATIONS and in_annotation):
                    continue
                seen.add(code)
                self.report(node, code, self.qualified_message(code, name, detail))
            if name in self.banned_names and not in_annotation and "banned-name" not in seen:
                seen.add("banned-name")
                self.report(node, "NJS202", f"use of banned name '{name}': {self.banned_names[name]}")

    def qualified_message(self, code: str, name: str, detail: str) -> str:
        if code == "NJS101":
            return f"nursery opened via '{name}' outside infra; enqueue jobs or ask nursery_jobs.infra.owner for a scope"
        if code == "NJS103":
            if name.startswith("trio.lowlevel."):
                return (
                    f"'{name}' is a trio.lowlevel escape hatch outside infra (only checkpoint/current_task-style "
                    "reads are allowed here); ask nursery_jobs.infra.owner for a scope"
                )
            return f"'{name}' reaches into trio's private internals outside infra; ask nursery_jobs.infra.owner for a scope"
        if code == "NJS105":
            return f"offload via '{name}' outside infra; call nursery_jobs.run_blocking(fn) instead"
        if code == "NJS106":
            if name in LOOP_NAMES:
                return (
                    f"event loop started via '{name}' outside infra; a service's entry point is "
                    "nursery_jobs.run(main, app=app, main_grace=seconds), with its web server inside main, drained on "
                    "rt.shutdown_requested (see nursery_jobs' docs/shutdown.md#web-services-that-drain)"
                )
            return (
                f"thread bridged into the event loop via '{name}' outside infra; run the work as a job "
                "(nursery_jobs.run_blocking for blocking calls) or through infra's bridge"
            )
        if code == "NJS107":
            return (
                f"raw nursery type '{name}' named outside infra; accept the scope infra hands out "
                "(ask nursery_jobs.infra.owner for a scope)"
            )
        if code == "NJS202":
            shown = f"'{detail}'" if name == detail else f"'{detail}' ('{name}')"
            return (
                f"use of banned module {shown} outside infra; use the runtime (jobs, nursery_jobs.run_blocking, "
                "infra's bridge) instead"
            )
        if code == "NJS203":
            return f"process spawn via '{name}' outside infra; use 'await trio.run_process(...)' in a job"
        if code == "NJS204":
            return (
                f"'{name}' registers a callback that runs outside any scope; signals and cleanup belong to infra "
                "(nursery_jobs.infra.signals) or a finally block"
            )
        if code == "NJS205":
            return f"'{name}' starts threads or processes internally; use a non-threading variant or move it into infra"
        raise AssertionError(code)  # pragma: no cover

    # -- spawn methods --------------------------------------------------------------------

    def check_spawn_attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if attr in DISTINCTIVE_SPAWN_ATTRS:
            self.report(node, "NJS102", f"spawn via '.{attr}' outside infra; ask nursery_jobs.infra.owner for a scope")
            return
        kind = GATED_SPAWN_ATTRS.get(attr)
        if kind is not None and kind in self.resolver.kinds(node.value):
            self.report(node, "NJS102", self.gated_message(attr, kind))

    @staticmethod
    def gated_message(attr: str, kind: str) -> str:
        if kind == "executor":
            return f"spawn via '.{attr}' on an executor outside infra; call nursery_jobs.run_blocking(fn) instead"
        what = "a nursery-like receiver" if kind == "nursery" else "a blocking portal"
        return f"spawn via '.{attr}' on {what} outside infra; ask nursery_jobs.infra.owner for a scope"

    # -- calls ----------------------------------------------------------------------------

    def check_call(self, node: ast.Call) -> None:
        targets = self.names_for(node.func)
        if targets & IMPORT_FUNCTIONS:
            self.check_dynamic_import(node)
        if targets & GETATTR_FUNCTIONS:
            self.check_getattr(node)
        if targets & ATTRGETTER_FUNCTIONS:
            self.check_attrgetter(node, "operator.methodcaller" in targets and "operator.attrgetter" not in targets)
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("__getattribute__", "__getattr__"):
            self.check_dunder_getattribute(node)
        if targets & THREAD_RUN_SYNC:
            self.check_abandon(node, sorted(targets & THREAD_RUN_SYNC)[0])
        elif targets & PARTIAL_FUNCTIONS and node.args:
            wrapped = self.names_for(node.args[0]) & THREAD_RUN_SYNC
            if wrapped:
                self.check_abandon(node, sorted(wrapped)[0])

    def check_dynamic_import(self, node: ast.Call) -> None:
        if not node.args:
            return
        first = node.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            return
        for module in self.banned_modules:
            if dotted_match(first.value, module):
                self.report(
                    node,
                    "NJS003",
                    f"dynamic import of banned module '{first.value}' outside infra; use the runtime "
                    "(jobs, nursery_jobs.run_blocking, infra's bridge) instead",
                )
                return

    def reflective(self, node: ast.AST, what: str) -> None:
        self.report(
            node,
            "NJS004",
            f"reflective access to '{what}' outside infra is a hidden spawn; ask nursery_jobs.infra.owner for a scope",
        )

    def spawn_attr_hit(self, attr: str, receiver: ast.AST | None) -> bool:
        if attr in DISTINCTIVE_SPAWN_ATTRS:
            return True
        kind = GATED_SPAWN_ATTRS.get(attr)
        return kind is not None and receiver is not None and kind in self.resolver.kinds(receiver)

    def check_getattr(self, node: ast.Call) -> None:
        if len(node.args) < 2:
            return
        receiver, name = node.args[0], node.args[1]
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            attr = name.value
            if self.spawn_attr_hit(attr, receiver):
                self.reflective(node, attr)
                return
            for base in sorted(self.names_for(receiver)):
                full = f"{base}.{attr}"
                if qualified_matches(full, self.banned_modules) or full in self.banned_names:
                    self.reflective(node, full)
                    return
            return
        watched = WATCHED_MODULES + self.banned_modules
        for base in self.names_for(receiver):
            if any(dotted_match(base, module) for module in watched):
                self.reflective(node, f"{base}.<dynamic>")
                return
        if "nursery" in self.resolver.kinds(receiver):
            self.reflective(node, f"{_short(receiver)}.<dynamic>")

    def check_attrgetter(self, node: ast.Call, methodcaller_only: bool) -> None:
        args = node.args[:1] if methodcaller_only else node.args
        for arg in args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                for part in arg.value.split("."):
                    if part in DISTINCTIVE_SPAWN_ATTRS:
                        self.reflective(node, part)
                        return

    def check_dunder_getattribute(self, node: ast.Call) -> None:
        assert isinstance(node.func, ast.Attribute)
        owner = node.func.value
        for index, arg in enumerate(node.args):
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                # x.__getattribute__("a") or type(x).__getattribute__(x, "a")
                receiver = owner if index == 0 else node.args[0]
                if self.spawn_attr_hit(arg.value, receiver):
                    self.reflective(node, arg.value)
                    return

    def check_abandon(self, node: ast.Call, function: str) -> None:
        for keyword in node.keywords:
            if keyword.arg in ABANDON_KEYWORDS:
                if not (isinstance(keyword.value, ast.Constant) and keyword.value.value is False):
                    self.report(
                        keyword,
                        "NJS104",
                        f"'{function}' with {keyword.arg}={_short(keyword.value)} abandons the thread on cancel; "
                        "leave it False (the default) or call nursery_jobs.run_blocking(fn)",
                        allowed=False,
                    )
            elif keyword.arg is None:
                self.check_abandon_mapping(keyword, function)

    def check_abandon_mapping(self, keyword: ast.keyword, function: str) -> None:
        value = keyword.value
        if isinstance(value, ast.Dict):
            for key, item in zip(value.keys, value.values):
                if key is None:
                    nested = ast.keyword(arg=None, value=item, lineno=keyword.lineno, col_offset=keyword.col_offset)
                    self.check_abandon_mapping(nested, function)
                elif isinstance(key, ast.Constant) and key.value in ABANDON_KEYWORDS:
                    if not (isinstance(item, ast.Constant) and item.value is False):
                        self.report(
                            keyword,
                            "NJS104",
                            f"'{function}' with {key.value}={_short(item)} abandons the thread on cancel; "
                            "leave it False (the default) or call nursery_jobs.run_blocking(fn)",
                            allowed=False,
                        )
                elif not isinstance(key, ast.Constant):
                    self.abandon_unknown(keyword, function)
            return
        self.abandon_unknown(keyword, function)

    def abandon_unknown(self, keyword: ast.keyword, function: str) -> None:
        self.report(
            keyword,
            "NJS104",
            f"'{function}' with **{_short(keyword.value)} may set abandon_on_cancel, which abandons the thread "
            "on cancel; pass keywords explicitly or call nursery_jobs.run_blocking(fn)",
            allowed=False,
        )

    def check_await(self, node: ast.Await) -> None:
        call = node.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "start"):
            return
        if not call.args:
            return
        receiver = call.func.value
        if "nursery" in self.resolver.kinds(receiver) or self.resolver.is_typed(receiver):
            return
        self.report(
            call.func,
            "NJS901",
            f"'await {_short(receiver)}.start(...)' on a receiver of unknown type may be nursery.start; "
            "annotate the receiver with its real type or go through infra",
        )

    # -- imports --------------------------------------------------------------------------

    def banned_module_of(self, name: str) -> str | None:
        for module in self.banned_modules:
            if dotted_match(name, module):
                return module
        return None

    def check_import(self, node: ast.Import) -> None:
        type_checking = id(node) in self.binder.type_checking_ids
        for alias in node.names:
            banned = self.banned_module_of(alias.name)
            if banned and not type_checking:
                self.report(alias, "NJS201", self.import_message(alias.name))
            self.import_site_rules(alias, alias.name, type_checking, followed=False)

    def check_import_from(self, node: ast.ImportFrom) -> None:
        type_checking = id(node) in self.binder.type_checking_ids
        base = self.binder.import_base(node)
        if base is None:
            return
        banned = self.banned_module_of(base)
        for alias in node.names:
            if alias.name == "*":
                if any(dotted_match(base, m) for m in WATCHED_MODULES + self.banned_modules):
                    self.report(
                        alias,
                        "NJS005",
                        f"star import from watched module '{base}' hides which names are bound; import the names "
                        "you need explicitly",
                        allowed=False,
                    )
                if banned and not type_checking:
                    self.report(alias, "NJS201", self.import_message(base))
                continue
            name = f"{base}.{alias.name}"
            if banned and not type_checking:
                self.report(alias, "NJS201", self.import_message(base))
            self.import_site_rules(alias, name, type_checking, followed=True)

    def import_message(self, module: str) -> str:
        return (
            f"import of banned concurrency module '{module}' outside infra; use the runtime (jobs, "
            "nursery_jobs.run_blocking, infra's bridge) instead"
        )

    def import_site_rules(self, alias: ast.alias, name: str, type_checking: bool, *, followed: bool) -> None:
        names = {name}
        if followed and self.expand is not None:
            names |= self.expand(name)
        seen: set[str] = set()
        for candidate in sorted(names, key=lambda n: (n != name, n)):
            for code, detail in qualified_matches(candidate, self.banned_modules):
                if code == "NJS202":
                    if candidate == name or type_checking or "NJS201" in seen:
                        continue
                    seen.add("NJS201")
                    self.report(
                        alias,
                        "NJS201",
                        f"import of '{name}' brings in banned '{candidate}' through a first-party re-export; infra "
                        "may export wrappers, not raw primitives",
                    )
                    continue
                if code in seen or (code == "NJS101" and type_checking):
                    continue
                seen.add(code)
                self.report(alias, code, self.qualified_message(code, candidate, detail))
            if candidate in self.banned_names and "banned-name" not in seen:
                seen.add("banned-name")
                self.report(alias, "NJS202", f"use of banned name '{candidate}': {self.banned_names[candidate]}")


# -- suppression (NJS002) ---------------------------------------------------------------

_NOQA = re.compile(r"#\s*noqa(?::[\s]?(?P<codes>([A-Z]+[0-9]+(?:[,\s]+)?)+))?", re.IGNORECASE)
_FILE_NOQA = re.compile(r"#\s*(?:flake8|ruff)[:=]\s*noqa", re.IGNORECASE)
_OWN_DIRECTIVE = re.compile(r"#.*?nursery[-_ ]?jobs[-_ ]?lint\s*[:=]", re.IGNORECASE)
_NJS = re.compile(r"njs", re.IGNORECASE)


def _comments(text: str, lines: list[str]) -> tuple[list[tuple[int, int, str]], dict[int, range]]:
    """Comments (line, byte col, text) and, per line, flake8's noqa range for that line."""
    comments: list[tuple[int, int, str]] = []
    ranges: dict[int, range] = {}
    try:
        low, high = len(lines) + 2, -1
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type in (tokenize.ENDMARKER, tokenize.DEDENT):
                continue
            if token.type == tokenize.COMMENT:
                line, col = token.start
                comments.append((line, len(lines[line - 1][:col].encode("utf-8", "surrogatepass")), token.string))
            low, high = min(low, token.start[0]), max(high, token.end[0])
            if token.type in (tokenize.NL, tokenize.NEWLINE):
                span = range(low, high + 1)
                for number in span:
                    ranges[number] = span
                low, high = len(lines) + 2, -1
    except (tokenize.TokenError, SyntaxError, IndentationError):
        # tokenize is stricter than ast in corner cases; fall back to a line scan
        comments = []
        for number, text_line in enumerate(lines, 1):
            position = text_line.find("#")
            if position >= 0:
                prefix = text_line[:position].encode("utf-8", "surrogatepass")
                comments.append((number, len(prefix), text_line[position:]))
    return comments, ranges


def _suppression_findings(
    text: str, lines: list[str], findings: list[RawFinding], config: Config
) -> list[RawFinding]:
    lowered = text.lower()
    if "noqa" not in lowered and "lint" not in lowered:
        return []  # no comment can be a suppression: skip tokenizing
    comments, ranges = _comments(text, lines)
    finding_lines = {line for line, _, code, _ in findings if code.startswith("NJS")}
    out: list[RawFinding] = []
    advice = f"fix the code or move it under an allowed path (allowed: {config.allow_text})"
    for line, col, comment in comments:
        quoted = comment.strip()
        if len(quoted) > 60:
            quoted = quoted[:57] + "..."
        message = f"suppression comment '{quoted}' is not allowed: this lint has no inline ignores; {advice}"
        if _OWN_DIRECTIVE.search(comment):
            out.append((line, col, "NJS002", message))
            continue
        file_level = _FILE_NOQA.search(comment)
        if file_level:
            if _NJS.search(comment[file_level.end() :]) or finding_lines:
                out.append((line, col, "NJS002", message))
            continue
        match = _NOQA.search(comment)
        if not match:
            continue
        if _NJS.search(comment[match.start() :]):
            out.append((line, col, "NJS002", message))
            continue
        if match.group("codes") is None:
            span = ranges.get(line, range(line, line + 1))
            if any(number in finding_lines for number in span):
                out.append((line, col, "NJS002", message))
    return out
