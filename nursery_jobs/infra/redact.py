"""Passwords out of every text and error the library shows: `redact` and `redact_exception`.

A PostgreSQL URL or libpq conninfo can carry a password in two places: the URL's userinfo
(``postgresql://user:pw@host/db``) and a ``password=`` option, in the URL's query string or as
a keyword of a ``key=value`` conninfo. Every message, log line and repr the library builds from
such a string passes through `redact` first, and so does every message of libpq or psycopg
that is shown to anyone: they quote the URL, or the token they could not parse, back to the
caller (``invalid percent-encoded token: "S3CR%zzET"``).

A password is replaced where it stands, never wherever its letters happen to occur: replacing
a one-letter password ``p`` everywhere turned ``password`` into ``***assword``. So `redact` works
in three passes, each replacing a whole place:

1. each source as a whole, wherever the text quotes it (as written, or collapsed to one line as
   messages are), by the source with its passwords starred (`_spans` finds them by parsing);
2. anything shaped like a password: the userinfo password of anything that looks like a URL
   (up to its last '@', since a malformed one may hold '@' and '/'), and the value after
   ``password=``, quoted or not;
3. each form a password of the sources can take in a message (as written, percent-decoded,
   whitespace collapsed): as a quoted token (``"pw"``, libpq's way of quoting what it could not
   read) always, and as a bare substring only when it has at least `BARE_MIN` characters, long
   enough that its letters are not ordinary words.

The sources are read leniently, the way libpq splits a URL and the way `urllib` does, because the
case where a message quotes the URL back is precisely a URL libpq could not parse. A message
whose own words contain a long password, or a quoted token that equals a short one, comes out
with those words starred: over-redacting is the price of never under-redacting.

An error shows more than its message: a traceback prints its `__cause__` and `__context__`, a
group its members, and `repr` its args. `redact_exception` redacts all of them, through the
whole chain, in place (args and notes), for an error that is kept as the cause of one of ours.

Pure string work, no psycopg: `open_backend` uses it for any URL before choosing a backend.
"""

from __future__ import annotations

import re
from typing import TypeVar
from urllib.parse import unquote

E = TypeVar("E", bound=BaseException)

__all__ = ["BARE_MIN", "REDACTED", "redact", "redact_exception"]

REDACTED = "***"

BARE_MIN = 8
"""The shortest password replaced wherever its text occurs; a shorter one only where it stands."""

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# The userinfo password of a URL in running text, up to the last '@' of the URL (a password
# with a raw '@' or '/' is the case where a message quotes a URL back): never past white space,
# a quote, or the query string.
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@\"']*:)[^\s\"'?#]*@")
# `password=value` in a query string, a conninfo, or a message quoting either: a quoted
# conninfo value ('...' with backslash escapes) or everything up to a separator.
_PASSWORD_OPTION = re.compile(r"(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'?|[^\s&'\"]+)")


def redact(text: str, *sources: str) -> str:
    """`text` with every password of `sources` (URLs or conninfo strings), and anything shaped
    like a password, replaced by ``***`` where it stands (see the module doc)."""
    secrets: set[str] = set()
    for source in sources:
        spans = _spans(source)
        if not spans:
            continue
        shown = _starred(source, spans)
        for form in sorted({source, " ".join(source.split())}, key=len, reverse=True):
            text = text.replace(form, shown)
        secrets |= _forms(source, spans)
    text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    text = _PASSWORD_OPTION.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= BARE_MIN:
            text = text.replace(secret, REDACTED)
        else:
            for quote in ('"', "'"):
                text = text.replace(f"{quote}{secret}{quote}", f"{quote}{REDACTED}{quote}")
    return text


def redact_exception(exc: E, *sources: str) -> E:
    """`exc` and everything its traceback or repr shows (its `__cause__` and `__context__`,
    through the whole chain, and an exception group's members), their args and notes redacted
    in place: an error of ours raised ``from`` it shows it in every traceback, logged ones
    included."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        error = pending.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        args = tuple(redact(a, *sources) if isinstance(a, str) else a for a in error.args)
        if args != error.args:
            error.args = args
        notes = getattr(error, "__notes__", None)
        if isinstance(notes, list):
            notes[:] = [redact(n, *sources) if isinstance(n, str) else n for n in notes]
        pending.extend(e for e in (error.__cause__, error.__context__) if e is not None)
        if isinstance(error, BaseExceptionGroup):
            pending.extend(error.exceptions)
    return exc


def _spans(source: str) -> list[tuple[int, int]]:
    """Where the passwords of `source` are, as (start, end) offsets, each reading of it (libpq's,
    urllib's, a malformed URL's) a span of its own, overlapping ones included."""
    spans: list[tuple[int, int]] = []
    scheme = _SCHEME.match(source)
    start = scheme.end() if scheme else 0
    rest = source[start:]
    head = rest.partition("?")[0]
    url_like = scheme is not None or not re.search(r"[\s=]", head.partition("@")[0])
    if url_like and not rest.startswith("/"):
        # A URL, or what would be one but for its missing scheme (`user:pw@host/db`); one whose
        # location starts with '/' has no userinfo (`sqlite:///a:b@c`).
        userinfos = []
        libpq = re.match(r"[^@/]*@", rest)  # libpq ends the userinfo at the first '@' or '/'
        if libpq:
            userinfos.append(libpq.end() - 1)
        netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
        for part in (netloc, head):
            if "@" in part:
                userinfos.append(part.rindex("@"))
        for end in userinfos:
            colon = rest.find(":", 0, end)
            if colon >= 0:
                spans.append((start + colon + 1, start + end))
    if url_like:
        question = rest.find("?")
        if question >= 0:
            at = start + question + 1
            for item in rest[question + 1 :].split("&"):
                key, equals, _ = item.partition("=")
                if equals and unquote(key).strip().lower() == "password":
                    spans.append((at + len(key) + 1, at + len(item)))
                at += len(item) + 1
    spans.extend(m.span(2) for m in _PASSWORD_OPTION.finditer(source))
    return [(a, b) for a, b in spans if b > a]


def _starred(source: str, spans: list[tuple[int, int]]) -> str:
    """`source` with the union of `spans` replaced by ``***`` (one per run)."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    out: list[str] = []
    at = 0
    for a, b in merged:
        out += [source[at:a], REDACTED]
        at = b
    out.append(source[at:])
    return "".join(out)


def _forms(source: str, spans: list[tuple[int, int]]) -> set[str]:
    """Every form the passwords at `spans` may take in a message (see the module doc)."""
    found = {source[a:b] for a, b in spans}
    for value in list(found):
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
