"""The one LISTEN connection per process: notifications to a callback, reconnecting for ever."""

from __future__ import annotations

import logging
import math
from typing import Callable, Sequence

import psycopg
import trio
from psycopg import pq, sql
from psycopg.conninfo import make_conninfo

from ..redact import redact
from .connect import connect, connection_params
from .connection import TrioConnection

__all__ = ["listen"]

log = logging.getLogger("nursery_jobs")

async def listen(
    conninfo: str,
    channels: Sequence[str],
    on_notify: Callable[[str, str, int], None],
    on_reconnect: Callable[[], None],
    *,
    max_backoff: float = 5.0,
    ping_interval: float | None = 30.0,
    ping_timeout: float = 10.0,
    blocking: bool = False,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """LISTEN on `channels` until cancelled, calling ``on_notify(channel, payload, sender_pid)`` per
    notification. Reports started once the first LISTEN is in place (or the first attempt
    failed: start-up must not hang on an unreachable server; polling covers the gap).

    Liveness: the connection gets TCP keepalives (`KEEPALIVE_DEFAULTS`, unless the conninfo sets
    them), and after `ping_interval` seconds without traffic it sends ``SELECT 1``; no answer
    within `ping_timeout` (plus at most `DRAIN_TIMEOUT` to cancel it) counts as a lost
    connection, so a silent partition cannot leave the listener deaf for long. `ping_interval`
    None: no pings (always so in blocking mode, where a ping would block the loop).
    `blocking`: connect and subscribe blocking (see the module doc); notifications are still
    awaited with a Trio wait."""
    given = conninfo
    params = connection_params(conninfo, connect_timeout=10)
    conninfo = make_conninfo("", **params)
    if blocking:
        ping_interval = None
    backoff = 0.1
    started = False
    while True:
        conn: TrioConnection | None = None
        try:
            conn = await connect(conninfo, autocommit=True, blocking=blocking)
            # Notifications that arrive while a ping runs are read by psycopg: through here.
            conn.add_notify_handler(lambda n: on_notify(n.channel, n.payload, n.pid))
            for channel in channels:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
            if not started:
                started = True
                task_status.started()
            else:
                log.warning("LISTEN connection re-established", extra={"event": "listen_reconnected"})
                on_reconnect()
            backoff = 0.1
            await _pump(conn, on_notify, ping_interval, ping_timeout)
        except (psycopg.Error, OSError) as exc:
            log.warning(
                "LISTEN connection lost (%s); retrying in %.1f s, polling meanwhile",
                redact(" ".join(str(exc).split()), given, conninfo),
                backoff,
                extra={"event": "listen_lost", "retry_in": backoff},
            )
            if not started:
                started = True
                task_status.started()
            await trio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)
        finally:
            if conn is not None:
                conn.close_now()


async def _pump(
    conn: TrioConnection,
    on_notify: Callable[[str, str, int], None],
    ping_interval: float | None,
    ping_timeout: float,
) -> None:
    pgconn = conn.pgconn
    fileno = pgconn.socket
    while True:
        with trio.move_on_after(math.inf if ping_interval is None else ping_interval) as idle:
            await trio.lowlevel.wait_readable(fileno)
        if idle.cancelled_caught:
            with trio.move_on_after(ping_timeout) as ping:
                await conn.execute("SELECT 1")
            if ping.cancelled_caught:
                raise psycopg.OperationalError(f"LISTEN connection did not answer a ping within {ping_timeout:g} s")
            continue
        pgconn.consume_input()  # raises OperationalError when the server went away
        if pgconn.status != pq.ConnStatus.OK:
            raise psycopg.OperationalError("LISTEN connection closed by the server")
        while (n := pgconn.notifies()) is not None:
            on_notify(n.relname.decode(), n.extra.decode(), n.be_pid)
