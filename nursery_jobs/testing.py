"""`nursery_jobs.testing`: the kit for testing a service's jobs, in virtual time.

A job's life is spread over time (backoffs, snoozes, delays) and over deliveries (at least once:
a job cut by a shutdown or a crash runs again). A test wants neither to wait for the time nor to
hand-write the deliveries, so the kit gives it:

- `open_test_runtime(app)`: `open_runtime` plus a record of every job enqueued through it
  (`kind.enqueue`, `rt.enqueue`, `enqueue_many`, from the test or from a job) and `drain`.
  The pytest plugin's `runtime` fixture is this runtime on a `MockClock`.
- `await rt.drain(horizon=...)`: waits while the recorded jobs that are due, or become due
  within `horizon` seconds, reach a final state (the runtime runs them as it always does: the
  clock, virtual under the fixture, carries them through retries, snoozes and delays), and
  returns them. Bounded twice: by the horizon, and by `max_steps` backend events, so a job that
  snoozes forever (even `Snooze(0)`, which never moves the clock) fails the test with its name
  (`DrainIncomplete`) instead of hanging it.
- `assert_enqueued` / `assert_not_enqueued` on that record, and `run_job`: enqueue one job and
  return its final `Job`.
- `check_at_least_once`: a handler must be idempotent, since it may run again after any of its
  checkpoints. The check runs it once cleanly and records `observe()`; then for each checkpoint
  k of that run it runs the job again, cancels the attempt as it reaches its k-th checkpoint
  (with the reason "shutdown", so the runtime gives the attempt back and runs the job again to
  completion, as after a redeploy), and compares `observe()` with the clean run. A checkpoint
  is a call the handler awaits that yields to Trio, counted once however many round trips the
  library makes inside it (`_checkpoint` says why). A trio `Instrument` follows the task
  running the handler, so no handler code changes; the failure names the checkpoint by the
  handler's file and line.

The test runtime is the `Runtime` that `open_runtime` built, its class switched to `TestRuntime`
(the same object: the context's enqueuer and the backend's listeners already point at it), so a
test's `rt` is typed and has `drain`, while production code has no test hook at all. Nothing
here spawns a task: the runtime runs the jobs; the kit only waits, reads and cancels.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import math
import os
import site
import sysconfig
from contextlib import asynccontextmanager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator, Mapping, NamedTuple, Sequence

import trio

from ._context import current_attempt, current_enqueuer
from .app import App, JobKind
from .backends import Backend, BackendEvent, NewJob
from .errors import ConfigError, DrainIncomplete, JobNotFound, NotIdempotent
from .execution.attempt import Attempt
from .infra.runner import instrumented
from .jobs import Job, JobId, JobState, decode_args
from .runtime import Runtime, open_runtime

__all__ = [
    "DEFAULT_HORIZON",
    "DrainIncomplete",
    "NotIdempotent",
    "TestRuntime",
    "assert_enqueued",
    "assert_not_enqueued",
    "check_at_least_once",
    "check_test_backend",
    "open_test_backend",
    "open_test_runtime",
    "run_job",
]

DEFAULT_HORIZON = 3_600.0
"""Seconds ahead `drain` and `run_job` follow jobs by default: an hour. On a `MockClock` an idle
virtual hour costs a few hundredths of a second (the runtime's services tick through it), so a
stuck job fails a test quickly; pass a longer horizon for longer backoffs."""
DEFAULT_MAX_STEPS = 10_000
"""Backend events (an attempt's outcome, an enqueue) a drain waits through at most."""
MAX_CHECKPOINTS = 1_000
"""Checkpoints `check_at_least_once` tries at most: one run of the job per checkpoint."""
_SHOWN = 20  # enqueued jobs a failure message lists


class TestRuntime(Runtime):
    """The runtime `open_test_runtime` yields (and the `runtime` fixture): a `Runtime` that
    records the jobs enqueued through it and can `drain`. Not built directly."""

    __test__ = False  # not a pytest test class
    enqueued: dict[int, NewJob]
    """Every job enqueued through this runtime, by id, in order (a unique enqueue that found an
    existing job adds nothing)."""
    _unreported: set[int]
    _events: int
    _changed: trio.Event

    @classmethod
    def adopt(cls, rt: Runtime) -> TestRuntime:
        rt.__class__ = cls
        assert isinstance(rt, TestRuntime)
        rt.enqueued = {}
        rt._unreported = set()
        rt._events = 0
        rt._changed = trio.Event()
        rt.backend.add_listener(rt._kit_event)
        return rt

    def _kit_event(self, event: BackendEvent) -> None:
        self._events += 1
        self._changed.set()

    async def insert(self, jobs: Sequence[NewJob]) -> list[JobId]:
        ids = await super().insert(jobs)
        self._record(jobs, ids)
        return ids

    def _record(self, jobs: Sequence[NewJob], ids: Sequence[JobId]) -> None:
        for job, job_id in zip(jobs, ids):
            if not job_id.existing:
                self.enqueued[int(job_id)] = job
                self._unreported.add(int(job_id))

    async def insert_tx(self, conn: Any, jobs: Sequence[NewJob]) -> list[JobId]:
        # Recorded at once: a job whose transaction rolls back is gone (`JobNotFound`) when a
        # drain reads it, and a drain skips it.
        ids = await super().insert_tx(conn, jobs)
        self._record(jobs, ids)
        return ids

    async def drain(self, *, horizon: float = DEFAULT_HORIZON, max_steps: int = DEFAULT_MAX_STEPS) -> list[Job]:
        """Wait while every recorded job that is due, or becomes due within `horizon` seconds,
        reaches a final state; return the recorded jobs that are final and were not returned by
        an earlier drain, by id.

        The runtime runs the jobs as usual; on a `MockClock` with autojump the retries, snoozes
        and delays inside the horizon pass at once. Jobs due later stay pending (a later drain
        returns them). Raises `DrainIncomplete`, naming each job still due, when the horizon
        passes or `max_steps` backend events went by (a job that snoozes or retries forever, a
        handler that never returns), and `ConfigError` for a bad bound.
        """
        finals = await self._settle(self._unreported, horizon, max_steps)
        self._unreported.difference_update(j.id for j in finals)
        return finals

    async def _settle(self, ids: set[int], horizon: float, max_steps: int) -> list[Job]:
        if isinstance(horizon, bool) or not isinstance(horizon, (int, float)) or not 0 <= horizon < math.inf:
            raise ConfigError(f"horizon must be a finite number of seconds >= 0, not {horizon!r}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ConfigError(f"max_steps must be an int >= 1, not {max_steps!r}")
        end = trio.current_time() + horizon
        due_by = self.backend.now() + horizon
        first_event = self._events
        finals: dict[int, Job] = {}
        gone: set[int] = set()
        touched: set[int] = set()  # due at some point of this drain: owed a final state
        first = True
        while True:
            self._changed = trio.Event()
            out_of_bounds = trio.current_time() >= end or self._events - first_event > max_steps
            if first or len(self.attempts) == 0 or out_of_bounds:
                # While an attempt runs here, work is due: the reads wait for a quiet moment.
                first = False
                due: list[Job] = []
                left: list[Job] = []
                for job_id in sorted(ids - finals.keys() - gone):
                    try:
                        job = await self.get_job(job_id)
                    except JobNotFound:  # deleted by retention: nothing left to wait for
                        gone.add(job_id)
                        continue
                    if job.state.final:
                        finals[job_id] = job
                    elif job.state is JobState.RUNNING or job.run_at <= due_by:
                        due.append(job)
                        touched.add(job_id)
                    elif job_id in touched:
                        left.append(job)  # ran, and comes back after the horizon
                if out_of_bounds or (not due and left):
                    raise DrainIncomplete(self._incomplete(due + left, horizon, self._events - first_event, max_steps))
                if not due:
                    return [finals[i] for i in sorted(finals)]
            if not self._changed.is_set():
                with trio.move_on_at(end):
                    await self._changed.wait()

    def _incomplete(self, due: list[Job], horizon: float, steps: int, max_steps: int) -> str:
        bound = f"after {steps} backend events (max_steps={max_steps})" if steps > max_steps else f"within the horizon of {horizon:g} s"
        now = self.backend.now()
        lines = [
            f"{len(due)} job(s) due during the drain did not reach a final state {bound}; "
            "a job that snoozes or retries forever, or a handler that never returns, keeps a drain from ending:"
        ]
        for job in due[:_SHOWN]:
            when = "" if job.state is JobState.RUNNING else f", due in {job.run_at - now:g} s" if job.run_at > now else ", due now"
            error = f", last error: {job.errors[-1].message}" if job.errors else ""
            lines.append(f"  job {job.id} {_call(job.kind, job.args)}: {job.state.value}, attempt {job.attempt}{when}{error}")
        if len(due) > _SHOWN:
            lines.append(f"  ... and {len(due) - _SHOWN} more")
        return "\n".join(lines)


def _call(kind: str, args: Mapping[str, Any]) -> str:
    return f"{kind}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


@asynccontextmanager
async def open_test_runtime(app: App, **options: Any) -> AsyncIterator[TestRuntime]:
    """`open_runtime(app, **options)` (the same keyword arguments: `backend`, `grace`, ...)
    yielding a `TestRuntime`: the record of enqueued jobs and `drain`, which the kit's other
    calls need. Run it on a `MockClock` with autojump
    (``trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))``), or use the
    `runtime` fixture, which does all of this."""
    async with open_runtime(app, **options) as rt:
        test_rt = TestRuntime.adopt(rt)
        try:
            yield test_rt
        finally:
            rt.backend.remove_listener(test_rt._kit_event)


def check_test_backend(spec: str) -> str:
    """`spec` if `open_test_backend` takes it, else `ConfigError` naming what it takes."""
    if not isinstance(spec, str) or not (
        spec in ("memory", "memory://", "sqlite", "sqlite://") or spec.startswith(("postgresql://", "postgres://"))
    ):
        raise ConfigError(f"test backend {spec!r} is not one of: memory, sqlite, a postgresql:// URL")
    return spec


@asynccontextmanager
async def open_test_backend(spec: str, folder: str | os.PathLike[str]) -> AsyncIterator[Backend]:
    """A fresh backend for one test, closed and removed afterwards. `spec`: ``memory`` (or
    ``memory://``); ``sqlite`` (a new file in `folder`); or a ``postgresql://`` URL (a new schema
    in that database, dropped afterwards).

    The durable backends run in their deterministic mode, as the project's own suites run them
    under virtual time: on the Trio clock, every database call made on the Trio thread (so
    ``MockClock(autojump_threshold=0)`` never jumps while a query runs), one process (no
    wake-up sockets, no LISTEN: every wake-up is delivered in-process). A service never runs
    this way; a test gets the durable backend's rows, statements and rules at memory's pace."""
    check_test_backend(spec)
    if spec in ("memory", "memory://"):
        from .backends.memory import MemoryBackend

        yield MemoryBackend()
        return
    backend: Backend
    drop: Callable[[], None] = lambda: None
    if spec in ("sqlite", "sqlite://"):
        from .backends.sqlite.backend import SqliteBackend

        class DeterministicSqlite(SqliteBackend):
            _blocking_io = True

        backend = DeterministicSqlite(str(Path(folder) / "nursery_jobs.db"), synchronous="NORMAL", clock=trio.current_time)
        backend.poll_interval = None
    else:
        import psycopg
        from psycopg import sql

        from .backends.postgres.backend import PostgresBackend
        from .backends.postgres.schema import migrate
        from .backends.postgres.url import parse_postgres_url

        class DeterministicPostgres(PostgresBackend):
            _blocking_io = True

            async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                task_status.started()  # no LISTEN: one process hears its own wake-ups
                await trio.sleep_forever()

        conninfo, opts = parse_postgres_url(spec)
        schema = opts["schema"] = f"nj_test_{os.getpid()}_{next(_schemas)}"
        migrate(conninfo, schema)

        def drop_schema() -> None:
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))

        drop = drop_schema

        opts["poll_interval"] = None
        backend = DeterministicPostgres(conninfo, **opts, clock=trio.current_time)
    try:
        yield backend
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            await backend.close()
        drop()


_schemas = itertools.count(1)


def _current(what: str) -> TestRuntime:
    rt = current_enqueuer.get()
    if not isinstance(rt, TestRuntime):
        raise ConfigError(
            f"{what} needs the test runtime in this context: use the `runtime` fixture "
            "(nursery_jobs' pytest plugin) or `async with nursery_jobs.testing.open_test_runtime(app) as rt:`"
            + ("" if rt is None else f" (this context has {rt!r})")
        )
    return rt


def _test_runtime(rt: Runtime, what: str) -> TestRuntime:
    if not isinstance(rt, TestRuntime):
        raise ConfigError(
            f"{what} reads the record of enqueued jobs that only the test runtime keeps: use the `runtime` "
            f"fixture or nursery_jobs.testing.open_test_runtime(app), not {rt!r}"
        )
    return rt


def _kind_name(kind: str | JobKind[Any, Any]) -> str:
    return kind if isinstance(kind, str) else kind.name


def _matches(rt: TestRuntime, kind: str | JobKind[Any, Any], args: Mapping[str, Any]) -> list[JobId]:
    name = _kind_name(kind)
    found = []
    for job_id, new in rt.enqueued.items():
        if new.kind == name:
            stored = decode_args(new.args_json)
            if all(k in stored and stored[k] == v for k, v in args.items()):
                found.append(JobId(job_id))
    return found


def _enqueued_text(rt: TestRuntime) -> str:
    if not rt.enqueued:
        return "nothing was enqueued"
    items = list(rt.enqueued.items())
    shown = [f"  job {i}: {_call(new.kind, decode_args(new.args_json))}" for i, new in items[-_SHOWN:]]
    more = [f"  ({len(items) - _SHOWN} earlier jobs not shown)"] if len(items) > _SHOWN else []
    return "enqueued instead:\n" + "\n".join(more + shown)


def assert_enqueued(rt: Runtime, kind: str | JobKind[Any, Any], /, **args: Any) -> JobId:
    """Assert that a job of `kind` (the kind or its name) was enqueued through `rt` with these
    args (args not named here may be anything); return the first such job's id. The failure
    lists what was enqueued instead."""
    test_rt = _test_runtime(rt, "assert_enqueued")
    found = _matches(test_rt, kind, args)
    if not found:
        raise AssertionError(f"no job {_call(_kind_name(kind), args)} was enqueued; {_enqueued_text(test_rt)}")
    return found[0]


def assert_not_enqueued(rt: Runtime, kind: str | JobKind[Any, Any], /, **args: Any) -> None:
    """Assert that no job of `kind` with these args (args not named here may be anything; none
    named: any job of the kind) was enqueued through `rt`. The failure names the jobs found."""
    test_rt = _test_runtime(rt, "assert_not_enqueued")
    found = _matches(test_rt, kind, args)
    if found:
        jobs = ", ".join(f"job {i}: {_call(test_rt.enqueued[i].kind, decode_args(test_rt.enqueued[i].args_json))}" for i in found[:_SHOWN])
        raise AssertionError(f"{len(found)} job(s) matching {_call(_kind_name(kind), args)} were enqueued: {jobs}")


async def run_job(kind: str | JobKind[Any, Any], /, **args: Any) -> Job:
    """Enqueue one job of `kind` on the test runtime of this context, follow it to a final state
    (through its retries and snoozes, within `DEFAULT_HORIZON`), and return it. Raises
    `DrainIncomplete` if it does not get there (the message says where it is), `ConfigError`
    outside a test runtime."""
    rt = _current("run_job")
    job_id = await rt.enqueue(kind, args)
    await rt._settle({int(job_id)}, DEFAULT_HORIZON, DEFAULT_MAX_STEPS)
    return await rt.get_job(job_id)


# -- at least once --


class _Checkpoint(NamedTuple):
    """One checkpoint of a handler's run: one call the handler (or code of yours it called)
    awaited that yielded to Trio, however many times it yielded inside."""

    where: str
    """``file:line in handler``, and the innermost frame of your code below it."""
    call: str
    """The library call it waited in (``psycopg.connection_async.AsyncConnection.execute``)."""


class _Probe(trio.abc.Instrument):
    """Follows the task running the first attempt of one new job of `kind`: records its
    checkpoints, and cuts the attempt at the first yield of its `cut`-th one, or as its handler
    returns (`at_return`: the kit's wrapper around the handler calls `returned`)."""

    def __init__(self, rt: TestRuntime, kind: JobKind[Any, Any], old: set[int], cut: int | None, at_return: bool) -> None:
        self.rt = rt
        self.kind = kind.name
        self.code = _code_of(kind.fn)
        self.old = old
        self.cut = cut
        self.at_return = at_return
        self.task: trio.lowlevel.Task | None = None
        self.attempt: Attempt | None = None
        self.steps: list[_Checkpoint] = []
        self._waiting_in: object = None  # the frame of the call the last checkpoint waited in
        self.done = False

    def _ours(self, task: trio.lowlevel.Task) -> bool:
        running = task.context.get(current_attempt)
        if running is None:
            return False
        job_id = running.job.id
        attempt = self.rt.attempts.get(job_id)
        if self.task is None:
            if attempt is None or attempt.job.kind != self.kind or attempt.job.attempt != 1 or job_id in self.old:
                return False
            self.task, self.attempt = task, attempt
        return task is self.task and attempt is self.attempt

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.done or not self._ours(task):
            return
        waiting_in, step = _checkpoint(task, self.code)
        if waiting_in is not None and waiting_in is self._waiting_in:
            return  # the same call yielded again: its own I/O, not a step of the handler
        self._waiting_in = waiting_in
        self.steps.append(step)
        if len(self.steps) == self.cut:
            self._cut()

    def returned(self) -> None:
        if self.at_return and not self.done and self._ours(trio.lowlevel.current_task()):
            self._cut()

    def _cut(self) -> None:
        self.done = True
        assert self.attempt is not None
        self.attempt.cancel("shutdown")


@contextmanager
def _on_return(rt: TestRuntime, kind: str, hook: Callable[[], None]) -> Iterator[None]:
    """Every attempt of `kind` calls `hook` as its handler returns, for the block: the one
    moment the runtime has not yet taken its outcome (it does without a checkpoint)."""
    runner = rt.runners[kind]
    inner = runner.call

    async def call(ctx: Any, args: dict[str, Any]) -> Any:
        result = await inner(ctx, args)
        hook()
        return result

    rt.runners[kind] = runner._replace(call=call)
    try:
        yield
    finally:
        rt.runners[kind] = runner


def _code_of(fn: Callable[..., Any]) -> Any:
    return getattr(inspect.unwrap(fn), "__code__", None)


def _dirs(*paths: str) -> tuple[str, ...]:
    return tuple(sorted({os.path.join(p, "") for p in paths if p}))


_PACKAGES = _dirs(
    *(sysconfig.get_paths()[name] for name in ("purelib", "platlib")),
    *getattr(site, "getsitepackages", list)(),
    site.getusersitepackages(),
)
"""Where installed packages live (psycopg, an HTTP client)."""
_STDLIB = _dirs(os.path.dirname(inspect.__file__))
_TRIO = _dirs(os.path.dirname(trio.__file__))
_LIBRARY = _STDLIB + _PACKAGES + _TRIO + _dirs(os.path.dirname(__file__))
"""Where library code lives: the standard library, installed packages, trio and nursery_jobs.
Any other frame is your code."""


def _plumbing(filename: str) -> bool:
    """The standard library's or trio's: what a call waits through, not what it is (`_call_name`)."""
    return filename.startswith(_TRIO) or (filename.startswith(_STDLIB) and not filename.startswith(_PACKAGES))


def _shown(path: str) -> str:
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _checkpoint(task: trio.lowlevel.Task, code: Any) -> tuple[object | None, _Checkpoint]:
    """Where `task` waits: the frame of the call that your deepest frame awaits (all yields
    inside that call are one checkpoint), and that checkpoint.

    A checkpoint is a call, not a yield, because a library call yields once per round trip, and
    how many it takes is the library's business: the first run of a statement may prepare it,
    the pool may open a connection or replace one the server closed. Counting yields made a
    deterministic handler take "another path" whenever the library took another round trip."""
    frames = list(task.iter_await_frames())
    yours = [i for i, (frame, _) in enumerate(frames) if frame.f_code is code or not frame.f_code.co_filename.startswith(_LIBRARY)]
    if not yours:
        return None, _Checkpoint("(no frame of the handler or of your code on the stack)", "")
    deepest = yours[-1]
    below = frames[deepest + 1 :]
    waiting_in = below[0][0] if below else None  # yielded in your own code: a checkpoint each time
    at = [i for i in yours if frames[i][0].f_code is code]
    if at:
        frame, line = frames[at[-1]]
        where = f"{_shown(frame.f_code.co_filename)}:{line} in {frame.f_code.co_name}"
    else:
        where = "(no frame of the handler on the stack)"
    if not at or deepest != at[-1]:
        frame, line = frames[deepest]
        where += f" (innermost: {_shown(frame.f_code.co_filename)}:{line} in {frame.f_code.co_qualname})"
    return waiting_in, _Checkpoint(where, _call_name(below))


def _call_name(frames: Sequence[tuple[Any, int]]) -> str:
    """The library function a checkpoint waits in, named past the standard library's and
    trio's plumbing (``contextlib``'s ``__aenter__``) when a package of its own is below it."""
    if not frames:
        return "(no call)"
    named = [f for f, _ in frames if not _plumbing(f.f_code.co_filename)]
    frame = named[0] if named else frames[0][0]
    return f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_qualname}"


def _path_difference(clean: list[_Checkpoint], probe: _Probe) -> str | None:
    """How the run `probe` followed left the clean run's path up to its cut, or None."""
    wanted = clean if probe.cut is None else clean[: probe.cut]
    seen = probe.steps
    for i, (was, now) in enumerate(zip(wanted, seen), 1):
        if was != now:
            return (
                f"its checkpoint {i} was {now.where}, waiting in {now.call}, where the clean run's is "
                f"{was.where}, waiting in {was.call}"
            )
    if len(seen) > len(wanted):
        extra = seen[len(wanted)]
        return f"it had a checkpoint after the clean run's last one: {extra.where}, waiting in {extra.call}"
    if probe.done:
        return None
    if len(seen) < len(wanted):
        missed = wanted[len(seen)]
        return (
            f"its run ended after {len(seen)} checkpoint(s), before the clean run's checkpoint {len(seen) + 1}, "
            f"{missed.where}, waiting in {missed.call}"
        )
    return "its handler did not return after its last checkpoint, as in the clean run (it raised, or was cut otherwise)"


async def _call_user(fn: Callable[[], Any]) -> Any:
    result = fn()
    if inspect.isawaitable(result):
        result = await result
    return result


async def check_at_least_once(
    kind: str | JobKind[Any, Any],
    args: Mapping[str, Any],
    *,
    observe: Callable[[], Any],
    reset: Callable[[], Any] | None = None,
    horizon: float = DEFAULT_HORIZON,
) -> int:
    """Check that a job of `kind` with `args` has the same effects however its deliveries are cut.

    Runs the job once to completion on the test runtime of this context and records
    ``observe()`` (a function, or an async one, returning the effects to compare: a copy of your
    fake's rows, the emails sent; it is deep-copied). Then for each checkpoint k of that run
    (each call the handler, or code of yours below it, awaited that yielded to Trio: one
    checkpoint however many round trips the call took inside the library), and once more after
    its last checkpoint (the handler returns, its outcome is not kept: a worker that died just
    then), it runs the job again, cuts that attempt there as a shutdown would (Cancelled at the
    call's first yield, the attempt given back), lets the runtime run the job again to
    completion, and compares ``observe()`` with the clean run. Only the handler's own task is
    counted: child tasks of ``ctx.children()`` are cut with it, wherever they are.

    `reset`, called (or awaited) before every run, puts your fakes back to the start so each run
    is judged on its own; without it each run starts from what the previous ones left, as
    repeated deliveries do (then only the first difference is reported: the next ones would be
    judged against effects already wrong). Between runs the runtime is drained (`rt.drain`).

    Returns the number of interruptions tried. Raises `NotIdempotent` naming each checkpoint
    (``file:line in handler``, and the innermost user frame below it) where the effects differ,
    with both observations; AssertionError when the clean run itself does not complete, or when
    a run after `reset` takes another path than the clean one (naming the first checkpoint that
    differs: where in the handler, and the call it waited in).
    """
    rt = _current("check_at_least_once")
    job_kind = kind if isinstance(kind, JobKind) else rt.app.kind(kind)
    args = dict(args)

    async def deliver(cut: int | None, at_return: bool = False) -> tuple[Job, _Probe]:
        await rt.drain(horizon=horizon)  # what earlier runs left, before the fakes are reset
        if reset is not None:
            await _call_user(reset)
        probe = _Probe(rt, job_kind, set(rt.enqueued), cut, at_return)
        with instrumented(probe), _on_return(rt, job_kind.name, probe.returned) if at_return else nullcontext():
            job_id = await rt.enqueue(job_kind, args)
            await rt.drain(horizon=horizon)
        return await rt.get_job(job_id), probe

    clean, probe = await deliver(None)
    if clean.state is not JobState.COMPLETED:
        error = f": {clean.errors[-1].message}" if clean.errors else ""
        raise AssertionError(
            f"the clean run of {_call(job_kind.name, args)} ended {clean.state.value}{error}; "
            "check_at_least_once compares runs of a job that completes"
        )
    expected = copy.deepcopy(await _call_user(observe))
    steps = probe.steps
    if len(steps) > MAX_CHECKPOINTS:
        raise ConfigError(
            f"{job_kind.name} reached {len(steps)} checkpoints in one run, over {MAX_CHECKPOINTS}: check it with "
            "args that make a shorter run (each checkpoint costs a run)"
        )
    trials: list[tuple[int | None, bool, str]] = [
        (k, False, f"at checkpoint {k} of {len(steps)}, {steps[k - 1].where}") for k in range(1, len(steps) + 1)
    ]
    if steps:
        trials.append((None, True, f"after the last checkpoint ({steps[-1].where}): the handler returned, its outcome was not kept"))
    failures = []
    for cut, at_return, label in trials:
        job, probe = await deliver(cut, at_return)
        if reset is not None:
            # From the same start the run must take the same path; without reset, a run that
            # finds the work done and yields less is what a repeated delivery does.
            differs = _path_difference(steps, probe)
            if differs is not None:
                raise AssertionError(
                    f"{_call(job_kind.name, args)} took another path than its clean run, so it could not be cut "
                    f"{label}: {differs}. check_at_least_once needs a handler that takes the same path on every "
                    "run with the same args and fakes: pass reset= and have it put back everything the handler reads"
                )
        if job.state is not JobState.COMPLETED:
            error = f": {job.errors[-1].message}" if job.errors else ""
            failures.append(f"interrupted {label}\n    then the job ended {job.state.value}{error}")
        else:
            seen = copy.deepcopy(await _call_user(observe))
            if seen != expected:
                failures.append(f"interrupted {label}\n    clean run observed: {expected!r}\n    this run observed:  {seen!r}")
        if failures and reset is None:
            break
    if failures:
        raise NotIdempotent(
            f"{_call(job_kind.name, args)} is not idempotent: run again after an interruption, its effects differ "
            f"from one clean run ({len(failures)} of {len(trials)} interruptions):\n  " + "\n  ".join(failures)
        )
    return len(trials)
