"""The asyncio bridge: trio-asyncio, for asyncio job handlers and asyncio database connections.

One trio-asyncio loop per runtime, opened by infra only when something needs it (an asyncio job
kind), so a service that never touches asyncio never pays for it. An asyncio handler runs as
``aio_as_trio(fn)(ctx, **args)`` *inside* its attempt's Trio cancel scope: a timeout, a cancel or a
shutdown cancels the asyncio task, and the attempt ends only once that task has finished, so no
asyncio task outlives its Trio caller.

Import order no longer matters. psycopg's `waiting` module binds `asyncio.get_running_loop`
when it is imported, and trio-asyncio replaces that function when *it* is imported: with
psycopg first, every async psycopg call under trio-asyncio failed with "no running event loop".
Importing this module (the runtime does so only when an asyncio job kind runs, or an async
connection is passed to `enqueue_tx`) points psycopg's binding at trio-asyncio's function if
psycopg was imported first (`_rebind_psycopg`). That one name of psycopg's is pinned by a test
(tests/backends/postgres/test_psycopg_pins.py), with the psycopg versions it was checked on.
"""

from __future__ import annotations

import asyncio
import sys
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

import trio_asyncio

__all__ = ["call_asyncio", "loop_running", "maybe_open_loop"]


def _rebind_psycopg() -> None:
    """psycopg imported before trio-asyncio kept the original `get_running_loop`, which cannot
    see trio-asyncio's loop: point it at the function trio-asyncio installed."""
    waiting = sys.modules.get("psycopg.waiting")
    if waiting is not None and getattr(waiting, "get_running_loop", None) is not asyncio.get_running_loop:
        waiting.get_running_loop = asyncio.get_running_loop  # type: ignore[attr-defined]


_rebind_psycopg()


def loop_running() -> bool:
    """Whether a trio-asyncio loop is open in this context."""
    return trio_asyncio.current_loop.get(None) is not None


@asynccontextmanager
async def maybe_open_loop(needed: bool) -> AsyncIterator[None]:
    """A trio-asyncio loop for the block if `needed` (and none is running already)."""
    if not needed or trio_asyncio.current_loop.get(None) is not None:
        yield
        return
    _rebind_psycopg()  # psycopg may have been imported since this module was
    async with trio_asyncio.open_loop():
        yield


async def call_asyncio(fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """Await the asyncio coroutine function `fn` from Trio, under the caller's cancel scope."""
    return await trio_asyncio.aio_as_trio(fn)(*args, **kwargs)
