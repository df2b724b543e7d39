"""`run_blocking`: the one sanctioned way for job code to call blocking code.

The call runs on a Trio worker thread under the runtime's `CapacityLimiter` (so blocking code
can never take more than `thread_limit` threads), and it is never abandoned: if the job is
cancelled while the thread runs, the job waits for the thread to return before it unwinds, so no
thread outlives the job that started it. Blocking code that can run for long should take its own
timeout (a socket timeout, a statement timeout) so that cancellation is prompt.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

import trio

from .._context import get_runtime

__all__ = ["run_blocking", "run_sync_io"]

T = TypeVar("T")


async def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on a thread under the runtime's limiter and return its result.

    Raises `RuntimeClosed` outside a runtime; re-raises whatever `fn` raises.
    """
    rt = get_runtime("run_blocking()")
    rt.threads_in_flight += 1
    try:
        return await trio.to_thread.run_sync(fn, *args, limiter=rt.thread_limiter, abandon_on_cancel=False)
    finally:
        rt.threads_in_flight -= 1


async def run_sync_io(fn: Callable[..., T], *args: Any, limiter: trio.CapacityLimiter) -> T:
    """For the library's own blocking I/O (SQLite calls): a thread under `limiter`, never
    abandoned, so the Trio loop never blocks on a database call and no call outlives its caller."""
    return await trio.to_thread.run_sync(fn, *args, limiter=limiter, abandon_on_cancel=False)
