"""`open_runtime` and `run`: the start order, the live `Runtime` handle, the shutdown sequence.

This module is the composition root: it builds every part with exactly what the part uses (the
client, the completer, the attempt registry, one executor per queue, the services), routes the
backend's events to them, and owns the order in which they start and stop. Nothing below it
takes the whole runtime.

Start order (each step only once the previous one is ready): validate the app and settings ->
open the backend -> subscribe to its events -> the app's resources, in declaration order -> the
backend's own service (LISTEN) -> completer -> heartbeats, cancel hints, rescuer, retention ->
the periodic scheduler -> the outbox relay -> one executor per queue -> user code.

Shutdown reverses it, and every step is bounded:

1. stop the outbox relay (its pass in flight rolls back, its rows stay) and the periodic
   scheduler, refuse new enqueues (`RuntimeClosed`) from all but the running attempts
   (`Runtime._refusal`: they may add work through their grace and their unwind, and the
   backend stays open until the last of them has ended) and stop claiming: fetchers stop, idle
   workers exit;
2. wait up to `grace` seconds for running attempts to finish on their own;
3. cancel what is still running, with the reason "shutdown": those attempts are *interrupted*,
   not failed -- the attempt is given back and the job is available again (on durable backends,
   for any process to pick up; at least once, nothing lost);
4. wait up to `flush_bound` for the cancelled attempts to unwind;
5. within one more `flush_bound`: wait for claims in flight (each cut at that bound), stop the
   completer, which writes every outcome still pending -- if the backend does not take them in
   time, the completer is abandoned and the unwritten job ids are logged (on a durable backend
   those jobs stay running and are rescued);
6. once every task has ended, close the resources in reverse order (each within
   `resource_bound`, see `execution/resources.py`); then within a last `flush_bound`: write
   what torn-down tasks gave back, unsubscribe, and close the backend if the runtime opened it.

The sequence runs shielded from outside cancellation but inside its own bounds, so `open_runtime`
exits within `grace + 3 * flush_bound` -- even when the backend stops answering -- as long as
job code honours cancellation (a job that
shields itself forever cannot be killed in Trio; the runtime names it in a warning instead).
If the body is left by a cancellation from outside (or Ctrl-C), there is no grace: step 2 is
skipped. `skip_grace()` (the second signal in `run`) ends step 2 early.

`run` puts one step before these: at the first signal it sets `shutdown_requested`; with
`main_grace` it lets `main` return on its own for that long (the runtime keeps serving it:
enqueues accepted, jobs claimed, receipts delivered, so a server's requests in flight get their
answers) before cancelling it; without, it cancels `main` and does step 1 at once. The sequence
above starts when `main` is done.
"""

from __future__ import annotations

import logging
import math
import random
from collections import abc
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence, TypeVar

import attrs
import trio

from ._context import culprit_of, current_attempt, current_enqueuer, current_resources, get_enqueuer
from .app import App
from .backends import (
    Backend,
    BackendEvent,
    Caching,
    CancelRequested,
    ClaimedJob,
    JobFinalized,
    JobsAvailable,
    Outbox,
    OutboxPublished,
    LockStore,
    ScheduleStore,
    open_backend,
)
from .cache import Cache, current_cache
from .client import REFUSED_OUTSIDE, Client, QueueStats
from .config import RuntimeSettings
from .coordination.locks import HeldLock, Locks, Release
from .coordination.receipts import Receipts
from .errors import ConfigError
from .execution.attempt import AttemptRegistry, KindRunner
from .execution.completer import Completer
from .execution.executor import QueueExecutor
from .execution.resources import check_replacements, holder_of, open_resources
from .infra.owner import TaskOwner, open_owner
from .infra.runner import run_trio, watch_shutdown_signals
from .infra.threads import ThreadBudget, current_budget
from .infra.watchdog import Culprit, Holder, watch_blocked_loop
from .middleware import Hooks, LoopBlocked, hooks_of
from .services import ServiceSet
from .services.backend import BackendService
from .services.heartbeats import CancelHints, Heartbeats
from .services.relay import Relay, Router
from .services.periodic import PeriodicInfo, Scheduler
from .services.rescuer import Rescuer
from .services.retention import Retention

__all__ = ["QueueStats", "Runtime", "open_runtime", "publish", "run"]

log = logging.getLogger("nursery_jobs")

T = TypeVar("T")


class Runtime(Client):
    """The live handle `open_runtime` yields: a `Client` (enqueue, get_job, wait, cancel,
    stats) and the runtime's lifecycle (`shutdown_requested`, `begin_shutdown`, `skip_grace`,
    `interrupted`). Its
    methods are safe to call from any task of the service; each is a Trio checkpoint and each
    wait in it is bounded."""

    def __init__(self, app: App, backend: Backend, settings: RuntimeSettings, queues: Sequence[str]) -> None:
        threads = ThreadBudget(settings.thread_limit)
        receipts = Receipts(backend, settings.max_waiters, lambda queue: _queue_poll(app, queue))
        super().__init__(app, backend, receipts, threads)
        self.settings = settings
        self.rng = random.Random(random.getrandbits(64))
        self.completer = Completer(backend)
        self.attempts = AttemptRegistry()
        hooks = self.hooks = hooks_of(app.middlewares)
        """The app's middleware as the runtime calls it (`middleware.Hooks`), taken at start-up."""
        runners = self.runners = {
            name: KindRunner.build(kind, app.timeout_for(kind), kind.retry or app.retry, hooks.around_attempt)
            for name, kind in app.kinds.items()
        }
        """Each kind's handler chain, by kind name: the executors' own mapping (the testing
        kit's `check_at_least_once` wraps one for a run)."""
        self.executors = {
            name: QueueExecutor(
                app.queues[name],
                backend=backend,
                completer=self.completer,
                attempts=self.attempts,
                runners=runners,
                flush_bound=settings.flush_bound,
                rng=self.rng,
                on_exit=self._request_exit,
                observe=hooks.attempt_ended,
            )
            for name in queues
        }
        self.cancel_hints = CancelHints(backend, self.attempts)
        cache_store = backend.cache_store() if isinstance(backend, Caching) else None
        namespace, version = app._cache_keys
        self._cache = (
            Cache(cache_store, namespace=namespace, version=version, owner=lambda: self._task_owner)
            if cache_store is not None
            else None
        )
        self.backend_service = ServiceSet([BackendService(backend)])
        self.services = ServiceSet(
            [
                Heartbeats(
                    backend,
                    self.attempts,
                    self.completer.unwritten,
                    interval=settings.heartbeat_interval,
                    rescue_after=settings.rescue_after,
                ),
                self.cancel_hints,
                Rescuer(
                    backend,
                    interval=settings.rescue_interval,
                    rescue_after=settings.rescue_after,
                    on_rescued=hooks.jobs_rescued,
                ),
                Retention(
                    backend,
                    interval=settings.retention_interval,
                    keep_completed=settings.keep_completed,
                    keep_cancelled=settings.keep_cancelled,
                    keep_discarded=settings.keep_discarded,
                    cache=cache_store,
                ),
            ]
        )
        router = Router(app.subscriptions, backend.now)
        self.relay: Relay | None = None
        """The outbox relay (None when the app subscribes to nothing or the backend has no
        outbox); its own service set, started after the others and stopped first."""
        if router.topics and isinstance(backend, Outbox):
            self.relay = Relay(
                backend, router, batch=settings.relay_batch, interval=settings.relay_interval, bounds=self.bounds
            )
        self.relay_service = ServiceSet([self.relay] if self.relay is not None else [])
        schedules = list(app.periodic_schedules.values())
        if schedules and not isinstance(backend, ScheduleStore):
            raise ConfigError(
                f"the app declares periodic schedules ({', '.join(s.name for s in schedules)}) but the backend "
                f"{backend.url!r} cannot store them (it does not implement ScheduleStore)"
            )
        self.scheduler = (
            Scheduler(backend, schedules, closing=lambda: self.closing, bounds=self.bounds)  # type: ignore[arg-type]
            if schedules
            else None
        )
        self.periodic_service = ServiceSet([self.scheduler] if self.scheduler is not None else [])
        """Started after the other services, stopped first: when the shutdown begins, before
        claiming stops (so no tick is enqueued once enqueues are refused)."""
        self._task_owner: TaskOwner | None = None
        self._locks = Locks(backend, lambda: self._task_owner) if isinstance(backend, LockStore) else None
        self.shutdown_requested = trio.Event()
        """Set when the service is asked to stop: at `nj.run`'s first signal and by
        `begin_shutdown` (so also when the runtime's shutdown begins). A server in `main` waits
        on it to stop accepting and drain (``shutdown_trigger=rt.shutdown_requested.wait``)."""
        self.interrupted: list[int] = []
        """Ids of the attempts the last shutdown interrupted (available again, attempt given back)."""
        self._grace_scope: trio.CancelScope | None = None
        self._skip_grace = False
        self._body_scope = trio.CancelScope()
        """Around the body of `open_runtime`: cancelled when a handler makes the process exit."""
        self._exit: BaseException | None = None

    def workers_here(self) -> Mapping[str, tuple[int, int]]:
        busy: dict[str, int] = {}
        for attempt in self.attempts.values():
            busy[attempt.job.queue] = busy.get(attempt.job.queue, 0) + 1
        return {name: (ex.max_workers, busy.get(name, 0)) for name, ex in self.executors.items()}

    def __repr__(self) -> str:
        return f"<Runtime backend={self.backend.url!r} queues={sorted(self.executors)} closing={self.closing}>"

    # -- backend events --

    def _on_event(self, event: BackendEvent) -> None:
        if type(event) is JobFinalized:  # the most frequent event first
            self.receipts.on_finalized(event.job_id)
        elif isinstance(event, JobsAvailable):
            if event.queue is None:
                for each in self.executors.values():
                    each.wake_up(None)
            else:
                executor = self.executors.get(event.queue)
                if executor is not None:
                    executor.wake_up(event.due)
        elif type(event) is OutboxPublished:
            if self.relay is not None:
                self.relay.wake()
        elif isinstance(event, CancelRequested):
            if event.verified:
                attempt = self.attempts.get(event.job_id)
                if attempt is not None:
                    attempt.cancel("cancel")
            else:
                self.cancel_hints.hint(event.job_id)

    # -- lifecycle --

    def begin_shutdown(self) -> None:
        """Start the shutdown now: refuse enqueues and stop claiming, while the service's own
        code (main) is still winding down; sets `shutdown_requested`. Leaving `open_runtime`
        does the rest. The outbox relay and the periodic scheduler stop first: no job is made
        by them after this."""
        self.relay_service.stop()
        self.shutdown_requested.set()
        self.periodic_service.stop()
        self.closing = True
        for executor in self.executors.values():
            executor.stop_claiming()

    def _refusal(self) -> str | None:
        """Once shutdown began, a running attempt of this runtime may still add work (its task,
        its `ctx.children()` tasks), through the grace and its unwind: it is what the grace is
        for. Anything else is refused: code outside every job, and job code whose attempt is
        not running here (it ended, or is another runtime's)."""
        attempt = current_attempt.get()
        if attempt is None:
            return REFUSED_OUTSIDE
        if self.attempts.holds(attempt):
            return None
        job = attempt.job
        return (
            f"the runtime is shutting down, and this call comes from the code of job {job.id} ({job.kind}) "
            "whose attempt has ended (in a task that outlived it: start tasks with ctx.children(), which "
            "the attempt waits for), or runs under another runtime; once shutdown began only a running "
            "attempt may add work: enqueue before the handler returns"
        )

    @property
    def cache(self) -> Cache:
        """The service's cache on the runtime's backend (docs/cache.md): `get`, `set`, `delete`,
        `get_or_compute` (one computation per key at a time, cached errors, stale values served
        while one task refreshes them), `request_scope`, `check`. Keys are namespaced by the
        app (`App.cache_keys`). Raises ConfigError for a backend without a cache."""
        if self._cache is None:
            raise ConfigError(f"the backend {self.backend.url!r} has no cache (it does not implement Caching)")
        return self._cache

    def _lock_store(self) -> Locks:
        if self._locks is None:
            raise ConfigError(f"the backend {self.backend.url!r} has no locks (it does not implement LockStore)")
        return self._locks

    def lock(self, name: str, *, ttl: float = 30.0, timeout: float = 10.0) -> AbstractAsyncContextManager[HeldLock]:
        """``async with rt.lock(name, ttl=30, timeout=10) as lock:`` holds the lock `name` across every
        process on the store for the block: waits up to `timeout` seconds for it (then
        `LockTimeout`; `timeout=0` tries once), renews it every ``ttl / 3``, releases it when
        the block ends. The block's scope has the hold's end as its deadline (moved on by each
        renewal the store confirmed, never past the store's expiry): past it, or when a
        renewal is refused, the block is cancelled and `LockLost` is raised, even after the
        process was frozen past its ttl. ``lock.token`` is the acquisition's fencing token, for
        the block's writes elsewhere. A crashed holder's lock frees itself `ttl` seconds after
        its last renewal (docs/locks.md)."""
        return self._lock_store().hold(name, ttl, timeout)

    async def try_lock(self, name: str, *, ttl: float = 30.0) -> tuple[bool, Release]:
        """``acquired, release = await rt.try_lock(name, ttl=30)``: one try, never waits. When
        acquired, the runtime renews the lock every ``ttl / 3`` until ``await release()``
        (idempotent, and safe to call when not acquired); a lost hold is logged and sets
        `release.lost` (there is no block to cancel: use `rt.lock(name, timeout=0)` for that).
        ``release.token`` is the acquisition's fencing token (None when not acquired)."""
        return await self._lock_store().try_lock(name, ttl)

    async def periodic(self) -> list[PeriodicInfo]:
        """Every schedule the app declares (`App.periodic`), enabled or not: its name,
        schedule, timezone, kind, last tick (enqueued by any process), the next tick this
        runtime will enqueue, and the last tick's job and its state now."""
        if self.scheduler is None:
            return []
        return await self.scheduler.describe()

    def skip_grace(self) -> None:
        """End the grace period now (or make the coming shutdown skip it): running attempts
        are interrupted at once."""
        self._skip_grace = True
        if self._grace_scope is not None:
            self._grace_scope.cancel()

    def _request_exit(self, exc: BaseException, job: ClaimedJob) -> None:
        """A handler raised `SystemExit` or `KeyboardInterrupt` (its attempt is already recorded
        as failed): shut down at once, interrupting the other attempts and writing their
        outcomes within the usual bounds, then raise `exc` from `open_runtime`."""
        if self._exit is None:
            self._exit = exc
            log.error(
                "job %d (%s) raised %s: shutting down without a grace; the other running attempts are "
                "interrupted (given back) and the process exits",
                job.id,
                job.kind,
                type(exc).__name__,
                extra={"event": "process_exit", "job_id": job.id, "kind": job.kind, "queue": job.queue},
            )
        self.begin_shutdown()
        self.skip_grace()
        self._body_scope.cancel()

    async def _wait_idle(self) -> None:
        for executor in self.executors.values():
            await executor.wait_workers_exited()

    async def _shutdown(self, graceful: bool) -> None:
        settings = self.settings
        with trio.CancelScope(shield=True):
            self.begin_shutdown()
            if graceful and not self._skip_grace:
                with trio.move_on_after(settings.grace) as self._grace_scope:
                    await self._wait_idle()
                self._grace_scope = None
            cut = sorted(self.attempts.values(), key=lambda a: a.job.id)
            if cut:
                self.interrupted = [a.job.id for a in cut]
                log.warning(
                    "shutdown: grace over, interrupting %d running attempts (they become available again): %s",
                    len(cut),
                    ", ".join(f"job {a.job.id} ({a.job.kind})" for a in cut),
                    extra={"event": "shutdown_interrupting", "job_ids": self.interrupted},
                )
            for executor in self.executors.values():
                executor.cancel_running("shutdown")
            with trio.move_on_after(settings.flush_bound) as unwind:
                await self._wait_idle()
            if unwind.cancelled_caught:
                stuck = ", ".join(f"job {a.job.id} ({a.job.kind})" for a in self.attempts.values())
                log.warning(
                    "shutdown: %s ignored cancellation for %g s; the runtime waits for them to unwind",
                    stuck or "some attempts",
                    settings.flush_bound,
                    extra={"event": "shutdown_unwind_slow", "job_ids": [a.job.id for a in self.attempts.values()]},
                )
            with trio.move_on_after(settings.flush_bound) as flush:
                # A claim in flight when claiming stopped hands its jobs back through the
                # completer: wait for every fetcher (each claim is bounded by flush_bound once
                # claiming stopped) before stopping it; then the completer writes what is left.
                for executor in self.executors.values():
                    await executor.wait_fetcher_exited()
                self.completer.stop()
                await self.completer.finished.wait()
                await self.completer.drain_inline()
            if flush.cancelled_caught:
                unwritten = self.completer.abandon()
                log.error(
                    "shutdown: the backend did not take the last outcomes within flush_bound (%g s); "
                    "not written: %s. On a durable backend these jobs stay running and are rescued "
                    "after rescue_after",
                    settings.flush_bound,
                    ", ".join(f"job {i}" for i in unwritten) or "none pending",
                    extra={"event": "shutdown_unwritten", "job_ids": unwritten, "backend": self.backend.url},
                )
            self.periodic_service.stop()
            if self._cache is not None:
                self._cache.close()
            self.services.stop()
            self.backend_service.stop()


async def publish(conn: Any, topic: str, payload: Any) -> None:
    """Publish an event on `topic` inside the transaction open on `conn`, with the runtime of
    the current context: the event -- and so the job of every kind subscribed to `topic` --
    exists if and only if that transaction commits (docs/outbox.md).

    `conn`: the connection ``rt.transaction()`` lends, or one of your own, as for
    `kind.enqueue_tx`: a psycopg `Connection` or `AsyncConnection` to the runtime's database,
    or a `sqlite3.Connection` to the backend's file (memory has only ``rt.transaction()``; or
    use ``rt.publish(topic, payload)`` outside a transaction). `payload`: a JSON value held to
    the rules of job args (`ArgsError`). Raises ConfigError for a bad topic or a connection the
    backend cannot use, RuntimeClosed outside a runtime or once shutdown began (except in a
    running job's code)."""
    client = get_enqueuer("nj.publish()")
    if not isinstance(client, Client):
        raise ConfigError(f"nj.publish() needs the runtime's client in this context, not {client!r}")
    await client.publish_tx(conn, topic, payload)


def _queue_poll(app: App, queue: str) -> float | None:
    cfg = app.queues.get(queue)
    return cfg.poll_interval if cfg is not None else None


def _is_cancellation(exc: BaseException | None) -> bool:
    if exc is None:
        return False
    if isinstance(exc, (trio.Cancelled, KeyboardInterrupt)):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_is_cancellation(e) for e in exc.exceptions)
    return False


@asynccontextmanager
async def open_runtime(
    app: App,
    *,
    backend: str | Backend = "memory://",
    grace: float | None = None,
    queues: Sequence[str] | None = None,
    settings: RuntimeSettings | None = None,
    resources: Mapping[str, Any] | None = None,
) -> AsyncIterator[Runtime]:
    """Run `app`'s queues for the duration of the block and yield the live `Runtime`.

    `backend`: a URL (``memory://``) or a Backend instance; a URL's backend is opened and closed
    here, an instance is left open for its owner (which is how a test restarts a runtime on the
    same jobs). `grace`: seconds shutdown waits for running jobs before interrupting them
    (default: `settings.grace`, 20 s).
    `queues`: the queues this runtime works (default: all of the app's; ``[]`` makes an
    enqueue-only runtime). `settings`: the other tuning constants (see `RuntimeSettings`).
    `resources`: values that replace declared resources by name (a test's fakes); a replaced
    resource is neither opened nor closed here.

    The app's resources open before any queue starts and close after every task has ended (an
    enqueue-only runtime, ``queues=[]``, opens none).
    Raises ConfigError for a bad argument, ResourceError for a resource that did not open (no
    job was claimed) or, at the end, for one that did not close. A crash in a runtime service cancels the whole tree
    and propagates from here (as an ExceptionGroup holding the original error).
    """
    if not isinstance(app, App):
        raise ConfigError(f"open_runtime needs an nursery_jobs.App, not {app!r}")
    settings = settings or RuntimeSettings()
    if grace is not None:
        settings = attrs.evolve(settings, grace=grace)  # validated by RuntimeSettings
    if isinstance(queues, (str, bytes)) or not (queues is None or isinstance(queues, abc.Iterable)):
        raise ConfigError(
            f"queues must be a list of queue names, not {queues!r}"
            + (f" (a str is read letter by letter: did you mean [{queues!r}]?)" if isinstance(queues, str) else "")
        )
    names = list(app.queues) if queues is None else list(queues)
    unknown = [q for q in names if q not in app.queues]
    if unknown:
        raise ConfigError(f"queues {unknown} are not declared in the app (declared: {sorted(app.queues)})")
    # An enqueue-only runtime runs no job, so it opens no resource.
    declared = app.resources if names else {}
    replaced = check_replacements(app.resources, resources)
    owns_backend = isinstance(backend, str)
    be: Backend = open_backend(backend) if isinstance(backend, str) else backend
    be.check_budget(sum(app.queues[q].max_workers for q in names))
    rt = Runtime(app, be, settings, names)
    token = current_enqueuer.set(rt)
    budget_token = current_budget.set(rt.threads)
    cache_token = current_cache.set(rt._cache)
    close_by: float | None = None
    try:
        await be.open()  # idempotent: a caller's instance may be open already
        be.add_listener(rt._on_event)
        needs_aio = any(k.asyncio and k.queue in names for k in app.kinds.values())
        try:
            async with AsyncExitStack() as stack:
                stack.enter_context(
                    watch_blocked_loop(settings.blocked_loop_warning, _culprit_or_holder, observe=_blocked_observer(rt.hooks))
                )
                if needs_aio:  # imported only when needed: trio_asyncio costs 0.3 s to import
                    from .infra.aio import maybe_open_loop

                    await stack.enter_async_context(maybe_open_loop(True))
                # Entered before the owner, so closed only once every task in it has ended.
                opened = await stack.enter_async_context(open_resources(declared, replaced, settings.resource_bound))
                resources_token = current_resources.set(opened)
                stack.callback(current_resources.reset, resources_token)
                owner = await stack.enter_async_context(open_owner("nursery_jobs.runtime"))
                rt._task_owner = owner
                stack.callback(setattr, rt, "_task_owner", None)
                await rt.backend_service.start(owner)
                await owner.start(rt.completer.run, name="completer")
                await rt.services.start(owner)
                await rt.periodic_service.start(owner)
                await rt.relay_service.start(owner)
                for name, executor in rt.executors.items():
                    await owner.start(executor.run, name=f"queue:{name}")
                graceful = True
                try:
                    with rt._body_scope:
                        yield rt
                except BaseException as exc:
                    graceful = not _is_cancellation(exc)
                    raise
                finally:
                    await rt._shutdown(graceful and rt._exit is None)
            # Every task has ended; write anything pushed after the completer stopped (a task
            # torn down from outside gives its job back on its way out). This write and the
            # backend's close share one flush_bound: the last step of the shutdown's bound.
            close_by = trio.current_time() + settings.flush_bound
            with trio.CancelScope(shield=True), trio.move_on_at(close_by):
                await rt.completer.drain_inline()
        finally:
            be.remove_listener(rt._on_event)
            if owns_backend:
                with trio.CancelScope(shield=True), trio.move_on_at(close_by or trio.current_time() + settings.flush_bound):
                    await be.close()
    finally:
        rt.threads.closed = True  # a task that outlived the runtime starts no thread
        current_cache.reset(cache_token)
        current_budget.reset(budget_token)
        current_enqueuer.reset(token)
    if rt._exit is not None:
        raise rt._exit  # a handler's sys.exit(): everything else is written, now exit


def _culprit_or_holder(task: trio.lowlevel.Task) -> Culprit | Holder | None:
    """Whose code a blocked-loop step ran: a job's, else an app resource's (opening or closing)."""
    return culprit_of(task) or holder_of(task)


def _blocked_observer(hooks: Hooks) -> Callable[[trio.lowlevel.Task, Culprit | Holder | None, float], None] | None:
    """The watchdog's finding of each blocked step, for the middleware's `loop_blocked` hooks."""
    hook = hooks.loop_blocked
    if hook is None:
        return None

    def observe(task: trio.lowlevel.Task, culprit: Culprit | Holder | None, seconds: float) -> None:
        if isinstance(culprit, Culprit):
            hook(LoopBlocked(seconds, culprit.job_id, culprit.kind, culprit.queue, task.name))
        else:
            hook(LoopBlocked(seconds, None, None, None, task.name))

    return observe


def run(
    main: Callable[[Runtime], Awaitable[T]],
    *,
    app: App,
    backend: str | Backend = "memory://",
    grace: float | None = None,
    queues: Sequence[str] | None = None,
    settings: RuntimeSettings | None = None,
    main_grace: float | None = None,
) -> T | None:
    """Hand the runtime the whole life of a service: start Trio, open the runtime, run
    ``await main(rt)``, shut down, and return main's value.

    SIGINT and SIGTERM start the graceful shutdown; a second signal skips what is left of every
    grace. `main_grace` says what the first signal does to `main`:

    - None (the default): `main` is cancelled at once, and the runtime stops claiming and
      refuses enqueues at once;
    - a number of seconds: `main` is not cancelled. `rt.shutdown_requested` is set and `main`
      has that long to return on its own (a server started with
      ``shutdown_trigger=rt.shutdown_requested.wait`` stops accepting, finishes its requests
      and returns); only then is it cancelled. Until `main` has returned the runtime serves it
      as before (enqueues are accepted, jobs run and receipts arrive), so a request in flight
      gets its answer.

    Either way, once `main` has returned the runtime's own shutdown follows, with its `grace`
    for running jobs. After a signal, `run` returns None, so a script that ends with it exits
    0. Raises ConfigError for a bad argument.
    """
    if main_grace is not None and (
        isinstance(main_grace, bool)
        or not isinstance(main_grace, (int, float))
        or not math.isfinite(main_grace)
        or main_grace < 0
    ):
        raise ConfigError(f"main_grace must be None or a finite number of seconds >= 0, not {main_grace!r}")
    try:
        return run_trio(_serve, main, app, backend, grace, queues, settings, main_grace)
    except BaseExceptionGroup as group:
        leaf = _single_leaf(group)
        if leaf is None:
            raise
        raise leaf from None  # one error, nested only by the runtime's own scopes: show it plain


async def _serve(
    main: Callable[[Runtime], Awaitable[T]],
    app: App,
    backend: str | Backend,
    grace: float | None,
    queues: Sequence[str] | None,
    settings: RuntimeSettings | None,
    main_grace: float | None,
) -> T | None:
    """`run`'s body inside Trio (apart so that tests can run it under a MockClock)."""
    result: T | None = None
    signals = 0
    main_scope = trio.CancelScope()
    rt_box: list[Runtime] = []

    def on_signal() -> None:
        # Called for each signal, and once more when the runtime exists (a signal may arrive
        # while it starts).
        if signals == 0:
            return
        rt = rt_box[0] if rt_box else None
        if signals >= 2 or main_grace is None:
            main_scope.cancel()
            if rt is not None:
                rt.begin_shutdown()  # stop claiming at once, not after main unwinds
                if signals >= 2:
                    rt.skip_grace()
            return
        if rt is not None:
            rt.shutdown_requested.set()

    def first() -> None:
        nonlocal signals
        signals = 1
        if main_grace is not None:
            main_scope.deadline = min(main_scope.deadline, trio.current_time() + main_grace)
        on_signal()

    def second() -> None:
        nonlocal signals
        signals += 1
        on_signal()

    async with open_owner("nursery_jobs.run") as owner:
        await owner.start(watch_shutdown_signals, first, second, name="signals")
        try:
            async with open_runtime(app, backend=backend, grace=grace, queues=queues, settings=settings) as rt:
                rt_box.append(rt)
                on_signal()
                with main_scope:
                    result = await main(rt)
                if main_scope.cancelled_caught and signals == 1 and main_grace is not None:
                    log.warning(
                        "main did not return within main_grace (%g s) after the signal: cancelled it",
                        main_grace,
                        extra={"event": "main_grace_over", "main_grace": main_grace},
                    )
        finally:
            owner.cancel_scope.cancel()
    return None if signals else result


def _single_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc
