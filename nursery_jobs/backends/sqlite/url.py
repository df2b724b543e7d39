"""The URL: ``sqlite:///path/to/jobs.db?synchronous=full|normal&wake=on|off``.

Three slashes and a relative path, four and an absolute one, as SQLAlchemy writes them. Two
options: `synchronous` (``full``, the default, syncs every commit; ``normal`` syncs at
checkpoints, and a power loss can lose the last commits but never corrupts the file) and `wake`
(``off``: no wake-up sockets between processes, poll only). Anything else is an error that names
the options known, so a typo cannot be silently ignored.
"""

from __future__ import annotations

from urllib.parse import parse_qs

from ...errors import ConfigError

__all__ = ["parse_sqlite_url"]

_SYNC_MODES = {"full": "FULL", "normal": "NORMAL"}
_WAKE_MODES = {"on": True, "off": False}


def parse_sqlite_url(url: str) -> tuple[str, str, bool]:
    """(path, synchronous, wake) from ``sqlite:///path?synchronous=full|normal&wake=on|off``."""
    rest = url[len("sqlite://") :]
    path, _, query = rest.partition("?")
    if not path.startswith("/") or path == "/":
        raise ConfigError(f"SQLite URL {url!r} needs a path: 'sqlite:///jobs.db' or 'sqlite:////abs/jobs.db'")
    path = path[1:]
    params = parse_qs(query, keep_blank_values=True)
    unknown = set(params) - {"synchronous", "wake"}
    if unknown:
        raise ConfigError(f"unknown SQLite URL option(s) {sorted(unknown)} in {url!r}; known: synchronous, wake")
    sync = params.get("synchronous", ["full"])[-1].lower()
    if sync not in _SYNC_MODES:
        raise ConfigError(f"synchronous must be 'full' or 'normal' in {url!r}, not {sync!r}")
    wake = params.get("wake", ["on"])[-1].lower()
    if wake not in _WAKE_MODES:
        raise ConfigError(f"wake must be 'on' or 'off' in {url!r}, not {wake!r}")
    return path, _SYNC_MODES[sync], _WAKE_MODES[wake]
