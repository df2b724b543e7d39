"""PostgreSQL robustness: no round trip waits forever (a connection that goes silent without
a reset), the listener notices a silent connection and reconnects, the URL's own libpq
settings survive the pool, and URL options are validated.

The silent connection comes from `FreezingProxy`: a TCP proxy between the client and the
server that can stop forwarding without closing anything (the kernel keeps acknowledging, so
keepalives cannot help: only the client-side bounds can)."""

from __future__ import annotations

import math
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import trio

import nursery_jobs as nj
import nursery_jobs.infra.pg as pg
from nursery_jobs.backends import NewJob
from nursery_jobs.backends.postgres import PostgresBackend, parse_postgres_url
from tests import pgutil


class FreezingProxy:
    """Forwards TCP connections to the server. `freeze()` stops forwarding on every connection
    open at that moment (kept open, data held); `freeze_new` also holds connections made later
    (accepted, never forwarded)."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.freeze_new = False
        self._live: list[dict[str, bool]] = []

    def freeze(self) -> None:
        for state in self._live:
            state["frozen"] = True

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                client = await listeners[0].accept()
                nursery.start_soon(self._handle, client)

    async def _handle(self, client: trio.SocketStream) -> None:
        state = {"frozen": self.freeze_new}
        self._live.append(state)
        if state["frozen"]:
            await trio.sleep_forever()  # (the client socket stays open until the test ends)
        server = await trio.open_tcp_stream(*self.target)

        async def pump(src: trio.SocketStream, dst: trio.SocketStream) -> None:
            try:
                while data := await src.receive_some(65536):
                    if state["frozen"]:
                        await trio.sleep_forever()
                    await dst.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            if not state["frozen"]:
                await dst.aclose()

        async with client, server, trio.open_nursery() as nursery:
            nursery.start_soon(pump, client, server)
            nursery.start_soon(pump, server, client)

    def url(self, url: str) -> str:
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


@pytest.fixture
async def proxy(pg_url: str, nursery: trio.Nursery) -> FreezingProxy:
    parts = urlsplit(pg_url)
    p = FreezingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await nursery.start(p.serve)
    return p


@pytest.fixture
def short_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg.pool, "ROUND_TRIP_MARGIN", 0.5)
    monkeypatch.setattr(pg.connection, "DRAIN_TIMEOUT", 0.5)
    monkeypatch.setattr(pg.pool, "DRAIN_TIMEOUT", 0.5)


def _job(queue: str = "q") -> NewJob:
    return NewJob(kind="k", queue=queue, args_json="{}", max_attempts=3, priority=0, run_at=None, unique_key=None)


async def _backend_through(proxy: FreezingProxy, pg_url: str, query: str = "", **kwargs: Any) -> PostgresBackend:
    schema = pgutil.new_schema(pg_url)
    backend = PostgresBackend(proxy.url(pg_url) + query, schema=schema, statement_timeout=1.0, outage_timeout=2.0, **kwargs)
    backend.check_budget(1)
    await backend.open()
    return backend


# -- item: no round trip waits forever --


async def test_a_write_on_a_frozen_connection_fails_within_the_bound(pg_url, proxy, short_bounds):
    backend = await _backend_through(proxy, pg_url)
    try:
        [first] = await backend.insert_many([_job()])
        proxy.freeze()
        t0 = time.perf_counter()
        with pytest.raises(nj.BackendUnavailable, match="outcome is unknown"):
            await backend.insert_many([_job()])  # a write: never retried
        elapsed = time.perf_counter() - t0
        # statement_timeout 1 + margin 0.5 + drain 0.5, plus slack
        assert 1.4 < elapsed < 4, elapsed
        assert backend.pool.checked_out == 0 and backend.pool._idle == []
        # the next call opens a new connection (the proxy forwards new ones) and works
        assert (await backend.get_job(first.id)).id == first.id
    finally:
        await backend.close()


async def test_a_read_on_a_frozen_connection_is_retried_on_a_new_one(pg_url, proxy, short_bounds):
    backend = await _backend_through(proxy, pg_url)
    try:
        [first] = await backend.insert_many([_job()])
        proxy.freeze()
        t0 = time.perf_counter()
        job = await backend.get_job(first.id)  # retry=True: a new connection answers
        assert job.id == first.id
        assert time.perf_counter() - t0 < 4
    finally:
        await backend.close()


async def test_a_claim_gives_up_when_nothing_answers(pg_url, proxy, short_bounds):
    backend = await _backend_through(proxy, pg_url, "?connect_timeout=1")
    try:
        await backend.insert_many([_job()])
        proxy.freeze()
        proxy.freeze_new = True  # not even a new connection gets through
        t0 = time.perf_counter()
        with pytest.raises(nj.BackendUnavailable):
            await backend.claim("q", 1)
        # one bounded attempt (2 s) + outage_timeout 2 s + a last attempt (connect_timeout 1 s)
        assert time.perf_counter() - t0 < 7
    finally:
        await backend.close()


async def test_an_outcome_write_is_retried_past_a_frozen_connection_then_gives_up(pg_url, proxy, short_bounds):
    from nursery_jobs.backends import Outcome, OutcomeKind

    backend = await _backend_through(proxy, pg_url, "?connect_timeout=1")
    try:
        [one, two] = await backend.insert_many([_job(), _job()])
        claimed = (await backend.claim("q", 2)).jobs
        assert sorted(j.id for j in claimed) == [one.id, two.id]
        # frozen: retried on a new connection, which the proxy still forwards
        proxy.freeze()
        t0 = time.perf_counter()
        await backend.finish_many([Outcome(one.id, 1, OutcomeKind.COMPLETED)])
        assert time.perf_counter() - t0 < 4
        assert (await backend.get_job(one.id)).state is nj.JobState.COMPLETED
        # nothing gets through at all: BackendUnavailable, bounded
        proxy.freeze()
        proxy.freeze_new = True
        t0 = time.perf_counter()
        with pytest.raises(nj.BackendUnavailable):
            await backend.finish_many([Outcome(two.id, 1, OutcomeKind.COMPLETED)])
        assert time.perf_counter() - t0 < 7
    finally:
        await backend.close()


async def test_the_pool_bounds_a_call_and_discards_its_connection(pg_url, proxy, short_bounds):
    pool = pg.PgPool(proxy.url(pg_url), size=2, statement_timeout=1.0)
    try:
        assert await pool.run(lambda c: _fetch(c, "SELECT 1")) == [(1,)]
        proxy.freeze()
        t0 = time.perf_counter()
        with pytest.raises(pg.RoundTripTimeout):
            await pool.run(lambda c: _fetch(c, "SELECT 2"))
        assert time.perf_counter() - t0 < 3
        assert pool.checked_out == 0 and pool._idle == [] and pool.backend_pids == frozenset()
        assert await pool.run(lambda c: _fetch(c, "SELECT 3")) == [(3,)]
    finally:
        await pool.close()


async def test_a_slow_statement_on_a_healthy_server_is_not_cut_by_the_client_bound(pg_url):
    # the server's statement_timeout comes first: QueryCanceled, not RoundTripTimeout
    pool = pg.PgPool(pg_url, size=2, statement_timeout=0.3, round_trip_margin=5)
    try:
        with pytest.raises(psycopg.errors.QueryCanceled):
            await pool.run(lambda c: _fetch(c, "SELECT pg_sleep(2)"))
        assert await pool.run(lambda c: _fetch(c, "SELECT 1")) == [(1,)]
    finally:
        await pool.close()


async def _fetch(conn: pg.TrioConnection, query: str) -> list[tuple[Any, ...]]:
    cur = await conn.execute(query)
    return await cur.fetchall()


# -- the listener --


async def test_the_listener_notices_a_frozen_connection_and_reconnects(pg_url, proxy, short_bounds):
    got: list[str] = []
    reconnects = 0

    def on_reconnect() -> None:
        nonlocal reconnects
        reconnects += 1

    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: pg.listen(
                proxy.url(pg_url), ["robust_ch"], lambda ch, payload, pid: got.append(payload), on_reconnect,
                ping_interval=0.3, ping_timeout=0.3, task_status=task_status,
            )  # fmt: skip
        )
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("NOTIFY robust_ch, 'one'")
            with trio.fail_after(5):
                while got != ["one"]:
                    await trio.sleep(0.02)
            proxy.freeze()
            with trio.fail_after(5):  # ping 0.3 + its timeout 0.3 + drain 0.5 + backoff
                while reconnects == 0:
                    await trio.sleep(0.02)
            admin.execute("NOTIFY robust_ch, 'two'")
            with trio.fail_after(5):
                while got != ["one", "two"]:
                    await trio.sleep(0.02)
        nursery.cancel_scope.cancel()


async def test_pool_and_listener_connections_get_tcp_keepalives(pg_url):
    pool = pg.PgPool(pg_url, size=2)
    try:
        async with pool.connection() as conn:
            opts = {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}
        for key, value in pg.KEEPALIVE_DEFAULTS.items():
            assert opts[key] == str(value), key
    finally:
        await pool.close()
    params = pg.connection_params(pg_url + "?keepalives_idle=99&tcp_user_timeout=1234")
    assert params["keepalives_idle"] == "99" and params["tcp_user_timeout"] == "1234"
    assert params["keepalives"] == 1


# -- the URL's own settings and options --


async def test_the_urls_options_and_connect_timeout_survive_the_pool(pg_url):
    url = pg_url + "?options=-c%20search_path%3Dnj_robust_path&connect_timeout=3&application_name=robust"
    conninfo, _ = parse_postgres_url(url)
    pool = pg.PgPool(conninfo, size=2, statement_timeout=7, connect_timeout=10)
    try:
        async with pool.connection() as conn:
            opts = {o.keyword.decode(): (o.val or b"").decode() for o in conn.pgconn.info}
            cur = await conn.execute(
                "SELECT current_setting('search_path'), current_setting('statement_timeout'),"
                " current_setting('application_name')"
            )
            row = await cur.fetchone()
        assert row == ("nj_robust_path", "7s", "robust")
        assert opts["connect_timeout"] == "3"  # the URL's own wins over the pool's 10
    finally:
        await pool.close()
    # without one in the URL, the pool's applies
    assert pg.connection_params(pg_url, connect_timeout=10)["connect_timeout"] == 10


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf", "-inf"])
def test_a_bad_poll_interval_in_the_url_is_a_config_error_naming_it(value):
    with pytest.raises(nj.ConfigError, match=r"poll_interval.*" + ("inf" if "inf" in value else value)):
        parse_postgres_url(f"postgresql://127.0.0.1/db?poll_interval={value}")


@pytest.mark.parametrize("name", ["statement_timeout", "outage_timeout"])
def test_timeouts_in_the_url_are_options_and_validated(name):
    _, opts = parse_postgres_url(f"postgresql://127.0.0.1/db?{name}=2.5")
    assert opts[name] == 2.5
    assert PostgresBackend("postgresql://127.0.0.1/db", **{name: 2.5}).__dict__[name] == 2.5
    with pytest.raises(nj.ConfigError, match=name):
        parse_postgres_url(f"postgresql://127.0.0.1/db?{name}=0")


def test_a_bad_poll_interval_argument_is_a_config_error():
    for bad in (0, -1, math.nan, math.inf):
        with pytest.raises(nj.ConfigError, match="poll_interval"):
            PostgresBackend("postgresql://127.0.0.1/db", poll_interval=bad)


async def test_a_misspelt_url_parameter_is_a_config_error(pg_url):
    # Refused when the backend is built, before anything connects.
    schema = pgutil.new_schema(pg_url)
    with pytest.raises(nj.ConfigError, match='bad PostgreSQL URL: invalid URI query parameter: "conect_timeout"'):
        PostgresBackend(pg_url + "?conect_timeout=3", schema=schema)
    app = nj.App()
    with pytest.raises(nj.ConfigError, match="bad PostgreSQL URL"):
        async with nj.open_runtime(app, backend=f"{pg_url}?conect_timeout=3&schema={schema}", queues=[]):
            pass


# -- the runtime: a worker cut off by a silent connection stops its jobs in time --


async def test_a_heartbeat_through_a_frozen_connection_cancels_the_job_as_lost(pg_url, proxy, short_bounds):
    # rescue_after 4 s: another process may rescue the job 4 s after its last heartbeat, so
    # this one must cancel it by then -- at rescue_after / 2 -- although its heartbeat call
    # never answers (the proxy holds the packets; nothing fails, nothing resets).
    app = nj.App()
    app.queue("q", max_workers=1, timeout=None, poll_interval=60)
    seen: list[tuple[str | None, float]] = []
    running = trio.Event()

    @app.job(queue="q")
    async def long(ctx: nj.JobContext) -> None:
        running.set()
        try:
            await trio.sleep(60)
        finally:
            seen.append((ctx.cancel_reason, trio.current_time()))

    backend = await _backend_through(proxy, pg_url)
    settings = nj.RuntimeSettings(heartbeat_interval=0.5, rescue_after=4, grace=0.5, flush_bound=0.5)
    frozen_at = math.inf
    with trio.fail_after(30):
        try:
            async with nj.open_runtime(app, backend=backend, settings=settings) as rt:
                await rt.enqueue("long", {})
                await running.wait()
                proxy.freeze_new = True
                proxy.freeze()
                frozen_at = trio.current_time()
                while not seen:
                    await trio.sleep(0.05)
        except BaseExceptionGroup as group:
            # the fetcher or completer may give up on the frozen database first: that must be
            # the library's error, not a hang or a raw driver error
            _, rest = group.split(nj.BackendUnavailable)
            assert rest is None, rest
        finally:
            with trio.move_on_after(5):
                await backend.close()
    reason, at = seen[0]
    assert reason == "lost"
    # The safety property, not a speed: cancelled before another process may rescue the job,
    # rescue_after (4 s) after its last good heartbeat, which was before the freeze. (The
    # runtime aims at rescue_after / 2; the rest is margin for a loaded machine.)
    assert at - frozen_at < 4, at - frozen_at


# -- the rescuer's pass --


async def test_a_repair_that_times_out_loses_no_rescued_jobs_wake_up(pg_url, caplog):
    """The rescue pass's repair of parked keys (migrations 0011, 0012) runs after the rescue: if
    it fails (here it outlasts the statement timeout), the rescued jobs are still rescued, their
    queue's wake-up is still sent, and the failure is logged, not raised."""
    schema = pgutil.new_schema(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f'CREATE OR REPLACE FUNCTION "{schema}".repair_parked() RETURNS TABLE (queue text) LANGUAGE sql'
            " AS $$ SELECT 'never'::text FROM pg_sleep(5) $$"
        )
    listener = psycopg.connect(pg_url, autocommit=True)
    backend = PostgresBackend(pg_url, schema=schema, statement_timeout=0.3)
    await backend.open()
    try:
        listener.execute(f'LISTEN "{schema}_jobs"')
        (job,) = await backend.insert_many([NewJob("crashed", "q", "{}", 0, None, 5)])
        assert [j.id for j in (await backend.claim("q", 1)).jobs] == [job.id]  # a worker that then crashed
        assert [n.payload for n in listener.notifies(timeout=1, stop_after=1)] == ["q"]  # the insert's own wake-up
        with trio.fail_after(10):
            rescued = await backend.rescue(backend.now() + 1)
        woken = await trio.to_thread.run_sync(lambda: [n.payload for n in listener.notifies(timeout=5, stop_after=1)])
        state = (await backend.get_job(job.id)).state
    finally:
        await backend.close()
        listener.close()
    assert rescued == [job.id] and state is nj.JobState.AVAILABLE
    assert woken == ["q"]
    failed = [r for r in caplog.records if getattr(r, "event", None) == "repair_failed"]
    assert len(failed) == 1 and "statement timeout" in failed[0].getMessage(), [r.getMessage() for r in caplog.records]
