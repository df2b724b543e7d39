"""`App`: the declarative registry of queues and job kinds. No I/O happens here.

An app is built at import time (`app = nj.App()`, `app.queue(...)`, `@app.job(...)`) and handed
to `open_runtime` or `run`. Everything that can be checked without a backend is checked when it
is declared, so a typo fails at import, not at three in the morning.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Generic, Iterable, Mapping, ParamSpec, TypeVar

import attrs

from ._context import get_runtime
from .config import DEFAULT_QUEUE, QueueConfig, RetryPolicy, check_name, check_priority, check_timeout, check_unique_key
from .errors import ArgsError, ConfigError, UnknownJob

if TYPE_CHECKING:
    from .jobs import JobContext, JobId

__all__ = ["App", "JobKind"]

P = ParamSpec("P")
R = TypeVar("R")

Handler = Callable[..., Awaitable[Any]]


@attrs.frozen
class EnqueueOptions:
    delay: float | None = None
    run_at: float | None = None
    priority: int = 0
    unique_key: str | None = None


class JobKind(Generic[P, R]):
    """A registered job kind: the handler plus its queue, timeout and retry settings.

    Calling it calls the handler directly (handy in unit tests); `enqueue` and `enqueue_many`
    put jobs on the runtime of the current context.
    """

    def __init__(
        self,
        fn: Callable[..., Awaitable[R]],
        *,
        name: str,
        queue: str,
        timeout: float | None,
        max_attempts: int,
        priority: int,
        retry: RetryPolicy | None,
        asyncio: bool = False,
        unique: Callable[[Mapping[str, Any]], str | None] | None = None,
    ) -> None:
        self.fn = fn
        self.asyncio = asyncio
        self.unique = unique
        self.name = name
        self.queue = queue
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.priority = priority
        self.retry = retry
        self.signature = inspect.signature(fn)
        self._options = EnqueueOptions(priority=priority)
        params = list(self.signature.parameters.values())[1:]
        self._var_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
        self._keywords = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        self._required = frozenset(
            p.name
            for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty
        )
        self._simple = not any(p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL) for p in params)

    def __repr__(self) -> str:
        return f"<JobKind {self.name!r} queue={self.queue!r}>"

    async def __call__(self, ctx: JobContext, *args: Any, **kwargs: Any) -> R:
        return await self.fn(ctx, *args, **kwargs)

    def unique_key_for(self, args: Mapping[str, Any]) -> str | None:
        """The unique key the kind's `unique` function gives these args, scoped to the kind
        (``"<kind>:<key>"``); None when the kind has no function or it returned None."""
        if self.unique is None:
            return None
        key = self.unique(args)
        if key is None:
            return None
        if not isinstance(key, str) or not key:
            raise ConfigError(
                f"the unique function of job {self.name!r} must return a non-empty str or None, "
                f"not {key!r} (for args {dict(args)!r})"
            )
        return check_unique_key(f"{self.name}:{key}")

    def check_args(self, args: Mapping[str, Any]) -> None:
        """`ArgsError` unless `args` bind to the handler's keyword parameters."""
        if self._simple:
            # The common case, checked with set operations (inspect's bind costs ~10 us a call).
            keys = args.keys()
            if self._required <= keys and (self._var_keyword or keys <= self._keywords):
                return
        try:
            self.signature.bind(None, **args)
        except TypeError as exc:
            raise ArgsError(f"args {dict(args)!r} do not fit job {self.name!r}{self.signature}: {exc}") from None

    def options(
        self,
        *,
        delay: float | None = None,
        run_at: float | None = None,
        priority: int | None = None,
        unique_key: str | None = None,
    ) -> BoundEnqueue:
        """Enqueue with options: ``await kind.options(delay=5).enqueue(doc_id=1)``."""
        return BoundEnqueue(
            self,
            EnqueueOptions(
                delay=delay,
                run_at=run_at,
                priority=self.priority if priority is None else priority,
                unique_key=unique_key,
            ),
        )

    async def enqueue(self, **args: Any) -> JobId:
        """Enqueue one job with these keyword arguments; returns its id."""
        return await BoundEnqueue(self, self._options).enqueue(**args)

    async def enqueue_many(self, many: Iterable[Mapping[str, Any]]) -> list[JobId]:
        """Enqueue one job per mapping of keyword arguments, in one backend call."""
        return await BoundEnqueue(self, self._options).enqueue_many(many)


@attrs.frozen
class BoundEnqueue:
    kind: JobKind[Any, Any]
    opts: EnqueueOptions

    async def enqueue(self, **args: Any) -> JobId:
        rt = get_runtime(f"{self.kind.name}.enqueue()")
        o = self.opts
        return await rt.enqueue(
            self.kind.name, args, delay=o.delay, run_at=o.run_at, priority=o.priority, unique_key=o.unique_key
        )

    async def enqueue_many(self, many: Iterable[Mapping[str, Any]]) -> list[JobId]:
        rt = get_runtime(f"{self.kind.name}.enqueue_many()")
        o = self.opts
        if o.unique_key is not None:
            raise ConfigError("unique_key applies to enqueue(), not enqueue_many(): one key cannot name many jobs")
        return await rt.enqueue_many(self.kind.name, many, delay=o.delay, run_at=o.run_at, priority=o.priority)


class App:
    """The declaration of a service's background work.

    A queue named "default" always exists (10 workers, 60 s timeout); redeclare it with
    `app.queue("default", ...)` to change it.
    """

    def __init__(self) -> None:
        self._queues: dict[str, QueueConfig] = {
            DEFAULT_QUEUE: QueueConfig(DEFAULT_QUEUE, max_workers=10, timeout=60.0)
        }
        self._declared: set[str] = set()
        self._kinds: dict[str, JobKind[Any, Any]] = {}
        self.retry = RetryPolicy()

    @property
    def queues(self) -> Mapping[str, QueueConfig]:
        return dict(self._queues)

    @property
    def kinds(self) -> Mapping[str, JobKind[Any, Any]]:
        return dict(self._kinds)

    def queue(
        self, name: str, *, max_workers: int, timeout: float | None = 60.0, poll_interval: float | None = None
    ) -> QueueConfig:
        """Declare a queue with its own pool of `max_workers` and per-attempt `timeout` seconds.

        `poll_interval`: on durable backends, how often the queue looks for work when no
        wake-up arrives, and how often `rt.wait` on one of its jobs looks for the outcome when
        another process runs it (default: the backend's, 1 s; use 0.1 for queues requests wait
        on).

        Raises `ConfigError` for a bad value or a queue declared twice.
        """
        if name in self._declared:
            raise ConfigError(f"queue {name!r} is declared twice; declare each queue once")
        if any(k.queue == name for k in self._kinds.values()):
            raise ConfigError(f"queue {name!r} must be declared before the jobs that use it")
        cfg = QueueConfig(name, max_workers=max_workers, timeout=timeout, poll_interval=poll_interval)
        self._queues[name] = cfg
        self._declared.add(name)
        return cfg

    def job(
        self,
        *,
        queue: str = DEFAULT_QUEUE,
        timeout: float | None = None,
        max_attempts: int = 25,
        name: str | None = None,
        priority: int = 0,
        retry: RetryPolicy | None = None,
        asyncio: bool = False,
        unique: Callable[[Mapping[str, Any]], str | None] | None = None,
    ) -> Callable[[Callable[P, Awaitable[R]]], JobKind[P, R]]:
        """Register an async handler ``async def fn(ctx, **args)`` as a job kind.

        `timeout=None` uses the queue's timeout. `asyncio=True` marks an asyncio coroutine
        function: it runs through the runtime's trio-asyncio bridge, still under its attempt's
        cancel scope and timeout. `name` defaults to the function's name and is
        what `rt.enqueue(name, args)` and the backends store. `unique`, a function of the job's
        args returning a key (or None), makes every enqueue of this kind unique on
        ``"<name>:<key>"`` unless the call passes its own `unique_key`. Raises `ConfigError` for an
        unknown queue, a duplicate name, a non-async handler or a bad value.
        """
        if queue not in self._queues:
            raise ConfigError(
                f"job uses unknown queue {queue!r}; declare it first with app.queue({queue!r}, max_workers=...) "
                f"(known: {sorted(self._queues)})"
            )
        job_timeout = check_timeout("job timeout", timeout, allow_none=True)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ConfigError(f"max_attempts must be an int >= 1, not {max_attempts!r}")
        check_priority(priority)
        if unique is not None and not callable(unique):
            raise ConfigError(f"unique must be a function of the job's args returning a str or None, not {unique!r}")

        def register(fn: Callable[P, Awaitable[R]]) -> JobKind[P, R]:
            if not inspect.iscoroutinefunction(fn):
                raise ConfigError(
                    f"job handler {getattr(fn, '__qualname__', fn)!r} must be an `async def`; "
                    "wrap blocking calls in nursery_jobs.run_blocking()"
                )
            kind_name = check_name("job", name if name is not None else getattr(fn, "__name__", None))
            if kind_name in self._kinds:
                raise ConfigError(
                    f"job name {kind_name!r} is registered twice; pass name=... to tell them apart"
                )
            params = list(inspect.signature(fn).parameters.values())
            if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
                raise ConfigError(f"job handler {kind_name!r} must take the JobContext as its first argument")
            kind: JobKind[P, R] = JobKind(
                fn,
                name=kind_name,
                queue=queue,
                timeout=job_timeout,
                max_attempts=max_attempts,
                priority=priority,
                retry=retry,
                asyncio=asyncio,
                unique=unique,
            )
            self._kinds[kind_name] = kind
            return kind

        return register

    def kind(self, name: str) -> JobKind[Any, Any]:
        try:
            return self._kinds[name]
        except KeyError:
            raise UnknownJob(
                f"no job kind named {name!r} is registered; register it with @app.job (known: {sorted(self._kinds)})"
            ) from None

    def timeout_for(self, kind: JobKind[Any, Any]) -> float | None:
        return kind.timeout if kind.timeout is not None else self._queues[kind.queue].timeout
