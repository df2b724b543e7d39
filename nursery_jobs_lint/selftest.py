"""``--self-test``: prove, on this install, that the gate can go red.

The problem
-----------
A lint that silently stopped firing looks exactly like a clean codebase. A broken install
(a stale wheel, a refactor that disconnected a rule table, a Python upgrade that changed ``ast``)
turns the gate green forever, and nobody notices because green is what everyone wants to see.

The naive approach, and why it fails
------------------------------------
"The unit tests cover it": they run in the project's CI against the source tree, not against the
copy a user's pre-commit environment installed. "Plant a violation once by hand": that proves
the gate worked on the day someone tried.

The algorithm chosen
--------------------
A built-in corpus, checked through the same :func:`check_source` entry point as real files:

* must-catch snippets: the evasion corpus of the specification (aliases, relative names,
  reflection, receivers typed by ``async with``, annotations and ``self.`` attributes) plus one
  example per rule, each with the codes it must produce;
* must-not-catch snippets: structured or innocent code that looks similar (``trio.sleep``,
  ``trio.run_process``, ``server.start()``, ``rt.enqueue(job)``, the read-only ``trio.lowlevel``
  helpers, cancel scopes and channels);
* placement checks: the same spawn is clean under ``allow`` and in ``tests``, while NJS104 still
  fires under ``allow``;
* a column check on a line with a non-ASCII character.

It passes only if every snippet behaves *and every rule code fired at least once*, so a rule
whose table was emptied by accident fails the self-test even if no snippet names it.

What was left out
-----------------
No file-system or git checks (full mode is covered by the project's own tests and by CI running
the lint on itself); the self-test must work in any directory, including outside a repository.
"""

from __future__ import annotations

import pathlib
import textwrap

from .checker import check_source
from .config import Config
from .rules import RULES

__all__ = ["MUST_CATCH", "MUST_NOT_CATCH", "run_self_test", "self_test_config"]

# (snippet, codes that must all be reported); lines are real newlines, indented blocks allowed.
MUST_CATCH: list[tuple[str, frozenset[str]]] = [
    (src, frozenset(codes.split()))
    for src, codes in [
        ("import trio as t\nasync def f():\n    async with t.open_nursery() as n:\n        ...", "NJS101"),
        ("from trio import lowlevel\nlowlevel.spawn_system_task(f)", "NJS103"),
        ("from trio import lowlevel as ll\nll.spawn_system_task(f)", "NJS103"),
        ("import trio.lowlevel\ntrio.lowlevel.start_guest_run(f)", "NJS103"),
        ("import trio\nll = trio.lowlevel\nll.spawn_system_task(f)", "NJS103"),
        ("from threading import Thread as T\nT(target=f).start()", "NJS201 NJS202"),
        ("import threading\nclass W(threading.Thread):\n    pass", "NJS202"),
        ("class C:\n    def m(self):\n        self._nursery.start_soon(f)", "NJS102"),
        ("async def f(nursery):\n    await nursery.start(serve)", "NJS102"),
        ('async def f(n: "trio.Nursery"):\n    await n.start(serve)', "NJS102 NJS107"),
        ("import trio\nasync def f():\n    async with trio.open_nursery() as n:\n        await n.start(g)", "NJS101 NJS102"),
        ('spawn = getattr(n, "start_soon")\nspawn(f)', "NJS004"),
        ('import operator\noperator.methodcaller("start_soon", f)(n)', "NJS004"),
        ("import functools\nfunctools.partial(n.start_soon, f)", "NJS102"),
        ('import importlib\nimportlib.import_module("threading")', "NJS003"),
        ("from trio.lowlevel import *", "NJS005"),
        ("import trio\nasync def f():\n    await trio.to_thread.run_sync(g, abandon_on_cancel=True)", "NJS104 NJS105"),
        ('import subprocess as sp\nsp.Popen(["x"])', "NJS203"),
        ("import os\nos.fork()", "NJS203"),
        ("import atexit\n@atexit.register\ndef flush():\n    pass", "NJS204"),
        ("from concurrent import futures\nfutures.ThreadPoolExecutor().submit(f)", "NJS201 NJS202"),
        ("import asyncio\nasyncio.get_running_loop().run_in_executor(None, f)", "NJS102 NJS201 NJS202"),
        ("def f(loop):\n    loop.call_later(5, g)", "NJS102"),
        ("import signal\nsignal.signal(signal.SIGTERM, h)", "NJS204"),
        ("import trio\ndef register(n: trio.Nursery):\n    ...", "NJS107"),
        # one per remaining rule
        ("def f(:", "NJS001"),
        ("n.start_soon(f)  # noqa: NJS102", "NJS002 NJS102"),
        ("import trio\ntrio.run(main)", "NJS106"),
        ("from logging.handlers import QueueListener\nQueueListener(q, h).start()", "NJS205"),
        ("async def f(x):\n    await x.start(serve)", "NJS901"),
        # resolver corners
        ("def f():\n    from trio import lowlevel as ll\n    ll.spawn_system_task(g)", "NJS103"),
        ("import trio\ndef f(ll=trio.lowlevel):\n    ll.current_trio_token()", "NJS103"),
        ("import trio\nif c:\n    ll = None\nelse:\n    ll = trio.lowlevel\nll.spawn_system_task(f)", "NJS103"),
        (
            "import trio\nclass C:\n    def __init__(self):\n        self.ll = trio.lowlevel\n"
            "    def m(self):\n        self.ll.spawn_system_task(f)",
            "NJS103",
        ),
        (
            "import trio\nclass S:\n    async def run(self):\n"
            "        async with trio.open_nursery() as self.pool:\n            await self.pool.start(g)",
            "NJS101 NJS102",
        ),
    ]
]

MUST_NOT_CATCH: list[str] = [
    "import trio\nasync def f():\n    await trio.sleep(1)",
    "import signal, trio\ndef f():\n    with trio.open_signal_receiver(signal.SIGTERM) as s:\n        pass",
    'import trio\nasync def f():\n    await trio.run_process(["x"])',
    "def f(server):\n    server.start()",
    'import subprocess\nsubprocess.run(["x"], check=True)',
    "async def f(rt, job):\n    await rt.enqueue(job)",
    textwrap.dedent(
        """\
        import trio
        from trio.lowlevel import checkpoint, current_task
        async def f(owner, job):
            await trio.lowlevel.checkpoint()
            await trio.lowlevel.checkpoint_if_cancelled()
            await trio.lowlevel.cancel_shielded_checkpoint()
            trio.lowlevel.current_task(); trio.lowlevel.current_root_task()
            trio.lowlevel.current_statistics()
            with trio.CancelScope() as scope, trio.fail_after(3), trio.move_on_at(9):
                event = trio.Event()
                send, receive = trio.open_memory_channel(10)
                limiter = trio.CapacityLimiter(4)
                await trio.sleep(0)
            owner.spawn(job)
        async def startable(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
        """
    ),
]

_PLACEMENT = (
    "import trio\nasync def f(nursery):\n    nursery.start_soon(g)\n"
    "    await trio.to_thread.run_sync(g, abandon_on_cancel=True)\n"
)


def self_test_config() -> Config:
    """The built-in configuration the self-test judges its corpus with."""
    return Config(
        root=pathlib.Path("."),
        include=(".",),
        allow=("pkg/infra/**",),
        tests=("tests/**",),
        extend_select=("NJS901",),
    )


def run_self_test() -> tuple[bool, list[str]]:
    """Run the corpus; return (passed, report lines)."""
    config = self_test_config()
    problems: list[str] = []
    fired: set[str] = set()
    for index, (source, expected) in enumerate(MUST_CATCH, 1):
        found = {f.code for f in check_source(source, f"pkg/catch_{index}.py", config)}
        fired |= found
        missing = expected - found
        if missing:
            first = source.splitlines()[0] if source else ""
            problems.append(f"must-catch #{index} ({first!r}...) missed {', '.join(sorted(missing))}")
    for index, source in enumerate(MUST_NOT_CATCH, 1):
        found_findings = check_source(source, f"pkg/clean_{index}.py", config)
        if found_findings:
            problems.append(f"must-not-catch #{index} fired: {found_findings[0].format()}")
    in_allow = {f.code for f in check_source(_PLACEMENT, "pkg/infra/owner.py", config)}
    if in_allow != {"NJS104"}:
        problems.append(f"under allow, expected only NJS104, got {sorted(in_allow) or 'nothing'}")
    in_tests = check_source(_PLACEMENT, "tests/test_owner.py", config)
    if in_tests:
        problems.append(f"in tests, expected nothing, got {in_tests[0].format()}")
    columns = check_source('x = "é"; n.start_soon(f)\n', "pkg/columns.py", config)
    if [(f.line, f.col) for f in columns] != [(1, 10)]:
        problems.append(f"column check: expected 1:10, got {[(f.line, f.col) for f in columns]}")
    silent = sorted(set(RULES) - fired)
    if silent:
        problems.append(f"rules that never fired: {', '.join(silent)}")
    summary = (
        f"nursery-jobs-lint self-test: {len(MUST_CATCH)} must-catch snippets, {len(MUST_NOT_CATCH)} "
        f"must-not-catch snippets, {len(fired & set(RULES))}/{len(RULES)} rules fired"
    )
    if problems:
        return False, [*problems, summary + ": FAILED"]
    return True, [summary + ": ok"]
