"""The PostgreSQL backend (``postgresql://user@host/db?schema=nursery_jobs&pool_size=20``).

Many processes on many hosts share one database. The design, call by call:

- **Claim**: one statement, `UPDATE ... WHERE id IN (<best k of the due jobs, FOR UPDATE SKIP
  LOCKED>) RETURNING ...`, for as many jobs as the fetcher has idle workers, by priority DESC,
  run_at, id. SKIP LOCKED lets concurrent fetchers take disjoint rows without waiting on each
  other. The due jobs come from two partial indexes (migration 0002): `jobs_available` holds
  only `available` rows, in claim order; `jobs_waiting` holds scheduled and retryable rows by
  `run_at`, read only up to now. Those that came due and are not claimed are made `available`
  in the same statement. Neither scan reads a finished row or one that is not due yet, so the
  cost stays flat however many of those the queue holds (tests/backends/postgres/test_claim_cost.py).
  Nor, after one pass, a due job whose concurrency key is full: the claim that passes over it
  parks it out of `jobs_available` until a job of its key leaves `running` (migration 0011).
  The same round trip reports when the next scheduled job of the queue is due. A queue whose
  claims have been lean (no rate or global limit, nothing parked, every keyed pick started)
  claims with a lean statement first (`claim_lean`: the prefix of the same scan whose rows
  have no rate key and no concurrency key or one with room, the keyed ones admitted by
  `claim_picked` under their keys' locks, in a third of the full statement's execution time
  with no key), which says in the same round trip whether the full one must run for the rest.
  Claims and heartbeats commit with `synchronous_commit =
  off` (`PgPool.run(durable=False)`): losing the last milliseconds of them in a server crash
  only makes jobs claimable again, and they do not wait for the WAL flush. (After such a crash
  the lost claim's attempt number is handed out again, so a late outcome of the lost attempt
  can end the new one early: a job may run twice, which at-least-once allows, and none is lost.)
- **Inserts**: one job is one `INSERT ... RETURNING` whose `pg_notify` rides in the same
  statement; a batch is one `INSERT ... SELECT FROM unnest(...)`, or from `_COPY_AT` jobs on,
  `COPY` in one transaction (ids reserved from the sequence first, so they keep the order).
  Jobs with a unique key go one by one (`ON CONFLICT ... DO NOTHING`, then a lookup).
- **Outcomes**: one `UPDATE ... WHERE id = ANY(<ids>)` per completer batch, each row's outcome
  read from a jsonb object keyed by "id:attempt" (no list joined against the table, so no plan
  can walk the table for it, whatever the statistics say). Every row is updated only if it is
  still `running` under the attempt the worker claimed (the fencing token), so a late worker
  can never overwrite a job that was rescued or finished elsewhere. Heartbeats take the same
  shape.
- **Wake-ups**: inserts and retries `pg_notify` the queue's name on `<schema>_jobs`; finalized
  jobs and cancel requests go on `<schema>_events`. One LISTEN connection per process
  (`infra.pg.listen`) fans them out. Fetchers also poll (1 s; 0.1 s for awaited queues), so a
  lost connection delays work by at most a poll interval and nothing is lost. A process whose
  runtimes have no queue workers listens on `<schema>_events` only, and a process drops the
  echo of its own notifications (their events were emitted in-process already), but for a
  wake-up marked '!', which a statement sends from inside a claim that cannot report it
  (migration 0017's `unpark_keys`, which `rate_park` calls).
- **No transaction is held across user code or network I/O**: every call here is a single
  autocommit statement (or a short transaction with no I/O but the database's) on a pooled
  connection that is returned at once. The connections are `infra.pg.TrioConnection`s: psycopg
  on Trio's own I/O, no thread per call; statements run on a cursor kept per statement.
- **Schema**: in its own schema (default `nursery_jobs`), validated as an identifier and always
  quoted by psycopg, never built from strings; created and upgraded only by
  `nursery-jobs migrate`, checked at start-up.
- **The URL** is libpq's: only the library's own options are taken out of its query string, and
  the rest reaches libpq as written, so every form libpq accepts (sockets, several hosts, its
  options) means the same here. The conninfo is kept only to connect; everything shown names
  the database by `url`, which has no password, and every message made from libpq's text goes
  through `infra.redact.redact` first.
- **Failures are classified by SQLSTATE**, not by psycopg's exception class (`_failure_kind`):
  psycopg files statement errors such as 54 (program limit exceeded) under the same class as a
  dropped connection, and only a dropped connection may be retried as one.

Times are float seconds on the runtime's clock (Unix time; hosts are expected to run NTP).
"""

from __future__ import annotations

import contextlib
import enum
import importlib.resources
import json
import logging
import operator
import re
import shlex
import time
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable, ClassVar, Mapping, Protocol, Sequence
from urllib.parse import quote, unquote

import trio

from ..infra.pg import (  # psycopg only through infra: import order
    DRAIN_TIMEOUT,
    ConnectFailed,
    PgPool,
    RoundTripTimeout,
    TrioConnection,
    conninfo_to_dict,
    listen,
    psycopg,
    sql,
)
from ..infra.redact import REDACTED, redact, redact_exception
from ..infra.threads import run_callers_io
from ..config import check_timeout
from ..errors import BackendError, BackendUnavailable, ConfigError, JobNotFound
from ..jobs import MAX_ERRORS_KEPT, Job, JobState
from .protocol import (
    BackendEvent,
    Bounds,
    CancelRequested,
    ClaimedJob,
    ClaimResult,
    HeartbeatResult,
    InsertResult,
    JobFinalized,
    JobsAvailable,
    Listener,
    NewJob,
    OutboxEvent,
    OutboxPublished,
    Outcome,
    OutcomeKind,
    QueueCounts,
    Route,
    ScheduleState,
)
from .cache_postgres import PgCacheStore
from .rows import counts_from_rows, job_from_row
from .transitions import PARK_AT_ONCE, PENDING, check_room, sql_case

log = logging.getLogger("nursery_jobs")

__all__ = ["PostgresBackend", "migrate", "parse_postgres_url", "schema_version"]

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,40}$")
_OPTIONS = {"schema", "pool_size", "pool_share", "poll_interval", "statement_timeout", "outage_timeout"}
_SECONDS_OPTIONS = ("poll_interval", "statement_timeout", "outage_timeout")
_MIN_STATEMENT_TIMEOUT = 0.001
_MAX_STATEMENT_TIMEOUT = 2_147_483  # seconds: INT_MAX milliseconds, rounded down
_NOTIFY_IDS_PER_PAYLOAD = 400  # NOTIFY payloads are limited to 8000 bytes
_STATES = {s.value: s for s in JobState}
_tuple_new = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)
_RUN_AT_ID = operator.itemgetter(7, 0)
_PRIORITY = operator.itemgetter(6)
"""A claim row's (run_at, id) and its priority: the claim order's sort keys."""
_COMPLETED_KIND = OutcomeKind.COMPLETED
POOL_SESSION = {"plan_cache_mode": "force_generic_plan", "enable_seqscan": "off", "jit": "off"}
"""Settings of every pooled connection, which runs only the runtime's own statements.

Each of the runtime's statements is prepared at its first use on a connection (`prepare=True`
per call; the connection keeps psycopg's default threshold, for a service's own statements in
`transaction()`) and always runs on its generic plan, so the server never plans a claim again per call: with the default (`auto`), a
claim on an analyzed table was re-planned every time, 0.88 ms of planning for 0.25 ms of work.
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
_COPY_AT = 50
"""Batches of at least this many jobs (none with a unique key) are inserted with COPY: its
extra round trips (a transaction, the ids, the COPY) cost less than passing the batch as arrays
from about here on (measured on the benchmark machine: 50 jobs take ~3.3 ms either way, 100 take
4.3 against 5.8 ms, 2,000 take 40 against 81 ms)."""


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
    conninfo, ours = _split_options(url)
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
        _check_statement_timeout("?statement_timeout= in the PostgreSQL URL", opts["statement_timeout"])
    return conninfo, opts


def _split_options(url: str) -> tuple[str, dict[str, str]]:
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


def _check_statement_timeout(what: str, seconds: float) -> None:
    """The server counts `statement_timeout` in whole milliseconds, and 0 there means no limit
    at all: a positive value under 1 ms would turn the bound off instead of making it short.
    Above INT_MAX ms the server refuses the connection."""
    if not _MIN_STATEMENT_TIMEOUT <= seconds <= _MAX_STATEMENT_TIMEOUT:
        raise ConfigError(
            f"{what} must be at least {_MIN_STATEMENT_TIMEOUT:g} s (PostgreSQL counts whole milliseconds, "
            f"and 0 would disable the timeout) and at most {_MAX_STATEMENT_TIMEOUT} s (about 24 days), not {seconds!r}"
        )


def _conninfo_params(conninfo: str) -> dict[str, Any]:
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
        message = f"bad PostgreSQL URL: {redact(_one_line(exc), conninfo)}"
    # Raised outside the handler, so libpq's error, which quotes the password, is not its context.
    raise ConfigError(message)


def _display_url(params: Mapping[str, Any], schema: str) -> str:
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


def _migrations() -> list[tuple[int, str, str]]:
    files = importlib.resources.files("nursery_jobs.backends") / "pg_migrations"
    out = []
    for entry in sorted(files.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            out.append((int(entry.name.split("_", 1)[0]), entry.name, entry.read_text()))
    return out


LATEST_VERSION = max(v for v, _, _ in _migrations())


def schema_version(conn: psycopg.Connection[Any], schema: str) -> int | None:
    """The applied version of `schema`, or None if it was never migrated."""
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f'"{check_schema_name(schema)}".migrations',)
    ).fetchone()
    if not row or not row[0]:
        return None
    got = conn.execute(
        sql.SQL("SELECT max(version) FROM {}.migrations").format(sql.Identifier(schema))
    ).fetchone()
    return int(got[0]) if got and got[0] is not None else None


async def _schema_version_async(conn: TrioConnection, schema: str) -> int | None:
    """`schema_version` on the runtime's own (Trio) connection."""
    cur = await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f'"{check_schema_name(schema)}".migrations',))
    row = await cur.fetchone()
    if not row or not row[0]:
        return None
    cur = await conn.execute(sql.SQL("SELECT max(version) FROM {}.migrations").format(sql.Identifier(schema)))
    got = await cur.fetchone()
    return int(got[0]) if got and got[0] is not None else None


# The runtime's statements run on a cursor the connection keeps per statement (`cached_cursor`):
# a new psycopg cursor per call costs ~30 us of client CPU (measured), a reused one keeps its
# adapters and query conversion.


# The runtime's statements, prepared at their first use on each connection (`POOL_SESSION`):
# `prepare=True` per call, so the connection itself keeps psycopg's default threshold for the
# statements of a service's transaction (`transaction()`).


async def _all(conn: TrioConnection, query: Any, params: Any = None) -> list[tuple[Any, ...]]:
    cur = conn.cached_cursor(query)
    await cur.execute(query, params, prepare=True)
    return await cur.fetchall()


async def _one(conn: TrioConnection, query: Any, params: Any = None) -> tuple[Any, ...] | None:
    cur = conn.cached_cursor(query)
    await cur.execute(query, params, prepare=True)
    return await cur.fetchone()


async def _exec(conn: TrioConnection, query: Any, params: Any = None) -> None:
    await conn.cached_cursor(query).execute(query, params, prepare=True)


def migrate(conninfo: str, schema: str = "nursery_jobs") -> list[str]:
    """Create or upgrade `schema`; returns the names of the migrations applied. Safe to run
    from several processes at once (an advisory lock serialises them)."""
    check_schema_name(schema)
    _conninfo_params(conninfo)
    try:
        return _migrate(conninfo, schema)
    except psycopg.Error as exc:
        raise redact_exception(exc, conninfo)  # libpq's messages can quote the URL back


def _migrate(conninfo: str, schema: str) -> list[str]:
    ident = sql.Identifier(schema)
    applied: list[str] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"nursery_jobs:{schema}",))
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {}.migrations"
                    " (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
                ).format(ident)
            )
            current = schema_version(conn, schema) or 0
            for version, name, text in _migrations():
                if version <= current:
                    continue
                conn.execute(sql.SQL(text).format(schema=ident, schema_text=sql.Literal(schema)))
                conn.execute(
                    sql.SQL("INSERT INTO {}.migrations (version, name) VALUES (%s, %s)").format(ident), (version, name)
                )
                applied.append(name)
    return applied


class PostgresBackend:
    """Jobs in PostgreSQL, shared by every process and host that uses the same schema."""

    never_yields = False
    _blocking_io: ClassVar[bool] = False
    """Every database wait blocks the Trio thread (`PgPool(blocking=True)`): set only by a test
    subclass that runs the runtime under `MockClock(autojump_threshold=0)`, never by a service."""

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
        _, stray = _split_options(conninfo)
        if stray:
            names = ", ".join(f"?{name}=" for name in stray)
            raise ConfigError(
                f"{names} in the conninfo: PostgresBackend takes them as keyword arguments "
                "(nj.open_backend(url) reads them from a URL)"
            )
        params = _conninfo_params(conninfo)
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
        _check_statement_timeout("statement_timeout", self.statement_timeout)
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
        self.url = redact(_display_url(params, schema), conninfo)
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
            for name, q in _QUERIES.items()
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
                kind = _failure_kind(exc)
                if kind is _Failure.CLIENT:
                    raise  # psycopg refused the call before sending it: a bug here, shown as it is
                if kind is _Failure.RESOURCE:
                    raise BackendUnavailable(
                        f"PostgreSQL is out of a resource or failed internally ({self._describe(exc)}); "
                        "the statement failed and is not retried: see the server's log"
                    ) from exc
                if kind is _Failure.STATEMENT:
                    raise BackendError(
                        f"PostgreSQL returned an error for the statement ({self._describe(exc)}); "
                        "the connection is fine, and the call is not retried"
                    ) from exc
                if kind is _Failure.ROLLED_BACK and not retry:
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
        text = _one_line(exc)
        state = _sqlstate(exc)
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

    def check_budget(self, workers: int) -> None:
        self._workers = workers if self._workers is None else max(self._workers, workers)
        needs = workers + 2  # + the runtime's own calls (fetch, complete, maintenance) + the listener
        if self._auto_pool:
            # No pool_size given: size the pool to the first runtime's needs, with half left
            # for the service's own requests, so a burst of jobs cannot starve its handlers.
            if self._pool is None:
                self.pool_size = max(4, int(needs / self.pool_share))
            return
        assert self.pool_size is not None
        allowed = int(self.pool_size * self.pool_share)
        if needs > allowed:
            raise ConfigError(
                f"connection budget exceeded: {workers} queue workers + 1 runtime + 1 listener = {needs} "
                f"connections, but pool_size {self.pool_size} x pool_share {self.pool_share:g} = {allowed}; "
                "raise pool_size, lower max_workers, or run fewer queues in this process"
            )

    async def open(self) -> None:
        if self._pool is not None:
            return
        bad_url: str | None = None
        try:
            pool = PgPool(
                self.conninfo,
                size=self.pool_size or 10,
                acquire_timeout=self.acquire_timeout,
                statement_timeout=self.statement_timeout,
                blocking=self._blocking_io,
                session=POOL_SESSION,
            )
        except psycopg.ProgrammingError as exc:
            bad_url = f"bad PostgreSQL URL: {redact(_one_line(exc), self.conninfo)}"
        # Each error below is raised outside the handler that caught psycopg's: that one may
        # quote the URL, and would be the context of ours.
        if bad_url is not None:
            raise ConfigError(bad_url)
        failed: psycopg.Error | None = None
        try:
            async def check(conn: TrioConnection) -> int | None:
                self._dbname = conn.info.dbname
                return await _schema_version_async(conn, self.schema)

            version = await pool.run(check)
        except psycopg.Error as exc:
            failed = exc
        if failed is not None:
            await pool.close()
            kind = _failure_kind(failed)
            if kind is _Failure.CLIENT:
                raise ConfigError(f"bad PostgreSQL URL: {self._describe(failed)}")
            if kind is _Failure.LOST:
                raise BackendUnavailable(
                    f"cannot connect to PostgreSQL at {self.url} ({self._describe(failed)}); "
                    "check the URL and that the server is running"
                )
            raise BackendUnavailable(
                f"PostgreSQL returned an error while checking the schema {self.schema!r} at {self.url} "
                f"({self._describe(failed)})"
            )
        if version is None or version < LATEST_VERSION:
            await pool.close()
            what = "does not exist" if version is None else f"is at version {version}, this nursery_jobs needs {LATEST_VERSION}"
            given = redact(self.conninfo, self.conninfo)
            password = " (with the password in place of ***)" if REDACTED in given else ""
            raise ConfigError(
                f"the nursery_jobs schema {self.schema!r} {what}; run "
                f"`nursery-jobs migrate --database-url {shlex.quote(given)} --schema {self.schema}` first{password}"
            )
        if version > LATEST_VERSION:
            await pool.close()
            raise ConfigError(
                f"the nursery_jobs schema {self.schema!r} is at version {version}, newer than this "
                f"nursery_jobs ({LATEST_VERSION}); upgrade nursery_jobs"
            )
        self._pool = pool

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # A process with no queue workers (a web process that only enqueues and waits) has no
        # fetcher to wake: it skips the jobs channel, and with it the echo of every enqueue.
        channels = [self._events_channel] if self._workers == 0 else [self._jobs_channel, self._events_channel]
        await listen(
            self.conninfo,
            channels,
            self._on_notify,
            lambda: self._emit([JobsAvailable(None)]),
            blocking=self._blocking_io,
            task_status=task_status,
        )

    def _on_notify(self, channel: str, payload: str, sender_pid: int) -> None:
        if channel == self._jobs_channel and payload.startswith("!"):
            # A wake-up from inside a statement that could not report it to its caller
            # (migration 0017's `unpark_keys`, from `rate_park`): acted on in every process,
            # the writer's too.
            self._emit([JobsAvailable(payload[1:])])
            return
        pool = self._pool
        if pool is not None and sender_pid in pool.backend_pids:
            # Our own NOTIFY: its event was already delivered in-process when the call returned.
            # Acting on the echo would only claim again (twice per enqueue, measured).
            return
        if channel == self._jobs_channel:
            self._emit([JobsAvailable(payload)])
            return
        kind, _, ids = payload.partition(":")
        if kind == "o":
            self._emit([OutboxPublished()])
            return
        if kind == "k":  # a cache key filled or freed by another process (cache_postgres)
            if self._cache is not None:
                self._cache.on_notify(ids)
            return
        # Another process's outcome batch names up to 400 finalized ids: one event each, built
        # without the NamedTuple's Python-level __new__ (every process reads every batch).
        events: list[BackendEvent]
        if kind == "f":
            events = [_tuple_new(JobFinalized, (int(text), None, None)) for text in ids.split(",") if text.isdecimal()]
        else:
            events = [CancelRequested(int(text), False) for text in ids.split(",") if text.isdecimal()]
        self._emit(events)

    def cache_store(self) -> PgCacheStore:
        if self._cache is None:
            self._cache = PgCacheStore(self)
        return self._cache

    # -- protocol --

    async def insert_many(self, jobs: Sequence[NewJob], bounds: Bounds | None = None) -> list[InsertResult]:
        if not jobs:
            await trio.lowlevel.checkpoint()
            return []
        now = self.now()
        run_ats = [now if j.run_at is None or j.run_at < now else j.run_at for j in jobs]
        results: list[InsertResult] = await self._run(
            lambda c: self._insert(_TrioSession(c), jobs, run_ats, now, bounds), retry=False
        )
        if len(results) == 1:  # the common case, without the sets of `_emit_inserted`
            if not results[0].existing:
                self._emit([JobsAvailable(jobs[0].queue) if run_ats[0] <= now else JobsAvailable(jobs[0].queue, run_ats[0])])
            return results
        self._emit_inserted(jobs, run_ats, results, now)
        return results

    async def _insert(
        self,
        s: _Session,
        jobs: Sequence[NewJob],
        run_ats: list[float],
        now: float,
        bounds: Bounds | None = None,
        *,
        serialize: bool = True,
    ) -> list[InsertResult]:
        """The jobs' rows, on session `s`: a pooled connection of the backend's own, the one
        `transaction()` lent, or the caller's (`insert_tx`). One code for all of them, so a
        job stored in a transaction is the job `insert_many` stores. Each statement queues the
        wake-up NOTIFY of its queues, sent at the commit (at once on an autocommit session).

        With `bounds` for a queue of the batch: in one transaction (a savepoint inside one
        already open), take each bounded queue's enqueue lock (`serialize`: a transaction-level
        advisory lock, in queue order, held to the commit), insert the rows, then count each
        bounded queue's pending jobs with them (`count_pending`: three index-only reads of the
        pending rows' partial indexes, each of at most `max_length + 1` entries, so the cost
        grows with the bound, never with the table), and let `transitions.check_room` decide; `QueueFull` rolls the
        rows back. Under the lock the count is a new statement, and so (READ COMMITTED) sees
        every enqueue of the queue that committed before the lock was granted: exact."""
        if not jobs:
            return []
        if bounds and any(j.queue in bounds for j in jobs):
            queues = sorted({j.queue for j in jobs if j.queue in bounds})
            async with _atomic(s):
                if serialize:
                    await s.one(self._q["lock_queue"], (queues,))
                results = await self._insert(s, jobs, run_ats, now)
                for queue in queues:
                    limit = bounds[queue]
                    row = await s.one(self._q["count_pending"], {"queue": queue, "limit": limit + 1})
                    assert row is not None
                    check_room(queue, int(row[0]), limit)
            return results
        if any(j.unique_key is not None for j in jobs):
            if len(jobs) == 1:
                return [await self._insert_one(s, jobs[0], run_ats[0], now)]
            # One transaction: the batch is all or nothing, and no job of it can be claimed
            # (and its key freed) before the rest is in -- a key twice in one batch is one job.
            async with _atomic(s):
                return [await self._insert_one(s, j, r, now) for j, r in zip(jobs, run_ats)]
        if len(jobs) == 1:
            job = jobs[0]
            one = (job.kind, job.queue, job.args_json, "available" if run_ats[0] <= now else "scheduled",
                   job.max_attempts, job.priority, run_ats[0], now, job.concurrency_key, job.max_concurrent,
                   job.rate_key, job.rate_limit, job.rate_per, self._jobs_channel, job.queue)  # fmt: skip
            row = await s.one(self._q["insert_single"], one)
            assert row is not None
            return [InsertResult(row[0], False)]
        if len(jobs) >= _COPY_AT:
            return [InsertResult(i, False) for i in await self._copy_in(s, jobs, run_ats, now)]
        params = (
            now,
            [j.kind for j in jobs],
            [j.queue for j in jobs],
            [j.args_json for j in jobs],
            ["available" if r <= now else "scheduled" for r in run_ats],
            [j.max_attempts for j in jobs],
            [j.priority for j in jobs],
            run_ats,
            [j.concurrency_key for j in jobs],
            [j.max_concurrent for j in jobs],
            [j.rate_key for j in jobs],
            [j.rate_limit for j in jobs],
            [j.rate_per for j in jobs],
            self._jobs_channel,
        )
        rows = await s.all(self._q["insert_many"], params)
        return [InsertResult(i, False) for i in sorted(r[0] for r in rows)]

    async def _copy_in(self, s: _Session, jobs: Sequence[NewJob], run_ats: list[float], now: float) -> list[int]:
        """A large batch through COPY, in one transaction: take its ids from the table's
        sequence first (ascending, so the jobs keep their order), queue the NOTIFYs (sent at
        commit), then COPY the rows with their ids."""
        queues = sorted({j.queue for j in jobs})
        async with _atomic(s):
            row = await s.one(self._q["reserve_ids"], (self._jobs_channel, queues, len(jobs)))
            assert row is not None
            first, last, listed = row
            # Without concurrent inserts the ids are one run: only its ends travel.
            ids = list(range(first, last + 1)) if listed is None else [int(i) for i in listed.split(",")]
            await s.copy(self._q["copy_in"], _copy_text(ids, jobs, run_ats, now))
        return ids

    async def _insert_one(self, s: _Session, job: NewJob, run_at: float, now: float) -> InsertResult:
        while True:
            row = await s.one(
                self._q["insert_one"],
                (job.kind, job.queue, job.args_json, "available" if run_at <= now else "scheduled", job.max_attempts,
                 job.priority, run_at, now, job.unique_key, job.concurrency_key, job.max_concurrent,
                 job.rate_key, job.rate_limit, job.rate_per, self._jobs_channel, job.queue),
            )  # fmt: skip
            if row is not None:
                return InsertResult(row[0], False)
            existing = await s.one(self._q["find_unique"], (job.unique_key,))
            if existing is not None:
                return InsertResult(existing[0], True)
            # the holder became final between the two statements: try again

    def _emit_inserted(self, jobs: Sequence[NewJob], run_ats: list[float], results: list[InsertResult], now: float) -> None:
        due_now: set[str] = set()
        due_later: dict[str, float] = {}
        for job, run_at, res in zip(jobs, run_ats, results):
            if res.existing:
                continue
            if run_at <= now:
                due_now.add(job.queue)
            else:
                due_later[job.queue] = min(run_at, due_later.get(job.queue, run_at))
        self._emit([JobsAvailable(q) for q in sorted(due_now)] + [JobsAvailable(q, d) for q, d in sorted(due_later.items())])

    async def claim(self, queue: str, limit: int, *, max_running: int | None = None) -> ClaimResult:
        if limit <= 0:
            return ClaimResult([], None)
        now = self.now()
        q = self._q["claim_limited" if max_running is not None else "claim"]
        q_park, q_release = self._q["rate_park"], self._q["rate_release"]
        pause = self._lean.get(queue)
        lean = max_running is None and pause == 0

        async def body(conn: TrioConnection) -> ClaimResult:
            next_due = rate_next = None
            jobs: list[tuple[Any, ...]] = []
            if lean:
                # The queue's claims have been lean: the lean statement first. Its last row
                # says whether the full one must run for the rest of the room; if so, this
                # queue's next `_LEAN_PAUSE` claims run the full one directly, so a keyed queue
                # does not pay two round trips a claim.
                need, waiting, wake = False, None, None
                for r in await _all(conn, self._q["claim_lean"], {"now": now, "queue": queue, "limit": limit}):
                    if r[0] is not None:
                        jobs.append(r)
                    else:
                        waiting, wake, need = r[7:10]
                if not need:
                    if wake is not None and wake > now:
                        rate_next = wake
                    return _claim_result(jobs, waiting if waiting is not None and waiting > now else None, rate_next)
                self._lean[queue] = _LEAN_PAUSE
            plain = not lean
            # The claim statement picks at most `want` jobs, and the limits may refuse some of
            # them (several of one key): then it looks again, and the next look passes over
            # the keys now full, so a key's backlog never keeps the claim from other keys' jobs
            # (no head-of-line blocking). A job passed over for its key is parked by the look
            # that passed it (migration 0011), so no later look or claim reads it again; a look
            # that parked some read at most `PARK_AT_ONCE` of them, and the next look goes on
            # behind them. Each look is one statement: it claims the jobs with no limit itself
            # and the others through `claim_picked_parking`, under the limits' locks, which
            # also parks a picked job it refuses for its rate (migration 0014). A job the scan passed over
            # for its rate is parked by `rate_park` under its key's lock, and a queue's rate key
            # whose wake time has come brings back what its window admits (`rate_release`)
            # before the next look: each a round trip of its own, only when there is one to do.
            more = False
            for look in range(_CLAIM_LOOKS if len(jobs) < limit else 0):
                params = {"now": now, "queue": queue, "limit": limit - len(jobs)}
                if max_running is not None:
                    params["max_running"] = max_running
                full = False
                rate_ids: list[int] = []
                wake = None
                for r in await _all(conn, q, params):
                    if r[0] is not None:
                        jobs.append(r)
                        continue
                    next_due, held, taken, parked, slot, rate_ids, wake, room, rated = r[7:16]
                    # The queue is full only when `claim_picked` found no room left under its
                    # global limit (migration 0015): then nothing more may start. A pick the
                    # keys or the rates cut short is not a full queue: what they passed over,
                    # and what was parked, may hide startable jobs behind it.
                    full = room is not None and room <= 0
                    more = not full and (parked > 0 or taken < held)
                    # Evidence that the lean statement would have done: jobs claimed by one
                    # look, every keyed pick started, none with a rate key, nothing parked or
                    # passed over for a rate.
                    plain = plain and look == 0 and taken == held and rated == 0 and parked == 0
                    plain = plain and not rate_ids and len(jobs) > 0 and (wake is None or wake > now)
                    if slot is not None and (rate_next is None or slot < rate_next):
                        rate_next = slot  # a rate key's next slot, seen under its lock (migration 0010)
                if rate_ids:
                    row = await _one(conn, q_park, {"ids": rate_ids, "queue": queue, "now": now})
                    if row is not None and row[0] is not None and (rate_next is None or row[0] < rate_next):
                        rate_next = row[0]  # a rate key's wake time, armed under its lock
                    more = not full  # behind the ones parked, or not parked: the window moved
                if wake is not None and wake <= now:
                    row = await _one(conn, q_release, {"queue": queue, "now": now})
                    if row is not None:
                        wake = row[1]
                        more = more or (not full and row[0] > 0)
                if wake is not None and wake > now and (rate_next is None or wake < rate_next):
                    rate_next = wake
                if len(jobs) >= limit or not more:
                    break  # room filled, or nothing was passed over: there is nothing behind
            if more and len(jobs) < limit:
                self._emit([JobsAvailable(queue)])  # jobs may wait behind the ones this claim parked
            if max_running is None and not lean:
                left = self._lean.get(queue)
                if left is not None and left > 1:
                    self._lean[queue] = left - 1
                elif plain:
                    self._lean[queue] = 0
            return _claim_result(jobs, next_due, rate_next)

        # Not durable: a claim lost in a server crash leaves its jobs claimable (or rescued),
        # which at-least-once allows; the outcome written later is durable, and its WAL flush
        # carries the claim's too.
        result: ClaimResult = await self._run(body, durable=False)
        return result

    async def finish_many(self, outcomes: Sequence[Outcome]) -> None:
        if not outcomes:
            return
        now = self.now()
        params = {
            "ids": _int_array([o.job_id for o in outcomes]),
            "outcomes": _outcomes_json(outcomes, now),
            "now": now,
            "jobs_channel": self._jobs_channel,
            "events_channel": self._events_channel,
        }
        q = self._q["finish"]
        rows = await self._run(lambda c: _all(c, q, params))
        # One JobFinalized per row (the ids are distinct: one row per job), and each queue's
        # wake-ups once per batch (a batch's rows share them). Built per row, so kept lean: no
        # hashing of the finalized events, each NamedTuple built without its Python __new__.
        events: list[BackendEvent] = []
        wakes: dict[JobsAvailable, None] = {}
        for job_id, queue, state, run_at, message, key in rows:
            if job_id is None:
                wakes[JobsAvailable(queue)] = None  # a queue a freed slot let a job back into
                continue
            st = _STATES[state]
            if st.final:
                events.append(_tuple_new(JobFinalized, (job_id, st, message)))
                if key is not None:
                    wakes[JobsAvailable(queue)] = None  # its slot is free
            elif run_at <= now:
                wakes[JobsAvailable(queue)] = None
            else:
                wakes[JobsAvailable(queue, run_at)] = None
                if key is not None:
                    wakes[JobsAvailable(queue)] = None  # its slot is free
        if wakes:
            events += wakes
        self._emit(events)

    async def _notify(self, ids: list[int], queues: list[str], kind: str) -> None:
        channels: list[str] = []
        payloads: list[str] = []
        for i in range(0, len(ids), _NOTIFY_IDS_PER_PAYLOAD):
            channels.append(self._events_channel)
            payloads.append(f"{kind}:" + ",".join(map(str, ids[i : i + _NOTIFY_IDS_PER_PAYLOAD])))
        for queue in queues:
            channels.append(self._jobs_channel)
            payloads.append(queue)
        await self._run(
            lambda c: _exec(c, "SELECT pg_notify(ch, p) FROM unnest(%s::text[], %s::text[]) AS t(ch, p)", (channels, payloads))
        )

    async def cancel(self, job_id: int) -> JobState:
        now = self.now()
        q = self._q["cancel"]
        params = {"id": job_id, "now": now, "channel": self._events_channel, "jobs_channel": self._jobs_channel}
        row = await self._run(lambda c: _one(c, q, params))
        if row is None:
            raise JobNotFound(f"no job with id {job_id} in {self.url}")
        before, after, message, _notified, changed, unparked, queue = row
        state = JobState(after)
        if JobState(before).final:
            return JobState(before)
        if state is JobState.RUNNING:
            if changed:
                self._emit([CancelRequested(job_id)])
        else:
            self._emit([JobFinalized(job_id, JobState.CANCELLED, message)])
            if unparked:
                self._emit([JobsAvailable(queue)])  # its key's next job took its place, in that job's queue
        return state

    async def heartbeat(self, running: Sequence[tuple[int, int]]) -> HeartbeatResult:
        if not running:
            return HeartbeatResult([], [])
        now = self.now()
        q = self._q["heartbeat"]
        params = (now, _int_array([r[0] for r in running]), _attempt_keys(running))
        # Retried like any call safe to repeat (it only renews rows this worker still owns): the
        # runtime cuts each heartbeat call at its own deadline (rescue_after / 2 after the last
        # good one), so retries cannot eat the margin before another process may rescue. A
        # connection terminated under a heartbeat (pg_terminate_backend, a failover) then costs
        # one retry, not a failed beat.
        # Not durable: a heartbeat lost in a server crash is one missed beat.
        rows = await self._run(lambda c: _all(c, q, params), durable=False)
        alive = {(r[0], r[1]): r[2] for r in rows}
        return HeartbeatResult(
            [pair for pair in running if pair not in alive],
            [job_id for (job_id, _), cancel in alive.items() if cancel],
        )

    async def rescue(self, stale_before: float) -> list[int]:
        now = self.now()
        q = self._q["rescue"]
        rows = await self._run(lambda c: _all(c, q, {"before": stale_before, "now": now}))
        events: list[BackendEvent] = []
        finalized: list[int] = []
        queues: set[str] = set()
        for job_id, queue, state, message, key in rows:
            if job_id is None or state == "available":  # (no id: a queue a freed slot let a job back into)
                queues.add(queue)
                events.append(JobsAvailable(queue))
            else:
                finalized.append(job_id)
                events.append(JobFinalized(job_id, JobState(state), message))
                if key is not None:
                    queues.add(queue)  # its slot is free
                    events.append(JobsAvailable(queue))
        # The rescued jobs' wake-ups go out before the repair, so a repair that fails cannot
        # lose them.
        if rows:
            await self._notify(finalized, sorted(queues), "f")
        self._emit(list(dict.fromkeys(events)))
        # The repair of keys left parked with a free slot (migrations 0011, 0012): nothing to do
        # unless something but this runtime wrote the rows. A repair that fails (a statement
        # timeout on a huge parked backlog) is logged and left to the next pass; the rescue
        # stands.
        try:
            repaired = sorted({queue for (queue,) in await self._run(lambda c: _all(c, self._q["repair_parked"]))})
        except (BackendError, BackendUnavailable) as exc:
            log.warning(
                "PostgreSQL repair of parked concurrency keys failed (%s); the next rescue pass tries again",
                exc,
                extra={"event": "repair_failed", "backend": self.url},
            )
            repaired = []
        if repaired:
            await self._notify([], repaired, "f")
            self._emit([JobsAvailable(queue) for queue in repaired])
        return sorted(r[0] for r in rows if r[0] is not None)

    async def delete_finished(self, before: Mapping[JobState, float], limit: int) -> int:
        q = self._q["delete_finished"]
        states = [JobState(s).value for s in before]
        cutoffs = list(before.values())
        params = {"states": states, "befores": cutoffs, "limit": limit, "now": self.now()}
        row = await self._run(lambda c: _one(c, q, params))
        return int(row[0]) if row else 0

    async def get_job(self, job_id: int) -> Job:
        q = self._q["get"]
        row = await self._run(lambda c: _one(c, q, (job_id,)))
        if row is None:
            raise JobNotFound(f"no job with id {job_id} in {self.url}")
        job, damage = job_from_row(row)
        if damage:
            # The column types and checks keep everything but the errors' shape readable:
            # replace what cannot be read by notes, once (only if nobody wrote it meanwhile).
            entries = [{"attempt": e.attempt, "at": e.at, "message": e.message, "traceback": e.traceback} for e in job.errors]
            fixed = json.dumps(entries)
            await self._run(lambda c: _exec(c, self._q["repair_errors"], (fixed, job_id, row[12])))
            log.warning(
                "PostgreSQL job %d: %s; replaced by a note",
                job_id,
                "; ".join(d.describe() for d in damage),
                extra={"event": "row_repaired", "job_id": job_id, "backend": self.url},
            )
            if not job.state.final:  # the repair held the row: a claim meanwhile skipped it
                self._emit([JobsAvailable(job.queue)])
        return job

    async def stats(self) -> Mapping[str, QueueCounts]:
        q = self._q["stats"]

        async def count(conn: TrioConnection) -> list[tuple[Any, ...]]:
            # Counting every row is the one statement a whole-table scan is right for: allow it
            # here (the pool's sessions refuse sequential scans, POOL_SESSION).
            async with conn.transaction():
                await _exec(conn, "SET LOCAL enable_seqscan = on")
                return await _all(conn, q)

        return counts_from_rows(await self._run(count))

    # -- transactions --

    # -- ScheduleStore --

    async def schedule_states(self, names: Sequence[str]) -> Mapping[str, ScheduleState]:
        q = self._q["schedule_states"]
        rows = await self._run(lambda c: _all(c, q, (list(names),)))
        return {name: ScheduleState(float(tick), job_id) for name, tick, job_id in rows}

    # -- LockStore --

    async def acquire_lock(self, name: str, owner: str, ttl: float) -> int | None:
        now = self.now()
        q = self._q["acquire_lock"]
        row = await self._run(lambda c: _one(c, q, (name, owner, now + ttl, now)), retry=False)
        return None if row is None else int(row[0])

    async def renew_lock(self, name: str, owner: str, ttl: float) -> bool:
        now = self.now()
        q = self._q["renew_lock"]
        return await self._run(lambda c: _one(c, q, (now + ttl, name, owner, now))) is not None

    async def release_lock(self, name: str, owner: str) -> None:
        q = self._q["release_lock"]
        await self._run(lambda c: _exec(c, q, (name, owner)))

    async def enqueue_tick(self, name: str, tick: float, job: NewJob, bounds: Bounds | None = None) -> InsertResult | None:
        now = self.now()
        run_at = now if job.run_at is None or job.run_at < now else job.run_at

        async def body(conn: TrioConnection) -> InsertResult | None:
            async with conn.transaction():
                if await _one(conn, self._q["advance_tick"], (name, tick)) is None:
                    return None
                (result,) = await self._insert(_TrioSession(conn), [job], [run_at], now, bounds)
                if not result.existing:
                    await _exec(conn, self._q["tick_job"], (result.id, name))
                return result

        result: InsertResult | None = await self._run(body, retry=False)
        if result is not None:
            self._emit_inserted([job], [run_at], [result], now)
        return result

    def _transaction_slots(self) -> trio.Semaphore:
        """At most `pool_size - (workers + 2)` transactions open at once: the connections the
        workers do not plan for (`check_budget`), so open transactions can never take one a
        worker counts on."""
        if self._tx_slots is None:
            size = self.pool.size
            planned = (self._workers or 0) + 2
            if size - planned < 1:
                raise ConfigError(
                    f"no connection is left for rt.transaction(): pool_size {size} is all planned for "
                    f"{self._workers or 0} queue workers + 1 runtime + 1 listener; raise pool_size"
                )
            self._tx_limit = size - planned
            self._tx_slots = trio.Semaphore(size - planned)
        return self._tx_slots

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[TrioConnection]:
        """A pooled connection in a transaction for the block (see `TransactionalEnqueue`).

        The transaction runs the service's own statements too, so the connection behaves as
        psycopg's default one does: the pool's session settings for the runtime's statements
        (`POOL_SESSION`) are set back to PostgreSQL's defaults for it (`SET LOCAL`, in the
        BEGIN's round trip), and the service's statements are prepared at psycopg's default
        threshold (the runtime's own ask for it per call), so a script of several statements
        runs. What the block leaves on the session is undone before the pool has the connection
        back (`_RESET`, in the COMMIT's or ROLLBACK's round trip), and its psycopg settings are
        put back (`TrioConnection.take_back`; one whose autocommit or isolation was changed is
        closed). Waits at most `acquire_timeout` for a free transaction slot and as long again
        for a connection; BEGIN and COMMIT are each bounded like any pooled round trip
        (`PgPool.round_trip_bound`). A block that raises or is cancelled is rolled back
        (shielded, bounded by `DRAIN_TIMEOUT`), and the connection closed if that cannot be
        done."""
        slots = self._transaction_slots()
        try:
            slots.acquire_nowait()
        except trio.WouldBlock:
            with trio.move_on_after(self.acquire_timeout) as waited:
                await slots.acquire()
            if waited.cancelled_caught:
                raise BackendUnavailable(
                    f"no transaction slot free within {self.acquire_timeout:g} s: {self._tx_limit} "
                    f"transactions are open, as many as the pool of {self.pool.size} leaves beside its workers; "
                    "keep transactions short (no network calls inside), or raise pool_size"
                ) from None
        try:
            staged: list[tuple[Sequence[NewJob], list[float], list[InsertResult], float] | OutboxPublished] = []
            async with AsyncExitStack() as stack:
                try:
                    conn = await stack.enter_async_context(self.pool.connection())
                    with trio.move_on_after(self.pool.round_trip_bound) as began:
                        await conn.execute(_BEGIN, prepare=False)
                    if began.cancelled_caught:
                        conn.close_now()  # never pooled again
                        raise BackendUnavailable(
                            f"no answer to BEGIN from PostgreSQL within {self.pool.round_trip_bound:g} s; nothing "
                            "was written, and the connection was closed"
                        )
                except trio.TooSlowError:
                    raise BackendUnavailable(
                        f"no PostgreSQL connection free in the pool of {self.pool.size} within its wait bound; "
                        "raise pool_size or lower the number of concurrent callers"
                    ) from None
                except psycopg.Error as exc:
                    redact_exception(exc, self.conninfo)
                    raise BackendUnavailable(f"cannot begin a PostgreSQL transaction ({self._describe(exc)})") from exc
                self._lent[conn] = staged
                lent = conn.lend()
                try:
                    yield conn
                    if conn.pgconn.transaction_status == _INERROR:
                        raise BackendError(
                            "the transaction failed inside the block (a statement's error was caught there) "
                            "and was rolled back; let the error propagate, or use a savepoint "
                            "(`async with conn.transaction():`) around the statement that may fail"
                        )
                    try:
                        with trio.move_on_after(self.pool.round_trip_bound) as committed:
                            await conn.execute(_COMMIT, prepare=False)
                        if committed.cancelled_caught:
                            conn.close_now()
                            raise BackendUnavailable(
                                f"no answer to COMMIT from PostgreSQL within {self.pool.round_trip_bound:g} s: whether "
                                "the transaction committed is unknown; the connection was closed"
                            )
                    except psycopg.Error as exc:
                        redact_exception(exc, self.conninfo)
                        if _failure_kind(exc) is _Failure.LOST:
                            raise BackendUnavailable(
                                f"PostgreSQL connection lost during COMMIT ({self._describe(exc)}): whether the "
                                "transaction committed is unknown"
                            ) from exc
                        raise
                except BaseException:
                    await _end_failed(conn)
                    raise
                finally:
                    del self._lent[conn]
                    if not conn.closed and not conn.take_back(lent):
                        conn.close_now()  # its autocommit or isolation was changed: never pooled again
            for entry in staged:  # committed: tell this process's runtime
                if isinstance(entry, OutboxPublished):
                    self._emit([entry])
                else:
                    self._emit_inserted(*entry)
        finally:
            slots.release()

    async def insert_tx(self, conn: Any, jobs: Sequence[NewJob], bounds: Bounds | None = None) -> list[InsertResult]:
        now = self.now()
        run_ats = [now if j.run_at is None or j.run_at < now else j.run_at for j in jobs]
        staged = None
        if isinstance(conn, TrioConnection):  # only ever one of the pool's: lent, or no longer
            staged = self._lent.get(conn)
            if staged is None:
                raise ConfigError(
                    "enqueue_tx: this transaction has ended (its connection went back to the pool); "
                    "enqueue inside its `async with rt.transaction()` block"
                )
        session = self._session_for(conn)
        try:
            # In a caller's transaction the queue's lock would be held until the caller ends it,
            # stopping every other enqueue of the queue meanwhile: the check counts what has
            # committed (and this transaction's own jobs) without it (docs/queues.md). On an
            # autocommit connection the insert is a short transaction of its own: locked, exact.
            results = await self._insert(session, jobs, run_ats, now, bounds, serialize=session.idle())
        except psycopg.errors.UndefinedTable as exc:
            raise ConfigError(
                f"enqueue_tx: the connection reaches database {conn.info.dbname!r}, which has no nursery_jobs schema "
                f"{self.schema!r}; pass a connection to the runtime's database ({self.url})"
            ) from exc
        except psycopg.Error as exc:
            raise redact_exception(exc, self.conninfo)
        if staged is not None:
            staged.append((jobs, run_ats, results, now))
        return results

    # -- the outbox --

    async def publish(self, events: Sequence[tuple[str, str]]) -> None:
        if not events:
            await trio.lowlevel.checkpoint()
            return
        q, params = self._publish_params(events)
        # Not retried: whether a lost connection's insert committed is unknown.
        await self._run(lambda c: _one(c, q, params), retry=False)
        self._emit([OutboxPublished()])

    def _publish_params(self, events: Sequence[tuple[str, str]]) -> tuple[bytes, tuple[Any, ...]]:
        topics = [t for t, _ in events]
        payloads = [p for _, p in events]
        return self._q["publish"], (self.now(), topics, payloads, self._events_channel)

    async def publish_tx(self, conn: Any, events: Sequence[tuple[str, str]]) -> None:
        staged = None
        if isinstance(conn, TrioConnection):  # only ever one of the pool's: lent, or no longer
            staged = self._lent.get(conn)
            if staged is None:
                raise ConfigError(
                    "publish: this transaction has ended (its connection went back to the pool); "
                    "publish inside its `async with rt.transaction()` block"
                )
        session = self._session_for(conn, "publish")
        q, params = self._publish_params(events)
        try:
            await session.one(q, params)
        except psycopg.errors.UndefinedTable as exc:
            raise ConfigError(
                f"publish: the connection reaches database {conn.info.dbname!r}, which has no nursery_jobs schema "
                f"{self.schema!r} at version 9 or later; pass a connection to the runtime's database ({self.url}) "
                "and run `nursery-jobs migrate`"
            ) from exc
        except psycopg.Error as exc:
            raise redact_exception(exc, self.conninfo)
        if staged is not None:
            staged.append(OutboxPublished())

    async def relay(self, topics: Sequence[str], route: Route, limit: int, bounds: Bounds | None = None) -> int:
        if limit <= 0 or not topics:
            await trio.lowlevel.checkpoint()
            return 0
        now = self.now()
        wanted = list(topics)
        claim, delete = self._q["relay_claim"], self._q["relay_delete"]

        async def one_pass(conn: TrioConnection) -> tuple[int, list[NewJob], list[float], list[InsertResult]]:
            # One short transaction: claim (rows other passes hold are skipped, not waited
            # for), route in memory, insert the jobs, delete the rows. Anything that raises in
            # it -- route, a lost connection, a cancellation -- rolls all of it back.
            async with conn.transaction():
                rows = await _all(conn, claim, (wanted, limit))
                if not rows:
                    return 0, [], [], []
                claimed = [OutboxEvent(r[0], r[1], r[2]) for r in rows]
                jobs = [job for made in route(claimed) for job in made]
                run_ats = [now if j.run_at is None or j.run_at < now else j.run_at for j in jobs]
                results = await self._insert(_TrioSession(conn), jobs, run_ats, now, bounds)
                await _exec(conn, delete, (_int_array([e.id for e in claimed]),))
            return len(claimed), jobs, run_ats, results

        # Safe to repeat: a pass that committed before its connection was lost deleted its
        # rows, so the retry finds them gone and makes no second job.
        count, jobs, run_ats, results = await self._run(one_pass)
        if jobs:
            self._emit_inserted(jobs, run_ats, results, now)
        relayed: int = count
        return relayed

    def _session_for(self, conn: Any, what: str = "enqueue_tx") -> _Session:
        if isinstance(conn, TrioConnection):
            session: _Session = _TrioSession(conn)
        elif isinstance(conn, psycopg.AsyncConnection):
            from ..infra.aio import loop_running

            if not loop_running():
                raise ConfigError(
                    f"{what} with an async psycopg connection needs a trio-asyncio loop: open one "
                    "with `async with trio_asyncio.open_loop():` around your code, or pass a sync Connection"
                )
            session = _AsyncioSession(conn)
        elif isinstance(conn, psycopg.Connection):
            session = _ThreadSession(conn)
        else:
            raise ConfigError(
                f"{what} on the PostgreSQL backend takes the connection rt.transaction() lends, or a psycopg "
                f"Connection or AsyncConnection of your own, not {type(conn).__name__}"
            )
        if self._dbname is not None and conn.info.dbname != self._dbname:
            raise ConfigError(
                f"{what} got a connection to database {conn.info.dbname!r}, but this runtime's jobs are in "
                f"{self._dbname!r} ({self.url}); use a connection to that database"
            )
        return session


_BEGIN = b"BEGIN; SET LOCAL plan_cache_mode = auto; SET LOCAL enable_seqscan = on; SET LOCAL jit = on"
_RESET = b"RESET ALL; RESET ROLE; UNLISTEN *; SELECT pg_advisory_unlock_all(); CLOSE ALL; DISCARD TEMP"
"""What a lent connection's session may keep of the service's code, undone before the pool has
it back: settings (`SET` outlives the commit: `synchronous_commit`, `search_path`, the planner's
settings, which the runtime's statements on the connection would run under), the role, LISTENs
(their notifications would pile up on a connection nobody reads), session advisory locks (held
until the connection closes: for ever, in a pool), cursors WITH HOLD, temporary tables. Settings
given at connect time (`POOL_SESSION`, the URL's `options`) are what RESET returns to. The
statements psycopg prepared for the service stay, within psycopg's own bound (`prepared_max`)."""
_COMMIT = b"COMMIT; " + _RESET
_ROLLBACK = b"ROLLBACK; " + _RESET
_INERROR = psycopg.pq.TransactionStatus.INERROR
_ACTIVE = psycopg.pq.TransactionStatus.ACTIVE
_TX_IDLE = psycopg.pq.TransactionStatus.IDLE


async def _end_failed(conn: TrioConnection) -> None:
    """Roll back a lent connection's transaction and reset its session (`_RESET`), shielded and
    bounded; close the connection when that cannot be done (a statement still in flight, no
    answer in time, an error), so the pool never has it back dirty."""
    if conn.closed:
        return
    if conn.pgconn.transaction_status == _ACTIVE:
        conn.close_now()
        return
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + DRAIN_TIMEOUT
        try:
            await conn.execute(_ROLLBACK, prepare=False)
        except psycopg.Error:
            pass
    if scope.cancelled_caught or conn.closed or conn.pgconn.transaction_status != _TX_IDLE:
        conn.close_now()


class _Session(Protocol):
    """A connection the insert statements run on: the pool's (`_TrioSession`), or a caller's
    sync (`_ThreadSession`, each call on a thread) or asyncio one (`_AsyncioSession`)."""

    async def one(self, query: Any, params: Any) -> tuple[Any, ...] | None: ...

    async def all(self, query: Any, params: Any) -> list[tuple[Any, ...]]: ...

    async def command(self, statement: bytes) -> None:
        """A statement with no parameters, never prepared (BEGIN, SAVEPOINT, COMMIT)."""
        ...

    async def copy(self, statement: Any, text: str) -> None: ...

    def idle(self) -> bool:
        """Autocommit and in no transaction: each statement commits on its own."""
        ...


class _TrioSession:
    __slots__ = ("conn",)

    def __init__(self, conn: TrioConnection) -> None:
        self.conn = conn

    async def one(self, query: Any, params: Any) -> tuple[Any, ...] | None:
        return await _one(self.conn, query, params)

    async def all(self, query: Any, params: Any) -> list[tuple[Any, ...]]:
        return await _all(self.conn, query, params)

    async def command(self, statement: bytes) -> None:
        await self.conn.execute(statement, prepare=False)

    async def copy(self, statement: Any, text: str) -> None:
        async with self.conn.cursor() as cur:
            async with cur.copy(statement) as copy:
                await copy.write(text)

    def idle(self) -> bool:
        return self.conn.autocommit and self.conn.pgconn.transaction_status == _TX_IDLE


class _ThreadSession:
    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    async def one(self, query: Any, params: Any) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = await run_callers_io(lambda: self.conn.execute(query, params).fetchone())
        return row

    async def all(self, query: Any, params: Any) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = await run_callers_io(lambda: self.conn.execute(query, params).fetchall())
        return rows

    async def command(self, statement: bytes) -> None:
        await run_callers_io(lambda: self.conn.execute(statement, prepare=False))

    async def copy(self, statement: Any, text: str) -> None:
        def write() -> None:
            with self.conn.cursor() as cur, cur.copy(statement) as copy:
                copy.write(text)

        await run_callers_io(write)

    def idle(self) -> bool:
        return self.conn.autocommit and self.conn.info.transaction_status == _TX_IDLE


class _AsyncioSession:
    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def one(self, query: Any, params: Any) -> tuple[Any, ...] | None:
        async def run() -> Any:
            return await (await self.conn.execute(query, params)).fetchone()

        return await _via_asyncio(run)  # type: ignore[no-any-return]

    async def all(self, query: Any, params: Any) -> list[tuple[Any, ...]]:
        async def run() -> Any:
            return await (await self.conn.execute(query, params)).fetchall()

        return await _via_asyncio(run)  # type: ignore[no-any-return]

    async def command(self, statement: bytes) -> None:
        async def run() -> None:
            await self.conn.execute(statement, prepare=False)

        await _via_asyncio(run)

    async def copy(self, statement: Any, text: str) -> None:
        async def run() -> None:
            async with self.conn.cursor() as cur:
                async with cur.copy(statement) as copy:
                    await copy.write(text)

        await _via_asyncio(run)

    def idle(self) -> bool:
        return self.conn.autocommit and self.conn.info.transaction_status == _TX_IDLE


async def _via_asyncio(fn: Callable[[], Awaitable[Any]]) -> Any:
    from ..infra.aio import call_asyncio  # trio-asyncio only for a caller's asyncio connection

    return await call_asyncio(fn)


@asynccontextmanager
async def _atomic(s: _Session) -> AsyncIterator[None]:
    """The block's statements all or none: a transaction of its own on an autocommit session
    in no transaction, a savepoint inside the one open (so a failed batch leaves a caller's
    transaction usable). On a cancellation nothing more is sent: the pool rolls its own
    connection back at check-in, and a caller's transaction is the caller's to end."""
    own = s.idle()
    await s.command(b"BEGIN" if own else b"SAVEPOINT nursery_jobs_insert")
    try:
        yield
    except Exception:
        with contextlib.suppress(psycopg.Error):
            await s.command(b"ROLLBACK" if own else b"ROLLBACK TO SAVEPOINT nursery_jobs_insert")
        raise
    await s.command(b"COMMIT" if own else b"RELEASE SAVEPOINT nursery_jobs_insert")


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_text(ids: Sequence[int], jobs: Sequence[NewJob], run_ats: Sequence[float], now: float) -> str:
    """The rows of a COPY batch in COPY's text format. A batch is mostly one kind, queue and
    time: the columns after the id and the arguments are formatted once per distinct
    combination, not per row (psycopg's generic row formatter costs ~4 us per row, measured)."""
    now_text = repr(float(now))
    tails: dict[tuple[Any, ...], str] = {}
    lines = []
    for job_id, job, run_at in zip(ids, jobs, run_ats):
        key = (run_at, job.kind, job.queue, job.max_attempts, job.priority, job.concurrency_key, job.max_concurrent,
               job.rate_key, job.rate_limit, job.rate_per)  # fmt: skip
        tail = tails.get(key)
        if tail is None:
            state = "available" if run_at <= now else "scheduled"
            ckey = "\\N" if job.concurrency_key is None else job.concurrency_key.translate(_COPY_ESCAPES)
            most = "\\N" if job.max_concurrent is None else str(int(job.max_concurrent))
            rkey = "\\N" if job.rate_key is None else job.rate_key.translate(_COPY_ESCAPES)
            rlimit = "\\N" if job.rate_limit is None else str(int(job.rate_limit))
            rper = "\\N" if job.rate_per is None else repr(float(job.rate_per))
            tail = tails[key] = "\t".join(
                (repr(float(run_at)), job.kind.translate(_COPY_ESCAPES), job.queue.translate(_COPY_ESCAPES), state,
                 str(int(job.max_attempts)), str(int(job.priority)), now_text, ckey, most, rkey, rlimit, rper)
            ) + "\n"  # fmt: skip
        lines.append(f"{job_id}\t{job.args_json.translate(_COPY_ESCAPES)}\t{tail}")
    return "".join(lines)


def _int_array(values: Sequence[int]) -> str:
    """A PostgreSQL array literal of ints (for a ``%s::bigint[]`` / ``::int[]`` parameter)."""
    return "{" + ",".join(map(int.__repr__, values)) + "}"


def _attempt_keys(running: Sequence[tuple[int, int]]) -> str:
    """A jsonb object with the key "id:attempt" of each (job id, attempt): what the heartbeat
    statement fences its rows by."""
    return "{" + ",".join([f'"{int(job_id)}:{int(attempt)}":0' for job_id, attempt in running]) + "}"


def _outcomes_json(outcomes: Sequence[Outcome], now: float) -> str:
    """The outcome statement's jsonb object: per "id:attempt" key, ``[kind, run_at]`` and the
    error entry to append when there is one. Built as text here: 1.2 us per outcome, where
    ``json.dumps`` of a dict of them takes 1.7 (measured). Kinds are the enum's plain values,
    and run_at travels as the text of its ``repr`` (exact, and ``inf`` is no JSON number). A
    completed outcome (no run_at, no error: nearly all of them) shares one tail built once per
    batch, which brings it to 0.35 us (measured)."""
    now_text = repr(now)
    completed = f'":["{_COMPLETED_KIND.value}","{now_text}"]'
    parts: list[str] = []
    append = parts.append
    for o in outcomes:
        if o.kind is _COMPLETED_KIND and o.run_at is None and o.error is None:
            append(f'"{int(o.job_id)}:{int(o.attempt)}{completed}')
            continue
        run_at = now_text if o.run_at is None else repr(max(o.run_at, now))
        key = f'"{int(o.job_id)}:{int(o.attempt)}":["{o.kind.value}","{run_at}"'
        e = o.error
        if e is None:
            append(key + "]")
        else:
            entry = json.dumps({"attempt": e.attempt, "at": e.at, "message": e.message, "traceback": e.traceback})
            append(f"{key},{entry}]")
    return "{" + ",".join(parts) + "}"


def _seconds(what: str, value: Any) -> float:
    checked = check_timeout(what, value, allow_none=False)
    assert checked is not None
    return checked


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


class _Failure(enum.Enum):
    LOST = "lost"
    """The connection is gone or never came up: nothing tells whether the statement ran."""
    ROLLED_BACK = "rolled back"
    """The server undid the whole transaction (deadlock, serialization failure): repeatable."""
    RESOURCE = "resource"
    """The server lacks a resource (disk, memory, connections) or failed internally."""
    STATEMENT = "statement"
    """Any other error the server returned for the statement: repeating it fails again."""
    CLIENT = "client"
    """psycopg refused the call before sending it."""


def _sqlstate(exc: BaseException) -> str | None:
    if not isinstance(exc, psycopg.Error) or isinstance(exc, (ConnectFailed, RoundTripTimeout)):
        return None
    return exc.sqlstate or exc.diag.sqlstate


def _failure_kind(exc: psycopg.Error) -> _Failure:
    """What happened, by SQLSTATE rather than by psycopg's class: psycopg files several classes
    of statement errors (53 insufficient resources, 54 program limit exceeded, 55 object not in
    prerequisite state, ...) under `OperationalError`, the class it also uses for a dropped
    connection, and only a dropped connection may be retried as one."""
    if isinstance(exc, (ConnectFailed, RoundTripTimeout)):
        return _Failure.LOST
    state = _sqlstate(exc)
    if state is None:
        # No answer from the server: a closed or broken connection (psycopg's own
        # OperationalError), or a call psycopg refused before sending anything.
        return _Failure.LOST if isinstance(exc, psycopg.OperationalError) else _Failure.CLIENT
    if state.startswith("08") or state.startswith("57P") or state == "40003":
        # Connection exceptions; the server ending the session (admin, crash or fast shutdown,
        # starting up, database dropped, idle session timeout); "statement completion unknown".
        return _Failure.LOST
    if state.startswith("40"):
        return _Failure.ROLLED_BACK
    if state[:2] in ("53", "58", "XX"):
        return _Failure.RESOURCE
    return _Failure.STATEMENT


_PROMOTE_AT_ONCE = 1000
"""A claim looks at (and makes `available`) at most this many scheduled/retryable jobs that
came due, oldest first (see the claim statement)."""

_CLAIM_ORDER = "priority DESC, run_at, id"
"""Claim order: every due job starts by priority (highest first), then run_at, then enqueue
order (its id)."""

_CLAIM_LOOKS = 4
"""Claim statements one claim runs at most, when the limits refused jobs it picked: each look
passes over the keys the looks before it filled."""

_LEAN_PAUSE = 100
"""Claims of a queue that run the full claim statement directly after a lean one found it
needed (a full key, a rate key, a due scheduled job, a rate wake time): then one full claim
that the lean statement could have made brings it back."""


def _claim_result(jobs: list[tuple[Any, ...]], next_due: float | None, rate_next: float | None) -> ClaimResult:
    """The claimed rows in claim order, and the earlier of the next due time and rate slot."""
    # Claim order: priority descending, then run_at, id. Two sorts by C key functions (the
    # second stable, so it keeps the first's order within a priority) and the rows' first
    # seven columns as the ClaimedJob, with no Python call per row: half the cost of a lambda
    # key and the NamedTuple's own __new__ (RESULTS.md, h-twoproc).
    jobs.sort(key=_RUN_AT_ID)
    jobs.sort(key=_PRIORITY, reverse=True)
    if rate_next is not None and (next_due is None or rate_next < next_due):
        next_due = rate_next
    return ClaimResult([_tuple_new(ClaimedJob, r[:7]) for r in jobs], next_due)


_KEY_FREE = (
    "(SELECT count(*) FROM {{s}}.jobs r WHERE r.state = 'running' AND r.concurrency_key = {t}.concurrency_key)"
    " < coalesce({t}.max_concurrent, 1)"
)
"""A keyed job's key is below the job's limit, as the statement's snapshot sees it: the claim's
scan passes over the others and parks them (a hint, read without the key's lock:
`claim_picked_parking` decides what starts, and the park takes its own locks)."""

_UNPARK_FREED = (
    " freed AS (SELECT q.queue FROM (SELECT array_agg(concurrency_key) AS ks, array_agg(n) AS ns"
    "  FROM (SELECT concurrency_key, count(*)::int AS n FROM upd WHERE concurrency_key IS NOT NULL"
    "   GROUP BY concurrency_key) f HAVING count(*) > 0) a, LATERAL {s}.unpark_keys_queues(a.ks, a.ns) AS q(queue))"
)
"""For the rows `upd` moved out of `running` (each freed its key's slot): each key's best
parked jobs, one per freed slot, go back into claim order (migration 0011; 0017's
`unpark_keys_queues`), after every row of `upd` is written (the aggregate reads them all before
the call) and so in a snapshot that sees any claim that parked a job while holding one of
those rows. One row per job brought back, with its queue: a key is not scoped to a queue, so
the statement wakes those queues too, not only the freeing jobs' own."""

_RATE_FREE = (
    "NOT EXISTS (SELECT 1 FROM {{s}}.rate_keys k WHERE k.key = {t}.rate_key"
    " AND {{s}}.rate_slot(k.starts, coalesce({t}.rate_limit, 1), {t}.rate_per, %(now)s, 0) IS NOT NULL)"
)
"""A rate-keyed job's key has a slot open now, as the statement's snapshot sees it (migration
0010): the claim's scan passes over the others (a hint, read without the key's lock:
`claim_picked_parking` decides)."""

_RATE_OPEN = (
    "(" + _RATE_FREE + " AND NOT EXISTS (SELECT 1 FROM {{s}}.rate_wakes x WHERE x.queue = %(queue)s"
    " AND x.key = {t}.rate_key AND x.wake <= %(now)s))"
)
"""`_RATE_FREE`, and the key's wake time in the queue has not come with its parked jobs still
parked (migration 0014): a job of the key enqueued after them must not start before them. The
claim's scan reads the others and passes them over; the claim hands them to `rate_park`."""

_KEEP_ERRORS = f"'$[last-{MAX_ERRORS_KEPT - 1} to last]'"
"""The jsonpath that keeps the last `MAX_ERRORS_KEPT` entries of a job's error list."""


def _claim_sql(*, limited: bool) -> str:
    """The claim statement (see the comment above `_QUERIES["claim"]`): without a global limit
    the picked jobs with no key are claimed by the statement's own update and the others by
    `claim_picked_parking`; with one, every picked job goes to it."""
    held = "true" if limited else "concurrency_key IS NOT NULL OR rate_key IS NOT NULL"
    cols = "id, priority, run_at, concurrency_key, max_concurrent, rate_key, rate_limit, rate_per"
    return (
        "WITH due AS (SELECT " + cols + ""
        "  FROM {s}.jobs WHERE queue = %(queue)s"
        "  AND state IN ('scheduled', 'retryable') AND run_at <= %(now)s"
        "  ORDER BY run_at, id LIMIT " + str(_PROMOTE_AT_ONCE) + " FOR UPDATE SKIP LOCKED),"
        " scan AS (SELECT * FROM (SELECT " + cols + ", kfree, rfree, kfree AND rfree AS free,"
        "   count(*) FILTER (WHERE kfree AND rfree) OVER w AS n"
        "  FROM (SELECT " + cols + ","
        "    (a.concurrency_key IS NULL OR " + _KEY_FREE.format(t="a") + ") AS kfree,"
        "    (a.rate_key IS NULL OR " + _RATE_OPEN.format(t="a") + ") AS rfree"
        "   FROM {s}.jobs a WHERE queue = %(queue)s AND state = 'available' AND NOT parked AND run_at <= %(now)s"
        "   ORDER BY " + _CLAIM_ORDER + " LIMIT %(limit)s + " + str(PARK_AT_ONCE) + " FOR UPDATE SKIP LOCKED) o"
        "  WINDOW w AS (ROWS UNBOUNDED PRECEDING)) c WHERE n <= %(limit)s),"
        " passed AS (SELECT id, concurrency_key, coalesce(max_concurrent, 1) AS most FROM scan WHERE NOT kfree),"
        # Each passed key's running rows this statement holds, as one object: a lookup per passed
        # row, never a join of the two lists, whose plan follows their estimated sizes (a nested
        # loop of one over the other when the statistics say few rows are available).
        " full_keys AS (SELECT jsonb_object_agg(concurrency_key, n) AS held FROM (SELECT concurrency_key, count(*) AS n"
        "   FROM (SELECT r.concurrency_key FROM {s}.jobs r"
        "   WHERE r.state = 'running' AND r.concurrency_key = ANY(ARRAY(SELECT DISTINCT concurrency_key FROM passed))"
        "   FOR SHARE OF r SKIP LOCKED) k GROUP BY concurrency_key) f),"
        " parked AS (UPDATE {s}.jobs SET parked = true, rate_wait = false WHERE id = ANY(ARRAY(SELECT p.id FROM passed p"
        "   WHERE ((SELECT held FROM full_keys) ->> p.concurrency_key)::bigint >= p.most)) RETURNING 1),"
        " pick AS (SELECT * FROM (SELECT " + cols + " FROM scan WHERE free UNION ALL"
        "  SELECT " + cols + " FROM due d"
        "   WHERE (d.concurrency_key IS NULL OR " + _KEY_FREE.format(t="d") + ")"
        "   AND (d.rate_key IS NULL OR " + _RATE_OPEN.format(t="d") + ")) c"
        "  ORDER BY " + _CLAIM_ORDER + " LIMIT %(limit)s),"
        " direct AS (SELECT id FROM pick WHERE NOT (" + held + ")),"
        " promoted AS (UPDATE {s}.jobs SET state = 'available'"
        "  WHERE id = ANY(ARRAY(SELECT id FROM due EXCEPT SELECT id FROM direct)) RETURNING 1),"
        " claimed AS ("
        " UPDATE {s}.jobs SET state = 'running', attempt = attempt + 1, attempted_at = %(now)s,"
        "  heartbeat_at = %(now)s"
        " WHERE id = ANY(ARRAY(SELECT id FROM direct))"
        " RETURNING id, kind, queue, args, attempt, max_attempts, priority, run_at),"
        # The picked jobs under a limit, in claim order, with their keys and limits.
        " hold AS (SELECT array_agg(id ORDER BY " + _CLAIM_ORDER + ") AS ids,"
        "  array_agg(concurrency_key ORDER BY " + _CLAIM_ORDER + ") AS keys,"
        "  array_agg(coalesce(max_concurrent, 1) ORDER BY " + _CLAIM_ORDER + ") AS most,"
        "  array_agg(rate_key ORDER BY " + _CLAIM_ORDER + ") AS rkeys,"
        "  array_agg(coalesce(rate_limit, 1) ORDER BY " + _CLAIM_ORDER + ") AS rlimits,"
        "  array_agg(rate_per ORDER BY " + _CLAIM_ORDER + ") AS rpers"
        "  FROM pick WHERE " + held + "),"
        # ... claimed by `claim_picked_parking` (migration 0014: 0013's `claim_picked`, which a
        # runtime of version 13 still calls, with the parking of what it refuses for its rate)
        # under the limits' locks, in this statement and after every write above: the one-time
        # filter's counts run those writes to completion first, so the function, whose
        # statements each take a new snapshot that sees them, never updates a row a CTE has
        # still to write. The picked rows stay locked
        # by this statement's scans until the commit: nobody else can claim or change them.
        " held AS (SELECT * FROM {s}.claim_picked_parking((SELECT ids FROM hold), (SELECT keys FROM hold),"
        "   (SELECT most FROM hold), (SELECT rkeys FROM hold), (SELECT rlimits FROM hold), (SELECT rpers FROM hold),"
        "   %(queue)s::text, (%(limit)s - (SELECT count(*) FROM claimed))::int, "
        + ("%(max_running)s::int" if limited else "NULL::int")
        + ", %(now)s::float8)"
        "  WHERE (SELECT ids FROM hold) IS NOT NULL AND (SELECT count(*) FROM promoted) >= 0"
        "   AND (SELECT count(*) FROM parked) >= 0 AND (SELECT count(*) FROM claimed) >= 0)"
        " SELECT id, kind, queue, args, attempt, max_attempts, priority, run_at, NULL::int, NULL::int, NULL::bigint,"
        "  NULL::float8, NULL::bigint[], NULL::float8, NULL::int, NULL::int FROM claimed"
        " UNION ALL"
        " SELECT id, kind, queue, args, attempt, max_attempts, priority, run_at, NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
        "  NULL FROM held WHERE id IS NOT NULL"
        " UNION ALL"
        " SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL,"
        "  (SELECT min(run_at) FROM {s}.jobs WHERE queue = %(queue)s"
        "   AND state IN ('scheduled', 'retryable') AND run_at > %(now)s),"
        "  coalesce(cardinality((SELECT ids FROM hold)), 0), (SELECT count(*) FROM held WHERE id IS NOT NULL)::int,"
        "  (SELECT count(*) FROM parked), (SELECT min(run_at) FROM held WHERE id IS NULL),"
        # The jobs the scan passed over for their rate, for `rate_park` (migration 0014), and
        # the queue's earliest rate wake time, for `rate_release` once it has come.
        "  ARRAY(SELECT id FROM scan WHERE NOT rfree UNION ALL SELECT id FROM due d"
        "   WHERE d.rate_key IS NOT NULL AND NOT " + _RATE_OPEN.format(t="d") + "),"
        "  (SELECT min(wake) FROM {s}.rate_wakes WHERE queue = %(queue)s),"
        # The room `claim_picked` left under the queue's global limit (migration 0015; NULL: not
        # called, or no global limit): 0 is a full queue, more is a pick the keys cut short.
        "  (SELECT min(attempt) FROM held WHERE id IS NULL),"
        # How many picked jobs have a rate key: a claim with none, whose keyed picks all
        # started, is one the lean statement would have made (`claim`).
        "  (SELECT count(*) FROM pick WHERE rate_key IS NOT NULL)::int"
    )


def _claim_lean_sql() -> str:
    """The lean claim (see the comment above `_QUERIES["claim_lean"]`)."""
    cols = "id, priority, run_at, concurrency_key, max_concurrent"
    return (
        # The queue's earliest waiting row and rate wake time: due ones are the full claim's work.
        "WITH w AS (SELECT (SELECT min(run_at) FROM {s}.jobs WHERE queue = %(queue)s"
        "   AND state IN ('scheduled', 'retryable')) AS waiting,"
        "  (SELECT min(wake) FROM {s}.rate_wakes WHERE queue = %(queue)s) AS wake),"
        # The first `limit` available rows in claim order, each with whether it and every row
        # before it is lean (no rate key, and no concurrency key or one whose key has room as
        # this snapshot sees it): the lean prefix. Not read at all (a one-time filter) when the
        # full claim has to run first.
        " scan AS (SELECT " + cols + ", concurrency_key IS NULL AS plain,"
        "  bool_and(lean) OVER (ROWS UNBOUNDED PRECEDING) AS lead"
        "  FROM (SELECT " + cols + ","
        "    rate_key IS NULL AND (concurrency_key IS NULL OR " + _KEY_FREE.format(t="a") + ") AS lean"
        "   FROM {s}.jobs a WHERE queue = %(queue)s AND state = 'available' AND NOT parked AND run_at <= %(now)s"
        "   AND NOT EXISTS (SELECT 1 FROM w WHERE waiting <= %(now)s OR wake <= %(now)s)"
        "   ORDER BY " + _CLAIM_ORDER + " LIMIT %(limit)s FOR UPDATE SKIP LOCKED) o),"
        " claimed AS ("
        " UPDATE {s}.jobs SET state = 'running', attempt = attempt + 1, attempted_at = %(now)s,"
        "  heartbeat_at = %(now)s"
        " WHERE id = ANY(ARRAY(SELECT id FROM scan WHERE lead AND plain))"
        " RETURNING id, kind, queue, args, attempt, max_attempts, priority, run_at),"
        # The keyed rows of the prefix, in claim order, go to `claim_picked` (migration 0015),
        # which admits them under their keys' locks (`transitions.admit`), after `claimed` is
        # written (the one-time filter's count runs it first), as the full claim hands it its
        # keyed picks. No rate key is among them: no rate is weighed and nothing is parked.
        " hold AS (SELECT array_agg(id ORDER BY " + _CLAIM_ORDER + ") AS ids,"
        "  array_agg(concurrency_key ORDER BY " + _CLAIM_ORDER + ") AS keys,"
        "  array_agg(coalesce(max_concurrent, 1) ORDER BY " + _CLAIM_ORDER + ") AS most"
        "  FROM scan WHERE lead AND NOT plain),"
        " held AS (SELECT * FROM {s}.claim_picked((SELECT ids FROM hold), (SELECT keys FROM hold),"
        "   (SELECT most FROM hold), NULL::text[], NULL::int[], NULL::float8[], %(queue)s::text,"
        "   (%(limit)s - (SELECT count(*) FROM claimed))::int, NULL::int, %(now)s::float8)"
        "  WHERE (SELECT ids FROM hold) IS NOT NULL AND (SELECT count(*) FROM claimed) >= 0)"
        " SELECT id, kind, queue, args, attempt, max_attempts, priority, run_at,"
        "  NULL::float8, NULL::boolean FROM claimed"
        " UNION ALL"
        " SELECT id, kind, queue, args, attempt, max_attempts, priority, run_at, NULL, NULL"
        "  FROM held WHERE id IS NOT NULL"
        " UNION ALL"
        # The last row: the next waiting job's time, the earliest rate wake time, and whether
        # the full claim must run for the rest (a due waiting row or wake time, a row in the
        # prefix read that is not lean, or a keyed one `claim_picked` did not start: a key
        # filled by another claim, or several of one key in the prefix).
        " SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, (SELECT waiting FROM w), (SELECT wake FROM w),"
        "  coalesce((SELECT waiting <= %(now)s OR wake <= %(now)s FROM w), false)"
        "   OR EXISTS (SELECT 1 FROM scan WHERE NOT lead)"
        "   OR coalesce(cardinality((SELECT ids FROM hold)), 0) > (SELECT count(*) FROM held WHERE id IS NOT NULL)"
    )


_WAITING = ", ".join(f"'{s.value}'" for s in PENDING if s is not JobState.AVAILABLE)
"""The pending states but `available`: the ones `jobs_waiting` holds (migration 0002)."""

_QUERIES: dict[str, sql.SQL] = {
    "insert_many": sql.SQL(
        "WITH ins AS ("
        " INSERT INTO {s}.jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at,"
        "  concurrency_key, max_concurrent, rate_key, rate_limit, rate_per)"
        " SELECT k, q, a, st, m, p, r, %s::float8, ck, mc, rk, rl, rp"
        " FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::int[], %s::int[], %s::float8[],"
        "  %s::text[], %s::int[], %s::text[], %s::int[], %s::float8[])"
        "  WITH ORDINALITY AS t(k, q, a, st, m, p, r, ck, mc, rk, rl, rp, ord) ORDER BY ord"
        " RETURNING id, queue),"
        " notes AS (SELECT count(*) AS n FROM (SELECT DISTINCT queue FROM ins) d,"
        "  LATERAL (SELECT pg_notify(%s, d.queue)) x)"
        " SELECT id, (SELECT n FROM notes) FROM ins"
    ),
    "insert_single": sql.SQL(
        "WITH ins AS ("
        " INSERT INTO {s}.jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at,"
        "  concurrency_key, max_concurrent, rate_key, rate_limit, rate_per)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " RETURNING id)"
        " SELECT id, pg_notify(%s, %s) FROM ins"
    ),
    # The NOTIFYs of a COPY batch (sent at its commit), and its ids: the ends of the run when the
    # ids are consecutive (the list is computed only when they are not).
    "reserve_ids": sql.SQL(
        "WITH n AS (SELECT count(pg_notify(%s, queue)) FROM unnest(%s::text[]) AS queue),"
        " ids AS (SELECT nextval({seq}) AS id FROM n, generate_series(1, %s))"
        " SELECT lo, hi, CASE WHEN hi - lo + 1 = k THEN NULL"
        "  ELSE (SELECT string_agg(id::text, ',' ORDER BY id) FROM ids) END"
        " FROM (SELECT min(id) AS lo, max(id) AS hi, count(*) AS k FROM ids) r"
    ),
    # Columns in the order `_copy_text` writes them.
    "copy_in": sql.SQL(
        "COPY {s}.jobs (id, args, run_at, kind, queue, state, max_attempts, priority, created_at,"
        " concurrency_key, max_concurrent, rate_key, rate_limit, rate_per) FROM STDIN"
    ),
    "insert_one": sql.SQL(
        "WITH ins AS ("
        " INSERT INTO {s}.jobs (kind, queue, args, state, max_attempts, priority, run_at, created_at, unique_key,"
        "  concurrency_key, max_concurrent, rate_key, rate_limit, rate_per)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
        " ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL"
        "  AND state NOT IN ('completed', 'discarded', 'cancelled') DO NOTHING"
        " RETURNING id)"
        " SELECT id, (SELECT count(*) FROM (SELECT pg_notify(%s, %s)) x) FROM ins"
    ),
    # Periodic schedules (migration 0008): the tick is taken only if later than the stored one;
    # a concurrent upsert of the same tick waits for the row lock and then finds it taken.
    "advance_tick": sql.SQL(
        "INSERT INTO {s}.schedules AS sch (name, last_tick) VALUES (%s, %s) ON CONFLICT (name) DO UPDATE"
        " SET last_tick = EXCLUDED.last_tick, last_job_id = NULL WHERE sch.last_tick < EXCLUDED.last_tick"
        " RETURNING name"
    ),
    # Locks (migration 0008): a row per held lock, taken when free, expired or already ours. The
    # fencing token (migration 0019) is drawn in RETURNING, once the row is ours: an acquisition
    # that follows another (which it waited for, or whose row it found gone) draws a larger one.
    "acquire_lock": sql.SQL(
        "INSERT INTO {s}.locks AS l (name, owner, expires_at) VALUES (%s, %s, %s) ON CONFLICT (name) DO UPDATE"
        " SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at"
        " WHERE l.owner = EXCLUDED.owner OR l.expires_at <= %s RETURNING nextval({fences})"
    ),
    "renew_lock": sql.SQL(
        "UPDATE {s}.locks SET expires_at = %s WHERE name = %s AND owner = %s AND expires_at > %s RETURNING name"
    ),
    "release_lock": sql.SQL("DELETE FROM {s}.locks WHERE name = %s AND owner = %s"),
    "tick_job": sql.SQL("UPDATE {s}.schedules SET last_job_id = %s WHERE name = %s"),
    "schedule_states": sql.SQL("SELECT name, last_tick, last_job_id FROM {s}.schedules WHERE name = ANY(%s)"),
    # A bounded queue's enqueue lock (one per queue, taken in the order given: sorted), held to
    # the end of the transaction, so its enqueues count and insert one at a time.
    "lock_queue": sql.SQL(
        "SELECT count(pg_advisory_xact_lock(hashtext('nursery_jobs max_length ' || {schema_text}), hashtext(q)))"
        " FROM unnest(%s::text[]) AS u(q)"
    ),
    # Pending jobs (`transitions.PENDING`) of a queue, each part up to a limit, through the three
    # partial indexes that hold them: `jobs_available` (unparked), `jobs_parked_queue` (parked,
    # migration 0012) and `jobs_waiting` (the other pending states).
    "count_pending": sql.SQL(
        "SELECT (SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE queue = %(queue)s AND state = 'available'"
        " AND NOT parked LIMIT %(limit)s) a)"
        " + (SELECT count(*) FROM (SELECT 1 FROM {s}.jobs WHERE queue = %(queue)s AND state = 'available'"
        " AND parked LIMIT %(limit)s) p)"
        f" + (SELECT count(*) FROM (SELECT 1 FROM {{s}}.jobs WHERE queue = %(queue)s AND state IN ({_WAITING})"
        " LIMIT %(limit)s) w)"
    ),
    "find_unique": sql.SQL(
        "SELECT id FROM {s}.jobs WHERE unique_key = %s AND state NOT IN ('completed', 'discarded', 'cancelled')"
    ),
    # Due jobs come from two places (migration 0002): `available` rows (always due) in claim
    # order from `jobs_available`, and scheduled/retryable rows that came due from
    # `jobs_waiting` (queue, run_at), up to _PROMOTE_AT_ONCE of them, oldest first: neither scan
    # reads a row that is not due. The best `limit` of both are claimed; the due waiting rows
    # not claimed become `available` in the same statement, so the next claim finds them in
    # claim order. Claim order (priority, then run_at, then id) is exact among due jobs unless
    # more than _PROMOTE_AT_ONCE waiting rows came due at once: then the rest join at the next
    # claims. Both scans lock with SKIP LOCKED; rows locked and not updated are free again at
    # the statement's end. The next due time is the first not-due waiting row's, from
    # `jobs_waiting` too (an `available` row is due: only a host whose clock runs behind the
    # writer's can see one ahead of its time, and its next poll or wake-up finds it).
    # The two UPDATEs take their rows by `id = ANY(ARRAY(...))`, a lookup
    # in the primary key and no join: as `id IN (SELECT ...)`, a generic plan made while the
    # table was empty (analyzed after a drain, or on a fresh deploy) joined the picked ids
    # against a full scan of the primary key, ~0.3 s per claim once 10,000 jobs had arrived.
    # Concurrency keys (migration 0006): both scans pass over a keyed job whose key is at its
    # limit as this statement's snapshot sees it (`_KEY_FREE`, a probe of `jobs_running_key`), so
    # a busy key holds back nothing behind it; keyed jobs picked are not claimed by the
    # statement's own update but by `claim_picked_parking` (migration 0014, after 0013's
    # `claim_picked`), called at its end, which decides under the keys' locks
    # (`transitions.admit_rated`, restated in SQL there): a claim is one round trip with limits
    # or without.
    # Parked jobs (migration 0011): `jobs_available` leaves parked rows out, and the scan of
    # available rows reads them with their `_KEY_FREE` as a column, counting the free ones (a
    # window whose run condition stops the index scan after `limit` free rows), and reads at
    # most `PARK_AT_ONCE` rows more than `limit` (a LIMIT, under the window, not a bound on
    # the window's row number: the planner prices a scan for the rows its LIMIT lets through,
    # and a run condition is no LIMIT to it. Priced for every available row, the generic plan
    # of a table whose available rows were ~10 % of it, beside the finished rows retention
    # keeps, was a bitmap scan of all of them and a sort on disk, ~100 ms a claim: both plans
    # carry the same large per-row price of the key and rate subplans, so their totals came
    # within 1 % of each other, and a drain and an analyze made the sort the cheaper. Priced
    # for a tenth of them (a LIMIT of a parameter), the ordered scan costs a tenth of the
    # sort.) The keyed rows it passed over are parked, each only if the
    # statement holds share locks (SKIP LOCKED) on at least its limit of its key's running rows:
    # a row leaving `running` waits for those locks, then unparks in a snapshot of its own
    # (`_UNPARK_FREED`). The last row carries how many were parked: the claim looks again
    # behind them.
    # Rate keys (migration 0014): the scan reads a rate-keyed row with its verdict as a column
    # (`_RATE_OPEN`, so the window's bound counts it), and the last row carries the ids it
    # passed over for their rate, for `rate_park`, and the queue's earliest rate wake time,
    # which the claim passes to `rate_release` once it has come: one round trip more for each,
    # and only when there is something to park or a wake time has come. A picked job that
    # `claim_picked_parking` refuses for its rate (under the key's lock, several of one key in
    # one pick) is parked by it, through `rate_park`, in the same statement; its
    # slot comes back in the last row with the others'.
    "claim": sql.SQL(_claim_sql(limited=False)),
    # Under a queue's global limit: every job picked goes to `claim_picked_parking`, which counts the
    # queue's running jobs under the queue's lock.
    "claim_limited": sql.SQL(_claim_sql(limited=True)),
    # The lean claim of a queue with no global limit whose due jobs need none of the full
    # claim's other CTEs: the lean prefix of the first `limit` available rows in claim order
    # (rows with no rate key, and no concurrency key or one whose key has room as the
    # statement's snapshot sees it, `_KEY_FREE`), through `jobs_available` as the full claim
    # reads it. Its plain rows are claimed by its own update; its keyed ones go to
    # `claim_picked`, which decides under the keys' locks in a snapshot of its own, as the full
    # claim's keyed picks do, so the lean start can never put a key over its limit: a key
    # that filled after the scan's snapshot, or more jobs of one key in the prefix than its
    # room, start no more than the key's limit. It claims nothing when a scheduled or retryable job has come due (the full
    # claim promotes it, and it may come first) or a rate wake time has come, and its last row
    # says whether the full claim must run for the rest (those, a row behind the prefix that is
    # not lean, or a keyed job `claim_picked` did not start): see `claim`. One difference from
    # the full statement, by design: a claim that fills its limit reads no row behind it, where
    # the full scan reads on to the next startable row, parking the keyed rows it passes over
    # and reporting a rate-keyed one's next slot; those are parked (or reported) by the next
    # claim, which a fetcher whose claim filled its room makes as soon as a slot frees. Nothing
    # starts out of order or early (tests/backends/postgres/test_lean_claim_differential.py).
    "claim_lean": sql.SQL(_claim_lean_sql()),
    # Jobs a claim passed over for their rate, parked under their keys' locks; and a queue's
    # rate keys whose wake time came, brought back as far as their windows admit (migration 0014).
    "rate_park": sql.SQL("SELECT {s}.rate_park(%(ids)s::bigint[], %(queue)s::text, %(now)s::float8)"),
    "rate_release": sql.SQL("SELECT released, next_wake FROM {s}.rate_release(%(queue)s::text, %(now)s::float8)"),
    # Rows by primary key, outcomes by key, and no join. The rows are found by `id = ANY(ids)`,
    # a lookup in the primary key, and each row's outcome is read from a jsonb object keyed by
    # "id:attempt" (`_outcomes_json`; a binary search per row, and OFFSET 0 keeps the sub-select
    # from being inlined into each of the rules' references to the outcome, which would repeat
    # the lookup). The key carries the attempt, so it is the fencing token too: a row is
    # updated only if it is still `running` under the attempt the worker claimed, and two
    # outcomes of one job under different attempts stay apart. Why not a join: as
    # `FROM unnest(...) o WHERE j.id = o.id`, a generic plan made while the table was small or
    # had no row running (autovacuum analyzed it then) walked the whole primary key for
    # `running` rows and looped the outcome list against each, 7-13 s for 4,000 outcomes with
    # 8,000 rows running, until the next analyze; adding `j.id = ANY(ids)` to that join let the
    # plan loop the list against itself; finding the rows by a lateral probe and updating them
    # by ctid skipped a row updated meanwhile (an outcome lost); and a plan per call costs its
    # planning on every call. Against the join on fresh statistics this costs the same at one
    # outcome and 17 % more at 4,000 (30 against 26 ms). The new values come from the job rules
    # (`transitions.sql_case`): the same table the other backends apply row by row.
    "finish": sql.SQL(
        "WITH upd AS ("
        " UPDATE {s}.jobs j SET (state, attempt, run_at, finalized_at, errors, failed_attempts, interrupted) ="
        " (SELECT " + sql_case("state") + ","
        "  j.attempt - " + sql_case("give_back") + ","
        "  " + sql_case("run_at") + ","
        "  CASE WHEN " + sql_case("final") + " THEN %(now)s END,"
        "  CASE WHEN o.error IS NULL THEN j.errors"
        "   ELSE jsonb_path_query_array(coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(o.error), "
        + _KEEP_ERRORS
        + ") END,"
        "  j.failed_attempts + " + sql_case("failed") + ","
        "  j.interrupted + " + sql_case("interrupted") + ""
        "  FROM (SELECT v ->> 0 AS kind, (v ->> 1)::float8 AS run_at, v -> 2 AS error"
        "   FROM (SELECT %(outcomes)s::jsonb -> (j.id::text || ':' || j.attempt::text) AS v OFFSET 0) r) o),"
        "  heartbeat_at = NULL, parked = false"
        " WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state = 'running'"
        "  AND %(outcomes)s::jsonb ? (j.id::text || ':' || j.attempt::text)"
        " RETURNING j.id, j.queue, j.state, j.run_at, j.errors -> -1 ->> 'message' AS message, j.concurrency_key),"
        + _UNPARK_FREED
        + ","
        # Other processes learn of the batch in the same statement (and so at its commit): one
        # NOTIFY per queue with jobs available again (a keyed job's end frees its key's slot),
        # and the finalized ids in payloads of at most 400 ids (NOTIFY payloads are limited to
        # 8000 bytes).
        " ready AS (SELECT count(*) AS n FROM (SELECT queue FROM upd"
        "  WHERE state = 'available' OR concurrency_key IS NOT NULL UNION SELECT queue FROM freed) a,"
        "  LATERAL (SELECT pg_notify(%(jobs_channel)s, a.queue)) x),"
        " done AS (SELECT count(*) AS n FROM (SELECT string_agg(id::text, ',') AS ids FROM"
        "  (SELECT id, (row_number() OVER (ORDER BY id) - 1) / 400 AS g FROM upd"
        "   WHERE state IN ('completed', 'discarded', 'cancelled')) f GROUP BY g) b,"
        "  LATERAL (SELECT pg_notify(%(events_channel)s, 'f:' || b.ids)) x)"
        # (The two counts are one-time filters: they make both NOTIFY sets run, once.)
        # Then one row with no id per queue a freed slot let a job back into.
        " SELECT id, queue, state, run_at, message, concurrency_key FROM upd"
        " WHERE (SELECT n FROM ready) >= 0 AND (SELECT n FROM done) >= 0"
        " UNION ALL SELECT NULL::bigint, f.queue, NULL::text, NULL::float8, NULL::text, NULL::text"
        "  FROM (SELECT DISTINCT queue FROM freed) f"
    ),
    "cancel": sql.SQL(
        # on_cancel (transitions): a final job is left alone, a running one gets its request
        # (once: a second cancel changes nothing and tells nobody), a pending one ends now.
        # The update names its row by id, not only through `cur`: joined to `cur` alone, a plan
        # made on an empty analyzed table walked the whole primary key for it.
        "WITH cur AS (SELECT id, queue, state, cancel_requested, concurrency_key, parked FROM {s}.jobs"
        "  WHERE id = %(id)s FOR UPDATE),"
        " upd AS (UPDATE {s}.jobs j SET"
        "  state = CASE WHEN cur.state = 'running' THEN 'running' ELSE 'cancelled' END,"
        "  cancel_requested = CASE WHEN cur.state = 'running' THEN true ELSE j.cancel_requested END,"
        "  finalized_at = CASE WHEN cur.state = 'running' THEN NULL ELSE %(now)s END"
        "  FROM cur WHERE j.id = %(id)s AND j.id = cur.id AND cur.state NOT IN ('completed', 'discarded', 'cancelled')"
        "   AND NOT (cur.state = 'running' AND cur.cancel_requested)"
        "  RETURNING j.id, j.state, j.errors -> -1 ->> 'message' AS message),"
        # the wake-up rides in the same statement: one round trip, so a cancel either happened
        # with its NOTIFY or not at all (cancel-atomic)
        " n AS (SELECT pg_notify(%(channel)s, CASE WHEN upd.state = 'running' THEN 'c:' ELSE 'f:' END || upd.id)"
        "  FROM upd),"
        # A cancelled unparked job of a key may be the one a freed slot brought back: the key's
        # best parked job takes its place (migration 0011), and its queue is told (0017: it may
        # be another queue's). OFFSET 0: the job is filtered before the call, never after.
        " freed AS (SELECT u.queue, pg_notify(%(jobs_channel)s, u.queue) FROM (SELECT cur.concurrency_key"
        "  FROM cur JOIN upd ON upd.id = cur.id"
        "  WHERE cur.state = 'available' AND NOT cur.parked AND cur.concurrency_key IS NOT NULL OFFSET 0) c,"
        "  LATERAL {s}.unpark_keys_queues(ARRAY[c.concurrency_key], ARRAY[1]) AS u(queue))"
        " SELECT cur.state, coalesce(upd.state, cur.state), upd.message, (SELECT count(*) FROM n), upd.id IS NOT NULL,"
        "  (SELECT count(*) FROM freed), coalesce((SELECT min(queue) FROM freed), cur.queue)"
        " FROM cur LEFT JOIN upd ON upd.id = cur.id"
    ),
    # The outcome statement's shape (see there): rows by primary key, the attempt fenced by
    # "id:attempt" keys of a jsonb object (`_attempt_keys`), and no list joined against the
    # table (as a join with `unnest(...)`: 4.5-11 s for 4,000 heartbeats on a plan made on a
    # small table).
    "heartbeat": sql.SQL(
        "UPDATE {s}.jobs j SET heartbeat_at = %s"
        " WHERE j.id = ANY(%s::bigint[]) AND j.state = 'running' AND %s::jsonb ? (j.id::text || ':' || j.attempt::text)"
        " RETURNING j.id, j.attempt, j.cancel_requested"
    ),
    # The stale rows through the running rows' indexes (jobs_running, jobs_running_unbeaten),
    # then updated by `id = ANY(ARRAY(...))`, a lookup in the primary key, not by a join: as
    # `FROM stale WHERE j.id = stale.id`, with an `ORDER BY id` on the stale rows, a plan made
    # on an empty analyzed table walked the whole primary key for both, every minute, however
    # few rows were stale (0.07-0.16 s at 200,000 rows). SKIP LOCKED takes no lock it waits for, so
    # the order they are locked in does not matter.
    "rescue": sql.SQL(
        # A running row with no heartbeat (written by hand) is stale too, or it would run never.
        "WITH stale AS (SELECT id FROM {s}.jobs WHERE state = 'running'"
        "  AND (heartbeat_at < %(before)s OR heartbeat_at IS NULL)"
        "  FOR UPDATE SKIP LOCKED),"
        " upd AS (UPDATE {s}.jobs j SET"
        "  state = CASE WHEN j.cancel_requested THEN 'cancelled'"
        "   WHEN j.attempt >= j.max_attempts THEN 'discarded' ELSE 'available' END,"
        "  run_at = CASE WHEN j.cancel_requested OR j.attempt >= j.max_attempts THEN j.run_at ELSE %(now)s END,"
        "  finalized_at = CASE WHEN j.cancel_requested OR j.attempt >= j.max_attempts THEN %(now)s END,"
        "  errors = jsonb_path_query_array(coalesce(j.errors, '[]'::jsonb) || jsonb_build_array(jsonb_build_object("
        "   'attempt', j.attempt, 'at', %(now)s, 'traceback', NULL, 'message',"
        "   coalesce('rescued: its worker stopped heartbeating at ' || to_char(j.heartbeat_at, 'FM999999999990.000')"
        "   || ' (worker lost)', 'rescued: its running row had no readable heartbeat (worker lost)'))), "
        + _KEEP_ERRORS
        + "),"
        "  failed_attempts = j.failed_attempts + 1, heartbeat_at = NULL, parked = false"
        " WHERE j.id = ANY(ARRAY(SELECT id FROM stale))"
        " RETURNING j.id, j.queue, j.state, j.errors -> -1 ->> 'message' AS message, j.concurrency_key),"
        + _UNPARK_FREED
        + " SELECT id, queue, state, message, concurrency_key FROM upd WHERE (SELECT count(*) FROM freed) >= 0"
        # Then one row with no id per queue a freed slot let a job back into.
        " UNION ALL SELECT NULL::bigint, f.queue, NULL::text, NULL::text, NULL::text FROM (SELECT DISTINCT queue FROM freed) f"
    ),
    # Keys the rescuer's pass finds parked with a free slot (migration 0011): a repair that is
    # normally a no-op.
    "repair_parked": sql.SQL("SELECT queue FROM {s}.repair_parked()"),
    # Per state, the oldest final rows through jobs_finalized (state, finalized_at), then deleted
    # by primary key: no plan can scan the table for them, whatever it holds.
    "delete_finished": sql.SQL(
        "WITH doomed AS (SELECT d.id FROM unnest(%(states)s::text[], %(befores)s::float8[]) AS c(state, before)"
        "  CROSS JOIN LATERAL (SELECT id FROM {s}.jobs WHERE state = c.state AND finalized_at < c.before"
        "   ORDER BY finalized_at LIMIT %(limit)s) d LIMIT %(limit)s),"
        " del AS (DELETE FROM {s}.jobs j WHERE j.id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1),"
        # Rate keys idle longer than their window (`transitions.rate_idle`, migration 0010); the
        # condition is in the DELETE's own WHERE, so a record a claim updated meanwhile stays.
        " idle AS (DELETE FROM {s}.rate_keys r WHERE r.key = ANY(ARRAY(SELECT key FROM {s}.rate_keys"
        "  WHERE last + per <= %(now)s LIMIT %(limit)s)) AND r.last + r.per <= %(now)s)"
        " SELECT count(*) FROM del"
    ),
    "repair_errors": sql.SQL("UPDATE {s}.jobs SET errors = %s::jsonb WHERE id = %s AND errors = %s::jsonb"),
    "get": sql.SQL(
        "SELECT id, kind, queue, args, state, attempt, max_attempts, priority, run_at, created_at,"
        " attempted_at, finalized_at, errors::text, unique_key FROM {s}.jobs WHERE id = %s"
    ),
    # The outbox (migration 0009): one statement per publish, its NOTIFY sent at the commit.
    "publish": sql.SQL(
        "WITH ins AS (INSERT INTO {s}.outbox (topic, payload, created_at)"
        " SELECT t, p, %s::float8 FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS u(t, p, ord) ORDER BY ord"
        " RETURNING 1)"
        " SELECT (SELECT count(*) FROM ins), pg_notify(%s, 'o:')"
    ),
    # Claims rows, never a range after a remembered id: a row whose transaction commits after a
    # later row's is claimed by the next pass, not skipped.
    "relay_claim": sql.SQL(
        "SELECT id, topic, payload FROM {s}.outbox WHERE topic = ANY(%s::text[])"
        " ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"
    ),
    "relay_delete": sql.SQL("DELETE FROM {s}.outbox WHERE id = ANY(%s::bigint[])"),
    "stats": sql.SQL(
        "SELECT queue, state, count(*), sum(failed_attempts), sum(interrupted) FROM {s}.jobs GROUP BY queue, state"
    ),
}
