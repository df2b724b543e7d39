"""The conformance suite: every backend behaviour, written once, run against every backend.

A backend is done when this whole folder passes on it. The backends are those of
`tests/registry.py` (one registration each). Tests get `make_backend`, a factory for a fresh
backend instance of the parametrised kind (call it once per test; pass the same instance to two
runtimes to model a restart), `store` for several instances on one store (several processes
sharing a database), and run on virtual time (`autojump_clock`, at the backend's threshold).
"""

from tests.registry import autojump_clock, backend_name, damage, make_backend, store, test_backend  # noqa: F401
