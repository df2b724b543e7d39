"""Name resolution: which fully qualified names an expression may denote, and what kind of object
a receiver is.

The problem
-----------
The rule tables speak in qualified names (``trio.lowlevel.spawn_system_task``), but source code
speaks in local names: ``import trio as t``, ``from trio import lowlevel as ll``,
``ll = trio.lowlevel``, ``from ..infra import owner``, a function-local ``import threading``, a
parameter that shadows a module. And the most important spawn, ``.start_soon``/``.start``, is a
method on an object whose type Python does not write down.

The naive approach, and why it fails
------------------------------------
flake8-async's first resolver (before 26.4.1) matched the literal prefix ``trio.``; ``import trio
as t`` walked straight past it. Its later one maps module-level imports only: a function-local
``from trio import lowlevel as ll`` and relative imports stay invisible, and until 26.4.2 it
collapsed ``foo("x").bar`` to ``foo.bar``, inventing a name. A "last assignment wins" table
(what an interpreter would do) is flow-sensitive and therefore wrong for a checker: in
``ll = None`` / ``if cond: ll = trio.lowlevel`` / ``ll.spawn_system_task(f)`` the dangerous
binding is not the last one in the file, only the last one on one path.

The algorithm chosen
--------------------
1. :class:`Binder` walks the module once (iteratively, so deep nesting cannot blow the Python
   stack) and builds a :class:`Scope` for the module, each class, function, lambda and
   comprehension. Every binding site adds a :class:`Binding` to its scope: imports (``import
   a.b.c`` binds ``a``; ``import a.b as x`` binds ``x -> a.b``; ``from a.b import c as d`` binds
   ``d -> a.b.c``; relative imports are made absolute from the file's module name under
   ``roots``), simple aliases ``x = <expr>`` / ``(x := <expr>)`` / parameter defaults, ``with
   <ctx> as x``, annotations, and opaque bindings (``def``, ``class``, ``for``, ``except``, bare
   parameters) that carry no name but still shadow outer ones. ``global``/``nonlocal`` redirect
   a binding to the scope Python would use. ``self.<attr> = ...`` in any method is recorded on
   the class, next to the class body's own bindings.
2. A name keeps **all** its bindings in a scope. Resolution (LEGB; class scopes are skipped for
   nested functions, as in Python) returns the union of what every binding may denote. A finding
   fires if *any* candidate matches a rule: a false positive is fixed by renaming, a false
   negative is a hole.
3. Expressions: a Name gives its candidates; an Attribute appends ``.attr`` to each candidate of
   its value; a Call or Subscript anywhere in a chain makes the chain unresolvable (the 26.4.2
   lesson: ``foo("x").bar`` is not ``foo.bar``). A name bound nowhere falls back to itself, so
   builtins (``getattr``, ``__import__``) and unimported modules still resolve. Star imports add
   ``module.name`` candidates for names bound nowhere else.
4. Receiver kinds (nursery / executor / portal) come from the same bindings: a ``with``
   binding whose context is a known factory call, ``x = <factory>()``, ``x = await
   stack.enter_async_context(<factory>())``, an annotation naming a known type anywhere inside
   it (``Optional[...]``, ``X | None``, string annotations), ``self.<attr>`` assigned from such a
   value in any method or annotated in the class body, or the last identifier matching the
   configured nursery-name regex.

Alias chains are resolved lazily with memoisation and an in-progress guard, so ``x = x.y`` or
two names aliasing each other terminate, and the work per binding is done once.

What was left out
-----------------
No type inference beyond the above (pylint's astroid would know that ``make()`` returns a
nursery; we do not): untyped parameters and containers are the documented gap, closed by the
opt-in NJS901 and the runtime's task audit. No flow sensitivity (on purpose, see above). No
following of ``x.attr`` into classes other than ``self``/``cls`` of the enclosing class.
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Callable

from .rules import ENTER_CONTEXT_ATTRS, FACTORIES_BY_KIND, IMPORT_FUNCTIONS, TYPES_BY_KIND

__all__ = ["Binding", "Scope", "ClassInfo", "Binder", "Resolver", "resolve_relative"]

_MAX_CANDIDATES = 64
_MAX_ANNOTATION_STRING = 2000
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_STRUCTURAL = frozenset(
    {ast.Constant, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.If, ast.AnnAssign, ast.arg}
    | set(_COMPREHENSIONS)
)
_BINDING_SITES = frozenset(
    {
        ast.Assign,
        ast.AugAssign,
        ast.NamedExpr,
        ast.For,
        ast.AsyncFor,
        ast.With,
        ast.AsyncWith,
        ast.ExceptHandler,
        ast.Import,
        ast.ImportFrom,
        ast.Global,
        ast.Nonlocal,
        ast.MatchAs,
        ast.MatchStar,
        ast.MatchMapping,
    }
)


class Binding:
    """One way a name gets a value.

    Exactly what the binding site tells us: an import's qualified name, an alias ``value``
    expression, a ``with`` context expression ``ctx``, an ``annotation``, or none of them
    (opaque). ``scope`` is where ``value``/``ctx``/``annotation`` are evaluated (for parameters,
    the enclosing scope).
    """

    __slots__ = ("qualname", "value", "ctx", "annotation", "scope")

    def __init__(
        self,
        scope: Scope,
        *,
        qualname: str | None = None,
        value: ast.expr | None = None,
        ctx: ast.expr | None = None,
        annotation: ast.expr | None = None,
    ) -> None:
        self.scope = scope
        self.qualname = qualname
        self.value = value
        self.ctx = ctx
        self.annotation = annotation


class ClassInfo:
    """What a class body and its methods bind on ``self``."""

    __slots__ = ("scope", "self_attrs")

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.self_attrs: dict[str, list[Binding]] = {}

    def attr_bindings(self, name: str) -> list[Binding]:
        return self.scope.bindings.get(name, []) + self.self_attrs.get(name, [])


class Scope:
    __slots__ = ("kind", "parent", "bindings", "globals", "nonlocals", "star_imports", "method_self", "class_info")

    def __init__(self, kind: str, parent: Scope | None) -> None:
        self.kind = kind  # module | class | function | lambda | comprehension
        self.parent = parent
        self.bindings: dict[str, list[Binding]] = {}
        self.globals: set[str] = set()
        self.nonlocals: set[str] = set()
        self.star_imports: list[str] = []
        self.method_self: str | None = None  # first parameter of a method (self / cls)
        self.class_info: ClassInfo | None = None  # the class of a method, or of a class scope

    @property
    def module(self) -> Scope:
        scope = self
        while scope.parent is not None:
            scope = scope.parent
        return scope


def resolve_relative(module: str | None, level: int, is_package: bool, target: str | None) -> str | None:
    """Absolute module for ``from <level dots><target> import ...`` in ``module``; None if it
    climbs above the top-level package or the file's module name is unknown."""
    if level == 0:
        return target
    if module is None:
        return None
    parts = module.split(".")
    if not is_package:
        parts = parts[:-1]
    drop = level - 1
    if drop > len(parts) or (drop == len(parts) and not target):
        return None
    base = parts[: len(parts) - drop] if drop else parts
    if not base and not target:
        return None
    return ".".join([*base, target] if target else base)


def _parse_annotation(text: str) -> ast.Expression:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(text.strip(), mode="eval")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _first_param(args: ast.arguments) -> str | None:
    positional = [*args.posonlyargs, *args.args]
    return positional[0].arg if positional else None


def _decorator_names(node: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names = set()
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Name):
            names.add(decorator.id)
        elif isinstance(decorator, ast.Attribute):
            names.add(decorator.attr)
    return names


_Frame = tuple[ast.AST, "Scope", bool, bool, "ast.AST | None", int]


class Binder:
    """Builds the scope tree of one module and remembers, for every node it visited, the scope
    it is evaluated in and whether it sits inside an annotation or a TYPE_CHECKING block.

    ``visited`` lists every node once, including the nodes of parsed string annotations, whose
    ``anchor`` (for locations) is the string constant they came from.
    """

    def __init__(self, tree: ast.Module, module: str | None = None, is_package: bool = False) -> None:
        self.module_name = module
        self.is_package = is_package
        self.module = Scope("module", None)
        self.node_scope: dict[int, Scope] = {}
        self.annotation_ids: set[int] = set()
        self.type_checking_ids: set[int] = set()
        self.anchor: dict[int, ast.AST] = {}
        self.parent: dict[int, ast.AST] = {}
        self.visited: list[ast.AST] = []
        self._pending: list[tuple[Scope, str, Binding]] = []
        self._pending_self: list[tuple[Scope, str, str, Binding]] = []
        self._walk(tree)
        self._finish()

    # -- traversal ------------------------------------------------------------------------

    def _walk(self, tree: ast.Module) -> None:
        # An explicit stack instead of recursion: machine-generated code nests deeper than the
        # Python stack allows. Each entry carries the context its node is evaluated in:
        # (node, scope, in_annotation, in_type_checking, anchor, string_depth).
        stack: list[_Frame] = [(tree, self.module, False, False, None, 0)]
        visited, node_scope, parent = self.visited, self.node_scope, self.parent
        while stack:
            frame = stack.pop()
            node, scope, ann, tc, anchor, sdepth = frame
            key = id(node)
            visited.append(node)
            node_scope[key] = scope
            if ann:
                self.annotation_ids.add(key)
            if tc:
                self.type_checking_ids.add(key)
            if anchor is not None:
                self.anchor[key] = anchor
            kind = type(node)
            if kind in _STRUCTURAL:
                if self._structural(frame, stack):
                    continue
            elif kind in _BINDING_SITES:
                self._binding_site(node, scope)
            for child in ast.iter_child_nodes(node):
                parent[id(child)] = node
                stack.append((child, scope, ann, tc, anchor, sdepth))

    def _structural(self, frame: _Frame, stack: list[_Frame]) -> bool:
        """Nodes that open a scope or change the context of some children. Returns False when
        the children should be visited the generic way (same context)."""
        node, scope, ann, tc, anchor, sdepth = frame

        def push(child: ast.AST | None, child_scope: Scope = scope, child_ann: bool = ann, child_tc: bool = tc) -> None:
            if child is not None:
                self.parent[id(child)] = node
                stack.append((child, child_scope, child_ann, child_tc, anchor, sdepth))

        if isinstance(node, ast.Constant):
            if ann and isinstance(node.value, str):
                self._push_string_annotation(node, scope, tc, anchor or node, sdepth, stack)
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._bind(scope, node.name, Binding(scope))
            inner = Scope("function", scope)
            if scope.kind == "class" and "staticmethod" not in _decorator_names(node):
                inner.method_self = _first_param(node.args)
                inner.class_info = scope.class_info
            for decorator in node.decorator_list:
                push(decorator)
            self._bind_arguments(node.args, inner, scope, push)
            push(node.returns, scope, True)
            for statement in node.body:
                push(statement, inner, False)
            return True
        if isinstance(node, ast.Lambda):
            inner = Scope("lambda", scope)
            self._bind_arguments(node.args, inner, scope, push)
            push(node.body, inner, False)
            return True
        if isinstance(node, ast.ClassDef):
            self._bind(scope, node.name, Binding(scope))
            inner = Scope("class", scope)
            inner.class_info = ClassInfo(inner)
            for child in (*node.decorator_list, *node.bases, *node.keywords):
                push(child)
            for statement in node.body:
                push(statement, inner, False)
            return True
        if isinstance(node, _COMPREHENSIONS):
            inner = Scope("comprehension", scope)
            for index, generator in enumerate(node.generators):
                # the first iterable is evaluated in the enclosing scope, as in Python
                self.parent[id(generator)] = node
                self.visited.append(generator)
                self.node_scope[id(generator)] = inner
                push(generator.iter, scope if index == 0 else inner)
                push(generator.target, inner)
                for condition in generator.ifs:
                    push(condition, inner)
                self._bind_target(generator.target, inner, None)
            if isinstance(node, ast.DictComp):
                push(node.key, inner)
                push(node.value, inner)
            else:
                push(node.elt, inner)
            return True
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                return False
            push(node.test)
            for statement in node.body:
                push(statement, scope, ann, True)
            for statement in node.orelse:
                push(statement)
            return True
        if isinstance(node, ast.AnnAssign):
            push(node.annotation, scope, True)
            push(node.value)
            push(node.target)
            binding = Binding(scope, value=node.value, annotation=node.annotation)
            if isinstance(node.target, ast.Name):
                self._bind(scope, node.target.id, binding)
            else:
                self._maybe_self_attr(node.target, scope, binding)
            return True
        if isinstance(node, ast.arg):
            push(node.annotation, scope, True)
            return True
        return False  # pragma: no cover

    def _binding_site(self, node: ast.AST, scope: Scope) -> None:
        """Binding sites whose children are visited the generic way."""
        if isinstance(node, ast.Assign):
            for target in node.targets:
                self._bind_target(target, scope, node.value)
        elif isinstance(node, ast.AugAssign):
            self._bind_target(node.target, scope, None)
        elif isinstance(node, ast.NamedExpr):
            target_scope = scope
            while target_scope.kind == "comprehension" and target_scope.parent is not None:
                target_scope = target_scope.parent
            self._bind(target_scope, node.target.id, Binding(scope, value=node.value))
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            self._bind_target(node.target, scope, None)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                if item.optional_vars is not None:
                    self._bind_with(item.optional_vars, item.context_expr, scope)
        elif isinstance(node, ast.ExceptHandler):
            if node.name:
                self._bind(scope, node.name, Binding(scope))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self._bind(scope, alias.asname, Binding(scope, qualname=alias.name))
                else:
                    top = alias.name.split(".")[0]
                    self._bind(scope, top, Binding(scope, qualname=top))
        elif isinstance(node, ast.ImportFrom):
            base = self.import_base(node)
            for alias in node.names:
                if alias.name == "*":
                    if base is not None:
                        scope.star_imports.append(base)
                    continue
                qualname = f"{base}.{alias.name}" if base is not None else None
                self._bind(scope, alias.asname or alias.name, Binding(scope, qualname=qualname))
        elif isinstance(node, ast.Global):
            scope.globals.update(node.names)
        elif isinstance(node, ast.Nonlocal):
            scope.nonlocals.update(node.names)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)):
            if node.name:
                self._bind(scope, node.name, Binding(scope))
        elif isinstance(node, ast.MatchMapping):
            if node.rest:
                self._bind(scope, node.rest, Binding(scope))

    def _push_string_annotation(
        self,
        node: ast.Constant,
        scope: Scope,
        tc: bool,
        anchor: ast.AST,
        sdepth: int,
        stack: list[_Frame],
    ) -> None:
        text = node.value
        if not isinstance(text, str) or sdepth >= 3 or len(text) > _MAX_ANNOTATION_STRING:
            return
        try:
            parsed = _parse_annotation(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return
        self.parent[id(parsed.body)] = node
        stack.append((parsed.body, scope, True, tc, anchor, sdepth + 1))

    def _bind_arguments(self, args: ast.arguments, inner: Scope, outer: Scope, push: Callable[..., None]) -> None:
        positional = [*args.posonlyargs, *args.args]
        defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
        pairs: list[tuple[ast.arg, ast.expr | None]] = list(zip(positional, defaults))
        pairs += list(zip(args.kwonlyargs, args.kw_defaults))
        for extra in (args.vararg, args.kwarg):
            if extra is not None:
                pairs.append((extra, None))
        for arg, default in pairs:
            push(arg, outer)
            push(default, outer, False)
            self._bind(inner, arg.arg, Binding(outer, value=default, annotation=arg.annotation))

    def _bind_target(self, target: ast.expr, scope: Scope, value: ast.expr | None) -> None:
        if isinstance(target, ast.Name):
            self._bind(scope, target.id, Binding(scope, value=value))
        elif isinstance(target, (ast.Tuple, ast.List)):
            values: list[ast.expr | None]
            if (
                isinstance(value, (ast.Tuple, ast.List))
                and len(value.elts) == len(target.elts)
                and not any(isinstance(e, ast.Starred) for e in (*value.elts, *target.elts))
            ):
                values = list(value.elts)
            else:
                values = [None] * len(target.elts)
            for element, element_value in zip(target.elts, values):
                self._bind_target(element, scope, element_value)
        elif isinstance(target, ast.Starred):
            self._bind_target(target.value, scope, None)
        elif isinstance(target, ast.Attribute):
            self._maybe_self_attr(target, scope, Binding(scope, value=value))

    def _bind_with(self, target: ast.expr, ctx: ast.expr, scope: Scope) -> None:
        if isinstance(target, ast.Name):
            self._bind(scope, target.id, Binding(scope, ctx=ctx))
        elif isinstance(target, ast.Attribute):
            self._maybe_self_attr(target, scope, Binding(scope, ctx=ctx))
        else:
            self._bind_target(target, scope, None)

    def _maybe_self_attr(self, target: ast.expr, scope: Scope, binding: Binding) -> None:
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            self._pending_self.append((scope, target.value.id, target.attr, binding))

    def _bind(self, scope: Scope, name: str, binding: Binding) -> None:
        self._pending.append((scope, name, binding))

    def _finish(self) -> None:
        # global/nonlocal declarations are known only after the whole scope was walked
        local_names: dict[int, set[str]] = {}
        for scope, name, _ in self._pending:
            if name not in scope.globals and name not in scope.nonlocals:
                local_names.setdefault(id(scope), set()).add(name)
        for scope, name, binding in self._pending:
            target = scope
            if scope.kind != "module" and name in scope.globals:
                target = scope.module
            elif name in scope.nonlocals:
                outer = scope.parent
                while outer is not None and outer.kind != "module":
                    if outer.kind != "class" and name in local_names.get(id(outer), ()):
                        break
                    outer = outer.parent
                target = outer if outer is not None and outer.kind != "module" else scope
            target.bindings.setdefault(name, []).append(binding)
        for scope, name, attr, binding in self._pending_self:
            _, found = lookup(name, scope)
            if found is not None and found.method_self == name and found.class_info is not None:
                found.class_info.self_attrs.setdefault(attr, []).append(binding)

    def import_base(self, node: ast.ImportFrom) -> str | None:
        return resolve_relative(self.module_name, node.level, self.is_package, node.module)


def lookup(name: str, scope: Scope) -> tuple[list[Binding] | None, Scope | None]:
    """LEGB lookup: the bindings of ``name`` visible from ``scope`` and the scope holding them,
    or ``(None, None)`` if it is bound nowhere (a builtin or an undefined name)."""
    if scope.kind != "module" and name in scope.globals:
        module = scope.module
        found = module.bindings.get(name)
        return (found, module) if found else (None, None)
    current: Scope | None = scope
    first = True
    while current is not None:
        if current.kind == "class" and not first:
            current = current.parent
            continue
        found = current.bindings.get(name)
        if found:
            return found, current
        first = False
        current = current.parent
    return None, None


class Resolver:
    """Answers "what may this expression denote" and "what kind of receiver is this" for one
    module. ``expand`` (optional) follows first-party re-exports of a qualified name."""

    def __init__(
        self,
        binder: Binder,
        name_regex: re.Pattern[str],
        expand: Callable[[str], set[str]] | None = None,
    ) -> None:
        self.binder = binder
        self.name_regex = name_regex
        self.expand = expand
        self._candidates: dict[int, frozenset[str]] = {}
        self._kinds: dict[int, frozenset[str]] = {}
        self._in_progress: set[int] = set()
        self._kinds_in_progress: set[int] = set()

    # -- qualified names ------------------------------------------------------------------

    def resolve(self, expr: ast.AST, scope: Scope | None = None) -> set[str]:
        """Candidates for a Name/Attribute chain (empty when the chain is unresolvable)."""
        if scope is None:
            scope = self.binder.node_scope.get(id(expr), self.binder.module)
        attrs: list[str] = []
        node = expr
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return set()
        attrs.reverse()
        bindings, found = lookup(node.id, scope)
        if bindings is None:
            bases = {node.id} | {f"{module}.{node.id}" for module in scope.module.star_imports}
        else:
            info = self._self_class(node.id, found)
            if info is not None and attrs:
                bases = set()
                for binding in info.attr_bindings(attrs[0]):
                    bases |= self.binding_candidates(binding)
                attrs = attrs[1:]
            else:
                bases = set()
                for binding in bindings:
                    bases |= self.binding_candidates(binding)
        if not attrs:
            return bases
        suffix = "." + ".".join(attrs)
        return {base + suffix for base in bases}

    def resolve_full(self, expr: ast.AST, scope: Scope | None = None) -> set[str]:
        """:meth:`resolve` plus first-party re-export targets of every candidate."""
        names = self.resolve(expr, scope)
        if self.expand is not None and names:
            for name in list(names):
                names |= self.expand(name)
        return names

    def binding_candidates(self, binding: Binding) -> frozenset[str]:
        key = id(binding)
        cached = self._candidates.get(key)
        if cached is not None:
            return cached
        if binding.qualname is not None:
            result = frozenset({binding.qualname})
        elif binding.value is None or key in self._in_progress:
            result = frozenset()
        else:
            self._in_progress.add(key)
            try:
                result = frozenset(self._value_candidates(binding.value, binding.scope))
            finally:
                self._in_progress.discard(key)
            if len(result) > _MAX_CANDIDATES:
                result = frozenset(sorted(result)[:_MAX_CANDIDATES])
        if key not in self._in_progress:
            self._candidates[key] = result
        return result

    def _value_candidates(self, value: ast.expr, scope: Scope) -> set[str]:
        while isinstance(value, ast.NamedExpr):
            value = value.value
        if isinstance(value, ast.Call) and value.args:
            target = self.resolve(value.func, scope)
            first = value.args[0]
            if target & IMPORT_FUNCTIONS and isinstance(first, ast.Constant) and isinstance(first.value, str):
                name = first.value
                if "__import__" in {t.rsplit(".", 1)[-1] for t in target}:
                    # __import__("a.b") returns the top-level package a
                    return {name, name.split(".")[0]}
                return {name}
            return set()
        if isinstance(value, (ast.Name, ast.Attribute)):
            return self.resolve(value, scope)
        return set()

    def _self_class(self, name: str, found: Scope | None) -> ClassInfo | None:
        if found is not None and found.method_self == name:
            return found.class_info
        return None

    # -- receiver kinds -------------------------------------------------------------------

    def kinds(self, expr: ast.AST, scope: Scope | None = None) -> set[str]:
        """Receiver kinds (nursery / executor / portal) ``expr`` is known to have."""
        if scope is None:
            scope = self.binder.node_scope.get(id(expr), self.binder.module)
        kinds: set[str] = set()
        while isinstance(expr, (ast.Await, ast.NamedExpr)):
            expr = expr.value
        if isinstance(expr, ast.Name):
            if self.name_regex.search(expr.id):
                kinds.add("nursery")
            bindings, _ = lookup(expr.id, scope)
            for binding in bindings or ():
                kinds |= self.binding_kinds(binding)
        elif isinstance(expr, ast.Attribute):
            if self.name_regex.search(expr.attr):
                kinds.add("nursery")
            if isinstance(expr.value, ast.Name):
                _, found = lookup(expr.value.id, scope)
                info = self._self_class(expr.value.id, found)
                if info is not None:
                    for binding in info.attr_bindings(expr.attr):
                        kinds |= self.binding_kinds(binding)
        elif isinstance(expr, ast.Call):
            for name in self.resolve_full(expr.func, scope):
                for kind, factories in FACTORIES_BY_KIND.items():
                    if name in factories:
                        kinds.add(kind)
            if isinstance(expr.func, ast.Attribute) and expr.func.attr in ENTER_CONTEXT_ATTRS and expr.args:
                kinds |= self.kinds(expr.args[0], scope)
        return kinds

    def binding_kinds(self, binding: Binding) -> frozenset[str]:
        key = id(binding)
        cached = self._kinds.get(key)
        if cached is not None:
            return cached
        if key in self._kinds_in_progress:
            return frozenset()
        self._kinds_in_progress.add(key)
        try:
            kinds: set[str] = set()
            if binding.value is not None:
                kinds |= self.kinds(binding.value, binding.scope)
            if binding.ctx is not None:
                kinds |= self.kinds(binding.ctx, binding.scope)
            if binding.annotation is not None:
                kinds |= self.annotation_kinds(binding.annotation, binding.scope)
        finally:
            self._kinds_in_progress.discard(key)
        result = frozenset(kinds)
        self._kinds[key] = result
        return result

    def annotation_kinds(self, annotation: ast.AST, scope: Scope, depth: int = 0) -> set[str]:
        kinds: set[str] = set()
        for node in ast.walk(annotation):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and depth < 3:
                if len(node.value) > _MAX_ANNOTATION_STRING:
                    continue
                try:
                    parsed = _parse_annotation(node.value)
                except (SyntaxError, ValueError, RecursionError, MemoryError):
                    continue
                kinds |= self.annotation_kinds(parsed.body, scope, depth + 1)
            elif isinstance(node, (ast.Name, ast.Attribute)):
                for name in self.resolve_full(node, scope):
                    for kind, types in TYPES_BY_KIND.items():
                        if name in types:
                            kinds.add(kind)
        return kinds

    def is_typed(self, expr: ast.AST, scope: Scope | None = None) -> bool:
        """True if the receiver carries an annotation somewhere (a parameter, a variable, or a
        ``self`` attribute annotated in the class or a method)."""
        if scope is None:
            scope = self.binder.node_scope.get(id(expr), self.binder.module)
        if isinstance(expr, ast.Name):
            bindings, _ = lookup(expr.id, scope)
            return any(b.annotation is not None for b in bindings or ())
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            _, found = lookup(expr.value.id, scope)
            info = self._self_class(expr.value.id, found)
            if info is not None:
                return any(b.annotation is not None for b in info.attr_bindings(expr.attr))
        return False
