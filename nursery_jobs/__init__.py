"""nursery_jobs: the structured-concurrency job runtime for Trio services.

Every background activity of a service lives in a nursery the runtime owns: named queues with
their own worker limits and hard per-attempt timeouts, retries with backoff, snooze, discard and
cancel, bounded waiting for receipts, and a graceful shutdown that interrupts (never loses) what
is still running when the grace period ends.

    import nursery_jobs as nj

    app = nj.App()
    app.queue("index", max_workers=4, timeout=30)

    @app.job(queue="index")
    async def index_doc(ctx: nj.JobContext, doc_id: int) -> None: ...

    async def main(rt: nj.Runtime) -> None:
        job_id = await index_doc.enqueue(doc_id=1)
        print(await rt.wait(job_id, timeout=2.0))

    nj.run(main, app=app)
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from .app import App, BatchKind, JobKind
from .backends import Backend, open_backend
from .backends.memory import MemoryBackend
from .cache import Cache, CacheCheck, CachedFunction, RequestCache, cached
from .config import QueueConfig, Rate, RetryPolicy, RuntimeSettings
from .errors import (
    ArgsError,
    BackendError,
    BackendUnavailable,
    CachedError,
    CacheWaitTimeout,
    ConfigError,
    JobNotFound,
    LockLost,
    LockTimeout,
    NurseryJobsError,
    QueueFull,
    ResourceError,
    RuntimeClosed,
    UnknownJob,
)
from .infra.threads import run_blocking
from .jobs import BatchContext, BatchJob, Discard, Job, JobContext, JobError, JobId, JobState, Receipt, Resource, Resources, Snooze
from .client import Client, QueueStats
from .middleware import AttemptEnd, EnqueuedJob, LoopBlocked, Middleware
from .coordination.locks import HeldLock
from .runtime import Runtime, open_runtime, publish, run
from .services.periodic import PeriodicInfo

if _TYPE_CHECKING:
    from . import testing as testing

__all__ = [
    "App",
    "ArgsError",
    "AttemptEnd",
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "BatchContext",
    "BatchJob",
    "BatchKind",
    "Cache",
    "CacheCheck",
    "CacheWaitTimeout",
    "CachedError",
    "CachedFunction",
    "Client",
    "ConfigError",
    "Discard",
    "EnqueuedJob",
    "HeldLock",
    "Job",
    "JobContext",
    "JobError",
    "JobId",
    "JobKind",
    "JobNotFound",
    "LockLost",
    "LockTimeout",
    "JobState",
    "LoopBlocked",
    "MemoryBackend",
    "Middleware",
    "NurseryJobsError",
    "PeriodicInfo",
    "QueueConfig",
    "QueueFull",
    "QueueStats",
    "Rate",
    "Receipt",
    "RequestCache",
    "Resource",
    "ResourceError",
    "Resources",
    "RetryPolicy",
    "Runtime",
    "RuntimeClosed",
    "RuntimeSettings",
    "Snooze",
    "UnknownJob",
    "cached",
    "open_backend",
    "open_runtime",
    "publish",
    "run",
    "run_blocking",
]

__version__ = "0.1.0.dev0"


def __getattr__(name: str) -> _Any:
    # `nj.testing` without importing it in every service: the kit is for tests.
    if name == "testing":
        import importlib

        return importlib.import_module(".testing", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
