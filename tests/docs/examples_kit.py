"""How the docs tests run an example of examples/: loaded into this process and its `main` run
under `open_runtime` on virtual time, or run as a user runs it, a subprocess with a time bound
that must exit 0 without a traceback."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import trio
import trio.testing

import nursery_jobs as nj

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
SCRIPT_TIMEOUT = 60.0
"""The bound of one example's run as a script: interpreter start-up on a loaded 2-core machine,
not a speed claim."""


def load_example(path: Path, module_name: str) -> ModuleType:
    """The example at `path`, imported as a fresh module named `module_name`."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_main_on_virtual_time(
    example: ModuleType, *main_args: Any, autojump_threshold: float = 0, **runtime_options: Any
) -> Any:
    """What ``example.main(rt, *main_args)`` returns under ``open_runtime(example.app,
    **runtime_options)``, in a Trio run on a MockClock that jumps once every task has waited
    `autojump_threshold` real seconds."""

    async def body() -> Any:
        async with nj.open_runtime(example.app, **runtime_options) as rt:
            return await example.main(rt, *main_args)

    return trio.run(body, clock=trio.testing.MockClock(autojump_threshold=autojump_threshold))


def run_example_script(path: Path, *args: str, timeout: float = SCRIPT_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """``python <path> *args`` from the repository's root; it must exit 0 within `timeout` and
    write no traceback."""
    result = subprocess.run(
        [sys.executable, str(path), *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result
