"""Crash fuzz (§1.9 item 5): the checker never raises, whatever valid Python it is given.

50 examples by default keeps the lint suite fast; set NJS_LINT_FUZZ_EXAMPLES (e.g. 1000, as
flake8-async does) for a deeper run.
"""

from __future__ import annotations

import os
import pathlib

import hypothesmith
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from nursery_jobs_lint.checker import check_source
from nursery_jobs_lint.config import Config

settings.register_profile(
    "nursery-jobs-lint-fuzz",
    max_examples=int(os.environ.get("NJS_LINT_FUZZ_EXAMPLES", "50")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)
FUZZ = settings.get_profile("nursery-jobs-lint-fuzz")

CONFIG = Config(root=pathlib.Path("."), allow=("pkg/infra/**",), extend_select=("NJS901",))


@pytest.mark.filterwarnings("ignore::SyntaxWarning")  # hypothesmith compiles what it generates
@FUZZ
@given(source=hypothesmith.from_grammar() | hypothesmith.from_node(), in_allow=st.booleans())
def test_checker_never_raises(source: str, in_allow: bool) -> None:
    path = "pkg/infra/fuzzed.py" if in_allow else "pkg/fuzzed.py"
    findings = check_source(source, path, CONFIG)
    for finding in findings:
        assert finding.line >= 1 and finding.col >= 1
        assert finding.code in {"NJS001", "NJS002", "NJS003", "NJS004", "NJS005", "NJS901"} or finding.code[3] in "12"


@FUZZ
@given(source=st.binary(max_size=300))
def test_arbitrary_bytes_never_raise(source: bytes) -> None:
    check_source(source, "pkg/fuzzed.py", CONFIG)
