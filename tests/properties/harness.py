"""The property harness: scripted jobs drawn as data, one fresh `trio.run` per example, and the
command loop that drives the runtime and the reference model side by side: commands drawn one at
a time from `st.data()` inside the one `trio.run`, each depending on the model's current state
(Hypothesis has no async stateful testing, and a draw is a plain sync call a Trio task can make).

One example (`Example.run`) is:

- a fresh `App` whose kinds run *scripted* handlers: each execution looks up its `Step` (sleep,
  children, then return / raise / snooze / discard, or hang) and records `start` and `end` with
  `trio.current_time()`, the attempt and the execution number into `World.history`;
- a fresh `MockClock(autojump_threshold=0)` (virtual time jumps to the next deadline whenever
  every task is blocked), a fresh `TaskAudit` instrument, a fresh `HarnessBackend`;
- a driver task that opens the runtime, draws commands from `st.data()` that depend on the
  model's state (enqueue, burst, advance, cancel, wait, shutdown + restart), applies each to the
  runtime and to the model, and then waits for quiescence (`wait_all_tasks_blocked`, which never
  lets autojump move the clock) before checking;
- at every quiescent point the ambient invariants (audit violations, P01; the job tasks found
  by walking the task tree are exactly the running attempts, P02) and the property's own checks;
- at the end, a drain (run everything the model still expects to run, cancelling hung jobs),
  shutdown, and the exit invariants: the live set is the baseline again (P02).

Property tests request no pytest fixtures and build everything inside the example.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Awaitable, Callable

import attrs

import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st

import nursery_jobs as nj
from tests.properties.faults import NO_FAULTS, Faults
from nursery_jobs.backends import JobFinalized, JobsAvailable, OutcomeKind

from .audit import PropertyFailed, TaskAudit, context_job, expect, walk_tree
from .model import DISCARD, HANG, HANG_S, OK, RAISE, SNOOZE, JobSpec, Model, QueueSpec, Step

FLUSH_BOUND = 3.375
CLEANUP_BOUND = 1.0
DRAIN_HORIZON = 1000.0
PROBE_QUEUE = "probe"


def examples(n: int) -> int:
    """A per-test example budget, scaled by the loaded profile (`ci` = 100 -> n as written)."""
    assert settings.default is not None
    return max(1, n * settings.default.max_examples // 100)


class ScriptedError(Exception):
    """What a scripted `raise` step raises."""


class UnseededRetry(nj.RetryPolicy):
    """P15's mutant: jitter from the OS's entropy instead of the runtime's seeded RNG."""

    def delay(self, attempt: int, rng: random.Random) -> float:
        return super().delay(attempt, random.SystemRandom())


class _SystemChildren:
    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None) -> None:
        trio.lowlevel.spawn_system_task(fn, *args, name=name)


@contextlib.asynccontextmanager
async def _system_children() -> AsyncIterator[_SystemChildren]:
    yield _SystemChildren()


class _Spawner:
    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any, name: str | None = None) -> None:
        self._nursery.start_soon(fn, *args, name=name)


class _OtherChildren:
    """An attempt handle whose `ctx.children()` is another scope's: the mutants' context."""

    def __init__(self, attempt: Any, open_children: Callable[[], Any]) -> None:
        self._attempt = attempt
        self.open_children = open_children

    def __getattr__(self, name: str) -> Any:
        return getattr(self._attempt, name)


async def _children_as_system_tasks(ctx: nj.JobContext, call_next: Callable[[nj.JobContext], Awaitable[Any]]) -> Any:
    """P01's mutant: `ctx.children()` spawns Trio system tasks, outside every scope."""
    return await call_next(nj.JobContext(ctx.args, ctx.deadline, _OtherChildren(ctx._attempt, _system_children)))


async def _children_outside_the_attempt(ctx: nj.JobContext, call_next: Callable[[nj.JobContext], Awaitable[Any]]) -> Any:
    """P02's mutant: `ctx.children()` spawns into a scope around the handler, not the attempt's:
    the children outlive the handler's body (still inside the runtime's tree)."""
    async with trio.open_nursery() as outer:

        @contextlib.asynccontextmanager
        async def escaping() -> AsyncIterator[_Spawner]:
            yield _Spawner(outer)

        return await call_next(nj.JobContext(ctx.args, ctx.deadline, _OtherChildren(ctx._attempt, escaping)))


class BackendCrash(nj.BackendUnavailable):
    """What `HarnessBackend.finish_many` raises on its `crash_at`-th call (P11): the backend
    failing, which must stop the runtime. (Any other exception from `finish_many` is taken for
    content the backend refused: the completer isolates it and writes the rest.)"""


def first_property_failure(exc: BaseException) -> PropertyFailed | None:
    if isinstance(exc, PropertyFailed):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = first_property_failure(inner)
            if found is not None:
                return found
    return None


# -- the scripted world --


class World:
    """The app with scripted kinds, one per queue, and everything they record."""

    def __init__(
        self,
        queues: list[QueueSpec],
        audit: TaskAudit,
        *,
        jitter: float = 0.0,
        probe: bool = False,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.audit = audit
        self.queues = {q.name: q for q in queues}
        self.app = app = nj.App()
        # App-side mutants: the app the harness declares differs from the spec the model reads.
        extra_worker = 1 if faults.pool_off_by_one else 0
        retry = UnseededRetry if faults.unseeded_jitter else nj.RetryPolicy
        for q in queues:
            # The reference model starts the best due job whenever a worker frees; a queue that
            # claims ahead picks it at claim time (tests/unit/test_claim_ahead.py holds that).
            app.queue(q.name, max_workers=q.max_workers + extra_worker, timeout=q.timeout, claim_ahead=False)
            policy = retry(base=q.retry_base, factor=q.retry_factor, cap=100.0, jitter=jitter)
            app.job(queue=q.name, name=q.kind, max_attempts=q.max_attempts, retry=policy)(self._handler())
        if faults.system_task_children:
            app.middleware(_children_as_system_tasks)
        if faults.children_in_queue_scope:
            app.middleware(_children_outside_the_attempt)
        if probe:
            app.queue(PROBE_QUEUE, max_workers=1, timeout=None)
            app.job(queue=PROBE_QUEUE, name="probe")(self._probe())
        self.specs: dict[int, JobSpec] = {}
        self.id_of: dict[int, int] = {}
        self.n_of: dict[int, int] = {}
        self.execs: dict[int, int] = {}
        self.history: list[tuple[Any, ...]] = []
        self.running: dict[int, int] = {}
        self.in_queue: dict[str, int] = {}
        self.max_in_queue: dict[str, int] = {}
        self.finals: list[tuple[float, int, nj.JobState]] = []
        self.probes_run: list[int] = []

    def add(self, spec: JobSpec) -> int:
        n = len(self.specs)
        self.specs[n] = spec
        return n

    def accept(self, job_id: int, n: int) -> None:
        self.id_of[n] = job_id
        self.n_of[job_id] = n

    def starts(self) -> list[tuple[float, int, int, int]]:
        """(time, n, attempt, execution) of every attempt that started, in order."""
        return [(e[0], e[3], e[4], e[5]) for e in self.history if e[1] == "start"]

    def ends(self) -> list[tuple[float, int, int, int, str]]:
        """(time, n, attempt, execution, how) of every attempt that ended, in order."""
        return [(e[0], e[3], e[4], e[5], e[6]) for e in self.history if e[1] == "end"]

    def on_backend_event(self, event: Any) -> None:
        if isinstance(event, JobFinalized) and event.state is not None:
            now = trio.current_time()
            self.finals.append((now, event.job_id, event.state))
            self.history.append((now, "final", event.job_id, self.n_of.get(event.job_id), event.state))
            leftover = self.audit.live_for_job(event.job_id)
            if leftover:
                self.audit.record(
                    "P02", f"job {event.job_id} was recorded {event.state.value} at t={now} with live tasks {leftover}"
                )

    def _handler(self) -> Callable[..., Awaitable[None]]:
        async def scripted(ctx: nj.JobContext, n: int) -> None:
            await self._run_step(ctx, n)

        return scripted

    def _probe(self) -> Callable[..., Awaitable[None]]:
        async def probe(ctx: nj.JobContext, n: int) -> None:
            self.probes_run.append(ctx.id)

        return probe

    async def _run_step(self, ctx: nj.JobContext, n: int) -> None:
        spec = self.specs[n]
        k = self.execs.get(ctx.id, 0)
        self.execs[ctx.id] = k + 1
        step = spec.step(k)
        me = trio.lowlevel.current_task()
        self.history.append((trio.current_time(), "start", ctx.id, n, ctx.attempt, k))
        self.running[ctx.id] = n
        count = self.in_queue[ctx.queue] = self.in_queue.get(ctx.queue, 0) + 1
        self.max_in_queue[ctx.queue] = max(self.max_in_queue.get(ctx.queue, 0), count)
        how = "returned"
        try:
            try:
                async with ctx.children() as tasks:
                    for i, d in enumerate(step.children):
                        tasks.spawn(trio.sleep, d, name=f"child-{n}.{k}.{i}")
                    await trio.sleep(HANG_S if step.outcome == HANG else step.duration)
                if step.outcome == RAISE:
                    raise ScriptedError(f"job {n} execution {k}")
                if step.outcome == SNOOZE:
                    raise nj.Snooze(step.snooze)
                if step.outcome == DISCARD:
                    raise nj.Discard(f"job {n} execution {k} discarded")
            except BaseException as exc:
                how = type(exc).__name__
                raise
        finally:
            # cleanup: shielded (a cancelled job still runs it) and bounded (it cannot hang
            # the shutdown)
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_BOUND):
                await trio.sleep(0)
            now = trio.current_time()
            leftover = self.audit.live_for_job(ctx.id, exclude=me)
            if leftover:
                self.audit.record("P02", f"job {ctx.id} attempt {ctx.attempt} ended at t={now} with live tasks {leftover}")
            self.in_queue[ctx.queue] -= 1
            del self.running[ctx.id]
            self.history.append((now, "end", ctx.id, n, ctx.attempt, k, how))


class _Harness:
    """What the harness adds to a backend: optionally a claim that answers after a checkpoint
    (the round trip of a durable backend: inserts can land while a claim is in flight) and a
    `finish_many` that crashes on its `crash_at`-th call (a runtime service crash, P11)."""

    claim_yields: bool
    crash_at: int | None
    finish_calls: int
    crashed: BackendCrash | None

    def _harness(self, world: World, claim_yields: bool, crash_at: int | None) -> None:
        self.claim_yields = claim_yields
        self.crash_at = crash_at
        self.finish_calls = 0
        self.crashed = None
        self.add_listener(world.on_backend_event)  # type: ignore[attr-defined]

    async def claim(self, queue: str, limit: int) -> Any:
        result = await super().claim(queue, limit)  # type: ignore[misc]
        if self.claim_yields:
            await trio.lowlevel.cancel_shielded_checkpoint()
        return result

    async def finish_many(self, outcomes: Any) -> None:
        self.finish_calls += 1
        if self.finish_calls == self.crash_at:
            self.crashed = BackendCrash(f"finish_many call {self.finish_calls} failed")
            raise self.crashed
        await super().finish_many(outcomes)  # type: ignore[misc]


class HarnessBackend(_Harness, nj.MemoryBackend):
    """The memory backend, with the harness's additions, and the backend-side mutants: each
    a planted bug in what the runtime asks of its backend, or in how the runtime reacts to it."""

    def __init__(
        self, world: World, *, faults: Faults = NO_FAULTS, claim_yields: bool = False, crash_at: int | None = None
    ) -> None:
        nj.MemoryBackend.__init__(self)
        self._harness(world, claim_yields, crash_at)
        self.faults = faults
        self._claiming: set[str] = set()
        self._lied: set[int] = set()

    async def insert_many(self, jobs: Any, bounds: Any = None) -> Any:
        if self.faults.invert_priority:  # P08: lower priority runs first
            jobs = [job._replace(priority=-job.priority) for job in jobs]
        results = await nj.MemoryBackend.insert_many(self, jobs, bounds)
        if self.faults.enqueue_checkpoint_after_insert:  # P14: a cancel can land after the insert
            await trio.lowlevel.checkpoint()
        return results

    async def claim(self, queue: str, limit: int) -> Any:
        self._claiming.add(queue)
        try:
            return await _Harness.claim(self, queue, limit)
        finally:
            self._claiming.discard(queue)

    def _dropped(self, event: Any) -> bool:
        # P06: a wake-up landing during a claim is forgotten (a fetch cooldown)
        return self.faults.drop_wakeup_during_fetch and isinstance(event, JobsAvailable) and event.queue in self._claiming

    def _emit(self, event: Any) -> None:
        if not self._dropped(event):
            nj.MemoryBackend._emit(self, event)

    def _emit_all(self, events: list[Any]) -> None:
        nj.MemoryBackend._emit_all(self, [e for e in events if not self._dropped(e)])

    async def finish_many(self, outcomes: Any) -> None:
        faults = self.faults
        if faults.completer_drops_batch and len(outcomes) > 1:
            return  # P03: a batch of more than one outcome is lost
        if faults.swallow_service_errors:
            try:
                await _Harness.finish_many(self, outcomes)
            except BackendCrash:
                return  # P11: the crash is logged somewhere and swallowed
            return
        if faults.snooze_counts_attempt or faults.outcome_from_exception_type:
            outcomes = [self._mutated(o) for o in outcomes]
        await _Harness.finish_many(self, outcomes)

    def _mutated(self, out: Any) -> Any:
        row = self._rows.get(out.job_id)
        if row is None:
            return out
        now = self.now()
        spent = out.attempt >= row.max_attempts
        if self.faults.snooze_counts_attempt and out.kind is OutcomeKind.SNOOZE:  # P04
            error = nj.JobError(out.attempt, now, f"snoozed until {out.run_at}")
            return out._replace(kind=OutcomeKind.DISCARD if spent else OutcomeKind.RETRY, error=error)
        if self.faults.outcome_from_exception_type and out.kind in (OutcomeKind.CANCELLED, OutcomeKind.INTERRUPTED):
            # P09: any cancellation of an attempt taken for a timeout
            error = nj.JobError(out.attempt, now, "timed out")
            return out._replace(kind=OutcomeKind.DISCARD if spent else OutcomeKind.RETRY, run_at=now, error=error)
        return out

    async def cancel(self, job_id: int) -> nj.JobState:
        row = self._rows.get(job_id)
        if self.faults.late_cancel_overwrites and row is not None and row.state.final:
            if row.state is not nj.JobState.CANCELLED:  # P10: a late cancel overwrites the outcome
                self._move(row, self._q(row.queue), nj.JobState.CANCELLED)
            return row.state
        return await nj.MemoryBackend.cancel(self, job_id)

    async def get_job(self, job_id: int) -> nj.Job:
        job = await nj.MemoryBackend.get_job(self, job_id)
        if self.faults.wait_misses_recorded and job.state.final and job_id not in self._lied:
            # P07: the first read of a final job sees it still running, so a receipt waiter on
            # a job already final waits for a finalization that was recorded before it listened
            self._lied.add(job_id)
            return attrs.evolve(job, state=nj.JobState.RUNNING)
        return job


class _Forward:
    """A backend made of another: every protocol call goes to `inner`, unchanged (no
    checkpoint added), so `_Harness` can wrap any registered backend."""

    def __init__(self, inner: nj.Backend) -> None:
        self.inner = inner
        self.url = inner.url
        self.poll_interval = inner.poll_interval
        self.never_yields = inner.never_yields

    def now(self) -> float:
        return self.inner.now()

    def wall_offset(self) -> float:
        return self.inner.wall_offset()

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    def check_budget(self, workers: int) -> None:
        self.inner.check_budget(workers)

    async def insert_many(self, jobs: Any, bounds: Any = None) -> Any:
        return await self.inner.insert_many(jobs, bounds)

    async def claim(self, queue: str, limit: int, *, max_running: int | None = None) -> Any:
        return await self.inner.claim(queue, limit, max_running=max_running)

    async def finish_many(self, outcomes: Any) -> None:
        await self.inner.finish_many(outcomes)

    async def cancel(self, job_id: int) -> nj.JobState:
        return await self.inner.cancel(job_id)

    async def heartbeat(self, running: Any) -> Any:
        return await self.inner.heartbeat(running)

    async def rescue(self, stale_before: float) -> list[int]:
        return await self.inner.rescue(stale_before)

    async def delete_finished(self, before: Any, limit: int) -> int:
        return await self.inner.delete_finished(before, limit)

    async def get_job(self, job_id: int) -> nj.Job:
        return await self.inner.get_job(job_id)

    async def stats(self) -> Any:
        return await self.inner.stats()

    def add_listener(self, listener: Any) -> None:
        self.inner.add_listener(listener)

    def remove_listener(self, listener: Any) -> None:
        self.inner.remove_listener(listener)

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        await self.inner.serve(task_status=task_status)


class WrappedHarnessBackend(_Harness, _Forward):
    """A registered backend (`tests/registry.py`, its `harness` build: a fresh store per
    example, calls on the Trio thread, Trio's virtual clock) with the harness's additions."""

    def __init__(self, world: World, inner: nj.Backend, *, claim_yields: bool = False, crash_at: int | None = None) -> None:
        _Forward.__init__(self, inner)
        self._harness(world, claim_yields, crash_at)


@dataclass(frozen=True)
class Store:
    """Which backend an example runs on: memory (the harness's own `HarnessBackend`, where the
    mutants are planted), or a registered backend built by its `harness` function."""

    name: str = "memory"
    build: Callable[[], nj.Backend] | None = None

    def backend(self, world: World, faults: Faults, claim_yields: bool, crash_at: int | None) -> Any:
        if self.build is None:
            return HarnessBackend(world, faults=faults, claim_yields=claim_yields, crash_at=crash_at)
        assert faults == NO_FAULTS, "mutants are planted in the memory backend only"
        return WrappedHarnessBackend(world, self.build(), claim_yields=claim_yields, crash_at=crash_at)


MEMORY = Store()


# -- strategies: scripted jobs are data, not code --


@dataclass(frozen=True)
class Config:
    """What an example may draw. Each property test narrows or weights it."""

    queues: tuple[int, int] = (1, 2)
    max_workers: tuple[int, int] = (1, 3)
    timeouts: bool | None = None
    """None: a queue may have a timeout; True: every queue has one; False: none has."""
    max_attempts: tuple[int, int] = (1, 3)
    outcomes: tuple[str, ...] = (OK, OK, RAISE, SNOOZE, DISCARD, HANG)
    last_outcomes: tuple[str, ...] = (OK, OK, RAISE, DISCARD, HANG)
    max_steps: int = 3
    max_duration: int = 4
    max_children: int = 2
    max_child: int = 5
    priorities: tuple[int, int] = (0, 2)
    max_delay: int = 4
    commands: tuple[int, int] = (3, 20)
    max_advance: int = 4
    weights: tuple[tuple[str, int], ...] = (("advance", 4), ("enqueue", 4), ("burst", 1), ("cancel", 1))
    claim_yields: bool | None = None
    max_waiters: tuple[int, int] = (1, 3)
    graces: tuple[int, int] = (0, 3)
    skip: bool = True
    probe_submitters: bool = False
    crash: bool = False
    crash_at: tuple[int, int] = (1, 4)
    jitter: float = 0.0

    def but(self, **changes: Any) -> Config:
        return replace(self, **changes)


@functools.lru_cache(maxsize=None)
def ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


@functools.lru_cache(maxsize=None)
def choice(options: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    return st.sampled_from(options)


@functools.lru_cache(maxsize=None)
def queue_st(cfg: Config, i: int) -> st.SearchStrategy[QueueSpec]:
    timeout: st.SearchStrategy[float | None] = st.integers(1, 4).map(lambda k: k + 0.5)
    if cfg.timeouts is None:
        timeout = st.none() | timeout
    elif not cfg.timeouts:
        timeout = st.none()
    return st.builds(
        QueueSpec,
        name=st.just(f"q{i}"),
        max_workers=st.integers(*cfg.max_workers),
        timeout=timeout,
        max_attempts=st.integers(*cfg.max_attempts),
        retry_base=st.integers(1, 3),
        retry_factor=st.integers(1, 2),
    )


@functools.lru_cache(maxsize=None)
def queues_st(cfg: Config) -> st.SearchStrategy[list[QueueSpec]]:
    return st.lists(queue_st(cfg, 0), min_size=cfg.queues[0], max_size=cfg.queues[1]).map(
        lambda qs: [replace(q, name=f"q{i}") for i, q in enumerate(qs)]
    )


@functools.lru_cache(maxsize=None)
def step_st(cfg: Config, last: bool) -> st.SearchStrategy[Step]:
    return st.builds(
        Step,
        duration=st.integers(0, cfg.max_duration),
        outcome=st.sampled_from(cfg.last_outcomes if last else cfg.outcomes),
        snooze=st.integers(1, 3),
        children=st.lists(st.integers(0, cfg.max_child), max_size=cfg.max_children).map(tuple),
    )


@functools.lru_cache(maxsize=None)
def steps_st(cfg: Config) -> st.SearchStrategy[tuple[Step, ...]]:
    return st.tuples(st.lists(step_st(cfg, False), max_size=cfg.max_steps - 1), step_st(cfg, True)).map(
        lambda t: (*t[0], t[1])
    )


@functools.lru_cache(maxsize=None)
def spec_st(cfg: Config, queues: tuple[str, ...]) -> st.SearchStrategy[JobSpec]:
    return st.builds(
        JobSpec,
        queue=st.sampled_from(queues),
        steps=steps_st(cfg),
        delay=st.integers(0, cfg.max_delay) if cfg.max_delay else st.just(0),
        priority=st.integers(*cfg.priorities),
    )


@functools.lru_cache(maxsize=None)
def burst_st(cfg: Config, queues: tuple[str, ...]) -> st.SearchStrategy[list[JobSpec]]:
    """Jobs enqueued back to back without waiting in between: the fetcher's claims interleave
    with the inserts (P06). One queue, one priority, due now -- so any interleaving starts the
    same jobs and the model stays exact."""
    return st.tuples(
        st.sampled_from(queues),
        st.integers(*cfg.priorities),
        st.lists(steps_st(cfg), min_size=2, max_size=4),
    ).map(lambda t: [JobSpec(t[0], steps, 0, t[1]) for steps in t[2]])


SKIP_ST = st.none() | st.integers(0, 3).map(lambda k: k + 0.125)
BOOLS = st.booleans()

# -- the driver --


@dataclass
class WaitRecord:
    n: int
    job_id: int
    queue: str
    start: float
    tick: int
    """`Model.tick` when the wait began: orders it against commands at the same instant."""
    timeout: float
    end: float | None = None
    receipt: nj.Receipt | None = None


@dataclass
class CancelRecord:
    t: float
    n: int
    before: str
    returned: nj.JobState
    model_returned: str
    history_len: int
    """How much of `World.history` was written when the cancel returned."""
    state_after: nj.JobState | None = None


@dataclass
class ShutdownRecord:
    t0: float
    grace: float
    skip: float | None
    model_exit: float
    real_exit: float
    runtime: Any
    running_at_t0: set[int] = field(default_factory=set)


Hook = Callable[["Example"], Awaitable[None]]


class Example:
    """One example: draws the scenario from `data`, runs it, checks ambient invariants.

    Tests add `on_step` hooks (awaited at every quiescent point while a runtime is open),
    `on_drained` hooks (awaited once everything ran, before the final shutdown) and
    `on_shutdown` hooks (awaited right after each `open_runtime` block exits), then call `run()`
    and check `world` / `model` afterwards.
    """

    def __init__(
        self,
        data: Any,
        faults: Faults = NO_FAULTS,
        cfg: Config = Config(),
        *,
        draw: Callable[[st.SearchStrategy[Any], str], Any] | None = None,
        store: Store = MEMORY,
    ) -> None:
        self.faults = faults
        self.cfg = cfg
        self.draw = draw or (lambda strategy, label: data.draw(strategy, label=label))
        self.queues: list[QueueSpec] = self.draw(queues_st(cfg), "queues")
        self.audit = TaskAudit()
        self.world = World(self.queues, self.audit, jitter=cfg.jitter, probe=cfg.probe_submitters, faults=faults)
        self.model = Model(self.queues)
        claim_yields = cfg.claim_yields if cfg.claim_yields is not None else self.draw(BOOLS, "claim_yields")
        crash_at = self.draw(ints(*cfg.crash_at), "crash_at") if cfg.crash else None
        # the same flags go to the backend: the few it reads (P10's) are backend-side bugs
        self.store = store
        self.backend = store.backend(self.world, faults, claim_yields, crash_at)
        self.max_waiters: int = self.draw(ints(*cfg.max_waiters), "max_waiters")
        self.clock = trio.testing.MockClock(autojump_threshold=0)
        self.rt: nj.Runtime | None = None
        self.on_step: list[Hook] = []
        self.on_drained: list[Hook] = []
        self.on_shutdown: list[Callable[[Example, ShutdownRecord], Awaitable[None]]] = []
        self.cancels: list[CancelRecord] = []
        self.waits: list[WaitRecord] = []
        self.shutdowns: list[ShutdownRecord] = []
        self.submissions: list[tuple[float, int | None]] = []
        self.crash: BaseException | None = None
        self.jobs_at_end: dict[int, nj.Job] = {}
        """Every accepted job as the backend holds it after the final shutdown, by number."""
        self.probe_jobs_at_end: dict[int, nj.Job] = {}
        self._probes: trio.Nursery | None = None

    # -- running --

    def run(self) -> None:
        try:
            trio.run(self._main, clock=self.clock, instruments=[self.audit])
        except BaseExceptionGroup as group:
            found = first_property_failure(group)
            if found is not None:
                raise found from None
            raise
        self.audit.raise_violations()

    async def _main(self) -> None:
        self.audit.mark_baseline()
        try:
            async with trio.open_nursery() as probes:
                self._probes = probes
                probes.start_soon(self._drive, name="driver")
        finally:
            with trio.CancelScope(shield=True):
                await self.backend.close()  # a durable backend the example opened (memory: no-op)
        self.audit.check_exit()

    async def _drive(self) -> None:
        cfg = self.cfg
        self.audit.owner = trio.lowlevel.current_task()
        budget: int = self.draw(ints(*cfg.commands), "commands")
        while True:
            grace = self.draw(ints(*cfg.graces), "grace") + 0.25
            runtime_settings = nj.RuntimeSettings(flush_bound=FLUSH_BOUND, max_waiters=self.max_waiters, grace=grace)
            if self.faults.unbounded_grace:  # P13: no bound on the grace (no valid setting says so)
                object.__setattr__(runtime_settings, "grace", math.inf)
            final = False
            try:
                async with nj.open_runtime(
                    self.world.app, backend=self.backend, settings=runtime_settings
                ) as rt:
                    self.rt = rt
                    self.model.open()
                    await self.settle()
                    skip: float | None = None
                    while budget > 0:
                        budget -= 1
                        cmd = self._draw_command()
                        if cmd[0] == "shutdown":
                            skip = cmd[1]
                            break
                        await self.apply(cmd)
                    else:
                        final = True
                        await self.drain()
                        for hook in self.on_drained:
                            await hook(self)
                    t0 = trio.current_time()
                    running = set(self.world.running)
                    model_exit = self.model.shutdown(grace, skip)
                    assert self._probes is not None
                    if skip is not None:
                        self._probes.start_soon(self._skipper, rt, t0 + skip)
                    if cfg.probe_submitters:
                        self._probes.start_soon(self._submitter, rt, t0)
                        await trio.lowlevel.checkpoint()  # the submitter races the shutdown
            except BaseExceptionGroup as group:
                crash, rest = group.split(BackendCrash)
                if crash is None:
                    raise
                self.crash = group
                self.rt = None
                self.audit.check_runtime_exit()
                if rest is not None:  # anything beside the planted crash is a failure of its own
                    raise rest
                return
            self.audit.check_runtime_exit()
            expect(rt.threads.in_flight == 0, "P02", f"{rt.threads.in_flight} offloaded thread calls outlived the runtime")
            record = ShutdownRecord(t0, grace, skip, model_exit, trio.current_time(), rt, running)
            self.shutdowns.append(record)
            self.rt = None
            for check in self.on_shutdown:
                await check(self, record)
            await self.settle()
            if final:
                self.jobs_at_end = {n: await self.backend.get_job(i) for n, i in self.world.id_of.items()}
                self.probe_jobs_at_end = {i: await self.backend.get_job(i) for _t, i in self.submissions if i is not None}
                return
            # the next runtime starts on an integer time, like every command
            await self.advance_to(math.ceil(max(trio.current_time(), self.model.now)))

    async def _skipper(self, rt: nj.Runtime, at: float) -> None:
        await trio.sleep_until(at)
        rt.skip_grace()

    async def _submitter(self, rt: nj.Runtime, t0: float) -> None:
        for at in (t0, t0 + 0.125, t0 + 1.125):
            await trio.sleep_until(at)
            try:
                job_id = await rt.enqueue("probe", {"n": -1})
            except nj.RuntimeClosed:
                self.submissions.append((at, None))
            else:
                self.submissions.append((at, job_id))

    # -- commands --

    def _draw_command(self) -> tuple[Any, ...]:
        cfg, model = self.cfg, self.model
        kinds = tuple(k for k, w in cfg.weights for _ in range(w) if model.jobs or k not in ("cancel", "wait"))
        kind = self.draw(choice(kinds), "cmd")
        names = tuple(q.name for q in self.queues)
        if kind == "advance":
            return ("advance", self.draw(ints(0, cfg.max_advance), "dt"))
        if kind == "enqueue":
            return ("enqueue", self.draw(spec_st(cfg, names), "job"))
        if kind == "burst":
            return ("burst", self.draw(burst_st(cfg, names), "burst"))
        if kind == "cancel":
            return ("cancel", self._draw_job("cancel"))
        if kind == "wait":
            return ("wait", self._draw_job("wait"), self.draw(ints(0, 4), "wait_timeout") + 0.75)
        if kind == "shutdown":
            skip = self.draw(SKIP_ST, "skip") if cfg.skip else None
            return ("shutdown", skip)
        raise AssertionError(kind)

    def _draw_job(self, label: str) -> int:
        """A job to cancel or wait for: first its state (final, running or pending, among those
        that exist), then one job in it -- so every state is exercised, not only the common one."""
        groups: dict[str, list[int]] = {}
        for n, job in sorted(self.model.jobs.items()):
            groups.setdefault("final" if job.final else job.state, []).append(n)
        group = groups[self.draw(choice(tuple(sorted(groups))), label + "_state")]
        chosen: int = group[self.draw(ints(0, len(group) - 1), label)]
        return chosen

    async def apply(self, cmd: tuple[Any, ...]) -> None:
        rt, model, world = self.rt, self.model, self.world
        assert rt is not None
        op = cmd[0]
        if op == "advance":
            await self.advance_to(trio.current_time() + cmd[1])
            return
        if op in ("enqueue", "burst"):
            specs = [cmd[1]] if op == "enqueue" else cmd[1]
            added = []
            for spec in specs:
                n = world.add(spec)
                kind = self.world.queues[spec.queue].kind
                job_id = await rt.enqueue(kind, {"n": n}, delay=spec.delay, priority=spec.priority)
                world.accept(job_id, n)
                added.append((n, spec))
            for n, spec in added:
                model.enqueue(n, spec)
        elif op == "cancel":
            n = cmd[1]
            before = model.jobs[n].state
            returned = await rt.cancel(world.id_of[n])
            cancel = CancelRecord(trio.current_time(), n, before, returned, model.cancel(n), len(world.history))
            cancel.state_after = (await rt.get_job(world.id_of[n])).state
            self.cancels.append(cancel)
        elif op == "wait":
            n, timeout = cmd[1], cmd[2]
            spec = world.specs[n]
            record = WaitRecord(n, world.id_of[n], spec.queue, trio.current_time(), model.tick, timeout)
            self.waits.append(record)
            assert self._probes is not None
            self._probes.start_soon(self._waiter, rt, record)
        else:
            raise AssertionError(op)
        await self.settle()

    async def _waiter(self, rt: nj.Runtime, record: WaitRecord) -> None:
        record.receipt = await rt.wait(record.job_id, timeout=record.timeout)
        record.end = trio.current_time()

    async def advance_to(self, t: float) -> None:
        self.model.advance_to(t)
        await trio.sleep_until(t)
        await self.settle()

    async def drain(self) -> None:
        """Run until the model has nothing left to run; hung jobs are cancelled."""
        model = self.model
        for _ in range(1000):
            if model.idle():
                return
            hung = [n for n, run in sorted(model.runs.items()) if run.end - model.now > DRAIN_HORIZON]
            if hung:
                await self.apply(("cancel", hung[0]))  # may start another job: look again
                continue
            e = model.next_time()
            if e is None:
                return
            await self.advance_to(math.ceil(e))
        raise AssertionError("the model did not drain")

    # -- quiescence --

    async def settle(self) -> None:
        await trio.testing.wait_all_tasks_blocked()
        self.audit.raise_violations()
        root = trio.lowlevel.current_root_task()
        assert root is not None
        tree: set[int | None] = {context_job(t) for t in walk_tree(root)} - {None}
        history = set(self.world.running)
        attempts = set(self.rt.attempts) if self.rt is not None else set()
        expect(
            tree == history == attempts,
            "P02",
            f"at t={trio.current_time()} job tasks in the tree {sorted(tree)} != running attempts "  # type: ignore[type-var]
            f"{sorted(history)} (history) / {sorted(attempts)} (runtime)",
        )
        if self.rt is not None:
            for hook in self.on_step:
                await hook(self)

    def model_running_ids(self) -> set[int]:
        return {self.world.id_of[n] for n in self.model.runs}
