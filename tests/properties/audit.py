"""`TaskAudit`: the Trio instrument behind the ambient invariants P01 (containment) and P02 (no
task outlives its scope).

Hooks never assert: Trio logs an exception raised in a hook and *disables the instrument*, so a
failing check would silently stop checking. Every problem is appended to `violations` instead,
and the example raises `PropertyFailed` from them at its next quiescent point and at its end.

Attribution. A task belongs to a job if its `Task.context` carries the job's attempt
(`nursery_jobs._context.current_attempt`, inherited by ordinary children), else if the task that
spawned it belongs to a job -- `trio.lowlevel.current_task()` inside `task_spawned` is the
spawner. The second rule is what catches system tasks, which do not inherit context variables.

Ancestry follows `eventual_parent_nursery or parent_nursery`, so a task inside `nursery.start()`
is judged by the nursery it will end up in.
"""

from __future__ import annotations

from typing import Iterator

import trio

from nursery_jobs._context import current_attempt


class PropertyFailed(AssertionError):
    """A property of the suite (one `test_pNN_*.py` module each) does not hold. `prop` is its id
    ("P01" ... "P15"), so the mutant meta-test can check *which* property went red."""

    def __init__(self, prop: str, message: str) -> None:
        super().__init__(f"{prop}: {message}")
        self.prop = prop


def fail(prop: str, message: str) -> None:
    raise PropertyFailed(prop, message)


def expect(cond: object, prop: str, message: str) -> None:
    if not cond:
        raise PropertyFailed(prop, message)


def parent_task(task: trio.lowlevel.Task) -> trio.lowlevel.Task | None:
    nursery = task.eventual_parent_nursery or task.parent_nursery
    return None if nursery is None else nursery.parent_task


def ancestors(task: trio.lowlevel.Task) -> list[trio.lowlevel.Task]:
    chain = []
    parent = parent_task(task)
    while parent is not None:
        chain.append(parent)
        parent = parent_task(parent)
    return chain


def walk_tree(root: trio.lowlevel.Task) -> Iterator[trio.lowlevel.Task]:
    stack = [root]
    while stack:
        task = stack.pop()
        yield task
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)


def context_job(task: trio.lowlevel.Task) -> int | None:
    running = task.context.get(current_attempt)
    return None if running is None else running.job.id


class TaskAudit(trio.abc.Instrument):
    """Records every task's life, its job and whether it stayed inside the runtime's tree.

    - `mark_baseline()` (called by the example's main task) remembers the live tasks -- Trio's own
      plus main -- and makes main the task every later task must descend from: a task whose
      ancestry misses it is a system task, which escapes every scope (P01).
    - `owner` is the task that enters `open_runtime`, set *before* entering because services
      spawn during `__aenter__`. A task spawned on behalf of a job, or spawned by a task below the
      owner (a runtime service), must have the owner among its ancestors (P01).
    """

    def __init__(self) -> None:
        self.violations: list[tuple[str, str]] = []
        self.live: set[trio.lowlevel.Task] = set()
        self.job_of: dict[trio.lowlevel.Task, int] = {}
        self.baseline: frozenset[trio.lowlevel.Task] = frozenset()
        self.main: trio.lowlevel.Task | None = None
        self.owner: trio.lowlevel.Task | None = None
        self.spawned = 0

    def record(self, prop: str, message: str) -> None:
        self.violations.append((prop, message))

    def raise_violations(self) -> None:
        if self.violations:
            prop, message = self.violations[0]
            more = f" (+{len(self.violations) - 1} more)" if len(self.violations) > 1 else ""
            raise PropertyFailed(prop, message + more)

    def mark_baseline(self) -> None:
        self.main = trio.lowlevel.current_task()
        self.baseline = frozenset(self.live)

    # -- hooks: record, never raise --

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        try:
            self._spawned(task)
        except Exception as exc:  # a bug in the audit must not disable it silently
            self.record("AUDIT", f"task_spawned hook failed on {task.name}: {exc!r}")

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.live.discard(task)
        self.job_of.pop(task, None)

    def _spawned(self, task: trio.lowlevel.Task) -> None:
        self.live.add(task)
        self.spawned += 1
        try:
            spawner: trio.lowlevel.Task | None = trio.lowlevel.current_task()
        except RuntimeError:  # tasks Trio spawns before any task runs
            spawner = None
        job = context_job(task)
        if job is None and spawner is not None:
            job = self.job_of.get(spawner)
            if job is None:
                job = context_job(spawner)
        if job is not None:
            self.job_of[task] = job
        if self.main is None:
            return
        chain = ancestors(task)
        if self.main not in chain:
            who = f"job {job}" if job is not None else f"task {getattr(spawner, 'name', None)!r}"
            self.record("P01", f"{who} spawned {task.name!r} outside the test's task tree (a system task)")
            return
        owner = self.owner
        if owner is None:
            return
        by_service = spawner is not None and spawner is not owner and owner in ancestors(spawner)
        if (job is not None or by_service) and owner not in chain:
            self.record(
                "P01",
                f"{task.name!r} (job {job}, spawned by {getattr(spawner, 'name', None)!r}) "
                "escaped the runtime owner's tree",
            )

    # -- queries --

    def live_for_job(self, job_id: int, exclude: trio.lowlevel.Task | None = None) -> list[str]:
        """Names of live tasks that belong to `job_id` (by attribution or by their context)."""
        return sorted(
            t.name
            for t in self.live
            if t is not exclude and (self.job_of.get(t) == job_id or context_job(t) == job_id)
        )

    def check_runtime_exit(self) -> None:
        """Right after `open_runtime` returned in the owner task: nothing below it lives on (P02)."""
        owner = self.owner
        left = sorted(t.name for t in self.live if owner is not None and owner in ancestors(t))
        if left:
            self.record("P02", f"tasks outlived open_runtime: {left}")

    def check_exit(self) -> None:
        """At the end of the example's main task: nothing but the baseline is alive (P02)."""
        extra = self.live - self.baseline - {trio.lowlevel.current_task()}
        if extra:
            self.record("P02", f"tasks outlived the runtime and the example: {sorted(t.name for t in extra)}")
        living = trio.lowlevel.current_statistics().tasks_living
        if living != len(self.baseline):
            self.record("P02", f"tasks_living is {living} at exit, baseline was {len(self.baseline)}")
