"""A backend built outside `nursery_jobs/` passes every backend suite with no edit to them.

`tests/outoftree/` holds a backend as a third party would write one: `backend.py` (a
`DelegatingBackend` that reaches an inner backend only through the public protocol, with a real
checkpoint in every call) and `delegating.py` (one URL-scheme registration in nursery_jobs, one
`TestBackend` registration in `tests/registry.py`). Naming the module in `NJ_TEST_BACKENDS` is
all it takes for the contract, conformance and property suites to run on it: if any suite
needed an edit for a new backend, this test would not pass without it.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
from xml.etree import ElementTree

import pytest

import nursery_jobs as nj
from nursery_jobs.backends.protocol import Backend, CacheStore

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUITE_TIMEOUT = 300.0
# Each suite with real work on it (the contract suite alone has hundreds of cases).
AT_LEAST = {"contract": 101, "conformance": 51, "properties": 15}


@pytest.mark.timeout(SUITE_TIMEOUT + 60)
@pytest.mark.parametrize("suite", sorted(AT_LEAST))
def test_an_out_of_tree_backend_passes_the_suite(suite: str, tmp_path: pathlib.Path) -> None:
    """One suite per test, so the three run side by side under xdist; `-n 0`: each in its own
    subprocess only (the outer run has the workers)."""
    env = {**os.environ, "NJ_TEST_BACKENDS": "tests.outoftree.delegating", "NURSERY_JOBS_HYPOTHESIS_PROFILE": "ci"}
    report = tmp_path / "report.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", f"--junitxml={report}"]
    cmd += [f"tests/{suite}", "-k", "delegate and not test_outoftree"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=SUITE_TIMEOUT)
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    passed = 0
    for case in ElementTree.parse(report).iter("testcase"):
        assert case.get("classname", "").split(".")[1] == suite, case.attrib
        if len(case) == 0:  # no failure, error or skipped element: it passed
            passed += 1
    assert passed >= AT_LEAST[suite], (passed, tail)


def test_the_delegate_scheme_opens_through_nursery_jobs_registry() -> None:
    from tests.outoftree import delegating  # noqa: F401  (registers the scheme)
    from tests.outoftree.backend import DelegatingBackend

    backend = nj.open_backend("delegate://memory://")
    assert isinstance(backend, DelegatingBackend) and isinstance(backend, Backend)
    assert backend.url == "delegate://memory://" and backend.never_yields is False
    with pytest.raises(nj.ConfigError, match="wraps another backend's URL"):
        nj.open_backend("delegate://nowhere")


def test_the_delegating_backend_uses_only_the_public_protocol_of_its_inner_backend() -> None:
    """No private attribute of the inner backend (nor of anything else) is read: what the
    delegating backend needs is in the protocol, so any backend can be built the same way."""
    public = {
        name for protocol in (Backend, CacheStore) for name in [*dir(protocol), *protocol.__annotations__]
        if not name.startswith("_")
    }  # fmt: skip
    for path in (ROOT / "tests/outoftree").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                mine = isinstance(node.value, ast.Name) and node.value.id == "self"
                assert mine or not node.attr.startswith("_"), f"{path.name}:{node.lineno} reads {node.attr}"
                if isinstance(node.value, ast.Attribute) and node.value.attr == "inner":
                    assert node.attr in public, f"{path.name}:{node.lineno}: inner.{node.attr} is not in the protocol"


def test_a_module_named_in_the_environment_that_cannot_be_imported_stops_the_run_saying_so() -> None:
    env = {**os.environ, "NJ_TEST_BACKENDS": "tests.outoftree.no_such_module"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "--collect-only", "tests/contract/test_atomic.py"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "NJ_TEST_BACKENDS names the module 'tests.outoftree.no_such_module'" in proc.stdout + proc.stderr
