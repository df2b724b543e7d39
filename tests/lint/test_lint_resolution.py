"""Alias, scope and receiver resolution (§1.5), columns, suppression forms and robustness."""

from __future__ import annotations

import ast
import pathlib
import textwrap

import pytest

from nursery_jobs_lint.checker import check_source
from nursery_jobs_lint.config import Config
from nursery_jobs_lint.scopes import Binder, Resolver, resolve_relative

CONFIG = Config(root=pathlib.Path("."), allow=("pkg/infra/**",), tests=("tests/**",))


def found(source: str, path: str = "pkg/mod.py", config: Config = CONFIG) -> list[tuple[int, int, str]]:
    return [(f.line, f.col, f.code) for f in check_source(textwrap.dedent(source), path, config)]


def codes(source: str, path: str = "pkg/mod.py", config: Config = CONFIG) -> set[str]:
    return {code for _, _, code in found(source, path, config)}


def resolve_last(source: str, module: str | None = "pkg.mod", is_package: bool = False) -> set[str]:
    """Candidates of the expression in the last statement of ``source``."""
    tree = ast.parse(textwrap.dedent(source))
    binder = Binder(tree, module, is_package)
    last = tree.body[-1]
    while not isinstance(last, ast.Expr):
        last = last.body[-1]  # type: ignore[attr-defined]
    import re

    return Resolver(binder, re.compile("nursery")).resolve(last.value)


# -- binding table ----------------------------------------------------------------------


def test_import_forms() -> None:
    assert resolve_last("import trio.lowlevel\ntrio.lowlevel.x") == {"trio.lowlevel.x"}
    assert resolve_last("import trio.lowlevel as ll\nll.x") == {"trio.lowlevel.x"}
    assert resolve_last("from trio import lowlevel as ll\nll.x") == {"trio.lowlevel.x"}
    assert resolve_last("import trio as t\nx = t.lowlevel\nx.y") == {"trio.lowlevel.y"}
    assert resolve_last("import trio\n(x := trio.lowlevel)\nx.y") == {"trio.lowlevel.y"}


def test_all_candidates_are_kept() -> None:
    source = """
    import os, trio
    if cond:
        x = os
    else:
        x = trio.lowlevel
    x.fork
    """
    assert resolve_last(source) == {"os.fork", "trio.lowlevel.fork"}


def test_call_or_subscript_in_chain_is_unresolvable() -> None:
    assert resolve_last('import trio\nfoo("x").lowlevel.spawn_system_task') == set()
    assert resolve_last("import trio\nmods[0].lowlevel.spawn_system_task") == set()
    assert codes('import trio\nfoo("x").lowlevel.spawn_system_task(f)') == set()


def test_unbound_names_fall_back_to_themselves() -> None:
    assert resolve_last("getattr") == {"getattr"}
    assert resolve_last("trio.lowlevel.x") == {"trio.lowlevel.x"}


def test_local_binding_shadows_module_import() -> None:
    source = """
    import threading
    def f(threading):
        threading.Thread()
    """
    assert found(source) == [(2, 8, "NJS201")]


def test_function_local_import_is_tracked() -> None:
    assert codes("def f():\n    from trio import lowlevel as ll\n    ll.spawn_system_task(g)") == {"NJS103"}


def test_class_scope_is_skipped_for_methods() -> None:
    source = """
    import trio
    class C:
        ll = trio.lowlevel
        def method(self):
            return ll.spawn_system_task
    """
    # Python raises NameError here; the class attribute is not visible by bare name
    assert codes(source) == set()
    assert codes(source.replace("return ll.", "return self.ll.")) == {"NJS103"}


def test_comprehension_does_not_see_class_scope_but_sees_module() -> None:
    source = """
    import trio
    ll = trio.lowlevel
    class C:
        ll = None
        xs = [ll.spawn_system_task for _ in range(3)]
    """
    assert codes(source) == {"NJS103"}


def test_global_and_nonlocal_redirect_bindings() -> None:
    global_source = """
    def setup():
        global ll
        import trio
        ll = trio.lowlevel
    ll.spawn_system_task(f)
    """
    assert codes(global_source) == {"NJS103"}
    nonlocal_source = """
    import trio
    def outer():
        ll = None
        def inner():
            nonlocal ll
            ll = trio.lowlevel
        inner()
        ll.spawn_system_task(f)
    """
    assert codes(nonlocal_source) == {"NJS103"}


def test_parameter_defaults_and_tuple_unpacking_alias() -> None:
    assert codes("import trio\ndef f(ll=trio.lowlevel):\n    ll.spawn_system_task(g)") == {"NJS103"}
    assert codes("import trio\nlam = lambda ll=trio.lowlevel: ll.spawn_system_task(g)") == {"NJS103"}
    assert codes("import trio, os\na, b = trio.lowlevel, os\nb.fork()") == {"NJS203"}


def test_import_module_constant_binds_an_alias() -> None:
    assert codes('import importlib\nll = importlib.import_module("trio.lowlevel")\nll.spawn_system_task(f)') == {"NJS103"}
    assert codes('o = __import__("os")\no.fork()') == {"NJS203"}


def test_star_import_names_resolve_through_the_module() -> None:
    assert codes("from trio.lowlevel import *\nspawn_system_task(f)") == {"NJS005", "NJS103"}


def test_alias_cycles_terminate() -> None:
    assert codes("x = y\ny = x\nx.start_soon") == {"NJS102"}
    assert codes("x = x.y\nx = x.z\nx.q") == set()
    deep = "\n".join(f"a{i + 1} = a{i}" for i in range(300))
    assert codes("import trio\na0 = trio.lowlevel\n" + deep + "\na300.spawn_system_task(f)") == {"NJS103"}


# -- relative imports -------------------------------------------------------------------


@pytest.mark.parametrize(
    "module,is_package,level,target,expected",
    [
        ("pkg.sub.mod", False, 1, "x", "pkg.sub.x"),
        ("pkg.sub.mod", False, 1, None, "pkg.sub"),
        ("pkg.sub.mod", False, 2, "infra", "pkg.infra"),
        ("pkg.sub", True, 1, "x", "pkg.sub.x"),
        ("pkg.sub", True, 2, None, "pkg"),
        ("pkg.mod", False, 3, "x", None),
        (None, False, 1, "x", None),
        ("pkg.mod", False, 0, "trio", "trio"),
    ],
)
def test_resolve_relative(module: str | None, is_package: bool, level: int, target: str | None, expected: str | None) -> None:
    assert resolve_relative(module, level, is_package, target) == expected


def test_relative_imports_resolve_against_roots() -> None:
    config = Config(root=pathlib.Path("."), roots=("src",), extend_banned_modules=("pkg.legacy",))
    source = "from ..legacy import pool\npool.run()"
    assert codes(source, "src/pkg/sub/mod.py", config) == {"NJS201", "NJS202"}
    # outside every root the module name is unknown, so the relative import stays unresolved
    assert codes(source, "other/pkg/sub/mod.py", config) == set()


# -- TYPE_CHECKING and annotations ------------------------------------------------------


def test_type_checking_imports_bind_but_do_not_fire_njs201() -> None:
    source = """
    import typing
    from typing import TYPE_CHECKING
    if TYPE_CHECKING:
        import threading
    if typing.TYPE_CHECKING:
        from concurrent.futures import Executor
    else:
        import asyncio
    def f(t: threading.Thread, e: "Executor") -> "threading.Event": ...
    def g():
        threading.Thread()
    """
    assert found(source) == [(9, 12, "NJS201"), (12, 5, "NJS202")]


def test_annotations_skip_njs202_but_not_njs107() -> None:
    source = """
    import trio
    x: "trio.Nursery"
    def f(n: "list[trio.Nursery]") -> None: ...
    """
    assert codes(source) == {"NJS107"}


# -- receivers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "async def f(n: trio.Nursery):\n    await n.start(g)",
        "async def f(n: Optional[trio.Nursery]):\n    await n.start(g)",
        "async def f(n: 'trio.Nursery | None'):\n    await n.start(g)",
        "async def f(n: trio.Nursery | None = None):\n    await n.start(g)",
        "async def f():\n    async with trio.open_nursery() as n:\n        await n.start(g)",
        "async def f(stack):\n    n = await stack.enter_async_context(trio.open_nursery())\n    await n.start(g)",
        "async def f():\n    n = trio.open_nursery()\n    await n.start(g)",
        "class C:\n    pool: trio.Nursery\n    async def m(self):\n        await self.pool.start(g)",
        "class C:\n    def __init__(self, n: trio.Nursery):\n        self.pool = n\n    async def m(self):\n        await self.pool.start(g)",
        "class C:\n    async def m(self):\n        async def inner():\n            await self._tg.start(g)",
        "async def f(task_group):\n    await task_group.start(g)",
    ],
)
def test_nursery_like_receivers(source: str) -> None:
    assert "NJS102" in codes("import trio\nfrom typing import Optional\n" + source)


def test_executor_and_portal_receivers() -> None:
    executor = "from concurrent.futures import ThreadPoolExecutor\nwith ThreadPoolExecutor() as ex:\n    ex.submit(f)\n    ex.map(f, xs)"
    assert [c for _, _, c in found(executor) if c == "NJS102"] == ["NJS102", "NJS102"]
    portal = "from anyio.from_thread import start_blocking_portal\nwith start_blocking_portal() as p:\n    p.start_task(f)"
    assert "NJS102" in codes(portal)
    assert codes("def f(form, data):\n    form.submit()\n    data.map(str)\n    form.start_task(g)") == set()


def test_nursery_name_regex_is_configurable() -> None:
    config = Config(root=pathlib.Path("."), nursery_name_regex=r"^scope$")
    assert codes("async def f(scope):\n    await scope.start(g)", config=config) == {"NJS102"}
    assert codes("async def f(nursery):\n    await nursery.start(g)", config=config) == set()


# -- columns, locations -----------------------------------------------------------------


def test_columns_are_characters_not_bytes() -> None:
    # ast says byte offset 10; editors count 9 characters before `n`, so column 10 (1-based)
    assert found('x = "é"; n.start_soon(f)') == [(1, 10, "NJS102")]
    assert found('x = "日本語"; n.start_soon(f)') == [(1, 12, "NJS102")]


def test_columns_with_a_latin1_coding_cookie() -> None:
    source = '# -*- coding: latin-1 -*-\nx = "é"; n.start_soon(f)\n'.encode("latin-1")
    assert [(f.line, f.col) for f in check_source(source, "pkg/m.py", CONFIG)] == [(2, 10)]


def test_string_annotation_findings_point_at_the_string() -> None:
    assert found('def f(n: "trio.Nursery"): ...') == [(1, 10, "NJS107")]


def test_findings_are_sorted_and_unique() -> None:
    result = check_source("n.start_soon(f); n.start_soon(f)\nimport threading\n", "pkg/m.py", CONFIG)
    assert [(f.line, f.col, f.code) for f in result] == [(1, 1, "NJS102"), (1, 18, "NJS102"), (2, 8, "NJS201")]


# -- NJS002 forms -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    [
        "n.start_soon(f)  # noqa",
        "n.start_soon(f)  #noqa:NJS102",
        "n.start_soon(f)  # NoQA: njs1",
        "x = 1  # noqa : NJS102",
        "x = 1  # nursery-jobs-lint: disable",
        "x = 1  # nursery_jobs_lint: off",
    ],
)
def test_suppression_forms(line: str) -> None:
    assert "NJS002" in codes(line)


def test_bare_noqa_without_finding_is_fine() -> None:
    assert codes("x = 1  # noqa\ny = 2  # noqa: E501") == set()


def test_named_other_codes_do_not_count_only_bare_noqa_does() -> None:
    # `# noqa: E501` does not silence NJS102 in flake8; it is not a suppression of this lint
    result = found("n.start_soon(f)  # noqa: E501")
    assert result == [(1, 1, "NJS102")]


def test_bare_noqa_at_the_end_of_a_multiline_string_covers_the_range() -> None:
    source = 's = """\n""" + str(n.start_soon)  # noqa\n'
    assert codes(source) == {"NJS102", "NJS002"}
    source = 'n.start_soon(f); s = """\n"""  # noqa\n'
    assert codes(source) == {"NJS102", "NJS002"}


def test_file_level_noqa() -> None:
    assert codes("# flake8: noqa\nn.start_soon(f)\n") == {"NJS002", "NJS102"}
    assert codes("# flake8: noqa\nx = 1\n") == set()
    assert codes("# ruff: noqa: NJS102\nx = 1\n") == {"NJS002"}


def test_suppression_is_not_reported_in_allow_or_tests() -> None:
    source = "n.start_soon(f)  # noqa: NJS102\n"
    assert codes(source, "pkg/infra/owner.py") == set()
    assert codes(source, "tests/test_x.py") == set()


# -- NJS001 and robustness ---------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        b"def f(:\n",
        b"x = 1\x00\n",
        b"# -*- coding: no-such-codec -*-\nx = 1\n",
        b"x = '\xff\xfe'\n",
        b"type X = int\n",  # Python 3.12 syntax: this interpreter cannot judge it
    ],
)
def test_unjudgeable_files_are_njs001(source: bytes) -> None:
    result = check_source(source, "pkg/m.py", CONFIG)
    assert [f.code for f in result] == ["NJS001"]


def test_njs001_applies_in_allow_but_not_in_tests() -> None:
    assert [f.code for f in check_source("def f(:", "pkg/infra/x.py", CONFIG)] == ["NJS001"]
    assert check_source("def f(:", "tests/test_x.py", CONFIG) == []


def test_deeply_nested_code_does_not_crash() -> None:
    chain = "x = " + " + ".join(["1"] * 800) + "\n"
    assert check_source(chain, "pkg/m.py", CONFIG) == []
    # deeper than the compiler itself can build: not judged, so it fails (never silently passes)
    deeper = "x = " + " + ".join(["1"] * 50000) + "\n"
    assert [f.code for f in check_source(deeper, "pkg/m.py", CONFIG)] == ["NJS001"]
    attrs = "n" + ".a" * 3000 + ".start_soon(f)\n"
    assert [f.code for f in check_source(attrs, "pkg/m.py", CONFIG)] in (["NJS102"], ["NJS001"])
    nested = "x = " + "[" * 150 + "]" * 150 + "\n"
    assert check_source(nested, "pkg/m.py", CONFIG) == []


def test_files_outside_include_are_not_judged() -> None:
    config = Config(root=pathlib.Path("."), include=("pkg",))
    assert check_source("n.start_soon(f)", "other/m.py", config) == []
    assert check_source("n.start_soon(f)", "pkg/m.py", config) != []


def test_extend_banned_modules_and_names() -> None:
    config = Config(
        root=pathlib.Path("."),
        extend_banned_modules=("twisted",),
        extend_banned_names=(("pkg.infra.owner.raw_nursery", "use open_runtime"),),
    )
    assert codes("from twisted.internet import reactor\nreactor.run()", config=config) == {"NJS201", "NJS202"}
    result = check_source(
        "from pkg.infra.owner import raw_nursery\nraw_nursery()\nraw_nursery_factory = 1\n", "pkg/m.py", config
    )
    assert [(f.line, f.code) for f in result] == [(1, "NJS202"), (2, "NJS202")]
    assert "use open_runtime" in result[0].message
    assert "NJS003" in codes('import importlib\nimportlib.import_module("twisted.internet")', config=config)


def test_opt_in_rule_needs_extend_select() -> None:
    source = "async def f(x):\n    await x.start(serve)"
    assert codes(source) == set()
    assert codes(source, config=Config(root=pathlib.Path("."), extend_select=("NJS901",))) == {"NJS901"}
