"""The one `trio.run` of the library, run-wide instruments, and the signal watcher of `nursery_jobs.run`."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator, Sequence, TypeVar

import trio

__all__ = ["instrumented", "run_trio", "watch_shutdown_signals"]

T = TypeVar("T")


def run_trio(
    async_fn: Callable[..., Awaitable[T]],
    *args: Any,
    clock: trio.abc.Clock | None = None,
    instruments: Sequence[trio.abc.Instrument] = (),
) -> T:
    return trio.run(async_fn, *args, clock=clock, instruments=instruments)


@contextmanager
def instrumented(instrument: trio.abc.Instrument) -> Iterator[None]:
    """`instrument` on the current run for the duration of the block (the testing kit's
    checkpoint counter)."""
    trio.lowlevel.add_instrument(instrument)
    try:
        yield
    finally:
        trio.lowlevel.remove_instrument(instrument)


async def watch_shutdown_signals(
    on_first: Callable[[], None],
    on_second: Callable[[], None],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Turn SIGINT/SIGTERM into calls: the first starts a graceful shutdown, any later one
    skips what is left of the grace. Runs until cancelled."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        seen = 0
        async for _sig in signals:
            seen += 1
            (on_first if seen == 1 else on_second)()
