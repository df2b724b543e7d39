"""P14 -- the public async API is a checkpoint and cancel-atomic.

How (style A, with the ambient audit of every example): a drawn sequence of calls to
`enqueue`, `enqueue_many`, `cancel` and `wait`, each made in one of four ways:
- plain, inside `trio.testing.assert_checkpoints()`: it must checkpoint, and its effect happens
  exactly once;
- in a pre-cancelled `CancelScope`: it must raise `Cancelled` and have no effect;
- in a scope that another task cancels as soon as the call first yields, or after a drawn
  number of further checkpoints (the schedule is drawn too): it either returns, and its effect
  happened exactly once, or raises `Cancelled`, and nothing happened -- no job accepted, no job
  cancelled, no receipt waiter left registered.
(A scope whose deadline is already past is cancelled on entry, so it is the pre-cancelled case.)
Effects are read from the backend (its job count, the target's state) around each call.
Mutant: `Faults(enqueue_checkpoint_after_insert=True)` (enqueue can be cancelled after the
insert).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import nursery_jobs as nj
from tests.properties.faults import NO_FAULTS, Faults

from .audit import PropertyFailed, expect, fail
from .harness import Config, Example, FLUSH_BOUND, MEMORY, Store, examples
from .model import HANG, OK, JobSpec, Step

CONFIG = Config(queues=(1, 1), max_workers=(1, 2), timeouts=False)
MUTANT = Faults(enqueue_checkpoint_after_insert=True)

OPS = ("enqueue", "enqueue_many", "cancel", "wait")
MODES = ("plain", "precancelled", "first_yield", "raced")
CALLS = st.lists(
    st.tuples(st.sampled_from(OPS), st.sampled_from(MODES), st.integers(0, 3), st.booleans()), min_size=1, max_size=12
)


class ApiExample(Example):
    """The same example skeleton (audit, settle, exit checks); the driver makes API calls."""

    async def _drive(self) -> None:
        self.audit.owner = trio.lowlevel.current_task()
        calls = self.draw(CALLS, "calls")
        settings_ = nj.RuntimeSettings(flush_bound=FLUSH_BOUND, max_waiters=self.max_waiters)
        async with nj.open_runtime(self.world.app, backend=self.backend, grace=0, settings=settings_) as rt:
            self.rt = rt
            await self.settle()
            for i, (op, mode, delay, long_job) in enumerate(calls):
                await self.call(i, op, mode, delay, long_job)
                await self.settle()
            self.rt = None
        self.audit.check_runtime_exit()

    async def call(self, i: int, op: str, mode: str, delay: int, long_job: bool) -> None:
        rt, world = self.rt, self.world
        assert rt is not None
        targets = sorted(world.id_of.values())
        if op in ("cancel", "wait") and not targets:
            op = "enqueue"
        what = f"call #{i}: {op} ({mode})"
        # jobs that hang (running until cancelled) or wait 50 s (pending): cancel sees both
        step = Step(outcome=HANG) if long_job else Step(outcome=OK)
        spec = JobSpec(self.queues[0].name, (step,), 0 if long_job else 50)
        kind = self.queues[0].kind
        target = targets[delay % len(targets)] if targets else None

        async def do() -> Any:
            if op == "enqueue":
                n = world.add(spec)
                job_id = await rt.enqueue(kind, {"n": n}, delay=spec.delay)
                world.accept(job_id, n)
                return job_id
            if op == "enqueue_many":
                ns = [world.add(spec), world.add(spec)]
                ids = await rt.enqueue_many(kind, [{"n": n} for n in ns], delay=spec.delay)
                for n, job_id in zip(ns, ids):
                    world.accept(job_id, n)
                return ids
            assert target is not None
            if op == "cancel":
                return await rt.cancel(target)
            return await rt.wait(target, timeout=1.75)

        before_count = await self.job_count()
        before_state = (await rt.get_job(target)).state if target is not None else None
        returned, result = await self.invoke(what, mode, delay, do)
        after_count = await self.job_count()
        added = {"enqueue": 1, "enqueue_many": 2}.get(op, 0) if returned else 0
        expect(
            after_count == before_count + added,
            "P14",
            f"{what}: {'returned' if returned else 'was cancelled'}, "
            f"and the backend went from {before_count} to {after_count} jobs",
        )
        if op == "cancel":
            assert target is not None and before_state is not None
            state = (await rt.get_job(target)).state
            if not returned and not before_state.final:
                expect(
                    state == before_state,
                    "P14",
                    f"{what} was cancelled but job {target} went {before_state.value} -> {state.value}",
                )
            if returned and before_state in (nj.JobState.AVAILABLE, nj.JobState.SCHEDULED, nj.JobState.RETRYABLE):
                expect(state is nj.JobState.CANCELLED, "P14", f"{what} returned {result} but job {target} is {state.value}")
        if op == "wait":
            expect(rt.receipts.waiting == 0, "P14", f"{what}: {rt.receipts.waiting} receipt waiters left registered")

    async def invoke(self, what: str, mode: str, delay: int, do: Callable[[], Awaitable[Any]]) -> tuple[bool, Any]:
        if mode == "plain":
            try:
                with trio.testing.assert_checkpoints():
                    return True, await do()
            except PropertyFailed:
                raise
            except AssertionError as exc:
                fail("P14", f"{what} did not checkpoint: {exc}")
        if mode == "precancelled":
            with trio.CancelScope() as scope:
                scope.cancel()
                result = await do()
                fail("P14", f"{what} in a cancelled scope returned {result!r} instead of raising Cancelled")
            return False, None
        returned: list[Any] = []
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._cancel_after, scope, 0 if mode == "first_yield" else delay)
                returned.append(await do())
        return bool(returned), returned[0] if returned else None

    @staticmethod
    async def _cancel_after(scope: trio.CancelScope, checkpoints: int) -> None:
        for _ in range(checkpoints):
            await trio.lowlevel.checkpoint()
        scope.cancel()

    async def job_count(self) -> int:
        counts = await self.backend.stats()
        return sum(
            c.available + c.scheduled + c.running + c.retryable + c.completed + c.discarded + c.cancelled
            for c in counts.values()
        )


def check(data: st.DataObject, faults: Faults = NO_FAULTS, store: Store = MEMORY) -> None:
    ApiExample(data, faults, CONFIG, store=store).run()


@settings(max_examples=examples(100))
@given(data=st.data(), _sched=st.random_module())
def test_p14_api_is_a_checkpoint_and_cancel_atomic(data: st.DataObject, _sched: object) -> None:
    check(data)
