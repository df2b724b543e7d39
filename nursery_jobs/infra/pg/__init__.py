"""The PostgreSQL driver bridge: psycopg 3 on Trio's own I/O, a pool, and the one LISTEN connection.

The bridge. `TrioConnection` is psycopg's `AsyncConnection` with the one place where psycopg
blocks -- `wait()`, which drives psycopg's I/O generators -- done by Trio:
`trio.lowlevel.wait_readable` / `wait_writable` on the connection's socket, on the Trio thread,
with no worker thread and no asyncio loop. When psycopg asks for "readable or writable" (while it
sends a message larger than the socket buffer), one Trio wait covers both: on an epoll set
holding just that socket (on platforms without epoll, two waits in a small nursery). Connecting
is done the same way (libpq's `connect_start` / `connect_poll`, `connect_timeout` honoured), and
so is a server-side cancel request (libpq's non-blocking cancel connection).

Why this and not the two options the issue named (psycopg's sync API through the thread limiter,
or its async API through trio-asyncio): measured in benchmarks/RESULTS.md ("Bridge"), both cost
~1.4-1.8 ms of client CPU per claim + complete round trip and reach 0.41-0.47 of sync psycopg's
round-trip rate; this bridge reaches 0.90-0.96 of it at 1.2-1.35x its CPU (with the cursor kept
per statement, as the backend calls it), and honours cancellation as well. trio-asyncio stays the bridge for asyncio job handlers
(`infra.aio`).

What in `AsyncConnection` touches asyncio, and what replaces it here: `wait()` (above);
`connect()` (its DNS lookup and connect loop run on asyncio: replaced by `connect()` below);
`cancel_safe()` (replaced); the connection's `lock`, an `asyncio.Lock` (replaced by a Trio lock
that costs nothing uncontended). Everything else (cursors, COPY with the default writer,
transactions, pipelines) only awaits `wait()` and the lock. Tests run it under plain
`trio.run`, with no asyncio loop at all.

Cancellation. A call waits only in Trio waits, so a cancelled caller stops waiting at once,
and a cancelled caller never sends anything. If a statement was in flight, the bridge sends the
server a cancel request and follows the statement to its end (shielded, at most `DRAIN_TIMEOUT`
seconds): if the server stopped it, the call raises `Cancelled` and nothing happened; if it had
completed before the request arrived, the call returns its result (the caller's cancellation
then takes effect at its next checkpoint), so a call that took effect is never reported as
cancelled -- which keeps `enqueue` and `cancel` cancel-atomic. A statement psycopg sends after
one that ended (the execute after a prepare) gets a cancel request of its own. If the server
does not stop in time, the connection is closed. Either way no connection is handed to the next
caller dirty: the pool rolls back a transaction left open and discards a connection that is
closed, still busy (a COPY left half-way), or whose rollback failed.

Blocking mode (`blocking=True`), for deterministic tests only. `trio.testing.MockClock` with
`autojump_threshold=0` jumps virtual time whenever every task is blocked, and a task waiting for
a socket looks blocked: virtual time would jump while a query runs. In blocking mode every wait
is a Trio checkpoint followed by a blocking poll on the Trio thread (psycopg's own
`waiting.wait`), and connecting blocks too: the loop never sees I/O as idleness. A cancellation
delivered at that checkpoint finds nothing sent. The price is that a query cannot be cancelled
while it runs (cancellation takes effect at the next checkpoint) and the whole loop stalls for
each round trip. The LISTEN connection connects and subscribes
blocking too, but waits for notifications with a Trio wait (it waits indefinitely). Never use
it in production.

Pool. A bounded set of autocommit connections, opened lazily, checked out without a wait while
one is free (a bounded wait otherwise), most recently used first. A connection that died while
idle is found by a zero-timeout poll of its socket at checkout and replaced. `run(fn,
durable=False)` asks for a session with `synchronous_commit = off`, for writes whose loss in a
server crash is harmless (claims, heartbeats). A connection keeps its mode; while the pool has
room each mode gets connections of its own, and only a full pool switches one (`SET
synchronous_commit = off`, or `RESET` back to whatever the server configures). psycopg_pool is
not used: its sync pool runs maintenance threads outside the runtime's task tree, and its async
pool needs an asyncio loop.

Bounds. No pooled round trip waits forever: `PgPool.run` is cut client-side at
`statement_timeout + ROUND_TRIP_MARGIN` (the server stops a statement at `statement_timeout`,
so only a silent connection -- a partition dropping packets, a frozen server -- gets there),
then cancelled as above (at most `DRAIN_TIMEOUT` more) and its connection closed:
`RoundTripTimeout`, an `OperationalError` like a lost connection. Pool and listener connections
get TCP keepalives and `tcp_user_timeout` (`KEEPALIVE_DEFAULTS`) unless the conninfo sets them,
and keep the conninfo's own `connect_timeout` and `options` (`connection_params`).

Listener. One dedicated connection per process LISTENs; Trio waits for its socket to become
readable (no thread, no polling) and hands each notification to a callback. If the connection
drops, the listener reconnects with bounded exponential backoff and calls `on_reconnect`, so the
caller can look for work it may have missed while deaf (fetchers also poll, so nothing waits
longer than a poll interval meanwhile). A connection that goes silent is found by a `SELECT 1`
after `ping_interval` idle seconds that must answer within `ping_timeout` (and by keepalives).
"""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from .connect import KEEPALIVE_DEFAULTS, connect, connection_params
from .connection import DRAIN_TIMEOUT, TrioConnection
from .listener import listen
from .pool import ROUND_TRIP_MARGIN, ConnectFailed, PgPool, RoundTripTimeout

__all__ = [
    "DRAIN_TIMEOUT",
    "KEEPALIVE_DEFAULTS",
    "ROUND_TRIP_MARGIN",
    "ConnectFailed",
    "PgPool",
    "RoundTripTimeout",
    "TrioConnection",
    "connect",
    "connection_params",
    "conninfo_to_dict",
    "listen",
    "psycopg",
    "sql",
]
