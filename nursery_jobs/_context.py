"""The runtime of the current context, for `JobKind.enqueue` and `run_blocking`."""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING

from .errors import RuntimeClosed

if TYPE_CHECKING:
    from .runtime import Runtime

current_runtime: contextvars.ContextVar[Runtime | None] = contextvars.ContextVar(
    "nursery_jobs.current_runtime", default=None
)


def get_runtime(what: str) -> Runtime:
    rt = current_runtime.get()
    if rt is None:
        raise RuntimeClosed(
            f"{what} needs a running runtime, and this context has none; call it inside "
            "`async with nursery_jobs.open_runtime(app) as rt:` (or from a job), or use rt directly"
        )
    return rt


current_job_id: contextvars.ContextVar[int | None] = contextvars.ContextVar("nursery_jobs.current_job_id", default=None)
"""The id of the job whose attempt this task belongs to (children inherit it)."""
