"""The app's resources (`@app.resource`): open before the first attempt, closed after the last.

A resource a service opens in its own `main` (an HTTP client, a pool) is closed when `main`
ends, which at a shutdown is *before* the grace: the jobs still running through the grace then
fail on a closed client and spend an attempt for nothing. So the runtime owns the resources'
lives instead. `open_resources` opens each declared resource in declaration order, before any
queue starts, and `open_runtime` keeps them open until every task of its tree has ended (the
grace, the unwinding and the flush are over), then closes them in reverse order.

Each resource is an async generator function run as an async context manager: the code before
its `yield` opens it, the code after closes it. Every open and every close is bounded by
`resource_bound`:

- a resource that raises or hangs while opening is a `ResourceError` naming it; those opened
  before it are closed, and the runtime starts nothing, so no job is claimed;
- a close that raises or hangs (cancelled at its bound) is logged at once, the others still
  close, and a `ResourceError` naming every such resource is raised once all have closed (when
  the runtime's body ended without an error of its own, which would otherwise be hidden; then
  the log is the report).

A test passes `resources={"http": fake}` to `open_runtime`: a replaced resource is never opened
or closed, its value is the fake as given.

A resource opens and closes in the runtime's own task, so a blocking call in it (a synchronous
client's connect) would be blamed by the blocked-loop watchdog on that task, a name the
operator never wrote. `holder_of` names the resource instead: each open and close runs between
two checkpoints of its own, with `_current` set, so the step that ran the resource's code ends
while the watchdog can still see whose it was.
"""

from __future__ import annotations

import contextvars
import logging
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Mapping

import trio

from ..errors import ConfigError, ResourceError
from ..infra.watchdog import Holder
from ..jobs import Resource, Resources, describe_exception

__all__ = ["check_replacements", "holder_of", "open_resources"]

log = logging.getLogger("nursery_jobs")

class _Step:
    """The resource whose open or close runs now, in `task`; a task the resource starts meanwhile
    inherits it."""

    __slots__ = ("name", "doing", "task", "returned")

    def __init__(self, name: str, doing: str, task: trio.lowlevel.Task) -> None:
        self.name = name
        self.doing = doing
        self.task = task
        self.returned = False


_current: contextvars.ContextVar[_Step | None] = contextvars.ContextVar("nursery_jobs.resource_step", default=None)


def holder_of(task: trio.lowlevel.Task) -> Holder | None:
    """The resource whose code `task` ran in its last step, for the blocked-loop watchdog."""
    step = task.context.get(_current)
    if step is None:
        return None
    own = step.task is task
    where = f"while {'opening' if step.doing == 'open' else 'closing'}" if own else f"in its task {task.name!r}"
    ended = f"its {step.doing}" if own and step.returned else None
    return Holder("resource", step.name, f"resource {step.name!r} ({where})", ended)


async def _as_resource(name: str, doing: str, code: Awaitable[Any]) -> Any:
    await trio.lowlevel.checkpoint()  # what ran before is not the resource's
    step = _Step(name, doing, trio.lowlevel.current_task())
    token = _current.set(step)
    try:
        result = await code
        step.returned = True
        await trio.lowlevel.checkpoint()  # the step that ran its code ends here, still named
        return result
    finally:
        _current.reset(token)


def check_replacements(declared: Mapping[str, Resource[Any]], replaced: Mapping[str, Any] | None) -> dict[str, Any]:
    """`open_runtime`'s `resources=` argument, checked: a mapping whose every key names a
    declared resource (`ConfigError` otherwise)."""
    if replaced is None:
        return {}
    if not isinstance(replaced, Mapping):
        raise ConfigError(f"resources must be a mapping of resource name to value, not {type(replaced).__name__}")
    unknown = sorted(str(k) for k in replaced if k not in declared)
    if unknown:
        raise ConfigError(
            f"resources {unknown} are not declared in the app (declared: {sorted(declared)}); "
            "declare each with @app.resource before replacing it"
        )
    return dict(replaced)


@asynccontextmanager
async def open_resources(
    declared: Mapping[str, Resource[Any]], replaced: Mapping[str, Any], bound: float
) -> AsyncIterator[Resources]:
    """Open `declared` in order (those in `replaced` take the given value instead) and yield
    them; close the opened ones in reverse order on the way out, each within `bound` seconds."""
    values: dict[str, Any] = {}
    opened: list[tuple[str, AbstractAsyncContextManager[Any]]] = []
    body_raised = True
    try:
        for name, resource in declared.items():
            if name in replaced:
                values[name] = replaced[name]
                continue
            manager = asynccontextmanager(resource.fn)()
            values[name] = await _open_one(name, manager, bound)
            opened.append((name, manager))
        yield Resources(values)
        body_raised = False
    finally:
        failures = await _close_all(opened, bound)
        if failures and not body_raised:
            raise ResourceError(
                "; ".join(text for _, text, _ in failures) + " (each was logged when it happened; every other "
                "resource was closed)"
            ) from next((error for _, _, error in failures if error is not None), None)


async def _open_one(name: str, manager: AbstractAsyncContextManager[Any], bound: float) -> Any:
    with trio.move_on_after(bound) as scope:
        try:
            return await _as_resource(name, "open", manager.__aenter__())
        except Exception as exc:
            if scope.cancel_called:
                raise _hung_opening(name, bound) from exc
            raise ResourceError(
                f"resource {name!r} failed to open: {describe_exception(exc)}; the runtime started no queue "
                "and claimed no job. Fix the resource (or replace it in tests with "
                f"open_runtime(app, resources={{{name!r}: ...}}))"
            ) from exc
    raise _hung_opening(name, bound)


def _hung_opening(name: str, bound: float) -> ResourceError:
    return ResourceError(
        f"resource {name!r} did not open within resource_bound ({bound:g} s); the runtime started no queue and "
        "claimed no job. Give its open a bound of its own, or raise RuntimeSettings(resource_bound=...)"
    )


async def _close_all(
    opened: list[tuple[str, AbstractAsyncContextManager[Any]]], bound: float
) -> list[tuple[str, str, BaseException | None]]:
    """Close each opened resource, last opened first; returns (name, what happened, its error)
    for each that raised or hung, each logged as it happens."""
    failures: list[tuple[str, str, BaseException | None]] = []
    for name, manager in reversed(opened):
        error: BaseException | None = None
        with trio.move_on_after(bound, shield=True) as scope:
            try:
                await _as_resource(name, "close", manager.__aexit__(None, None, None))
            except Exception as exc:
                error = exc
        if error is not None:
            text = f"resource {name!r} failed to close: {describe_exception(error)}"
        elif scope.cancelled_caught:
            text = f"resource {name!r} did not close within resource_bound ({bound:g} s): its close was cancelled"
        else:
            continue
        log.error(
            "%s; the other resources still close",
            text,
            exc_info=error,
            extra={"event": "resource_close_failed", "resource": name},
        )
        failures.append((name, text, error))
    return failures
