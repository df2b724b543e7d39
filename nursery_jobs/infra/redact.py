"""Passwords out of every text the library shows: one function, `redact`.

A PostgreSQL URL or libpq conninfo can carry a password in two places: the URL's userinfo
(``postgresql://user:pw@host/db``) and a ``password=`` option, in the URL's query string or as
a keyword of a ``key=value`` conninfo. Every message, log line and repr the library builds from
such a string passes through `redact` first, and so does every message of libpq or psycopg
that is shown to anyone: they quote the URL, or the token they could not parse, back to the
caller (``invalid percent-encoded token: "S3CR%zzET"``).

`redact` works in two passes. The first rewrites what has the shape of a password wherever it
appears in the text: the userinfo password of anything that looks like a URL, and the value
after ``password=``. The second replaces, wherever it still appears, every form the passwords of
the given sources can take: as written, percent-decoded, and with runs of whitespace collapsed
(as messages are, to fit one line). The sources are read leniently, the way libpq splits a URL
and the way `urllib` does, because the case where a message quotes the URL back is precisely a
URL libpq could not parse. A message whose own words happen to contain the password comes out
with those words starred: over-redacting is the price of never under-redacting.

Pure string work, no psycopg: `open_backend` uses it for any URL before choosing a backend.
"""

from __future__ import annotations

import re
from typing import TypeVar
from urllib.parse import unquote

E = TypeVar("E", bound=BaseException)

__all__ = ["REDACTED", "redact", "redact_exception"]

REDACTED = "***"

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# The userinfo password of a URL in running text: libpq ends the userinfo at the first '@' and
# never reads past a '/' for it.
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@]*:)[^\s/@]*@")
# `password=value` in a query string, a conninfo, or a message quoting either: a quoted
# conninfo value ('...' with backslash escapes) or everything up to a separator.
_PASSWORD_OPTION = re.compile(r"(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&'\"]+)")


def redact(text: str, *sources: str) -> str:
    """`text` with every password of `sources` (URLs or conninfo strings), and anything shaped
    like a password, replaced by ``***``."""
    text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    text = _PASSWORD_OPTION.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    secrets: set[str] = set()
    for source in sources:
        secrets |= _passwords(source)
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def redact_exception(exc: E, *sources: str) -> E:
    """`exc`, its message redacted in place: a library error raised ``from`` it shows it in
    every traceback, logged ones included."""
    args = tuple(redact(a, *sources) if isinstance(a, str) else a for a in exc.args)
    if args != exc.args:
        exc.args = args
    return exc


def _passwords(source: str) -> set[str]:
    """Every form the passwords in `source` may take in a message (see the module doc)."""
    found: set[str] = set()
    has_scheme = _SCHEME.match(source) is not None
    rest = _SCHEME.sub("", source, count=1)
    head = rest.partition("?")[0]
    if has_scheme or not re.search(r"[\s=]", head.partition("@")[0]):
        # A URL, or what would be one but for its missing scheme (`user:pw@host/db`).
        userinfos = []
        libpq = re.match(r"[^@/]*@", rest)
        if libpq:
            userinfos.append(rest[: libpq.end() - 1])
        netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
        for part in (netloc, head):
            if "@" in part:
                userinfos.append(part.rpartition("@")[0])
        for userinfo in userinfos:
            _user, colon, password = userinfo.partition(":")
            if colon:
                found.add(password)
        _, question, query = rest.partition("?")
        if question:
            for item in query.split("&"):
                key, _, value = item.partition("=")
                if unquote(key).strip().lower() == "password":
                    found.add(value)
    for match in _PASSWORD_OPTION.finditer(source):
        value = match.group(2)
        found.add(value)
        if value.startswith("'"):
            inner = value[1:-1] if len(value) > 1 and value.endswith("'") else value[1:]
            found.add(inner)
            found.add(re.sub(r"\\(.)", r"\1", inner))
    forms: set[str] = set()
    for password in found:
        for form in (password, unquote(password)):
            forms.add(form)
            forms.add(" ".join(form.split()))
    forms.discard("")
    return forms
