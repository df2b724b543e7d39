"""`PostgresBackend`: the concerns put together, its life, and its wake-ups.

The class is its concerns' classes combined (each a module of this package, each a subclass of
`connection.PostgresBase`, which holds the state they share). What is left here is what belongs to
the whole: the connection budget a runtime's workers need, opening (the pool, then the schema's
version checked) and closing, and the wake-ups.

Wake-ups: inserts and retries `pg_notify` the queue's name on ``<schema>_jobs``; finalized jobs
and cancel requests go on ``<schema>_events``. One LISTEN connection per process
(`infra.pg.listen`) fans them out. Fetchers also poll (1 s; 0.1 s for awaited queues), so a lost
connection delays work by at most a poll interval and nothing is lost. A process whose runtimes
have no queue workers listens on ``<schema>_events`` only, and a process drops the echo of its own
notifications (their events were emitted in-process already), but for a wake-up marked '!',
which a statement sends from inside a claim that cannot report it (migration 0017's
`unpark_keys`, which `rate_park` calls).
"""

from __future__ import annotations

import shlex
from typing import ClassVar

import trio

from ...errors import BackendUnavailable, ConfigError
from ...infra.pg import PgPool, TrioConnection, listen, psycopg  # psycopg only through infra: import order
from ...infra.redact import REDACTED, redact
from ..protocol import BackendEvent, CancelRequested, JobFinalized, JobsAvailable, OutboxPublished
from .cache import PgCacheStore
from .claim import Claims
from .connection import POOL_SESSION
from .coordination import Coordination
from .failures import FailureKind, failure_kind, one_line
from .maintenance import Maintenance
from .outcomes import Outcomes
from .reads import Reads
from .schema import LATEST_VERSION, schema_version_async

__all__ = ["PostgresBackend"]

_tuple_new = tuple.__new__  # builds a NamedTuple without its Python-level __new__ (hot path)


class PostgresBackend(Coordination, Claims, Outcomes, Maintenance, Reads):
    """Jobs in PostgreSQL, shared by every process and host that uses the same schema."""

    never_yields = False
    _blocking_io: ClassVar[bool] = False
    """Every database wait blocks the Trio thread (`PgPool(blocking=True)`): set only by a test
    subclass that runs the runtime under `MockClock(autojump_threshold=0)`, never by a service."""

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

    def cache_store(self) -> PgCacheStore:
        if self._cache is None:
            self._cache = PgCacheStore(self)
        return self._cache

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
            bad_url = f"bad PostgreSQL URL: {redact(one_line(exc), self.conninfo)}"
        # Each error below is raised outside the handler that caught psycopg's: that one may
        # quote the URL, and would be the context of ours.
        if bad_url is not None:
            raise ConfigError(bad_url)
        failed: psycopg.Error | None = None
        try:
            async def check(conn: TrioConnection) -> int | None:
                self._dbname = conn.info.dbname
                return await schema_version_async(conn, self.schema)

            version = await pool.run(check)
        except psycopg.Error as exc:
            failed = exc
        if failed is not None:
            await pool.close()
            kind = failure_kind(failed)
            if kind is FailureKind.CLIENT:
                raise ConfigError(f"bad PostgreSQL URL: {self._describe(failed)}")
            if kind is FailureKind.LOST:
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
        if kind == "k":  # a cache key filled or freed by another process (cache.py)
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
