"""Opening a `TrioConnection` without a thread and without asyncio, and the parameters every
connection of the library gets (keepalives, timeouts, session settings)."""

from __future__ import annotations

import ipaddress
import math
import os
import select
import time
from typing import Any, Mapping

import psycopg
import trio
from psycopg import pq
from psycopg.conninfo import conninfo_attempts, conninfo_to_dict, make_conninfo, timeout_from_conninfo

from .connection import _BAD, _POLL_FAILED, _POLL_OK, _POLL_READING, _POLL_WRITING, TrioConnection

__all__ = ["KEEPALIVE_DEFAULTS", "connect", "connection_params"]

KEEPALIVE_DEFAULTS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
"""libpq TCP settings the pool and the listener add unless the conninfo sets them: the kernel
declares a silent peer dead after ~25 s idle (10 s + 3 unanswered probes 5 s apart), or when sent
data stays unacknowledged for 30 s (`tcp_user_timeout`, ms). Ignored on Unix-domain sockets."""

def connection_params(
    conninfo: str,
    *,
    connect_timeout: float | None = None,
    statement_timeout: float | None = None,
    session: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The connection parameters of `conninfo` merged with the pool's: the conninfo's own
    `connect_timeout` and keepalive settings win; `KEEPALIVE_DEFAULTS` fill in the rest; a
    `statement_timeout` (seconds) is appended to the conninfo's own `options` (``-c
    search_path=...`` and the like are kept; the appended setting wins over one given there, so
    the pool's client-side bound and the server's agree). The server counts whole milliseconds
    and reads 0 as "no limit", so a positive `statement_timeout` is sent as at least 1 ms, rounded
    up. `session` settings (``{"plan_cache_mode": "force_generic_plan"}``) are appended the same
    way. Raises `psycopg.ProgrammingError` for a malformed conninfo."""
    params = conninfo_to_dict(conninfo)
    if connect_timeout is not None and params.get("connect_timeout") in (None, ""):
        params["connect_timeout"] = max(1, math.ceil(connect_timeout))
    for key, value in KEEPALIVE_DEFAULTS.items():
        if params.get(key) in (None, ""):
            params[key] = value
    if statement_timeout is not None:
        # round() first: 1.1 s is 1100.0000000000002 ms in floats, and must not become 1101.
        ours = f"-c statement_timeout={max(1, math.ceil(round(statement_timeout * 1000, 6)))}"
        theirs = str(params.get("options") or "").strip()
        params["options"] = f"{theirs} {ours}" if theirs else ours
    for name, value in (session or {}).items():
        ours = f"-c {name}={value}"
        theirs = str(params.get("options") or "").strip()
        params["options"] = f"{theirs} {ours}" if theirs else ours
    return params


async def connect(
    conninfo: str = "",
    *,
    autocommit: bool = False,
    blocking: bool = False,
    prepare_threshold: int | None = 5,
    **kwargs: Any,
) -> TrioConnection:
    """Open a `TrioConnection` without a thread and without asyncio (libpq's non-blocking
    connect, polled through Trio waits); `connect_timeout` (seconds, from `conninfo` or a keyword)
    bounds each attempt, as in psycopg. Host names are resolved on a Trio worker thread (the
    resolver blocks, and is not bounded by `connect_timeout`); IP addresses and socket paths need
    no lookup. With `blocking`, everything
    blocks the Trio thread instead (see the module doc). Raises `psycopg.ProgrammingError` for a
    malformed conninfo and `psycopg.OperationalError` when no attempt succeeds."""
    params = conninfo_to_dict(conninfo, **kwargs)
    timeout = timeout_from_conninfo(params)
    if blocking or not _needs_lookup(params):
        attempts = conninfo_attempts(params)
    else:
        # getaddrinfo blocks: on a worker thread, never abandoned (the library's rule), so a
        # caller cancelled during the lookup waits for the resolver's own timeout.
        attempts = await trio.to_thread.run_sync(conninfo_attempts, params)
    errors: list[psycopg.Error] = []
    pgconn = None
    for attempt in attempts:
        try:
            pgconn = await _connect_one(make_conninfo("", **attempt), timeout, blocking)
            break
        except psycopg.Error as exc:
            errors.append(exc)
    if pgconn is None:
        if len(errors) == 1:
            raise errors[0].with_traceback(None)
        raise type(errors[-1])(
            "\n".join([str(errors[-1]), "Multiple connection attempts failed. All failures were:"] + [f"- {e}" for e in errors])
        )
    conn = TrioConnection(pgconn)
    conn._blocking = blocking
    conn.prepare_threshold = prepare_threshold
    await conn.set_autocommit(autocommit)  # no I/O on a new connection
    return conn


def _needs_lookup(params: dict[str, Any]) -> bool:
    """Whether psycopg's `conninfo_attempts` would call the (blocking) resolver."""
    if params.get("hostaddr") or os.environ.get("PGHOSTADDR"):
        return False
    hosts = str(params.get("host") or os.environ.get("PGHOST") or "")
    for host in hosts.split(","):
        if not host or host.startswith("/") or host.startswith("@") or host[1:2] == ":":
            continue
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return True
    return False


async def _connect_one(conninfo: str, timeout: float, blocking: bool) -> pq.abc.PGconn:
    pgconn = pq.PGconn.connect_start(conninfo.encode())
    try:
        if blocking:
            _poll_connect_blocking(pgconn, time.monotonic() + timeout)
        else:
            with trio.move_on_after(timeout) as scope:
                while True:
                    status = _connect_poll(pgconn)
                    if status == _POLL_OK:
                        break
                    if status == _POLL_READING:
                        await trio.lowlevel.wait_readable(pgconn.socket)
                    else:
                        await trio.lowlevel.wait_writable(pgconn.socket)
            if scope.cancelled_caught:
                raise psycopg.errors.ConnectionTimeout("connection timeout expired")
    except BaseException:
        pgconn.finish()
        raise
    pgconn.nonblocking = 1
    return pgconn


def _connect_poll(pgconn: pq.abc.PGconn) -> int:
    if pgconn.status == _BAD:
        raise psycopg.OperationalError(f"connection is bad: {pgconn.get_error_message()}")
    status = pgconn.connect_poll()
    if status == _POLL_FAILED:
        raise psycopg.OperationalError(f"connection failed: {pgconn.get_error_message()}")
    if status not in (_POLL_OK, _POLL_READING, _POLL_WRITING):
        raise psycopg.InternalError(f"unexpected poll status: {status}")
    return int(status)


def _poll_connect_blocking(pgconn: pq.abc.PGconn, deadline: float) -> None:
    while (status := _connect_poll(pgconn)) != _POLL_OK:
        fd = pgconn.socket
        left = deadline - time.monotonic()
        if left <= 0:
            raise psycopg.errors.ConnectionTimeout("connection timeout expired")
        if status == _POLL_READING:
            select.select([fd], [], [], left)
        else:
            select.select([], [fd], [], left)
