"""Backends by URL scheme: `open_backend(url)` and `register(scheme, opener)`.

A backend is one module and one registration: `register("mariadb", open_mariadb)` makes
``open_backend("mariadb://...")`` (and `open_runtime(app, backend="mariadb://...")`) build it,
with no edit anywhere else. The built-in schemes are registered here, each imported only when a
URL asks for it (the PostgreSQL backend brings psycopg).
"""

from __future__ import annotations

import re
from typing import Callable
from urllib.parse import quote

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
        raise ConfigError(
            f"backend URL {redact(url, url)!r} has no scheme; did you mean {redact(_with_scheme(url), url)!r}? "
            f"(supported: {', '.join(repr(f'{s}://') for s in schemes())})"
        )
    opener = _OPENERS.get(scheme)
    if opener is None:
        raise ConfigError(
            f"unsupported backend URL scheme {redact(scheme, url)!r} in {redact(url, url)!r}; supported: "
            + ", ".join(f"'{s}://'" for s in schemes())
        )
    return opener(url)


def _with_scheme(url: str) -> str:
    """The URL that `url`, which has no ``scheme://``, most likely meant: its own scheme with the
    slashes it lacks (``sqlite:/jobs.db``), a PostgreSQL URL for what names a user, a host or
    conninfo keys, an SQLite one for a file path, else ``memory://``."""
    text = url.strip()
    named = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):/*(.*)$", text, re.S)
    if named and named.group(1).lower() in _OPENERS:
        scheme, rest = named.group(1).lower(), named.group(2)
        if scheme == "memory":
            return "memory://"
        if scheme == "sqlite":
            return f"sqlite:///{rest or 'jobs.db'}"
        return f"{scheme}://{rest or 'user@host/dbname'}"
    if text.lower() in ("", ":memory:"):
        return "memory://"
    keys = {m.group(1).lower(): _conninfo_value(m.group(2)) for m in _CONNINFO_PAIR.finditer(text)}
    if keys.keys() & {"host", "hostaddr", "dbname", "user", "port", "password"}:
        # A libpq key=value conninfo: the same settings as a URL (every value percent-encoded,
        # so `redact` finds the password in it as in any URL).
        part = {k: quote(v, safe="") for k, v in keys.items()}
        userinfo = part.get("user", "") + (f":{part['password']}" if "password" in part else "")
        port = f":{part['port']}" if "port" in part else ""
        host = part.get("host", part.get("hostaddr", ""))
        return f"postgresql://{userinfo + '@' if userinfo else ''}{host}{port}/{part.get('dbname', '')}"
    file = _FILE.search(text) is not None or text.startswith(("/", "~", "."))
    if "@" in text or (not file and re.fullmatch(r"[\w.-]+:\d+/\w+", text)):
        return f"postgresql://{text}"
    return f"sqlite:///{text}" if file or "/" in text else "memory://"


_CONNINFO_PAIR = re.compile(r"(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)")
_FILE = re.compile(r"\.(db|sqlite3?)$", re.I)


def _conninfo_value(raw: str) -> str:
    return re.sub(r"\\(.)", r"\1", raw[1:-1]) if raw.startswith("'") and raw.endswith("'") else raw


def _memory(url: str) -> Backend:
    if url != "memory://":
        raise ConfigError(f"the memory backend takes no location: use 'memory://', not {url!r}")
    from .memory import MemoryBackend

    return MemoryBackend()


def _sqlite(url: str) -> Backend:
    from .sqlite.backend import SqliteBackend
    from .sqlite.url import parse_sqlite_url

    path, synchronous, wake = parse_sqlite_url(url)
    return SqliteBackend(path, synchronous=synchronous, wake=wake)


def _postgres(url: str) -> Backend:
    from .postgres.backend import PostgresBackend
    from .postgres.url import parse_postgres_url

    conninfo, opts = parse_postgres_url(url)
    return PostgresBackend(conninfo, **opts)


register("memory", _memory)
register("sqlite", _sqlite)
register("postgresql", _postgres)
register("postgres", _postgres)
