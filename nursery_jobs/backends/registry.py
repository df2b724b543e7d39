"""Backends by URL scheme: `open_backend(url)` and `register(scheme, opener)`.

A backend is one module and one registration: `register("mariadb", open_mariadb)` makes
``open_backend("mariadb://...")`` (and `open_runtime(app, backend="mariadb://...")`) build it,
with no edit anywhere else. The built-in schemes are registered here, each imported only when a
URL asks for it (the PostgreSQL backend brings psycopg).
"""

from __future__ import annotations

from typing import Callable

from ..errors import ConfigError
from ..infra.redact import redact
from .protocol import Backend

__all__ = ["open_backend", "register", "schemes"]

Opener = Callable[[str], Backend]
"""Builds a backend from its whole URL; raises `ConfigError` for a bad one."""

_OPENERS: dict[str, Opener] = {}


def register(scheme: str, opener: Opener) -> None:
    """Make `scheme://...` URLs open with `opener`. Registering a scheme again replaces it."""
    if not isinstance(scheme, str) or not scheme.isidentifier():
        raise ConfigError(f"a backend URL scheme is a plain name such as 'mariadb', not {scheme!r}")
    _OPENERS[scheme] = opener


def schemes() -> list[str]:
    return sorted(_OPENERS)


def open_backend(url: str) -> Backend:
    """A backend for `url`: ``memory://``, ``sqlite:///path/jobs.db[?synchronous=full|normal&wake=on|off]``,
    ``postgresql://user@host/db[?schema=...]``, or a scheme `register`ed since.

    Raises ConfigError for an unsupported or malformed URL (its password redacted).
    """
    if not isinstance(url, str):
        raise ConfigError(f"backend must be a URL string or a Backend, not {type(url).__name__}")
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ConfigError(f"backend URL {redact(url, url)!r} has no scheme; use 'memory://'")
    opener = _OPENERS.get(scheme)
    if opener is None:
        raise ConfigError(
            f"unsupported backend URL scheme {redact(scheme, url)!r} in {redact(url, url)!r}; supported: "
            + ", ".join(f"'{s}://'" for s in schemes())
        )
    return opener(url)


def _memory(url: str) -> Backend:
    if url != "memory://":
        raise ConfigError(f"the memory backend takes no location: use 'memory://', not {url!r}")
    from .memory import MemoryBackend

    return MemoryBackend()


def _sqlite(url: str) -> Backend:
    from .sqlite import SqliteBackend, parse_sqlite_url

    path, synchronous, wake = parse_sqlite_url(url)
    return SqliteBackend(path, synchronous=synchronous, wake=wake)


def _postgres(url: str) -> Backend:
    from .postgres import PostgresBackend, parse_postgres_url

    conninfo, opts = parse_postgres_url(url)
    return PostgresBackend(conninfo, **opts)


register("memory", _memory)
register("sqlite", _sqlite)
register("postgresql", _postgres)
register("postgres", _postgres)
