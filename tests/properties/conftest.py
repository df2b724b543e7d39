"""Hypothesis profiles for the property suites.

`ci` (the default) keeps the whole `tests/properties` run to a few minutes on two cores;
`nightly` runs thirty times as many examples. Choose with NURSERY_JOBS_HYPOTHESIS_PROFILE.
Per-test budgets are written for `ci` and scaled by `harness.examples`.
"""

import os

from hypothesis import HealthCheck, settings

_suppress = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "ci", deadline=None, print_blob=True, suppress_health_check=_suppress, max_examples=100, stateful_step_count=30
)
settings.register_profile(
    "nightly", deadline=None, print_blob=True, suppress_health_check=_suppress, max_examples=3000, stateful_step_count=100
)
settings.load_profile(os.environ.get("NURSERY_JOBS_HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config, items):
    """The default time bound is written for `ci`; a bigger profile scales it with its budget."""
    import pathlib

    import pytest

    factor = settings.default.max_examples / settings.get_profile("ci").max_examples
    if factor <= 1:
        return
    here = pathlib.Path(__file__).parent
    bound = float(config.getini("timeout")) * factor
    for item in items:
        if here in item.path.parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(bound))
