"""The model-based properties again, on every registered backend but memory: one model, every backend.

Each property's `check` is written once, in its own module (which runs it on memory, with the
mutants); here it runs on each backend of `tests/registry.py` that says how the harness builds
it: SQLite (a fresh file per example), PostgreSQL (a fresh schema per example), and any backend
registered since. The runtime, the command
strategies, the model and the checks are the same as on memory; only the storage differs, so a
SQL claim that breaks priority order, a finish that loses an outcome, a fencing condition that
lets a stale attempt through or a restart that forgets an interrupted job turns these red.

Determinism: the durable backends run their calls on the Trio thread here (`tests/deterministic.py`),
so `MockClock(autojump_threshold=0)` never mistakes a database round trip for idleness, and the
backend's clock is Trio's virtual clock. What this does not cover -- the thread and socket
waits themselves -- the conformance suite covers with real I/O.

Mutants stay on the memory backend (`test_mutants.py`): the planted faults live there.
Budgets are smaller than on memory (each example does real I/O), scaled by the profile.
"""

from __future__ import annotations

from typing import Callable

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from . import (
    test_p01_containment,
    test_p02_scopes,
    test_p03_total_queue,
    test_p04_attempts,
    test_p05_bounded_concurrency,
    test_p06_work_conservation,
    test_p07_bounded_waits,
    test_p08_order,
    test_p09_timeouts,
    test_p10_cancel,
    test_p11_errors,
    test_p12_schedule_points,
    test_p13_shutdown,
    test_p14_cancel_atomic,
    test_p15_replay,
    test_p16_key_limits,
    test_p17_batches,
    test_p18_rate_limits,
    test_p19_bounded_length,
)
from tests import registry

from .harness import Store, examples

Check = Callable[..., None]

# (property, its check, examples per durable backend under the `ci` profile)
PROPERTIES: list[tuple[str, Check, int]] = [
    ("P01", test_p01_containment.check, 8),
    ("P02", test_p02_scopes.check, 8),
    ("P03", test_p03_total_queue.check, 20),
    ("P04", test_p04_attempts.check, 15),
    ("P05", test_p05_bounded_concurrency.check, 10),
    ("P06", test_p06_work_conservation.check, 15),
    ("P07", test_p07_bounded_waits.check, 10),
    ("P08", test_p08_order.check, 15),
    ("P09", test_p09_timeouts.check, 10),
    ("P10", test_p10_cancel.check, 15),
    ("P11 isolation", test_p11_errors.check_isolation, 8),
    ("P11 crash", test_p11_errors.check, 8),
    ("P12", test_p12_schedule_points.check, 5),
    ("P13", test_p13_shutdown.check, 15),
    ("P14", test_p14_cancel_atomic.check, 10),
    ("P15", test_p15_replay.check, 5),
    ("P16", test_p16_key_limits.check, 10),
    ("P17", test_p17_batches.check, 8),
    ("P18", test_p18_rate_limits.check, 10),
    ("P19", test_p19_bounded_length.check, 10),
]


HARNESSED = [b for b in registry.all_backends() if b.harness is not None]
CASES = [(b.name, p) for b in HARNESSED for p in PROPERTIES]


def _run(check: Check, n: int, store: Store) -> None:
    # database=None: the inner test's name is the same for every property; keep their examples apart
    # The explain phase traces every line of a failing example; with real I/O that takes
    # minutes and adds little to the shrunk example, which already names the property.
    @settings(max_examples=examples(n), database=None, phases=tuple(set(Phase) - {Phase.explain}))
    @given(data=st.data(), _sched=st.random_module())
    def run(data: st.DataObject, _sched: object) -> None:
        check(data, store=store)

    run()


@pytest.mark.parametrize(("backend", "prop"), CASES, ids=[f"{b}-{p[0]}" for b, p in CASES])
def test_property_on_backend(backend: str, prop: tuple[str, Check, int], request: pytest.FixtureRequest) -> None:
    harness = registry.get(backend).harness
    assert harness is not None
    _name, check, n = prop
    _run(check, n, Store(backend, harness(request)))


@pytest.mark.parametrize("backend", [b.name for b in HARNESSED])
def test_a_tick_at_the_end_of_the_window_on_backend(backend: str, request: pytest.FixtureRequest) -> None:
    """P12's example found on SQLite, replayed on every durable backend (see `TICK_AT_THE_END`)."""
    harness = registry.get(backend).harness
    assert harness is not None
    test_p12_schedule_points.check(
        test_p12_schedule_points.Drawn(*test_p12_schedule_points.TICK_AT_THE_END),  # type: ignore[arg-type]
        store=Store(backend, harness(request)),
    )
