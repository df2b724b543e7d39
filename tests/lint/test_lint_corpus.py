"""The evasion corpus of the specification (§1.9 item 2), and the code the runtime itself writes.

Snippets are written with real newlines (the specification joins lines with ``;``). Each
must-catch row must produce *at least* the listed codes; each must-not-catch snippet must produce
nothing at all.
"""

from __future__ import annotations

import pathlib
import textwrap

import pytest

from nursery_jobs_lint.checker import check_source
from nursery_jobs_lint.config import Config

CONFIG = Config(root=pathlib.Path("."), allow=("nursery_jobs/infra/**",), tests=("tests/**",))


def codes(source: str, path: str = "nursery_jobs/jobs_module.py", config: Config = CONFIG) -> set[str]:
    return {f.code for f in check_source(textwrap.dedent(source), path, config)}


MUST_CATCH = [
    ("import trio as t\nasync def f():\n    async with t.open_nursery() as n:\n        ...", {"NJS101"}),
    ("from trio import lowlevel\nlowlevel.spawn_system_task(f)", {"NJS103"}),
    ("from trio import lowlevel as ll\nll.spawn_system_task(f)", {"NJS103"}),
    ("import trio.lowlevel\ntrio.lowlevel.start_guest_run(f)", {"NJS103"}),
    ("import trio\nll = trio.lowlevel\nll.spawn_system_task(f)", {"NJS103"}),
    ("from threading import Thread as T\nT(target=f).start()", {"NJS201", "NJS202"}),
    ("import threading\nclass W(threading.Thread):\n    pass", {"NJS202"}),
    ("class C:\n    def method(self):\n        self._nursery.start_soon(f)", {"NJS102"}),
    ("async def f(nursery):\n    await nursery.start(serve)", {"NJS102"}),
    ('async def f(n: "trio.Nursery"):\n    await n.start(serve)', {"NJS102", "NJS107"}),
    ("import trio\nasync def f():\n    async with trio.open_nursery() as n:\n        await n.start(g)", {"NJS101", "NJS102"}),
    ('spawn = getattr(n, "start_soon")\nspawn(f)', {"NJS004"}),
    ('import operator\noperator.methodcaller("start_soon", f)(n)', {"NJS004"}),
    ("import functools\nfunctools.partial(n.start_soon, f)", {"NJS102"}),
    ('import importlib\nimportlib.import_module("threading")', {"NJS003"}),
    ("from trio.lowlevel import *", {"NJS005"}),
    ("import trio\nasync def f():\n    await trio.to_thread.run_sync(g, abandon_on_cancel=True)", {"NJS104", "NJS105"}),
    ('import subprocess as sp\nsp.Popen(["x"])', {"NJS203"}),
    ("import os\nos.fork()", {"NJS203"}),
    ("import atexit\n@atexit.register\ndef f():\n    pass", {"NJS204"}),
    ("from concurrent import futures\nfutures.ThreadPoolExecutor().submit(f)", {"NJS201", "NJS202"}),
    ("import asyncio\nasyncio.get_running_loop().run_in_executor(None, f)", {"NJS102", "NJS201", "NJS202"}),
    ("def f(loop):\n    loop.call_later(5, g)", {"NJS102"}),
    ("import signal\nsignal.signal(signal.SIGTERM, h)", {"NJS204"}),
    ("import trio\ndef register(n: trio.Nursery):\n    ...", {"NJS107"}),
]


@pytest.mark.parametrize("source,expected", MUST_CATCH, ids=[f"row{i + 1}" for i in range(len(MUST_CATCH))])
def test_must_catch(source: str, expected: set[str]) -> None:
    found = codes(source)
    assert expected <= found, f"missing {sorted(expected - found)}; found {sorted(found)}"


def test_corpus_without_imports_still_catches() -> None:
    # "Unresolved roots fall back to the literal name": a snippet without its import still fires
    assert "NJS102" in codes('async def f(n: "trio.Nursery"):\n    await n.start(serve)')
    assert "NJS204" in codes("signal.signal(signal.SIGTERM, h)")
    assert "NJS102" in codes("asyncio.get_running_loop().run_in_executor(None, f)")


MUST_NOT_CATCH = [
    "import trio\nasync def f():\n    await trio.sleep(1)",
    "import signal, trio\ndef f():\n    with trio.open_signal_receiver(signal.SIGTERM) as signals:\n        pass",
    'import trio\nasync def f():\n    await trio.run_process(["x"])',
    "def f(server):\n    server.start()",
    'import subprocess\nsubprocess.run(["x"], check=True)',
    "async def f(rt, job):\n    await rt.enqueue(job)",
]


@pytest.mark.parametrize("source", MUST_NOT_CATCH, ids=[f"clean{i + 1}" for i in range(len(MUST_NOT_CATCH))])
def test_must_not_catch(source: str) -> None:
    assert codes(source) == set()


RUNTIME_CODE_OUTSIDE_INFRA = '''
from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING

import trio
import trio.lowlevel
from trio.lowlevel import checkpoint, checkpoint_if_cancelled, current_task

from .infra import owner
from .infra.threads import run_blocking

if TYPE_CHECKING:
    from .infra.owner import Owner

log = logging.getLogger(__name__)


class Executor:
    def __init__(self, scope: "Owner", limit: int) -> None:
        self._scope = scope
        self._limiter = trio.CapacityLimiter(limit)
        self._send, self._receive = trio.open_memory_channel(limit)
        self._stopped = trio.Event()

    async def run_one(self, job, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        with trio.CancelScope() as cancel_scope:
            with trio.fail_after(job.timeout):
                await checkpoint()
                self._scope.spawn(self._attempt, job, name=job.kind)
        with trio.move_on_at(trio.current_time() + 1):
            await trio.sleep(0)
        await checkpoint_if_cancelled()
        await trio.lowlevel.cancel_shielded_checkpoint()
        log.debug("%s %s %s", current_task(), trio.lowlevel.current_root_task(), trio.lowlevel.current_statistics())
        await run_blocking(functools.partial(time.sleep, 0))
        async with self._limiter:
            await self._send.send(job)
        self._stopped.set()
        return cancel_scope

    async def _attempt(self, job) -> None:
        await owner.current().spawn(job.handler)
'''


def test_runtime_code_outside_infra_is_clean() -> None:
    # the patterns the runtime itself writes outside infra: none of them may fire
    findings = check_source(RUNTIME_CODE_OUTSIDE_INFRA, "nursery_jobs/executor.py", CONFIG)
    assert findings == []


def test_spawn_is_not_a_distinctive_spawn_method() -> None:
    assert codes("def f(scope, g):\n    scope.spawn(g)\n    scope.spawn(g, name='x')") == set()


def test_trio_run_only_in_infra() -> None:
    source = "import trio\ndef run(main):\n    return trio.run(main)\n"
    assert codes(source, "nursery_jobs/runtime.py") == {"NJS106"}
    assert codes(source, "nursery_jobs/infra/runner.py") == set()


def test_same_spawn_is_clean_in_allow_and_tests() -> None:
    source = "async def f(nursery, g):\n    nursery.start_soon(g)\n"
    assert codes(source, "nursery_jobs/infra/owner.py") == set()
    assert codes(source, "tests/test_owner.py") == set()
    assert codes(source, "nursery_jobs/owner.py") == {"NJS102"}


def test_njs106_sends_a_service_entry_point_to_nj_run_with_main_grace_and_the_page_it_names_says_so() -> None:
    """A service that starts its own loop to serve beside `open_runtime` is told the way that
    drains (nj.run with main_grace), and the docs section the message names teaches exactly that."""
    source = "import trio\nasync def main(): ...\ntrio.run(main)\n"
    [finding] = check_source(source, "service/app.py", CONFIG)
    assert finding.code == "NJS106"
    assert "nursery_jobs.run(main, app=app, main_grace=seconds)" in finding.message
    assert "rt.shutdown_requested" in finding.message
    assert "docs/shutdown.md#web-services-that-drain" in finding.message
    bridge = check_source("import trio\ntrio.from_thread.run_sync(f)\n", "service/app.py", CONFIG)
    assert [f.code for f in bridge] == ["NJS106"] and "main_grace" not in bridge[0].message

    root = pathlib.Path(__file__).resolve().parents[2]
    shutdown = (root / "docs" / "shutdown.md").read_text()
    section = shutdown[shutdown.index("## Web services that drain") :]
    section = section[: section.index("\n## ", 1)]
    for needed in ("main_grace", "shutdown_trigger=rt.shutdown_requested.wait", "nj.run", "NJS106"):
        assert needed in section, needed
    lint_page = (root / "docs" / "lint.md").read_text()
    njs106 = lint_page[lint_page.index("### NJS106") : lint_page.index("### NJS107")]
    assert "main_grace" in njs106 and "(shutdown.md#web-services-that-drain)" in njs106
