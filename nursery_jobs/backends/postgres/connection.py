"""The backend's state, and its one way to call the database.

Every call of the backend runs through `PostgresBase._run`: a function of one pooled connection
(`infra.pg.PgPool`), which returns the connection at once, so no transaction is ever held across
user code or network I/O. The call is bounded client-side as well as by the server's
`statement_timeout`, and what happens when it fails depends on what failed (`failures`): a lost
connection is retried with bounded backoff for up to `outage_timeout` when the call is safe to
repeat (claims and outcomes are fenced, reads are reads), and never when it is an insert whose
outcome is unknown; a statement the server refused is not retried at all.

The pooled connections run only the runtime's own statements, each prepared at its first use and
always on its generic plan (`POOL_SESSION`), on a cursor kept per statement (`fetch_all`,
`fetch_one`, `execute`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Awaitable, Callable, Sequence

import trio

from ...config import check_timeout
from ...errors import BackendError, BackendUnavailable, ConfigError
from ...infra.pg import ConnectFailed, PgPool, TrioConnection, psycopg, sql  # psycopg only through infra
from ...infra.redact import redact, redact_exception
from ..protocol import BackendEvent, Listener
from .cache import PgCacheStore
from .failures import FailureKind, failure_kind, one_line, sqlstate
from .statements import QUERIES
from .url import check_schema_name, check_statement_timeout, conninfo_params, display_url, split_options

__all__ = ["POOL_SESSION", "PostgresBase", "execute", "fetch_all", "fetch_one", "int_array"]

log = logging.getLogger("nursery_jobs")

POOL_SESSION = {"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off", "jit": "off"}
"""Settings of every pooled connection, which runs only the runtime's own statements.

Each of the runtime's statements is prepared at its first use on a connection (`prepare=True`
per call; the connection keeps psycopg's default threshold, for a service's own statements in
`transaction()`) and always runs on its generic plan, so the server never plans a claim again
per call: with the default (`auto`), a claim on an analyzed table was re-planned every time,
0.88 ms of planning for 0.25 ms of work.
That is safe because each hot statement is shaped so that its one plan is right whatever the
statistics say, even a plan made while the table was empty (migration 0004;
tests/backends/postgres/test_plans.py): the outcome, heartbeat, cancel and rescue statements
update their rows by primary key from ids they carry or have just locked, and join no list
against the table; the claim reaches its rows only through its partial indexes.
Sequential scans are off: a plan made while the table was small (a fresh deploy) would read it
whole, and keep doing so once a backlog has made it large, until autovacuum next analyzes it;
every statement here has an index made for it, and `stats`, the one that counts every row,
turns them back on for itself.
JIT compilation is off: a generic plan's cost is an estimate for any parameter, and the claim's
on a table of a million rows (its `LIMIT` unknown, a per-row key probe in its filter) passes
`jit_above_cost`, so the server compiled it at every call: 20 ms of JIT for 0.2 ms of work,
measured as 43 jobs/s against 2,000 on the production benchmark's 1M-row drain. Every statement
here reads a handful of rows through an index; none gains from compiled expressions."""


# The runtime's statements run on a cursor the connection keeps per statement (`cached_cursor`):
# a new psycopg cursor per call costs ~30 us of client CPU (measured), a reused one keeps its
# adapters and query conversion. Each is prepared at its first use on each connection
# (`POOL_SESSION`): `prepare=True` per call, so the connection itself keeps psycopg's default
# threshold for the statements of a service's transaction (`transaction()`).


async def fetch_all(conn: TrioConnection, query: Any, params: Any = None) -> list[tuple[Any, ...]]:
    cur = conn.cached_cursor(query)
    await cur.execute(query, params, prepare=True)
    return await cur.fetchall()


async def fetch_one(conn: TrioConnection, query: Any, params: Any = None) -> tuple[Any, ...] | None:
    cur = conn.cached_cursor(query)
    await cur.execute(query, params, prepare=True)
    return await cur.fetchone()


async def execute(conn: TrioConnection, query: Any, params: Any = None) -> None:
    await conn.cached_cursor(query).execute(query, params, prepare=True)


def int_array(values: Sequence[int]) -> str:
    """A PostgreSQL array literal of ints (for a ``%s::bigint[]`` / ``::int[]`` parameter)."""
    return "{" + ",".join(map(int.__repr__, values)) + "}"


def _seconds(what: str, value: Any) -> float:
    checked = check_timeout(what, value, allow_none=False)
    assert checked is not None
    return checked


class PostgresBase:
    """The backend's settings and state, and the calls every concern of it makes: `_run` (one
    function of a pooled connection, bounded and retried by what failed), `_describe` (an error on
    one line, without the password) and `_emit` (events to this process's listeners)."""

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = "nursery_jobs",
        pool_size: int | None = None,
        pool_share: float = 0.5,
        poll_interval: float | None = 1.0,
        outage_timeout: float = 30.0,
        statement_timeout: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.conninfo = conninfo
        """As given: it carries the password, so it is never shown; `url` names the database."""
        self.schema = check_schema_name(schema)
        _, stray = split_options(conninfo)
        if stray:
            names = ", ".join(f"?{name}=" for name in stray)
            raise ConfigError(
                f"{names} in the conninfo: PostgresBackend takes them as keyword arguments "
                "(nj.open_backend(url) reads them from a URL)"
            )
        params = conninfo_params(conninfo)
        if pool_size is not None and (isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 2):
            raise ConfigError(f"pool_size must be an int >= 2, not {pool_size!r}")
        if not 0 < pool_share <= 1:
            raise ConfigError(f"pool_share must be in (0, 1], not {pool_share!r}")
        self.pool_size = pool_size
        self._auto_pool = pool_size is None
        self.pool_share = pool_share
        # None: no fallback polling (tests that drive every wake-up themselves)
        self.poll_interval: float | None = check_timeout("poll_interval", poll_interval, allow_none=True)
        self.outage_timeout = _seconds("outage_timeout", outage_timeout)
        self.statement_timeout = _seconds("statement_timeout", statement_timeout)
        """The server's `statement_timeout` on pooled connections; every pooled call is also
        bounded client-side at this + `infra.pg.ROUND_TRIP_MARGIN` (`PgPool`)."""
        check_statement_timeout("statement_timeout", self.statement_timeout)
        self._clock = clock
        self._wall_offset: float | None = None
        self._listeners: list[Listener] = []
        self._pool: PgPool | None = None
        self._workers: int | None = None
        """The most queue workers a runtime on this backend has (`check_budget`); None: unknown."""
        self.acquire_timeout = 10.0
        """The longest wait for a free pooled connection, and for a transaction slot."""
        self._tx_slots: trio.Semaphore | None = None
        self._tx_limit = 0
        self._lent: dict[TrioConnection, list[Any]] = {}
        """The connections `transaction()` lent, each with the inserts to announce at its commit."""
        self._lean: dict[str, int] = {}
        """Per queue, how the claim starts: 0, with the lean statement (`claim_lean`); more, with
        the full one for that many more claims; absent, with the full one until a claim shows
        the queue's jobs lean."""
        self._dbname: str | None = None
        """The database the pool's connections reach (known once open): `enqueue_tx` checks a
        caller's connection against it."""
        self._cache: PgCacheStore | None = None
        self.url = redact(display_url(params, schema), conninfo)
        """The database this backend uses, for logs and messages: user, hosts, ports, database
        and schema, never the password."""
        ident = sql.Identifier(schema)
        self._jobs_channel = f"{schema}_jobs"
        self._events_channel = f"{schema}_events"
        # The id sequence the migration's bigserial made (a literal: resolved once, when the
        # statement is parsed, not per row).
        seq = sql.Literal(f'"{schema}".jobs_id_seq')
        fences = sql.Literal(f'"{schema}".lock_fences')
        # Rendered once: psycopg would compose a `sql.Composed` again on every call.
        self._q = {
            name: q.format(s=ident, seq=seq, fences=fences, schema_text=sql.Literal(schema)).as_bytes(None)
            for name, q in QUERIES.items()
        }

    def __repr__(self) -> str:
        return f"<PostgresBackend {self.url}>"

    @property
    def pool(self) -> PgPool:
        if self._pool is None:
            raise BackendUnavailable("the PostgreSQL backend is not open; use it inside open_runtime()")
        return self._pool

    def now(self) -> float:
        return self._clock()

    def wall_offset(self) -> float:
        if self._wall_offset is None:
            self._wall_offset = 0.0 if self._clock is time.time else self._clock() - time.time()
        return self._wall_offset

    async def _run(
        self, fn: Callable[[TrioConnection], Awaitable[Any]], *, retry: bool = True, durable: bool = True
    ) -> Any:
        """``await fn(conn)`` on a pooled connection (`durable=False`: see `PgPool.run`). A lost
        connection (server restart, terminated backend, or one silent past the pool's
        client-side bound: `RoundTripTimeout`) is retried with bounded backoff for up to
        `outage_timeout` after the first failure when `retry`: every call that retries is safe
        to repeat (claims and outcomes are fenced, reads are reads). Inserts do not retry: their
        outcome is unknown when the connection drops mid-call (a failed connect or session
        switch, `ConnectFailed`, sent nothing and is retried even then). Each attempt is bounded
        by `PgPool.round_trip_bound` + `DRAIN_TIMEOUT`, so a call ends within about
        `outage_timeout` + two such bounds, whatever the network does."""
        deadline: float | None = None
        delay = 0.05
        while True:
            try:
                return await self.pool.run(fn, durable=durable)
            except psycopg.errors.QueryCanceled as exc:
                redact_exception(exc, self.conninfo)
                raise BackendUnavailable(
                    f"PostgreSQL statement exceeded the statement timeout ({self._describe(exc)})"
                ) from exc
            except trio.TooSlowError as exc:
                raise BackendUnavailable(
                    f"no PostgreSQL connection free in the pool of {self.pool.size} within its wait bound; "
                    "raise pool_size or lower the number of concurrent callers"
                ) from exc
            except psycopg.Error as exc:
                redact_exception(exc, self.conninfo)  # it is the cause of what is raised below
                kind = failure_kind(exc)
                if kind is FailureKind.CLIENT:
                    raise  # psycopg refused the call before sending it: a bug here, shown as it is
                if kind is FailureKind.RESOURCE:
                    raise BackendUnavailable(
                        f"PostgreSQL is out of a resource or failed internally ({self._describe(exc)}); "
                        "the statement failed and is not retried: see the server's log"
                    ) from exc
                if kind is FailureKind.STATEMENT:
                    raise BackendError(
                        f"PostgreSQL returned an error for the statement ({self._describe(exc)}); "
                        "the connection is fine, and the call is not retried"
                    ) from exc
                if kind is FailureKind.ROLLED_BACK and not retry:
                    raise BackendUnavailable(
                        f"PostgreSQL rolled the write back ({self._describe(exc)}); nothing of it was "
                        "written, so it may be repeated"
                    ) from exc
                # A lost connection, or a transient rollback of a call safe to repeat. A failed
                # connect sent nothing: even a write may be retried then.
                if deadline is None:
                    deadline = trio.current_time() + self.outage_timeout
                if not (retry or isinstance(exc, ConnectFailed)) or trio.current_time() + delay > deadline:
                    raise BackendUnavailable(
                        f"PostgreSQL unavailable ({self._describe(exc)}); gave up after {self.outage_timeout:g} s"
                        if retry or isinstance(exc, ConnectFailed)
                        else f"PostgreSQL connection lost during a write whose outcome is unknown ({self._describe(exc)})"
                    ) from exc
                log.warning(
                    "PostgreSQL call failed (%s); retrying in %.2f s",
                    self._describe(exc),
                    delay,
                    extra={"event": "backend_retry", "backend": self.url, "retry_in": delay},
                )
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _describe(self, exc: BaseException) -> str:
        """`exc` on one line for a message or a log: its SQLSTATE and class when the server sent
        one, and never the password."""
        text = one_line(exc)
        state = sqlstate(exc)
        if state is not None:
            text = f"SQLSTATE {state} {type(exc).__name__}: {text}"
        return redact(text, self.conninfo)

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def _emit(self, events: Sequence[BackendEvent]) -> None:
        listeners = tuple(self._listeners)  # once per batch, not per event
        for event in events:
            for listener in listeners:
                listener(event)
