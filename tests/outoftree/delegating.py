"""Registers the out-of-tree `DelegatingBackend` (`backend.py`) as a new backend would be:

- in nursery_jobs' URL registry, as ``delegate://<inner url>`` (one `register` call), so
  ``nj.open_backend("delegate://memory://")`` and ``open_runtime(app, backend="delegate://...")``
  build it;
- in the test registry (`tests/registry.py`), twice: ``delegate`` over memory (opened through
  its URL) and ``delegate-sqlite`` over the registered SQLite test backend (a durable store that
  several instances share, with its damage hooks).

Nothing else names it: ``NJ_TEST_BACKENDS=tests.outoftree.delegating`` runs every backend suite
on it too (`tests/contract/test_outoftree.py` does so).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

import nursery_jobs as nj
from nursery_jobs.backends import register as register_scheme
from tests import registry

from .backend import SCHEME, DelegatingBackend, open_delegate

register_scheme(SCHEME, open_delegate)


def _over_memory(request: pytest.FixtureRequest) -> registry.Store:
    return registry.Store(lambda: nj.open_backend(f"{SCHEME}://memory://"), shared=False)


def _memory_harness(request: pytest.FixtureRequest) -> Callable[[], nj.Backend]:
    return lambda: DelegatingBackend(nj.MemoryBackend())


registry.register(registry.TestBackend(SCHEME, _over_memory, autojump=0.0, harness=_memory_harness))


def _wrapping(inner: registry.TestBackend) -> registry.TestBackend:
    """A delegating backend over a registered test backend: its stores, its clock threshold,
    its harness and damage hooks, each on the wrapped instance."""

    def new_store(request: pytest.FixtureRequest) -> registry.Store:
        store = inner.new_store(request)
        return registry.Store(lambda: DelegatingBackend(store.open()), shared=store.shared)

    harness = None
    if inner.harness is not None:
        inner_harness = inner.harness

        def harness(request: pytest.FixtureRequest) -> Callable[[], nj.Backend]:
            build = inner_harness(request)
            return lambda: DelegatingBackend(build())

    damage = None
    if inner.damage is not None:
        inner_write = inner.damage.write

        def write(backend: nj.Backend, job_id: int, assignments: str, params: tuple[Any, ...]) -> None:
            assert isinstance(backend, DelegatingBackend), backend
            inner_write(backend.inner, job_id, assignments, params)

        damage = registry.Damage(write, inner.damage.bad_errors, inner.damage.untyped)

    return registry.TestBackend(f"{SCHEME}-{inner.name}", new_store, autojump=inner.autojump, harness=harness, damage=damage)


registry.register(_wrapping(registry.get("sqlite")))
