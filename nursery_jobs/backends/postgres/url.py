"""The URL: libpq's, with the library's own options in its query string.

A backend is named by one URL (``postgresql://user@host/db?schema=jobs&pool_size=20``). libpq
accepts many forms of it -- sockets as ``?host=/dir``, several ``host:port`` pairs, its own options
-- and the library must not reinterpret any of them: only the library's options (`_OPTIONS`) are
taken out of the query string, and the rest reaches libpq byte for byte (`parse_postgres_url`).
The conninfo is kept only to connect; everything shown names the database by `display_url`, which
has no password, and every message made from libpq's text goes through `infra.redact.redact`
first. The schema name is checked here too (`check_schema_name`): it is always quoted by psycopg,
never built into a statement from a string, and must be a plain identifier.
"""

from __future__ import annotations

import re
from typing import Any, Mapping
from urllib.parse import quote, unquote

from ...config import check_timeout
from ...errors import ConfigError
from ...infra.pg import conninfo_to_dict, psycopg  # psycopg only through infra: import order
from ...infra.redact import redact
from .failures import one_line

__all__ = [
    "check_schema_name",
    "check_statement_timeout",
    "conninfo_params",
    "display_url",
    "parse_postgres_url",
    "split_options",
]

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
_OPTIONS = {"schema", "pool_size", "pool_share", "poll_interval", "statement_timeout", "outage_timeout"}
_SECONDS_OPTIONS = ("poll_interval", "statement_timeout", "outage_timeout")
_MIN_STATEMENT_TIMEOUT = 0.001
_MAX_STATEMENT_TIMEOUT = 2_147_483  # seconds: INT_MAX milliseconds, rounded down


def check_schema_name(schema: str) -> str:
    if not isinstance(schema, str) or not _SCHEMA_RE.match(schema):
        raise ConfigError(
            f"schema name {schema!r} is not a plain lower-case identifier (letters, digits, _; at most 41 characters)"
        )
    return schema


def parse_postgres_url(url: str) -> tuple[str, dict[str, Any]]:
    """(conninfo for psycopg, our options) from a ``postgresql://`` URL.

    Only the library's own options (`_OPTIONS`) are taken out of the query string; the rest of
    the URL is handed to libpq byte for byte, so every URL libpq accepts means here what it
    means to libpq (an empty host, ``?host=/socket/dir``, several ``host:port`` pairs, its own
    options). An option given twice is refused: libpq would silently keep the last one. A
    string that is not a ``postgresql://`` or ``postgres://`` URL (a ``key=value`` conninfo) is
    returned unchanged, with the default options."""
    conninfo, ours = split_options(url)
    opts: dict[str, Any] = {"schema": check_schema_name(ours.get("schema", "nursery_jobs"))}
    for name, convert, wanted in (("pool_size", int, "an int >= 2"), ("pool_share", float, "a number in (0, 1]")):
        if name in ours:
            try:
                opts[name] = convert(ours[name])
            except ValueError:
                raise ConfigError(f"?{name}= in the PostgreSQL URL must be {wanted}, not {ours[name]!r}") from None
    for name in _SECONDS_OPTIONS:
        if name in ours:
            try:
                value = float(ours[name])
            except ValueError:
                raise ConfigError(
                    f"?{name}= in the PostgreSQL URL must be a number of seconds, not {ours[name]!r}"
                ) from None
            opts[name] = check_timeout(f"?{name}= in the PostgreSQL URL", value, allow_none=False)
    if "statement_timeout" in opts:
        check_statement_timeout("?statement_timeout= in the PostgreSQL URL", opts["statement_timeout"])
    return conninfo, opts


def split_options(url: str) -> tuple[str, dict[str, str]]:
    """(`url` without the library's options, those options percent-decoded); the rest of the
    query string is kept as written, in its order. Raises ConfigError for a repeated key."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url, {}
    base, question, query = url.partition("?")
    if not question:
        return url, {}
    kept: list[str] = []
    ours: dict[str, str] = {}
    seen: set[str] = set()
    for item in query.split("&"):
        raw_key, _, raw_value = item.partition("=")
        # libpq percent-decodes keys as well as values, and does not read "+" as a space.
        key = unquote(raw_key)
        if key in seen:
            raise ConfigError(
                f"the PostgreSQL URL gives ?{redact(key, url)}= more than once; give each option once"
            )
        if key:
            seen.add(key)
        if key in _OPTIONS:
            ours[key] = unquote(raw_value)
        else:
            kept.append(item)
    return (f"{base}?{'&'.join(kept)}" if kept else base), ours


def check_statement_timeout(what: str, seconds: float) -> None:
    """The server counts `statement_timeout` in whole milliseconds, and 0 there means no limit
    at all: a positive value under 1 ms would turn the bound off instead of making it short.
    Above INT_MAX ms the server refuses the connection."""
    if not _MIN_STATEMENT_TIMEOUT <= seconds <= _MAX_STATEMENT_TIMEOUT:
        raise ConfigError(
            f"{what} must be at least {_MIN_STATEMENT_TIMEOUT:g} s (PostgreSQL counts whole milliseconds, "
            f"and 0 would disable the timeout) and at most {_MAX_STATEMENT_TIMEOUT} s (about 24 days), not {seconds!r}"
        )


def conninfo_params(conninfo: str) -> dict[str, Any]:
    """libpq's reading of `conninfo` (a URL or ``key=value`` string), without connecting;
    ConfigError, with the password redacted, when libpq cannot parse it."""
    if conninfo.startswith(("postgresql://", "postgres://")):
        # libpq ends the userinfo at the first '@' or '/': a password with a raw '/' or '@'
        # would be read as a host, a port or a database name, and show up in messages as one.
        rest = conninfo.partition("://")[2].partition("?")[0]
        head = re.match(r"[^@/]*@", rest)
        if "@" in (rest[head.end() :] if head else rest):
            raise ConfigError(
                "bad PostgreSQL URL: an '@' after the user and password; percent-encode '@' and '/' "
                "in a password or database name (%40, %2F)"
            )
    try:
        return conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        message = f"bad PostgreSQL URL: {redact(one_line(exc), conninfo)}"
    # Raised outside the handler, so libpq's error, which quotes the password, is not its context.
    raise ConfigError(message)


def display_url(params: Mapping[str, Any], schema: str) -> str:
    """A ``postgresql://`` URL naming the database of `params` (user, hosts, ports, database,
    schema), never its password: what logs, errors and reprs call the backend."""
    user = str(params.get("user") or "")
    hosts = str(params.get("host") or "").split(",")
    ports = str(params.get("port") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    query: list[str] = []
    if any(h.startswith(("/", "@")) for h in hosts):
        # Socket directories read better as an option than percent-encoded into the authority.
        authority = ""
        query.append("host=" + quote(",".join(hosts), safe="/@,:"))
        if any(ports):
            query.append("port=" + quote(",".join(ports), safe=","))
    else:
        pairs = []
        for i, host in enumerate(hosts):
            port = ports[i] if i < len(ports) else ""
            host = f"[{host}]" if ":" in host else quote(host, safe="")
            pairs.append(f"{host}:{quote(port, safe='')}" if port else host)
        authority = ",".join(pairs)
    if params.get("hostaddr"):
        query.append("hostaddr=" + quote(str(params["hostaddr"]), safe=",:"))
    userinfo = f"{quote(user, safe='')}@" if user else ""
    dbname = quote(str(params.get("dbname") or ""), safe="")
    query.append(f"schema={schema}")
    return f"postgresql://{userinfo}{authority}/{dbname}?{'&'.join(query)}"
