"""The conformance suite: every backend behaviour, written once, run against every backend.

A backend is done when this whole folder passes on it. Tests get `make_backend`, a factory for
a fresh backend instance of the parametrised kind (call it once per test; pass the same instance
to two runtimes to model a restart), and run on virtual time (`autojump_clock`).
"""

from __future__ import annotations

from typing import Callable

import pytest

import nursery_jobs as nj

BACKENDS = ["memory"]


def _memory() -> nj.Backend:
    return nj.MemoryBackend()


_FACTORIES: dict[str, Callable[[], nj.Backend]] = {"memory": _memory}


@pytest.fixture(params=BACKENDS)
def make_backend(request: pytest.FixtureRequest) -> Callable[[], nj.Backend]:
    return _FACTORIES[request.param]
