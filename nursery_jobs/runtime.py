"""`open_runtime` and `run`: the start order, the live `Runtime` handle, the shutdown sequence.

Start order (each step only once the previous one is ready): validate the app and settings ->
open the backend -> subscribe to its events -> completer -> one executor per queue -> user code.

Shutdown reverses it, and every step is bounded:

1. refuse new enqueues (`RuntimeClosed`) and stop claiming: fetchers stop, idle workers exit;
2. wait up to `grace` seconds for running attempts to finish on their own;
3. cancel what is still running, with the reason "shutdown": those attempts are *interrupted*,
   not failed -- the attempt is given back and the job is available again (on durable backends,
   for any process to pick up; at least once, nothing lost);
4. wait up to `flush_bound` for the cancelled attempts to unwind;
5. within one more `flush_bound`: wait for claims in flight (each cut at that bound), stop the
   completer, which writes every outcome still pending -- if the backend does not take them in
   time, the completer is abandoned and the unwritten job ids are logged (on a durable backend
   those jobs stay running and are rescued);
6. within a last `flush_bound`: write what torn-down tasks gave back, unsubscribe, and close the
   backend if the runtime opened it.

The sequence runs shielded from outside cancellation but inside its own bounds, so `open_runtime`
exits within `grace + 3 * flush_bound` -- even when the backend stops answering -- as long as
job code honours cancellation (a job that
shields itself forever cannot be killed in Trio; the runtime names it in a warning instead).
If the body is left by a cancellation from outside (or Ctrl-C), there is no grace: step 2 is
skipped. `skip_grace()` (the second signal in `run`) ends step 2 early.
"""

from __future__ import annotations

import logging
import math
import random
from collections import abc
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence, TypeVar

import attrs
import trio

from ._context import culprit_of, current_runtime
from ._faults import NO_FAULTS, Faults
from .app import App, JobKind
from .backends import Backend, BackendEvent, CancelRequested, JobFinalized, JobsAvailable, NewJob, open_backend
from .completer import Completer
from .config import RuntimeSettings, check_priority, check_unique_key
from .coordination import Receipts
from .errors import ArgsError, ConfigError, RuntimeClosed
from .executor import Attempt, QueueExecutor
from .infra.owner import TaskOwner, open_owner
from .infra.runner import run_trio, watch_shutdown_signals
from .infra.sync import Wakeup
from .infra.threads import ThreadBudget, current_budget
from .infra.watchdog import watch_blocked_loop
from .jobs import Job, JobId, JobState, Receipt, _ExistingJobId, check_job_id, encode_args

__all__ = ["QueueStats", "Runtime", "open_runtime", "run"]

log = logging.getLogger("nursery_jobs")

RETENTION_BATCH = 1000
"""Retention deletes at most this many rows per call: each call is a short transaction (no long
lock, no statement timeout after downtime left a backlog), and it loops until a batch is short."""

T = TypeVar("T")


@attrs.frozen
class QueueStats:
    """One queue, as `Runtime.stats` reports it.

    `running` counts attempts in progress in the backend (all processes); `queued` is available
    + scheduled + retryable; `failed` counts attempts that ended in an error or a timeout;
    `interrupted` counts attempts a shutdown gave back.
    """

    name: str
    max_workers: int
    running: int
    queued: int
    available: int
    scheduled: int
    retryable: int
    completed: int
    discarded: int
    cancelled: int
    failed: int
    interrupted: int


class Runtime:
    """The live handle `open_runtime` yields. Its methods are safe to call from any task of the
    service; each is a Trio checkpoint and each wait in it is bounded."""

    def __init__(self, app: App, backend: Backend, settings: RuntimeSettings, queues: Sequence[str], faults: Faults) -> None:
        self.app = app
        self.backend = backend
        self.settings = settings
        self.faults = faults
        self.rng = random.Random(random.getrandbits(64))
        self.completer = Completer(backend, faults)
        self.receipts = Receipts(self, settings.max_waiters)
        self.executors = {name: QueueExecutor(self, app.queues[name]) for name in queues}
        self.attempts: dict[int, Attempt] = {}
        self.threads = ThreadBudget(settings.thread_limit)
        """`run_blocking`'s threads in this runtime (its limiter and the calls in flight)."""
        self.closing = False
        self.interrupted: list[int] = []
        """Ids of the attempts the last shutdown interrupted (available again, attempt given back)."""
        self._grace_scope: trio.CancelScope | None = None
        self._skip_grace = False
        self._maintenance_scope = trio.CancelScope()
        self._backend_scope = trio.CancelScope()
        self._backend_ready = trio.Event()
        self._cancel_hints: set[int] = set()
        self._body_scope = trio.CancelScope()
        """Around the body of `open_runtime`: cancelled when a handler makes the process exit."""
        self._exit: BaseException | None = None
        self._hinted = Wakeup()

    def __repr__(self) -> str:
        return f"<Runtime backend={self.backend.url!r} queues={sorted(self.executors)} closing={self.closing}>"

    # -- backend events --

    def _on_event(self, event: BackendEvent) -> None:
        if type(event) is JobFinalized:  # the most frequent event first
            self.receipts.on_finalized(event.job_id)
        elif isinstance(event, JobsAvailable):
            if event.queue is None:
                for each in self.executors.values():
                    each.wake(None)
            else:
                executor = self.executors.get(event.queue)
                if executor is not None:
                    executor.wake(event.due)
        elif isinstance(event, CancelRequested):
            attempt = self.attempts.get(event.job_id)
            if attempt is None:
                return
            if event.verified:
                attempt.cancel("cancel")
            elif len(self._cancel_hints) < len(self.attempts) + 1:  # bounded by what runs here
                self._cancel_hints.add(event.job_id)
                self._hinted.set()

    async def _serve_backend(self) -> None:
        """The backend's own service (the LISTEN connection), stopped last."""

        async def ready_when_started(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            await self.backend.serve(task_status=task_status)

        with self._backend_scope:
            async with open_owner("backend") as owner:
                await owner.start(ready_when_started, name="serve")
                self._backend_ready.set()

    # -- maintenance: heartbeats and rescue --

    async def _maintenance(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Two tasks: heartbeats (renew the claim on this process's running jobs) and upkeep
        (rescue other processes' stale jobs, delete old final ones). Apart, so a slow rescue or
        retention can never delay a heartbeat past the point where another process rescues."""
        task_status.started()
        with self._maintenance_scope:
            async with open_owner("maintenance") as owner:
                owner.spawn(self._heartbeats, name="heartbeats")
                owner.spawn(self._upkeep, name="upkeep")
                owner.spawn(self._read_back_cancel_hints, name="cancel-hints")

    async def _heartbeats(self) -> None:
        """Every `heartbeat_interval`, renew the running jobs' heartbeats.

        Another process may rescue a job whose heartbeat is `rescue_after` old. So once this
        process has not renewed for half of that -- the calls failed, or one has not answered
        (a hung connection) -- it cancels its running attempts ("lost") rather than let them run
        unowned: each call is bounded by that deadline, not only checked when it returns.
        """
        s = self.settings
        backend = self.backend
        last_ok = trio.current_time()
        while True:
            await trio.sleep(s.heartbeat_interval)
            # An attempt that ended but whose outcome the completer has not written yet is still
            # `running` in the backend: renew it too, or another process would rescue and run
            # again a job that is done.
            running = [(a.job.id, a.job.attempt) for a in self.attempts.values()] + self.completer.unwritten()
            if not running:
                last_ok = trio.current_time()
                continue
            result = None
            with trio.move_on_at(last_ok + s.rescue_after / 2):
                try:
                    result = await backend.heartbeat(running)
                except Exception:
                    log.exception("heartbeat of %d running jobs failed", len(running))
            now = trio.current_time()
            if result is None:
                if now - last_ok >= s.rescue_after / 2:
                    log.error(
                        "no heartbeat for %g s (rescue_after is %g s): cancelling this process's running jobs",
                        now - last_ok,
                        s.rescue_after,
                    )
                    for attempt in list(self.attempts.values()):
                        attempt.cancel("lost")
                continue
            last_ok = now
            for job_id, attempt_no in result.lost:
                found = self.attempts.get(job_id)
                if found is not None and found.job.attempt == attempt_no:
                    found.cancel("lost")
            for job_id in result.cancel:
                found = self.attempts.get(job_id)
                if found is not None:
                    found.cancel("cancel")

    async def _read_back_cancel_hints(self) -> None:
        """A cancel request that arrived as a notification from another process is a hint,
        not an authority (on PostgreSQL any session that can connect may NOTIFY): read the rows
        of the hinted attempts that run here, in one `heartbeat` call, and cancel only those
        whose row says their cancellation was requested. A call that fails leaves the request to
        the next regular heartbeat, which reads the same flag."""
        while True:
            await self._hinted.wait()
            hinted, self._cancel_hints = self._cancel_hints, set()
            running = [(a.job.id, a.job.attempt) for i in sorted(hinted) if (a := self.attempts.get(i)) is not None]
            if not running:
                continue
            try:
                result = await self.backend.heartbeat(running)
            except Exception:
                log.warning(
                    "could not read back %d cancel requests; the next heartbeat will", len(running), exc_info=True
                )
                continue
            for job_id in result.cancel:
                found = self.attempts.get(job_id)
                if found is not None:
                    found.cancel("cancel")

    async def _upkeep(self) -> None:
        """Rescue stale running jobs every `rescue_interval` (the first at start-up) and delete
        old final jobs every `retention_interval`. Failures are logged and tried again."""
        s = self.settings
        backend = self.backend
        next_rescue = trio.current_time()
        next_retention = trio.current_time() + s.retention_interval
        while True:
            await trio.sleep_until(min(next_rescue, next_retention))
            now = trio.current_time()
            if now >= next_rescue:
                next_rescue = now + s.rescue_interval
                try:
                    rescued = await backend.rescue(backend.now() - s.rescue_after)
                except Exception:
                    log.exception("rescue of stale running jobs failed; retrying in %g s", s.rescue_interval)
                else:
                    if rescued:
                        log.warning("rescued %d jobs whose worker stopped heartbeating: %s", len(rescued), rescued)
            if now >= next_retention:
                next_retention = now + s.retention_interval
                await self._retention()

    async def _retention(self) -> None:
        s = self.settings
        now = self.backend.now()
        before = {
            JobState.COMPLETED: now - s.keep_completed,
            JobState.CANCELLED: now - s.keep_cancelled,
            JobState.DISCARDED: now - s.keep_discarded,
        }
        deleted = 0
        try:
            while True:
                batch = await self.backend.delete_finished(before, RETENTION_BATCH)
                deleted += batch
                if batch < RETENTION_BATCH:
                    break
                await trio.lowlevel.checkpoint()  # a backend whose call never yields (memory)
        except Exception:
            log.exception("retention failed after deleting %d final jobs; retrying in %g s", deleted, s.retention_interval)
        else:
            if deleted:
                log.info("retention deleted %d final jobs", deleted)

    # -- public API --

    def _options(
        self,
        kind: JobKind[Any, Any],
        delay: float | None,
        run_at: float | None,
        priority: int | None,
        unique_key: str | None,
    ) -> tuple[float | None, int, str | None]:
        """(run_at, priority, unique_key) validated once per enqueue call, not once per job."""
        if delay is not None and run_at is not None:
            raise ConfigError("pass delay= or run_at=, not both")
        if delay is not None:
            if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not math.isfinite(delay) or delay < 0:
                raise ConfigError(f"delay must be a finite number of seconds >= 0, not {delay!r}")
            run_at = self.backend.now() + delay if delay > 0 else None
        elif run_at is not None and (
            isinstance(run_at, bool) or not isinstance(run_at, (int, float)) or not math.isfinite(run_at)
        ):
            raise ConfigError(f"run_at must be a finite time on the backend's clock, not {run_at!r}")
        if priority is None:
            priority = kind.priority
        else:
            check_priority(priority)
        if self.faults.invert_priority:
            priority = -priority
        if unique_key is not None:
            check_unique_key(unique_key)
        return run_at, priority, unique_key

    @staticmethod
    def _args_json(kind: JobKind[Any, Any], args: Mapping[str, Any]) -> str:
        if type(args) is not dict:
            if not isinstance(args, abc.Mapping):
                raise ArgsError(
                    f"args for job {kind.name!r} must be a mapping of keyword arguments, not {type(args).__name__}"
                )
            args = dict(args)
        kind.check_args(args)
        return encode_args(args)

    def _new_job(
        self,
        kind: JobKind[Any, Any],
        args: Mapping[str, Any],
        delay: float | None,
        run_at: float | None,
        priority: int | None,
        unique_key: str | None,
    ) -> NewJob:
        run_at, prio, key = self._options(kind, delay, run_at, priority, unique_key)
        args_json = self._args_json(kind, args)
        if key is None and kind.unique is not None:
            key = kind.unique_key_for(args)
        return NewJob(kind.name, kind.queue, args_json, prio, run_at, kind.max_attempts, key)

    def _check_open(self) -> None:
        if self.closing:
            raise RuntimeClosed(
                "the runtime is shutting down and accepts no new jobs; enqueue before shutdown "
                "begins, or from the next run of the service"
            )

    async def _insert(self, jobs: list[NewJob]) -> list[JobId]:
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        results = await self.backend.insert_many(jobs)
        if self.faults.enqueue_checkpoint_after_insert:
            await trio.lowlevel.checkpoint()
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return [_ExistingJobId(i) if existing else JobId(i) for i, existing in results]

    async def enqueue(
        self,
        kind: str,
        args: Mapping[str, Any] | None = None,
        *,
        delay: float | None = None,
        run_at: float | None = None,
        priority: int | None = None,
        unique_key: str | None = None,
    ) -> JobId:
        """Enqueue one job of kind `kind` with keyword arguments `args`; returns its id (a
        `JobId`, an int whose `.existing` is True when `unique_key` matched a pending job).

        `delay` (seconds) or `run_at` (backend clock) schedule it for later; higher `priority`
        runs first (default: the kind's); with `unique_key`, while a job with that key is not
        final, the existing job's id is returned and no job is added. Raises UnknownJob,
        ArgsError, ConfigError, or RuntimeClosed once shutdown began. Cancel-atomic: if the
        caller is cancelled, the job was not enqueued.
        """
        new = self._new_job(self.app.kind(kind), args or {}, delay, run_at, priority, unique_key)
        return (await self._insert([new]))[0]

    async def enqueue_tx(
        self,
        conn: Any,
        kind: str,
        args: Mapping[str, Any] | None = None,
        *,
        delay: float | None = None,
        run_at: float | None = None,
        priority: int | None = None,
        unique_key: str | None = None,
    ) -> JobId:
        """Enqueue inside the caller's own open transaction on `conn` (PostgreSQL backend only).

        `conn` is a psycopg `Connection` (run on a thread) or `AsyncConnection` (run through
        trio-asyncio). The job exists only if that transaction commits, and its wake-up is sent
        at the commit: a rolled-back request leaves no job behind, a committed one always runs.
        The runtime never commits or rolls back `conn`.
        """
        insert_sql = getattr(self.backend, "insert_sql", None)
        if insert_sql is None:
            raise ConfigError(
                f"enqueue_tx needs the PostgreSQL backend (this runtime uses {self.backend.url}); use enqueue"
            )
        new = self._new_job(self.app.kind(kind), args or {}, delay, run_at, priority, unique_key)
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        query, params = insert_sql(new, self.backend.now())
        from .infra.threads import run_sync_io

        if hasattr(conn, "__aenter__"):  # psycopg.AsyncConnection
            from .infra.aio import call_asyncio, loop_running

            if not loop_running():
                raise ConfigError(
                    "enqueue_tx with an async psycopg connection needs a trio-asyncio loop: open one "
                    "with `async with trio_asyncio.open_loop():` around your code, or pass a sync Connection"
                )

            async def execute() -> Any:
                cur = await conn.execute(query, params)
                return await cur.fetchone()

            row = await call_asyncio(execute)
        else:
            row = await run_sync_io(lambda: conn.execute(query, params).fetchone(), limiter=self.threads.limiter)
        if row is None:
            raise ConfigError(
                f"unique_key {new.unique_key!r} is held by a pending job; enqueue_tx does not look it up "
                "inside your transaction: use enqueue for unique jobs"
            )
        return JobId.of(row[0])

    async def enqueue_many(
        self,
        kind: str,
        many: Iterable[Mapping[str, Any]],
        *,
        delay: float | None = None,
        run_at: float | None = None,
        priority: int | None = None,
    ) -> list[JobId]:
        """Enqueue one job of `kind` per mapping in `many`, in one backend call; returns the ids
        in order. Every job is validated first: one bad mapping rejects the whole batch. A kind
        with a `unique` function gives each job its own key."""
        job_kind = self.app.kind(kind)
        when, prio, _ = self._options(job_kind, delay, run_at, priority, None)
        name, queue, attempts, to_json = job_kind.name, job_kind.queue, job_kind.max_attempts, self._args_json
        new = tuple.__new__  # a NamedTuple without its Python-level __new__: once per job
        if job_kind.unique is None:
            jobs = [new(NewJob, (name, queue, to_json(job_kind, args), prio, when, attempts, None)) for args in many]
        else:  # each job its own key; a key twice in one batch gives the first job's id twice
            key_for = job_kind.unique_key_for
            jobs = [
                new(NewJob, (name, queue, to_json(job_kind, args), prio, when, attempts, key_for(args))) for args in many
            ]
        if not jobs:
            await trio.lowlevel.checkpoint()
            return []
        return await self._insert(jobs)

    async def get_job(self, job_id: int) -> Job:
        """A snapshot of the job. Raises JobNotFound."""
        await trio.lowlevel.checkpoint()
        return await self.backend.get_job(check_job_id(job_id))

    async def wait(self, job_id: int, *, timeout: float) -> Receipt:
        """Wait at most `timeout` seconds for the job to reach a final state.

        Returns a Receipt: `done` tells whether it did. Never raises for a slow job; when
        `max_waiters` receipts are already awaited in its queue, answers at once. Raises
        JobNotFound for an unknown id.
        """
        return await self.receipts.wait(check_job_id(job_id), timeout)

    async def cancel(self, job_id: int) -> JobState:
        """Cancel a job: a pending one is cancelled at once; a running one has its attempt's
        scope cancelled (wherever it runs) and ends as cancelled when its handler unwinds; a
        final one is left alone. Idempotent. Returns the job's state right after the request."""
        await trio.lowlevel.checkpoint_if_cancelled()
        state = await self.backend.cancel(check_job_id(job_id))
        await trio.lowlevel.cancel_shielded_checkpoint()
        return state

    async def stats(self) -> dict[str, QueueStats]:
        """Per queue of the app: its worker limit and its jobs by state."""
        await trio.lowlevel.checkpoint()
        counts = await self.backend.stats()
        out: dict[str, QueueStats] = {}
        from .backends import QueueCounts

        for name, cfg in sorted(self.app.queues.items()):
            c = counts.get(name, QueueCounts())
            out[name] = QueueStats(
                name=name,
                max_workers=cfg.max_workers,
                running=c.running,
                queued=c.available + c.scheduled + c.retryable,
                available=c.available,
                scheduled=c.scheduled,
                retryable=c.retryable,
                completed=c.completed,
                discarded=c.discarded,
                cancelled=c.cancelled,
                failed=c.failed,
                interrupted=c.interrupted,
            )
        return out

    def begin_shutdown(self) -> None:
        """Start the shutdown now: refuse enqueues and stop claiming, while the service's own
        code (main) is still winding down. Leaving `open_runtime` does the rest."""
        self.closing = True
        for executor in self.executors.values():
            executor.stop_claiming()

    def request_exit(self, exc: BaseException, job: Any) -> None:
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
            )
        self.begin_shutdown()
        self.skip_grace()
        self._body_scope.cancel()

    def skip_grace(self) -> None:
        """End the grace period now (or make the coming shutdown skip it): running attempts
        are interrupted at once."""
        self._skip_grace = True
        if self._grace_scope is not None:
            self._grace_scope.cancel()

    # -- shutdown --

    async def _wait_idle(self) -> None:
        for executor in self.executors.values():
            await executor.wait_workers_exited()

    async def _shutdown(self, graceful: bool) -> None:
        settings = self.settings
        with trio.CancelScope(shield=True):
            self.begin_shutdown()
            if graceful and not self._skip_grace:
                grace = math.inf if self.faults.unbounded_grace else settings.grace
                with trio.move_on_after(grace) as self._grace_scope:
                    await self._wait_idle()
                self._grace_scope = None
            cut = sorted(self.attempts.values(), key=lambda a: a.job.id)
            if cut:
                self.interrupted = [a.job.id for a in cut]
                log.warning(
                    "shutdown: grace over, interrupting %d running attempts (they become available again): %s",
                    len(cut),
                    ", ".join(f"job {a.job.id} ({a.job.kind})" for a in cut),
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
                )
            self._maintenance_scope.cancel()
            self._backend_scope.cancel()


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
    _faults: Faults = NO_FAULTS,
) -> AsyncIterator[Runtime]:
    """Run `app`'s queues for the duration of the block and yield the live `Runtime`.

    `backend`: a URL (``memory://``) or a Backend instance; a URL's backend is opened and closed
    here, an instance is left open for its owner (which is how a test restarts a runtime on the
    same jobs). `grace`: seconds shutdown waits for running jobs before interrupting them
    (default: `settings.grace`, 20 s).
    `queues`: the queues this runtime works (default: all of the app's; ``[]`` makes an
    enqueue-only runtime). `settings`: the other tuning constants (see `RuntimeSettings`).

    Raises ConfigError for a bad argument. A crash in a runtime service cancels the whole tree
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
    owns_backend = isinstance(backend, str)
    be: Backend = open_backend(backend) if isinstance(backend, str) else backend
    be.check_budget(sum(app.queues[q].max_workers for q in names))
    rt = Runtime(app, be, settings, names, _faults)
    token = current_runtime.set(rt)
    budget_token = current_budget.set(rt.threads)
    close_by: float | None = None
    try:
        await be.open()  # idempotent: a caller's instance may be open already
        be.add_listener(rt._on_event)
        needs_aio = any(k.asyncio and k.queue in names for k in app.kinds.values())
        try:
            async with AsyncExitStack() as stack:
                stack.enter_context(watch_blocked_loop(settings.blocked_loop_warning, culprit_of))
                if needs_aio:  # imported only when needed: trio_asyncio costs 0.3 s to import
                    from .infra.aio import maybe_open_loop

                    await stack.enter_async_context(maybe_open_loop(True))
                owner = await stack.enter_async_context(open_owner("nursery_jobs.runtime"))
                await _start_services(rt, owner)
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
        current_budget.reset(budget_token)
        current_runtime.reset(token)
    if rt._exit is not None:
        raise rt._exit  # a handler's sys.exit(): everything else is written, now exit


async def _start_services(rt: Runtime, owner: TaskOwner) -> None:
    owner.spawn(rt._serve_backend, name="backend")
    await rt._backend_ready.wait()
    if rt.faults.swallow_service_errors:
        owner.spawn_detached(rt.completer.run, name="completer")
        for name, executor in rt.executors.items():
            owner.spawn_detached(executor.run, name=f"queue:{name}")
        await trio.lowlevel.checkpoint()
        return
    await owner.start(rt.completer.run, name="completer")
    await owner.start(rt._maintenance, name="maintenance")
    for name, executor in rt.executors.items():
        await owner.start(executor.run, name=f"queue:{name}")


def run(
    main: Callable[[Runtime], Awaitable[T]],
    *,
    app: App,
    backend: str | Backend = "memory://",
    grace: float | None = None,
    queues: Sequence[str] | None = None,
    settings: RuntimeSettings | None = None,
) -> T | None:
    """Hand the runtime the whole life of a service: start Trio, open the runtime, run
    ``await main(rt)``, shut down, and return main's value.

    SIGINT and SIGTERM start the graceful shutdown (main is cancelled, then running jobs get
    `grace` seconds); a second signal skips what is left of the grace. After a signal, `run`
    returns None, so a script that ends with it exits 0.
    """

    async def root() -> T | None:
        result: T | None = None
        async with open_owner("nursery_jobs.run") as owner:
            main_scope = trio.CancelScope()
            rt_box: list[Runtime] = []

            def first() -> None:
                main_scope.cancel()
                if rt_box:
                    rt_box[0].begin_shutdown()  # stop claiming at once, not after main unwinds

            def second() -> None:
                main_scope.cancel()
                if rt_box:
                    rt_box[0].skip_grace()

            await owner.start(watch_shutdown_signals, first, second, name="signals")
            try:
                async with open_runtime(app, backend=backend, grace=grace, queues=queues, settings=settings) as rt:
                    rt_box.append(rt)
                    with main_scope:
                        result = await main(rt)
            finally:
                owner.cancel_scope.cancel()
        return result

    try:
        return run_trio(root)
    except BaseExceptionGroup as group:
        leaf = _single_leaf(group)
        if leaf is None:
            raise
        raise leaf from None  # one error, nested only by the runtime's own scopes: show it plain


def _single_leaf(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        if len(exc.exceptions) != 1:
            return None
        exc = exc.exceptions[0]
    return exc
