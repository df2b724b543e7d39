"""The context's client, resources and attempt: for `JobKind.enqueue`, for `ctx.client` and
`ctx.resources`, for the client, which lets a running attempt add work during the shutdown, and
for the blocked-loop watchdog, which asks which job a task's step belonged to.

ContextVars only, and the small protocol the client meets (`Enqueuer`), so that this bottom
module never imports the layers that set them.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import trio

from .errors import RuntimeClosed
from .infra.watchdog import Culprit
from .jobs import Resources

if TYPE_CHECKING:
    from .backends.protocol import ClaimedJob, NewJob
    from .infra.sync import Mailbox
    from .jobs import JobId


class Enqueuer(Protocol):
    """What `JobKind.enqueue` needs of the current client."""

    def now(self) -> float:
        """The backend's clock (a `delay=` becomes a `run_at` on it)."""
        ...

    def wall_offset(self) -> float:
        """What maps a wall-clock `run_at` onto that clock (`Backend.wall_offset`)."""
        ...

    async def insert(self, jobs: Sequence[NewJob]) -> list[JobId]:
        """Store `jobs` (cancel-atomic; `RuntimeClosed` once shutdown began, but for a running
        attempt)."""
        ...

    async def insert_tx(self, conn: Any, jobs: Sequence[NewJob]) -> list[JobId]:
        """Store `jobs` inside the transaction open on `conn` (`Client.enqueue_tx`)."""
        ...


current_enqueuer: contextvars.ContextVar[Enqueuer | None] = contextvars.ContextVar(
    "nursery_jobs.current_client", default=None
)


def get_enqueuer(what: str) -> Enqueuer:
    client = current_enqueuer.get()
    if client is None:
        raise RuntimeClosed(
            f"{what} needs a running runtime, and this context has none; call it inside "
            "`async with nursery_jobs.open_runtime(app) as rt:` (or from a job), or use rt directly"
        )
    return client


current_resources: contextvars.ContextVar[Resources] = contextvars.ContextVar(
    "nursery_jobs.current_resources", default=Resources({})
)
"""The open resources of the runtime this task runs under (set by `open_runtime` before any
queue starts, so every worker and job inherits it)."""


class RunningAttempt(Protocol):
    """What the context knows of the attempt a task's code belongs to."""

    @property
    def job(self) -> ClaimedJob: ...


current_attempt: contextvars.ContextVar[RunningAttempt | None] = contextvars.ContextVar(
    "nursery_jobs.current_attempt", default=None
)
"""The attempt (or batch) whose code this task runs (children inherit it, and so does a task
started from it anywhere else). The object, not its job's id: whether the attempt still runs,
and in which runtime, is the registry's answer for that object (`Runtime._refusal`)."""

current_worker_box: contextvars.ContextVar[Mailbox[ClaimedJob] | None] = contextvars.ContextVar(
    "nursery_jobs.current_worker_box", default=None
)
"""The mailbox of the worker this task is (or descends from): its `last` is the job it ran last."""


def culprit_of(task: trio.lowlevel.Task) -> Culprit | None:
    """The job whose code `task` ran in its last step, for the blocked-loop watchdog.

    `current_attempt` alone is not enough: a handler that blocks and then returns without another
    await ends its attempt in the same step, and the worker resets it before the step ends.
    A worker's step never spans two jobs (after an attempt the worker parks before it takes the
    next), so the job its mailbox delivered last is the one that ran. A child task of
    `ctx.children()` inherits both variables; its attempt's job and the mailbox's job agree while the
    attempt runs, and a task whose attempt's job disagrees (one that escaped its attempt) is not
    attributed.
    """
    context = task.context
    box = context.get(current_worker_box)
    if box is None:
        return None
    job = box.last
    if job is None:
        return None
    running = context.get(current_attempt)
    if running is None:
        return Culprit(job.id, job.kind, job.queue, ended=True)
    if running.job.id != job.id:
        return None
    parent = task.parent_nursery.parent_task if task.parent_nursery is not None else None
    in_child = parent is not None and parent.context.get(current_worker_box) is box
    return Culprit(job.id, job.kind, job.queue, child=task.name if in_child else None)
