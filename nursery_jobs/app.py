"""`App`: the declarative registry of queues and job kinds. No I/O happens here.

An app is built at import time (`app = nj.App()`, `app.queue(...)`, `@app.job(...)`) and handed
to `open_runtime` or `run`. Everything that can be checked without a backend is checked when it
is declared, so a typo fails at import, not at three in the morning.
"""

from __future__ import annotations

import datetime
import inspect
import math
import typing
from collections import abc
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Generic, Iterable, Mapping, ParamSpec, Protocol, TypeVar, cast, overload

import attrs

from ._context import get_enqueuer
from .backends.protocol import NewJob
from .config import (
    DEFAULT_QUEUE,
    check_cache_key_part,
    QueueConfig,
    Rate,
    RetryPolicy,
    check_limit,
    check_name,
    check_priority,
    check_timeout,
    check_unique_key,
)
from .cron import Cron, parse_schedule
from .errors import ArgsError, ConfigError, UnknownJob
from .jobs import ArgsChecker, BatchContext, BatchJob, Resource, Resources, check_context_param, encode_args
from .middleware import Middleware, as_middleware

if TYPE_CHECKING:
    from .jobs import JobContext, JobId

__all__ = ["App", "BatchKind", "EnqueueOptions", "JobKind", "Periodic", "Subscription"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

Handler = Callable[..., Awaitable[Any]]
MW = TypeVar("MW")


def _check_delay(_inst: Any, _attr: Any, value: Any) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
    ):
        raise ConfigError(f"delay must be a finite number of seconds >= 0, not {value!r}")


def _check_run_at(_inst: Any, _attr: Any, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, datetime.datetime):
        raise ConfigError(
            f"run_at must be an aware datetime (wall-clock time), not {value!r}: pass "
            "datetime.now(timezone.utc) + timedelta(...), or delay= in seconds"
        )
    if value.utcoffset() is None:
        raise ConfigError(
            f"run_at {value!r} is a naive datetime, which could mean any time zone: pass tzinfo, "
            "e.g. datetime(2030, 1, 1, 9, 0, tzinfo=timezone.utc) or dt.astimezone()"
        )


def _check_priority(_inst: Any, _attr: Any, value: Any) -> None:
    if value is not None:
        check_priority(value)


def _check_key(_inst: Any, _attr: Any, value: Any) -> None:
    if value is not None:
        check_unique_key(value)


@attrs.frozen
class EnqueueOptions:
    """How to enqueue: each value checked once, when the options are made (`kind.options(...)`),
    not once per job. `priority` None: the kind's."""

    delay: float | None = attrs.field(default=None, validator=_check_delay)
    run_at: datetime.datetime | None = attrs.field(default=None, validator=_check_run_at)
    priority: int | None = attrs.field(default=None, validator=_check_priority)
    unique_key: str | None = attrs.field(default=None, validator=_check_key)

    def __attrs_post_init__(self) -> None:
        if self.delay is not None and self.run_at is not None:
            raise ConfigError("pass delay= or run_at=, not both")

    def when(self, now: float, wall_offset: float = 0.0) -> float | None:
        """The job's run_at on the backend's clock (None: due now), given the clock's `now` and
        its `wall_offset` (`Backend.wall_offset`: what maps a wall-clock `run_at` onto it)."""
        if self.delay is not None:
            return now + self.delay if self.delay > 0 else None
        if self.run_at is not None:
            return self.run_at.timestamp() + wall_offset
        return None


_NO_OPTIONS = EnqueueOptions()
_NO_LIMITS = (None,) * (len(NewJob._fields) - 6)
"""A `NewJob`'s fields after `max_attempts` for a job with no unique key and no limits."""


def _short(args: Mapping[str, Any]) -> str:
    text = repr(dict(args))
    return text if len(text) <= 200 else f"{text[:200]}..."


def _signature(kind: JobKind[Any, Any]) -> inspect.Signature:
    return inspect.signature(kind.fn)


@attrs.frozen(eq=False, repr=False)
class JobKind(Generic[P, R]):
    """A registered job kind: the handler plus its queue, timeout and retry settings, made by
    `@app.job`.

    Calling it calls the handler directly (handy in unit tests); `enqueue`, `enqueue_many` and
    `enqueue_tx` (inside a transaction) put jobs on the runtime of the current context;
    `new_job` builds the job a backend stores.
    """

    fn: Callable[..., Awaitable[R]]
    name: str
    queue: str
    timeout: float | None
    max_attempts: int
    priority: int
    retry: RetryPolicy | None
    asyncio: bool = False
    unique: Callable[[Mapping[str, Any]], str | None] | None = None
    concurrency_key: Callable[[Mapping[str, Any]], str | None] | None = None
    max_concurrent: int | None = None
    rate_key: Callable[[Mapping[str, Any]], str | None] | None = None
    rate: Rate | None = None
    signature: inspect.Signature = attrs.field(init=False, default=attrs.Factory(_signature, takes_self=True))
    _var_keyword: bool = attrs.field(init=False, default=False)
    _keywords: frozenset[str] = attrs.field(init=False, default=frozenset())
    _required: frozenset[str] = attrs.field(init=False, default=frozenset())
    _simple: bool = attrs.field(init=False, default=True)
    _types: ArgsChecker | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        hints = check_context_param(self.fn, self.name)
        object.__setattr__(self, "_types", ArgsChecker.build(self.fn, self.name, hints))
        params = list(self.signature.parameters.values())[1:]
        plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        object.__setattr__(self, "_var_keyword", any(p.kind is p.VAR_KEYWORD for p in params))
        object.__setattr__(self, "_keywords", frozenset(p.name for p in params if p.kind in plain))
        object.__setattr__(
            self, "_required", frozenset(p.name for p in params if p.kind in plain and p.default is p.empty)
        )
        object.__setattr__(
            self, "_simple", not any(p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL) for p in params)
        )

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

    def concurrency_key_for(self, args: Mapping[str, Any]) -> str | None:
        """The concurrency key the kind's `concurrency_key` function gives these args (not
        scoped to the kind: kinds that return one key share its limit); None when the kind has
        no function or it returned None. `ArgsError`, naming the kind, when the function raises
        or returns something that is not a storable key: it depends on the args."""
        return self._limit_key("concurrency", self.concurrency_key, args)

    def rate_key_for(self, args: Mapping[str, Any]) -> str | None:
        """The rate key the kind's `rate_key` function gives these args, with the same rules as
        `concurrency_key_for` (not scoped to the kind; None: no rate limit for this job)."""
        return self._limit_key("rate", self.rate_key, args)

    def _limit_key(self, what: str, fn: Callable[[Mapping[str, Any]], str | None] | None, args: Mapping[str, Any]) -> str | None:
        if fn is None:
            return None
        try:
            key = fn(args)
        except Exception as exc:
            raise ArgsError(
                f"the {what}_key function of job {self.name!r} raised {type(exc).__name__}: {exc} "
                f"(for args {dict(args)!r})"
            ) from exc
        if key is None:
            return None
        return check_unique_key(key, f"the {what} key of job {self.name!r}", ArgsError)

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
            takes = ", ".join(str(p) for p in list(self.signature.parameters.values())[1:]) or "no arguments"
            raise ArgsError(
                f"args {_short(args)} do not fit job {self.name!r}: {exc} (it takes {takes})"
            ) from None

    def check_stored_args(self, args: Mapping[str, Any]) -> None:
        """`ArgsError` unless `args`, read back from a backend, fit the handler as an enqueue
        through this kind would have required: they bind to its parameters and have the types
        its annotations say. The worker checks every job before its call: one stored without
        that check would otherwise fail every attempt alike."""
        self.check_args(args)
        if self._types is not None:
            self._types.check(args)

    def _args_json(self, args: Mapping[str, Any]) -> str:
        if type(args) is not dict:
            if not isinstance(args, abc.Mapping):
                raise ArgsError(
                    f"args for job {self.name!r} must be a mapping of keyword arguments, not {type(args).__name__}"
                )
            args = dict(args)
        self.check_args(args)
        text = encode_args(args)  # JSON values first: a tuple is refused as a tuple, whatever the annotation
        if self._types is not None:
            self._types.check(args)
        return text

    def new_job(self, args: Mapping[str, Any], opts: EnqueueOptions, now: float, wall_offset: float = 0.0) -> NewJob:
        """The job a backend stores for one enqueue of `args` (validated: `ArgsError`); `now`
        and `wall_offset` are the backend's (`EnqueueOptions.when`)."""
        key = opts.unique_key
        if key is None and self.unique is not None:
            key = self.unique_key_for(args)
        priority = self.priority if opts.priority is None else opts.priority
        args_json = self._args_json(args)
        ckey = self.concurrency_key_for(args) if self.concurrency_key is not None else None
        rkey = self.rate_key_for(args) if self.rate_key is not None else None
        rate = None if rkey is None else self.rate
        return NewJob(
            self.name, self.queue, args_json, priority, opts.when(now, wall_offset), self.max_attempts, key,
            ckey, None if ckey is None else self.max_concurrent,
            rkey, None if rate is None else rate.limit, None if rate is None else rate.per,
        )  # fmt: skip

    def new_jobs(
        self, many: Iterable[Mapping[str, Any]], opts: EnqueueOptions, now: float, wall_offset: float = 0.0
    ) -> list[NewJob]:
        """One job per mapping of `many` (all validated first: one bad mapping refuses the batch);
        a kind with a `unique` function gives each job its own key."""
        if opts.unique_key is not None:
            raise ConfigError("unique_key applies to enqueue(), not enqueue_many(): one key cannot name many jobs")
        name, queue, attempts, to_json = self.name, self.queue, self.max_attempts, self._args_json
        priority = self.priority if opts.priority is None else opts.priority
        when = opts.when(now, wall_offset)
        new = tuple.__new__  # a NamedTuple without its Python-level __new__: once per job
        if self.concurrency_key is not None or self.rate_key is not None:
            return [self.new_job(args, opts, now, wall_offset) for args in many]  # each its own key
        if self.unique is None:
            return [new(NewJob, (name, queue, to_json(args), priority, when, attempts) + _NO_LIMITS) for args in many]
        key_for = self.unique_key_for  # a key twice in one batch gives the first job's id twice
        return [
            new(NewJob, (name, queue, to_json(args), priority, when, attempts, key_for(args)) + _NO_LIMITS[1:])
            for args in many
        ]

    def options(
        self,
        *,
        delay: float | None = None,
        run_at: datetime.datetime | None = None,
        priority: int | None = None,
        unique_key: str | None = None,
    ) -> BoundEnqueue:
        """Enqueue with options: ``await kind.options(delay=5).enqueue(doc_id=1)`` (or
        ``.enqueue_many(...)``, ``.enqueue_tx(conn, ...)``). `delay` is seconds from now, `run_at`
        an aware datetime (wall-clock time; a naive one is a `ConfigError`). The options are
        checked here (`ConfigError`)."""
        return BoundEnqueue(self, EnqueueOptions(delay=delay, run_at=run_at, priority=priority, unique_key=unique_key))

    async def enqueue(self, **args: Any) -> JobId:
        """Enqueue one job with these keyword arguments; returns its id."""
        return await BoundEnqueue(self, _NO_OPTIONS).enqueue(**args)

    async def enqueue_many(self, many: Iterable[Mapping[str, Any]]) -> list[JobId]:
        """Enqueue one job per mapping of keyword arguments, in one backend call."""
        return await BoundEnqueue(self, _NO_OPTIONS).enqueue_many(many)

    async def enqueue_tx(self, conn: Any, **args: Any) -> JobId:
        """Enqueue one job inside the transaction open on `conn` (`rt.transaction()`'s, or a
        connection of your own: see `Client.enqueue_tx`); returns its id. The job exists only
        if that transaction commits."""
        return await BoundEnqueue(self, _NO_OPTIONS).enqueue_tx(conn, **args)


MAX_BATCH_SIZE = 1_000
"""The largest `max_size` of a batch kind: a batch's jobs are claimed, heartbeated and written
together, and the completer writes at most this many outcomes in one call."""


def _batch_args_type(fn: Callable[..., Any], kind_name: str, hints: Mapping[str, Any]) -> Any:
    """The TypedDict that types a batch handler's jobs' args (``jobs: list[nj.BatchJob[T]]``),
    or None when they are plain mappings; `ConfigError` for a handler that does not take
    ``(ctx, jobs)`` or annotates `jobs` with what cannot be checked."""
    params = list(inspect.signature(fn).parameters.values())
    plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    extra = [p for p in params[2:] if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(params) < 2 or params[1].kind not in plain or extra:
        raise ConfigError(
            f"batch job handler {kind_name!r} must take (ctx, jobs) and nothing else: "
            f"`async def {getattr(fn, '__name__', 'handler')}(ctx: nj.BatchContext, jobs: list[nj.BatchJob]) -> ...`; "
            "each job's arguments are job.args"
        )
    ann = hints.get(params[1].name, Any)
    if ann is Any or isinstance(ann, str):
        return None
    origin = typing.get_origin(ann)
    if origin not in (list, abc.Sequence, abc.Iterable, abc.Collection) and ann not in (list, abc.Sequence):
        raise ConfigError(
            f"batch job handler {kind_name!r}: its jobs parameter is annotated {ann!r}; annotate it "
            "list[nj.BatchJob] or list[nj.BatchJob[ArgsTypedDict]] (the handler gets a list)"
        )
    inner = typing.get_args(ann)
    if not inner or inner[0] is BatchJob or inner[0] is Any:
        return None
    item = inner[0]
    if typing.get_origin(item) is not BatchJob:
        raise ConfigError(
            f"batch job handler {kind_name!r}: its jobs are {item!r}; annotate them nj.BatchJob or "
            "nj.BatchJob[ArgsTypedDict]"
        )
    (args_type,) = typing.get_args(item)
    if args_type is Any or args_type is dict or typing.get_origin(args_type) in (dict, abc.Mapping) or args_type is abc.Mapping:
        return None
    if not typing.is_typeddict(args_type):
        raise ConfigError(
            f"batch job handler {kind_name!r}: the args type {args_type!r} cannot be checked at enqueue; use a "
            "TypedDict of JSON types (checked at every enqueue), or dict[str, Any] (plain mappings)"
        )
    return args_type


@attrs.frozen(eq=False, repr=False)
class BatchKind(JobKind[..., Any]):
    """A batch job kind, made by `@app.batch_job`: its handler ``async def h(ctx, jobs)`` runs
    on up to `max_size` claimed jobs of the kind at once, collected for at most `max_wait`
    seconds after the first (docs/batches.md). Enqueued like any kind: each job is one
    `enqueue(**args)`, its args any JSON mapping, or checked against the TypedDict of the
    handler's ``jobs: list[nj.BatchJob[T]]``."""

    max_size: int = 20
    max_wait: float = 0.1

    def __attrs_post_init__(self) -> None:
        hints = check_context_param(self.fn, self.name, BatchContext)
        args_type = _batch_args_type(self.fn, self.name, hints)
        if args_type is not None:
            object.__setattr__(self, "_types", ArgsChecker.for_typeddict(self.name, args_type))
        object.__setattr__(self, "_simple", True)
        object.__setattr__(self, "_var_keyword", True)  # any keyword: the args are the job's mapping

    def __repr__(self) -> str:
        return f"<BatchKind {self.name!r} queue={self.queue!r} max_size={self.max_size} max_wait={self.max_wait:g}>"

    def check_args(self, args: Mapping[str, Any]) -> None:
        """Any mapping fits a batch kind (its handler takes the jobs, not keyword arguments);
        the TypedDict of its annotation, if any, is checked at enqueue."""


@attrs.frozen
class BoundEnqueue:
    kind: JobKind[Any, Any]
    opts: EnqueueOptions

    async def enqueue(self, **args: Any) -> JobId:
        client = get_enqueuer(f"{self.kind.name}.enqueue()")
        return (await client.insert([self.kind.new_job(args, self.opts, client.now(), client.wall_offset())]))[0]

    async def enqueue_many(self, many: Iterable[Mapping[str, Any]]) -> list[JobId]:
        client = get_enqueuer(f"{self.kind.name}.enqueue_many()")
        return await client.insert(self.kind.new_jobs(many, self.opts, client.now(), client.wall_offset()))

    async def enqueue_tx(self, conn: Any, **args: Any) -> JobId:
        client = get_enqueuer(f"{self.kind.name}.enqueue_tx()")
        return (await client.insert_tx(conn, [self.kind.new_job(args, self.opts, client.now(), client.wall_offset())]))[0]


MISSED = ("skip", "run_once")


class PeriodicDecorator(Protocol):
    """What `App.periodic` returns: applied to a `JobKind` (stacked above `@app.job`) or to an
    ``async def`` (registered as a job first), it returns the kind, typed as the handler."""

    @overload
    def __call__(self, target: JobKind[P, R]) -> JobKind[P, R]: ...

    @overload
    def __call__(self, target: Callable[P, Awaitable[R]]) -> JobKind[P, R]: ...


@attrs.frozen(eq=False)
class Periodic:
    """A periodic schedule of a job kind, made by `App.periodic`: at each tick of `cron` one
    job of `kind` with `args` is enqueued (see docs/periodic.md)."""

    name: str
    kind: JobKind[Any, Any]
    cron: Cron
    missed: str
    """"skip" or "run_once": what a scheduler that starts after ticks went by does about them."""
    enabled: bool
    run_at_start: bool
    args: Mapping[str, Any]

    @property
    def schedule(self) -> str:
        return self.cron.schedule

    def new_job(self, now: float) -> NewJob:
        """The job one tick enqueues."""
        return self.kind.new_job(self.args, _NO_OPTIONS, now)


@attrs.frozen
class Subscription:
    """One kind subscribed to one topic (`App.subscribe`): each event of the topic becomes one
    job of `kind`, unless `filter(payload)` is false; its args are `args(payload)`, or the
    payload itself when `args` is None."""

    topic: str
    kind: JobKind[Any, Any]
    filter: Callable[[Any], Any] | None = None
    args: Callable[[Any], Mapping[str, Any]] | None = None


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
        self._middlewares: list[Middleware] = []
        self._resources: dict[str, Resource[Any]] = {}
        self._subscriptions: dict[str, list[Subscription]] = {}
        self._periodic: dict[str, Periodic] = {}
        self._cache_keys = ("default", "1")
        """(namespace, version) of the app's cache keys (`cache_keys`)."""

    @property
    def queues(self) -> Mapping[str, QueueConfig]:
        return dict(self._queues)

    @property
    def kinds(self) -> Mapping[str, JobKind[Any, Any]]:
        return dict(self._kinds)

    @property
    def periodic_schedules(self) -> Mapping[str, Periodic]:
        """The declared periodic schedules (`App.periodic`), by name, in declaration order."""
        return dict(self._periodic)

    @property
    def middlewares(self) -> tuple[Middleware, ...]:
        """The registered middleware (`middleware`), outermost first; a function registered
        as one is shown as the `Middleware` that calls it."""
        return tuple(self._middlewares)

    def middleware(self, mw: MW) -> MW:
        """Register middleware, run around every attempt and every enqueue of this app's jobs,
        outermost first (the first registered sees the others' work inside it); returns `mw`,
        so it also decorates::

            @app.middleware
            async def timing(ctx, call_next):
                started = time.perf_counter()
                try:
                    return await call_next(ctx)  # the rest of the chain, then the handler
                finally:
                    print(ctx.kind, time.perf_counter() - started)

        `mw`: an ``async def mw(ctx, call_next)`` (around each attempt, in the attempt's task and
        cancel scope), or an `nj.Middleware` instance overriding any of its hooks: around each
        attempt, when an attempt ended (its outcome, error, wait and run time), around each
        enqueue (with `meta` to store with the jobs), a blocked loop, a rescue
        (docs/middleware.md). Register before the runtime opens: a runtime takes the app's
        middleware when it starts. Raises `ConfigError` for anything else, or one registered
        twice."""
        found = as_middleware(mw)
        if any(m is found or getattr(m, "fn", None) is mw for m in self._middlewares):
            raise ConfigError(f"middleware {mw!r} is registered twice; register each once")
        self._middlewares.append(found)
        return mw

    @property
    def resources(self) -> Mapping[str, Resource[Any]]:
        """The declared resources, in declaration order (the order they open in)."""
        return dict(self._resources)

    def resource(self, fn: Callable[[], AsyncIterator[T]]) -> Resource[T]:
        """Declare a resource the jobs share: ``@app.resource`` on an async generator function
        that takes no argument and yields the value once::

            @app.resource
            async def http() -> AsyncIterator[httpx.AsyncClient]:
                async with httpx.AsyncClient() as client:
                    yield client

        The runtime opens every resource before any queue starts, in declaration order, and
        closes them in reverse order after the last attempt has ended (after the grace and the
        unwinding); each open and each close is bounded by `RuntimeSettings.resource_bound`.
        Handlers read ``ctx.resources.http`` or, typed, ``ctx.resources[http]`` with the
        `Resource` handle returned here. Raises `ConfigError` for a function that is not an
        async generator function, takes arguments, or repeats a resource's name.
        """
        label = getattr(fn, "__qualname__", fn)
        if not inspect.isasyncgenfunction(fn):
            raise ConfigError(
                f"resource {label!r} must be an async generator function that yields its value once: "
                "`async def http(): async with httpx.AsyncClient() as client: yield client`"
            )
        name = getattr(fn, "__name__", "")
        if not name.isidentifier() or name.startswith("_") or hasattr(Resources, name):
            raise ConfigError(
                f"resource name {name!r} cannot be read as ctx.resources.{name}: name the function "
                "with a public identifier that is not a method of a mapping (keys, get, items, values)"
            )
        if name in self._resources:
            raise ConfigError(f"resource {name!r} is declared twice; declare each resource once")
        required = [
            p.name
            for p in inspect.signature(fn).parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if required:
            raise ConfigError(
                f"resource {name!r} must take no arguments (it takes {required}); read settings from "
                "the environment or a module-level value, or replace it in tests with "
                "open_runtime(app, resources={...})"
            )
        handle: Resource[T] = Resource(name, fn)
        self._resources[name] = handle
        return handle

    def cache_keys(self, *, namespace: str, version: str = "1") -> None:
        """Name the app's cache keys: every key `rt.cache` and `nj.cached` store starts with
        ``<namespace>:<version>:``. Give each service sharing a database its own `namespace`
        (default ``"default"``), and change `version` when a deploy changes what a cached value
        means: the old entries are then never read again, and expire. Each is 1 to 64 (version:
        32) ASCII letters, digits, ``_ . -``; ConfigError otherwise."""
        self._cache_keys = (check_cache_key_part("namespace", namespace), check_cache_key_part("version", version))

    def queue(
        self,
        name: str,
        *,
        max_workers: int,
        timeout: float | None = 60.0,
        poll_interval: float | None = None,
        global_max_workers: int | None = None,
        claim_ahead: bool = True,
        max_length: int | None = None,
        push_timeout: float = 5.0,
    ) -> QueueConfig:
        """Declare a queue with its own pool of `max_workers` and per-attempt `timeout` seconds.

        `global_max_workers`: at most this many jobs of the queue run at once across every
        process that works it (each process still runs at most its `max_workers`); None, the
        default: no limit across processes. Enforced where jobs are claimed (docs/concurrency.md).

        `poll_interval`: on durable backends, how often the queue looks for work when no
        wake-up arrives, and how often `rt.wait` on one of its jobs looks for the outcome when
        another process runs it (default: the backend's, 1 s; use 0.1 for queues requests wait
        on).

        `claim_ahead`: on a durable backend, a queue of two workers or more claims a few jobs
        for workers that are still running, so that they do not wait for a claim's round trip
        (see "Ordering" in the guarantees for what that changes); False claims only for idle
        workers, and starts jobs in the strict claim order whenever a worker frees. A queue
        with a rate-limited kind never claims ahead: a rate counts a start at the claim, and
        holds at the handler's first line only if the handler starts then (docs/rate_limits.md).

        `max_length`: a bounded queue. An enqueue that would make more than `max_length` jobs
        of the queue wait to start (available, scheduled or retryable; running jobs do not
        count) waits up to `push_timeout` seconds (default 5) for jobs to start, then raises
        `QueueFull`; `enqueue_tx`, the outbox relay and the periodic scheduler never wait
        (docs/queues.md). None, the default: unbounded, at no cost.

        Raises `ConfigError` for a bad value or a queue declared twice.
        """
        if name in self._declared:
            raise ConfigError(f"queue {name!r} is declared twice; declare each queue once")
        if any(k.queue == name for k in self._kinds.values()):
            raise ConfigError(f"queue {name!r} must be declared before the jobs that use it")
        cfg = QueueConfig(
            name, max_workers=max_workers, timeout=timeout, poll_interval=poll_interval,
            global_max_workers=global_max_workers, claim_ahead=claim_ahead,
        )  # fmt: skip
        if max_length is not None or push_timeout != 5.0:
            cfg = attrs.evolve(cfg, max_length=max_length, push_timeout=push_timeout)
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
        concurrency_key: Callable[[Mapping[str, Any]], str | None] | None = None,
        max_concurrent: int | None = None,
        rate: Rate | None = None,
        rate_key: Callable[[Mapping[str, Any]], str | None] | None = None,
    ) -> Callable[[Callable[P, Awaitable[R]]], JobKind[P, R]]:
        """Register an async handler ``async def fn(ctx, **args)`` as a job kind.

        `timeout=None` uses the queue's timeout. `asyncio=True` marks an asyncio coroutine
        function: it runs through the runtime's trio-asyncio bridge, still under its attempt's
        cancel scope and timeout. `name` defaults to the function's name and is
        what `rt.enqueue(name, args)` and the backends store. `unique`, a function of the job's
        args returning a key (or None), makes every enqueue of this kind unique on
        ``"<name>:<key>"`` unless the call passes its own `unique_key`.

        `concurrency_key`, a function of the job's args returning a key (or None: no limit for
        that job), computed once at enqueue and stored with the job, with `max_concurrent`
        (default 1): at most that many jobs with one key run at once, across every process.
        The key is not scoped to the kind, so kinds returning the same key share it (each job
        starting only while fewer than its own `max_concurrent` of the key run). A job whose
        key is at its limit is not claimed and holds back no other job (docs/concurrency.md).
        A key function that raises, or returns what is not a key, is an `ArgsError` at enqueue.

        `rate=nj.Rate(n, per=seconds)` with `rate_key`, a function of the args returning a key
        (or None: no rate limit for that job), computed once at enqueue and stored with the
        job: at most n starts per key in any window of `per` seconds, across every process;
        every attempt's start counts. A job over the rate is not claimed until its key's next
        slot, and holds back no other job (docs/rate_limits.md). A kind may have both limits.

        Raises `ConfigError` for an unknown queue, a duplicate name, a non-async handler or a
        bad value.
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
        if concurrency_key is not None and not callable(concurrency_key):
            raise ConfigError(
                f"concurrency_key must be a function of the job's args returning a str or None, not {concurrency_key!r}"
            )
        if max_concurrent is not None:
            if concurrency_key is None:
                raise ConfigError("max_concurrent needs a concurrency_key: the limit is per key")
            check_limit("max_concurrent", max_concurrent)
        elif concurrency_key is not None:
            max_concurrent = 1
        if rate_key is not None and not callable(rate_key):
            raise ConfigError(f"rate_key must be a function of the job's args returning a str or None, not {rate_key!r}")
        if rate is not None and not isinstance(rate, Rate):
            raise ConfigError(f"rate must be an nj.Rate(limit, per=seconds), not {rate!r}")
        if rate is not None and rate_key is None:
            raise ConfigError("rate needs a rate_key: the limit is per key (a function of the args returning one)")
        if rate_key is not None and rate is None:
            raise ConfigError("rate_key needs a rate: pass rate=nj.Rate(limit, per=seconds)")

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
                concurrency_key=concurrency_key,
                max_concurrent=max_concurrent,
                rate_key=rate_key,
                rate=rate,
            )
            self._kinds[kind_name] = kind
            return kind

        return cast(PeriodicDecorator, register)

    def batch_job(
        self,
        *,
        queue: str = DEFAULT_QUEUE,
        max_size: int = 20,
        max_wait: float = 0.1,
        timeout: float | None = None,
        max_attempts: int = 25,
        name: str | None = None,
        priority: int = 0,
        retry: RetryPolicy | None = None,
        unique: Callable[[Mapping[str, Any]], str | None] | None = None,
        **unsupported: Any,
    ) -> Callable[[Callable[..., Awaitable[Any]]], BatchKind]:
        """Register a batch handler ``async def fn(ctx: nj.BatchContext, jobs:
        list[nj.BatchJob]) -> list[nj.BatchJob] | None`` as a job kind (docs/batches.md).

        Jobs are enqueued one by one like any kind's (`kind.enqueue(**args)`, `enqueue_many`,
        `enqueue_tx`). A worker collects claimed jobs of the kind into a batch of at most
        `max_size`, for at most `max_wait` seconds after the batch's first job (never longer:
        full, it runs at once), and calls the handler once with them. It returns the jobs it
        could not handle (None or an empty list: all handled): those are retried with the
        kind's backoff, each on its own attempt count (a job out of attempts is discarded);
        the others complete. A handler that raises, or a batch that passes its timeout (one
        deadline for the batch, `timeout` or the queue's), fails every job of it as one attempt
        each. A batch occupies one worker of the queue for as long as it collects and runs.

        `timeout`, `max_attempts`, `name`, `priority`, `retry` and `unique` are those of
        `app.job`. Raises `ConfigError` for an unknown queue, a duplicate name, a handler
        that does not take ``(ctx, jobs)``, a bad `max_size` (an int from 1 to 1,000) or
        `max_wait` (finite seconds >= 0), and for what a batch cannot have: `concurrency_key`,
        `max_concurrent`, `rate`, `rate_key` (a limit counts job starts, and a batch starts its
        jobs together, so it would have to split the batch), `asyncio` (the handler is a Trio
        coroutine)."""
        for option, value in unsupported.items():
            if option in ("concurrency_key", "max_concurrent", "rate", "rate_key"):
                raise ConfigError(
                    f"batch_job does not take {option}=: a per-key or rate limit counts each job's start, and a "
                    "batch starts all its jobs at once, so the limit could only hold by splitting batches; declare "
                    "the limited work as a plain @app.job, or bound the batch with max_size and the queue's "
                    "max_workers / global_max_workers"
                )
            if option == "asyncio":
                if value:
                    raise ConfigError(
                        "batch_job does not take asyncio=True: a batch handler is a Trio coroutine; call asyncio "
                        "code from an @app.job(asyncio=True) kind instead"
                    )
                continue
            raise ConfigError(f"batch_job got an unknown option {option}={value!r}")
        if isinstance(max_size, bool) or not isinstance(max_size, int) or not 1 <= max_size <= MAX_BATCH_SIZE:
            raise ConfigError(f"max_size must be an int from 1 to {MAX_BATCH_SIZE:,}, not {max_size!r}")
        if isinstance(max_wait, bool) or not isinstance(max_wait, (int, float)) or not math.isfinite(max_wait) or max_wait < 0:
            raise ConfigError(
                f"max_wait must be a finite number of seconds >= 0, not {max_wait!r} (a batch waits at most this long "
                "after its first job)"
            )
        # Every check @app.job makes of these options (queue, timeout, attempts, priority, unique),
        # in one place; its decorator is not applied, so nothing is registered by it.
        self.job(
            queue=queue, timeout=timeout, max_attempts=max_attempts, name=name, priority=priority, retry=retry,
            unique=unique,
        )  # fmt: skip

        def register(fn: Callable[..., Awaitable[Any]]) -> BatchKind:
            if not inspect.iscoroutinefunction(fn):
                raise ConfigError(
                    f"batch job handler {getattr(fn, '__qualname__', fn)!r} must be an `async def`; "
                    "wrap blocking calls in nursery_jobs.run_blocking()"
                )
            kind_name = check_name("job", name if name is not None else getattr(fn, "__name__", None))
            if kind_name in self._kinds:
                raise ConfigError(f"job name {kind_name!r} is registered twice; pass name=... to tell them apart")
            kind = BatchKind(
                fn, name=kind_name, queue=queue, timeout=check_timeout("job timeout", timeout, allow_none=True),
                max_attempts=max_attempts, priority=priority, retry=retry, unique=unique, max_size=max_size,
                max_wait=float(max_wait),
            )  # fmt: skip
            self._kinds[kind_name] = kind
            return kind

        return register

    def uses_queue(self, name: str) -> bool:
        """True if the queue was declared with `app.queue` or a job kind uses it (the "default"
        queue exists either way)."""
        return name in self._declared or any(k.queue == name for k in self._kinds.values())

    @property
    def subscriptions(self) -> Mapping[str, tuple[Subscription, ...]]:
        """The subscribed kinds per topic, in declaration order."""
        return {topic: tuple(subs) for topic, subs in self._subscriptions.items()}

    def subscribe(
        self,
        topic: str,
        *,
        filter: Callable[[Any], Any] | None = None,
        args: Callable[[Any], Mapping[str, Any]] | None = None,
    ) -> Callable[[JobKind[P, R]], JobKind[P, R]]:
        """Make a job kind a subscriber of `topic`, stacked on `@app.job`::

            @app.subscribe("doc.written")
            @app.job(queue="index")
            async def index_doc(ctx, doc_id: int) -> None: ...

        Each event published on `topic` (`nj.publish`, `rt.publish`) becomes one job of every
        kind subscribed to it (fan-out), with the payload as its keyword arguments. `filter`, a
        function of the payload, leaves the event out for this kind when it returns false;
        `args`, a function of the payload returning the job's keyword arguments, is for a
        payload that is not already those. Both run in the relay, on the Trio thread: keep
        them quick and pure. One that raises, or args that do not fit the handler, never stops
        the relay: this kind's job of that event is not made, and an error is logged naming the
        event, the kind and the reason (the other subscribers' jobs are made); see
        docs/outbox.md. Raises `ConfigError` for a bad topic, a kind of another app, a kind
        subscribed twice to one topic, or a `filter`/`args` that is not callable.
        """
        topic = check_name("topic", topic)
        for what, fn in (("filter", filter), ("args", args)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"subscribe({topic!r}): {what} must be a function of the payload, not {fn!r}")

        def register(kind: JobKind[P, R]) -> JobKind[P, R]:
            if not isinstance(kind, JobKind):
                raise ConfigError(
                    f"@app.subscribe({topic!r}) goes above @app.job(...) (it takes the job kind @app.job "
                    f"made), not on {getattr(kind, '__qualname__', kind)!r}"
                )
            if self._kinds.get(kind.name) is not kind:
                raise ConfigError(f"job {kind.name!r} is not a kind of this app; subscribe it on the app that declares it")
            subs = self._subscriptions.setdefault(topic, [])
            if any(sub.kind is kind for sub in subs):
                raise ConfigError(f"job {kind.name!r} is subscribed to topic {topic!r} twice; subscribe it once")
            subs.append(Subscription(topic, kind, filter, args))
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

    def periodic(
        self,
        schedule: str,
        *,
        queue: str | None = None,
        timezone: str = "UTC",
        missed: str = "skip",
        enabled: bool = True,
        run_at_start: bool = False,
        name: str | None = None,
        args: Mapping[str, Any] | None = None,
    ) -> PeriodicDecorator:
        """Enqueue a job of a kind on a schedule, from every process, with no leader: stacked
        above `@app.job` (or on an `async def`, which it then registers as a job on `queue`)::

            @app.periodic("*/5 * * * *", timezone="Europe/Paris")
            @app.job(queue="maintenance")
            async def purge(ctx): ...

        `schedule`: a 5-field cron expression, 6 fields with seconds first, a macro (`@hourly`,
        `@daily`/`@midnight`, `@weekly`, `@monthly`, `@yearly`) or `@every 10m`; evaluated in
        `timezone` (an IANA name). Each tick enqueues exactly one job with `args` (default: none)
        across every runtime on the store. `missed`: what a scheduler starting after ticks went
        by unserved does: "skip" enqueues none of them, "run_once" one (the latest).
        `run_at_start`: each runtime start also enqueues one job, unless one from a start is
        still pending. `enabled=False` declares the schedule (listed by `rt.periodic()`) without
        running it. `name` (default: the kind's name) tells two schedules of one kind apart.
        Returns the job kind. Raises `ConfigError` for an invalid schedule, an unknown queue or
        timezone, a bad `missed`, args that do not fit the handler, or a name used twice.
        """
        cron = parse_schedule(schedule, timezone)
        if queue is not None and queue not in self._queues:
            raise ConfigError(
                f"periodic schedule {schedule!r} uses unknown queue {queue!r}; declare it first with "
                f"app.queue({queue!r}, max_workers=...) (known: {sorted(self._queues)})"
            )
        if missed not in MISSED:
            raise ConfigError(f"missed must be one of {MISSED}, not {missed!r}")
        for flag, value in (("enabled", enabled), ("run_at_start", run_at_start)):
            if not isinstance(value, bool):
                raise ConfigError(f"{flag} must be True or False, not {value!r}")
        if args is not None and not isinstance(args, abc.Mapping):
            raise ConfigError(f"args must be a mapping of the handler's keyword arguments, not {args!r}")
        job_args = dict(args or {})
        if name is not None:
            check_name("periodic schedule", name)
            if name in self._periodic:
                raise ConfigError(f"periodic schedule {name!r} is declared twice; pass name=... to tell them apart")

        def register(target: Any) -> Any:
            if isinstance(target, JobKind):
                kind: JobKind[Any, Any] = target
                if queue is not None and queue != kind.queue:
                    raise ConfigError(
                        f"periodic schedule {schedule!r}: job {kind.name!r} runs on queue {kind.queue!r}, not "
                        f"{queue!r}; set the queue on @app.job and leave it out of @app.periodic"
                    )
            else:
                kind = self.job(queue=queue or DEFAULT_QUEUE)(target)
            if self._kinds.get(kind.name) is not kind:
                raise ConfigError(f"job {kind.name!r} is not registered on this app; stack @app.periodic above @app.job")
            schedule_name = name if name is not None else kind.name
            if schedule_name in self._periodic:
                raise ConfigError(
                    f"periodic schedule {schedule_name!r} is declared twice; pass name=... to tell them apart"
                )
            try:
                kind._args_json(job_args)
            except ArgsError as exc:
                raise ConfigError(f"periodic schedule {schedule_name!r}: {exc}") from None
            self._periodic[schedule_name] = Periodic(
                schedule_name, kind, cron, missed, enabled, run_at_start, job_args
            )
            return kind

        return register
