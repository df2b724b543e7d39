"""The asyncio bridge: trio-asyncio, for asyncio job handlers and asyncio database connections.

One trio-asyncio loop per runtime, opened by infra only when something needs it (an asyncio job
kind), so a service that never touches asyncio never pays for it. An asyncio handler runs as
``aio_as_trio(fn)(ctx, **args)`` *inside* its attempt's Trio cancel scope: a timeout, a cancel or a
shutdown cancels the asyncio task, and the attempt ends only once that task has finished, so no
asyncio task outlives its Trio caller.

Import order matters: psycopg binds `asyncio.get_running_loop` when it is imported, and
trio-asyncio patches it when *it* is imported. If psycopg came first, every async psycopg call
under trio-asyncio fails with "no running event loop". This module imports trio_asyncio, and
`infra.pg` imports this module before psycopg, so the library's own imports are always in the
right order; if the application imported psycopg earlier, `check_import_order` says so.
"""

from __future__ import annotations

import sys
import warnings
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

_psycopg_first = "psycopg" in sys.modules and "trio_asyncio" not in sys.modules

import trio_asyncio  # noqa: E402  (after the check above, on purpose)

__all__ = ["call_asyncio", "check_import_order", "loop_running", "maybe_open_loop"]


def loop_running() -> bool:
    """Whether a trio-asyncio loop is open in this context."""
    return trio_asyncio.current_loop.get(None) is not None


def check_import_order() -> None:
    """Warn if psycopg was imported before trio_asyncio in this process."""
    if _psycopg_first:
        warnings.warn(
            "psycopg was imported before trio_asyncio: async psycopg calls under trio-asyncio will fail "
            "with 'no running event loop'; import trio_asyncio (or nursery_jobs.backends.postgres) "
            "before anything that imports psycopg",
            RuntimeWarning,
            stacklevel=2,
        )


@asynccontextmanager
async def maybe_open_loop(needed: bool) -> AsyncIterator[None]:
    """A trio-asyncio loop for the block if `needed` (and none is running already)."""
    if not needed or trio_asyncio.current_loop.get(None) is not None:
        yield
        return
    check_import_order()
    async with trio_asyncio.open_loop():
        yield


async def call_asyncio(fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """Await the asyncio coroutine function `fn` from Trio, under the caller's cancel scope."""
    return await trio_asyncio.aio_as_trio(fn)(*args, **kwargs)
