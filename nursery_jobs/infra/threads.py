"""`run_blocking`: the one sanctioned way for job code to call blocking code.

The call runs on a Trio worker thread under its runtime's `ThreadBudget` -- a `CapacityLimiter`
of `thread_limit` tokens and a count of the calls in flight -- so blocking code can never take
more than `thread_limit` threads, and it is never abandoned: if the job is cancelled while the
thread runs, the job waits for the thread to return before it unwinds, so no thread outlives the
job that started it. Blocking code that can run for long should take its own timeout (a socket
timeout, a statement timeout) so that cancellation is prompt.

The budget is the runtime's, found through a ContextVar the runtime sets for its tasks (as Trio
keeps its own per-run state in RunVars): jobs and the service's code inside `open_runtime` share
it, and infra needs nothing from the layers above to find it.
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable, TypeVar

import trio

from ..errors import RuntimeClosed

__all__ = ["ThreadBudget", "current_budget", "from_io_thread", "run_blocking", "run_callers_io", "run_sync_io"]

T = TypeVar("T")


class ThreadBudget:
    """At most `limit` `run_blocking` threads at once, and how many run now; `closed` once its
    runtime has ended."""

    __slots__ = ("closed", "in_flight", "limiter")

    def __init__(self, limit: int) -> None:
        self.limiter = trio.CapacityLimiter(limit)
        self.in_flight = 0
        self.closed = False


current_budget: contextvars.ContextVar[ThreadBudget | None] = contextvars.ContextVar(
    "nursery_jobs.thread_budget", default=None
)


async def run_blocking(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)`` on a thread under the runtime's limiter and return its result.

    The shutdown does not refuse it: the code still running then (an attempt in its grace or
    its unwind, main winding down) may need it for its cleanup, and it adds no work. Raises
    `RuntimeClosed` outside a runtime, and after the runtime ended (in a task that outlived it:
    its thread would outlive the runtime); re-raises whatever `fn` raises.
    """
    budget = current_budget.get()
    if budget is None:
        raise RuntimeClosed(
            "run_blocking() needs a running runtime, and this context has none; call it inside "
            "`async with nursery_jobs.open_runtime(app) as rt:` or from a job"
        )
    if budget.closed:
        raise RuntimeClosed(
            "run_blocking() was called after the runtime this task ran under had ended, from a task that "
            "outlived it (started outside ctx.children() and outside the runtime's block): no thread may "
            "outlive its runtime; start such tasks with ctx.children(), which the attempt waits for"
        )
    budget.in_flight += 1
    try:
        return await trio.to_thread.run_sync(fn, *args, limiter=budget.limiter, abandon_on_cancel=False)
    finally:
        budget.in_flight -= 1


async def run_sync_io(fn: Callable[..., T], *args: Any, limiter: trio.CapacityLimiter) -> T:
    """For the library's own blocking I/O (SQLite calls): a thread under `limiter`, never
    abandoned, so the Trio loop never blocks on a database call and no call outlives its caller."""
    return await trio.to_thread.run_sync(fn, *args, limiter=limiter, abandon_on_cancel=False)


def from_io_thread(fn: Callable[[], T]) -> T:
    """``fn()`` run on the Trio thread, called from a thread `run_sync_io` runs, which waits
    for it: for a value only the Trio thread may read (a Trio clock) that the I/O needs in the
    middle of its work. The Trio thread is free to run it: the task that started the thread is
    waiting for the thread."""
    return trio.from_thread.run_sync(fn)


async def run_callers_io(fn: Callable[..., T], *args: Any) -> T:
    """For blocking calls the library makes on a connection the caller handed it (a sync
    psycopg or sqlite3 connection passed to `enqueue_tx`): a thread under the runtime's budget
    when one is current (the call is the service's I/O, as `run_blocking`'s is), Trio's default
    limiter otherwise; never abandoned."""
    budget = current_budget.get()
    limiter = budget.limiter if budget is not None else trio.to_thread.current_default_thread_limiter()
    return await trio.to_thread.run_sync(fn, *args, limiter=limiter, abandon_on_cancel=False)
