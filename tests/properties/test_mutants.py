"""The property suite proven red: each property, run against its mutant, must fail.

A property that no bug can turn red is a toy: it would pass whatever the code did. For every
property below, its module's `check(data, faults)` -- the very body its own test runs -- is
wrapped in a fresh `@given` with the module's `MUTANT` flags (`nursery_jobs._faults.Faults`, set
only by tests) and a fixed example budget, without the example database and without shrinking.
The meta-test passes only if Hypothesis finds a failing example *and* the failure is reported by
that property (`PropertyFailed.prop`), not by some other check tripping first.
"""

from __future__ import annotations

from typing import Callable

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.properties.faults import Faults

from . import (
    test_p01_containment as p01,
    test_p02_scopes as p02,
    test_p03_total_queue as p03,
    test_p04_attempts as p04,
    test_p05_bounded_concurrency as p05,
    test_p06_work_conservation as p06,
    test_p07_bounded_waits as p07,
    test_p08_order as p08,
    test_p09_timeouts as p09,
    test_p10_cancel as p10,
    test_p11_errors as p11,
    test_p13_shutdown as p13,
    test_p14_cancel_atomic as p14,
    test_p15_replay as p15,
)
from .audit import PropertyFailed

# (property, module, examples): the budget is generous against each mutant's measured
# detection rate, so a red result does not depend on luck.
MUTANTS = [
    ("P01", p01, 200),
    ("P02", p02, 200),
    ("P03", p03, 200),
    ("P04", p04, 200),
    ("P05", p05, 200),
    ("P06", p06, 200),
    ("P07", p07, 200),
    ("P08", p08, 200),
    ("P09", p09, 200),
    ("P10", p10, 200),
    ("P11", p11, 200),
    ("P13", p13, 200),
    ("P14", p14, 200),
    ("P15", p15, 200),
]


def find_failure(check: Callable[[st.DataObject, Faults], None], faults: Faults, budget: int) -> None:
    @settings(
        max_examples=budget,
        database=None,
        phases=[Phase.generate],
        report_multiple_bugs=False,
        deadline=None,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data(), _sched=st.random_module())
    def property_against_mutant(data: st.DataObject, _sched: object) -> None:
        check(data, faults)

    property_against_mutant()


@pytest.mark.parametrize(("prop", "module", "budget"), MUTANTS, ids=[m[0] for m in MUTANTS])
def test_mutant_turns_its_property_red(prop: str, module: object, budget: int) -> None:
    with pytest.raises(PropertyFailed) as info:
        find_failure(module.check, module.MUTANT, budget)  # type: ignore[attr-defined]
    assert info.value.prop == prop, f"{prop}'s mutant was caught by {info.value.prop}, not by {prop}: {info.value}"
