"""A time bound on every test that Trio survives: pytest-timeout, made to end a hung Trio run
from the inside.

pytest-timeout's `signal` method raises its failure from the SIGALRM handler, wherever the main
thread happens to be. In a Trio test that is almost always inside Trio's own scheduler (waiting in
epoll): the exception tears through the run loop, the test fails with a traceback of Trio's
internals rather than of the test, and the run is left half-open, so every later Trio test in the
process fails with "Attempted to call run() from inside a run()". One hang would fail the rest of
the suite.

So for the `signal` method this plugin replaces pytest-timeout's timer (its
`pytest_timeout_set_timer` hook; cancelling stays pytest-timeout's). When the alarm fires:

- outside a Trio run (plain code, a sync fixture), it fails the test from the handler, exactly as
  pytest-timeout does;
- inside a Trio run, it asks the run to stop through `TrioToken.run_sync_soon` (safe from a signal
  handler). Inside the run, the request records where every task is waiting, then cancels all
  tasks but Trio's own `run_sync_soon` task, so the test unwinds through its own `finally`s and
  `async with`s and Trio closes the run properly. The phase then fails with "Timeout" and that
  record, chained to whatever the unwinding raised;
- if the run does not get to the request, or does not finish unwinding, within `timeout_unwind`
  seconds (ini option, 30 by default; a task stuck in a blocking call, or ignoring cancellation), the next alarm fails the test
  from the handler as pytest-timeout would, and the session stops after this test: the process's
  Trio state can no longer be trusted, and a clear stop beats a cascade of unrelated failures.

The `thread` method is left to pytest-timeout (it ends the whole process, with stacks).
"""

from __future__ import annotations

import signal
import threading
import traceback
from collections.abc import Iterator
from types import FrameType

import pytest
import pytest_timeout
import trio

_EXPIRED = pytest.StashKey[str]()


def _is_trio_internal(frame: FrameType) -> bool:
    """Trio's and outcome's own frames: the same few lines under every waiting task."""
    path = frame.f_code.co_filename.replace("\\", "/")
    return any(part in path for part in ("/trio/", "/outcome/", "/pytest_trio/"))


def _waiting_at(root: trio.lowlevel.Task, skip: trio.lowlevel.Task) -> str:
    """Where each task under `root` is waiting, innermost frame last, as a traceback would."""
    lines: list[str] = []

    def walk(task: trio.lowlevel.Task, depth: int) -> None:
        if task is not skip:
            frames = traceback.StackSummary.extract(
                (frame, lineno) for frame, lineno in task.iter_await_frames() if not _is_trio_internal(frame)
            )
            lines.append(f"{'  ' * depth}task {task.name!r}:\n")
            lines.extend(f"{'  ' * depth}{line}" for entry in frames.format() for line in entry.splitlines(True))
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child, depth + 1)

    walk(root, 0)
    return "".join(lines)


def _stop_the_run(item: pytest.Item, timeout: float) -> None:
    """Runs inside the Trio run (from run_sync_soon): record, then cancel everything."""
    root = trio.lowlevel.current_root_task()
    me = trio.lowlevel.current_task()  # Trio's run_sync_soon task: it must go on delivering
    item.stash[_EXPIRED] = (
        f"Timeout (>{timeout}s) from pytest-timeout: the Trio run was cancelled. "
        f"Where its tasks were waiting:\n{_waiting_at(root, me)}"
    )
    for nursery in root.child_nurseries:
        if me not in nursery.child_tasks:
            nursery.cancel_scope.cancel()


def pytest_addoption(parser: pytest.Parser) -> None:
    # The runtime's own shutdown after a cancellation is bounded by flush_bound (5 s) per step.
    parser.addini("timeout_unwind", "seconds a timed-out Trio run gets to unwind once cancelled", default="30")


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: pytest_timeout.Settings) -> bool | None:
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own timer
    asked = False
    unwind = float(item.config.getini("timeout_unwind"))

    def on_alarm(signum: int, frame: object) -> None:
        nonlocal asked
        __tracebackhide__ = True
        if not settings.disable_debugger_detection and pytest_timeout.is_debugging():
            return
        if trio.lowlevel.in_trio_run() and not asked:
            asked = True
            trio.lowlevel.current_trio_token().run_sync_soon(_stop_the_run, item, settings.timeout)
            signal.setitimer(signal.ITIMER_REAL, unwind)
            return
        if trio.lowlevel.in_trio_run():
            item.session.shouldstop = (
                f"{item.nodeid} hung past its time bound and its Trio run did not unwind within "
                f"{unwind:g} s; Trio's state in this process is unusable, so the run stops here"
            )
        pytest_timeout.timeout_sigalrm(item, settings)

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # what pytest-timeout's cancel hook calls
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    return True


def _phase(item: pytest.Item) -> Iterator[None]:
    __tracebackhide__ = True
    try:
        yield
    except BaseException as exc:
        expired = item.stash.get(_EXPIRED, None)
        if expired is None:
            raise
        del item.stash[_EXPIRED]
        # The cancellation's own traceback repeats the record above, leaf by leaf; anything else
        # the unwinding raised is news and stays chained.
        news = exc.split(trio.Cancelled)[1] if isinstance(exc, BaseExceptionGroup) else exc
        if isinstance(news, trio.Cancelled):
            news = None
        raise pytest.fail.Exception(expired, pytrace=False) from news
    expired = item.stash.get(_EXPIRED, None)
    if expired is not None:  # the test swallowed the cancellation: a timeout all the same
        del item.stash[_EXPIRED]
        pytest.fail(expired)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _phase(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    return (yield from _phase(item))
