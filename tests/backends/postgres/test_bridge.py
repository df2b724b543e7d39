"""The Trio-native psycopg bridge (`nursery_jobs.infra.pg`): waits, cancellation, connecting,
the pool's hygiene, the RW wait, and blocking mode under MockClock. No asyncio loop runs in any
of these tests: the bridge must not need one. PostgreSQL comes from tests/pgutil.py (under
CI=true an unreachable server fails these tests instead of skipping them)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

import psycopg
import pytest
import trio
import trio.testing

import nursery_jobs as nj
import nursery_jobs.infra.pg as pg
from nursery_jobs.backends import NewJob
from nursery_jobs.backends import postgres as postgres_backend
from nursery_jobs.backends.postgres import PostgresBackend
from tests import pgutil
from tests.deterministic import DeterministicPostgres

IDLE = psycopg.pq.TransactionStatus.IDLE


async def fetch(conn: pg.TrioConnection, query: Any, params: Any = None) -> list[tuple[Any, ...]]:
    cur = await conn.execute(query, params)
    return await cur.fetchall()


def server_state(url: str, pid: int) -> str | None:
    with psycopg.connect(url, autocommit=True) as admin:
        row = admin.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row[0] if row else None


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


# -- plain queries, no asyncio --


async def test_queries_run_on_trio_with_no_asyncio_loop(pg_url):
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()
    conn = await pg.connect(pg_url, autocommit=True)
    try:
        assert await fetch(conn, "SELECT %s::int + 1, %s::text", (41, "x")) == [(42, "x")]
        async with conn.transaction():
            await conn.execute("CREATE TEMP TABLE t (n int)")
            await conn.execute("INSERT INTO t SELECT generate_series(1, 10)")
        assert await fetch(conn, "SELECT sum(n) FROM t") == [(55,)]
        async with conn.cursor() as cur:
            async with cur.copy("COPY t (n) FROM STDIN") as copy:
                for n in range(1000):
                    await copy.write_row((n,))
        assert await fetch(conn, "SELECT count(*) FROM t") == [(1010,)]
    finally:
        await conn.close()


async def test_a_cached_cursor_parses_a_long_statement_once_and_binds_every_call(pg_url):
    """psycopg parses a statement over 4096 bytes again on every call; a cached cursor keeps the
    parse (`_ParsedOnce`). The parameters still bind per call: a name used twice, a new value
    each time, a literal `%%`."""
    from nursery_jobs.infra.pg import connection

    padding = " ".join(f"/* {i:04} */" for i in range(500))  # a comment: the statement is > 4096 bytes
    query = f"SELECT %(a)s::int + %(b)s::int, %(a)s::int * 2, 'x%%y' {padding}".encode()
    assert len(query) > 4096
    conn = await pg.connect(pg_url, autocommit=True)
    try:
        before = connection._parse.cache_info()
        for a, b in ((1, 2), (10, 20), (5, -5)):
            cur = conn.cached_cursor(query)
            await cur.execute(query, {"a": a, "b": b})
            assert await cur.fetchall() == [(a + b, 2 * a, "x%y")]
        after = connection._parse.cache_info()
        assert (after.misses - before.misses, after.hits - before.hits) == (1, 2)
        cur = conn.cached_cursor(query)
        with pytest.raises(psycopg.ProgrammingError):  # a missing parameter is still psycopg's error
            await cur.execute(query, {"a": 1})
        await cur.execute(b"SELECT 1", None)  # no parameters: psycopg's own path
        assert await cur.fetchall() == [(1,)]
    finally:
        await conn.close()


async def test_one_connection_shared_by_two_tasks_serialises_them(pg_url):
    conn = await pg.connect(pg_url, autocommit=True)
    results = []

    async def query(n: int) -> None:
        results.append(await fetch(conn, "SELECT pg_sleep(0.05), %s::int", (n,)))

    try:
        async with trio.open_nursery() as nursery:
            for n in range(4):
                nursery.start_soon(query, n)
    finally:
        await conn.close()
    assert sorted(r[0][1] for r in results) == [0, 1, 2, 3]


# -- cancellation --


async def test_a_cancelled_statement_returns_promptly_and_leaves_the_connection_usable(pg_url):
    conn = await pg.connect(pg_url, autocommit=True)
    try:
        pid = conn.pgconn.backend_pid
        t0 = time.perf_counter()
        with trio.move_on_after(0.2) as scope:
            await conn.execute("SELECT pg_sleep(10)")
        assert scope.cancelled_caught
        assert time.perf_counter() - t0 < 2
        assert conn.pgconn.transaction_status == IDLE
        assert server_state(pg_url, pid) == "idle"  # the server stopped the statement
        assert await fetch(conn, "SELECT 1") == [(1,)]
    finally:
        await conn.close()


async def test_cancelling_a_prepared_statement_keeps_the_prepared_cache_consistent(pg_url):
    conn = await pg.connect(pg_url, autocommit=True, prepare_threshold=0)  # prepare on first use
    try:
        for _ in range(3):
            with trio.move_on_after(0.1):
                await conn.execute("SELECT pg_sleep(%s)", (10,))
            assert await fetch(conn, "SELECT pg_sleep(%s), 1", (0,)) == [("", 1)]
    finally:
        await conn.close()


async def test_pool_hands_out_no_dirty_connection_after_a_cancelled_call(pg_url):
    pool = pg.PgPool(pg_url, size=2)
    try:
        pids = set()

        async def sleepy(conn: pg.TrioConnection) -> None:
            pids.add(conn.pgconn.backend_pid)
            await conn.execute("SELECT pg_sleep(10)")

        t0 = time.perf_counter()
        with trio.move_on_after(0.2):
            await pool.run(sleepy)
        assert time.perf_counter() - t0 < 2
        assert pool.checked_out == 0
        assert all(c.pgconn.transaction_status == IDLE for c in pool._idle)

        async def who(conn: pg.TrioConnection) -> int:
            assert conn.pgconn.transaction_status == IDLE
            return (await fetch(conn, "SELECT pg_backend_pid()"))[0][0]

        assert await pool.run(who) in pids  # the same connection, clean
    finally:
        await pool.close()


async def test_a_cancelled_transaction_is_rolled_back_or_its_connection_dropped(pg_url):
    schema = pgutil.new_schema(pg_url)
    pool = pg.PgPool(pg_url, size=2)
    try:

        async def write_then_sleep(conn: pg.TrioConnection) -> None:
            async with conn.transaction():
                await conn.execute(
                    f'INSERT INTO "{schema}".jobs (kind, queue, args, state, max_attempts, run_at, created_at)'
                    " VALUES ('k', 'q', '{}', 'available', 1, 0, 0)"
                )
                await conn.execute("SELECT pg_sleep(10)")

        with trio.move_on_after(0.3):
            await pool.run(write_then_sleep)
        assert pool.checked_out == 0
        assert all(c.pgconn.transaction_status == IDLE and not c.closed for c in pool._idle)
        rows = await pool.run(lambda c: fetch(c, f'SELECT count(*) FROM "{schema}".jobs'))
        assert rows == [(0,)]
    finally:
        await pool.close()


async def test_a_cancelled_copy_writes_nothing_and_leaves_no_dirty_connection(pg_url):
    schema = pgutil.new_schema(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as admin:  # a COPY the server consumes slowly
        admin.execute(
            f'CREATE FUNCTION "{schema}".slow() RETURNS trigger LANGUAGE plpgsql AS'
            " $$ BEGIN PERFORM pg_sleep(0.001); RETURN NEW; END $$"
        )
        admin.execute(f'CREATE TRIGGER slow BEFORE INSERT ON "{schema}".jobs FOR EACH ROW EXECUTE FUNCTION "{schema}".slow()')
    pool = pg.PgPool(pg_url, size=2)
    try:

        async def copy_in(conn: pg.TrioConnection) -> None:
            async with conn.transaction():
                async with conn.cursor() as cur:
                    async with cur.copy(
                        f'COPY "{schema}".jobs (kind, queue, args, state, max_attempts, run_at, created_at) FROM STDIN'
                    ) as copy:
                        for n in range(20_000):
                            await copy.write_row(("k", "q", "{}", "available", 1, n, n))

        t0 = time.perf_counter()
        with trio.move_on_after(0.5) as scope:
            await pool.run(copy_in)
        assert scope.cancelled_caught
        assert time.perf_counter() - t0 < 3
        assert pool.checked_out == 0
        assert all(c.pgconn.transaction_status == IDLE and not c.closed for c in pool._idle)
        assert await pool.run(lambda c: fetch(c, f'SELECT count(*) FROM "{schema}".jobs')) == [(0,)]
    finally:
        await pool.close()


async def test_a_statement_that_ignores_the_cancel_closes_its_connection_within_the_bound(pg_url, monkeypatch):
    monkeypatch.setattr(pg.connection, "DRAIN_TIMEOUT", 0.5)
    monkeypatch.setattr(pg.pool, "DRAIN_TIMEOUT", 0.5)

    async def no_cancel(self: pg.TrioConnection) -> None:  # the cancel request is lost
        await trio.lowlevel.checkpoint()

    monkeypatch.setattr(pg.TrioConnection, "_send_cancel", no_cancel)
    pool = pg.PgPool(pg_url, size=2)
    try:
        t0 = time.perf_counter()
        with trio.move_on_after(0.2):
            await pool.run(lambda c: c.execute("SELECT pg_sleep(5)"))
        assert time.perf_counter() - t0 < 2  # 0.2 s + the 0.5 s drain bound
        assert pool.checked_out == 0 and pool._idle == []  # closed, not pooled
        assert pool.backend_pids == frozenset()
        assert await pool.run(lambda c: fetch(c, "SELECT 1")) == [(1,)]
    finally:
        await pool.close()


# -- connecting --


@pytest.fixture
def silent_server():
    """A TCP port that accepts connections (the kernel completes the handshake) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield sock.getsockname()[1]
    finally:
        sock.close()


async def test_a_cancelled_connect_returns_promptly_and_leaks_nothing(silent_server):
    before = open_fds()
    for _ in range(3):
        t0 = time.perf_counter()
        with trio.move_on_after(0.2) as scope:
            await pg.connect(f"host=127.0.0.1 port={silent_server} user=x dbname=x sslmode=disable connect_timeout=30")
        assert scope.cancelled_caught
        assert time.perf_counter() - t0 < 1
    assert open_fds() <= before


async def test_connect_timeout_is_honoured(silent_server):
    t0 = time.perf_counter()
    with pytest.raises(psycopg.OperationalError, match="timeout"):
        await pg.connect(f"host=127.0.0.1 port={silent_server} user=x dbname=x sslmode=disable", connect_timeout=2)
    assert 1.5 < time.perf_counter() - t0 < 6  # psycopg's minimum is 2 s


async def test_the_pool_reports_a_failed_connect_as_connect_failed(silent_server):
    pool = pg.PgPool(f"postgresql://x@127.0.0.1:{silent_server}/x?sslmode=disable", size=2, connect_timeout=2)
    with pytest.raises(pg.ConnectFailed):
        await pool.run(lambda c: fetch(c, "SELECT 1"))
    assert pool.checked_out == 0
    await pool.close()


async def test_connect_resolves_a_host_name(pg_url):
    url = pg_url.replace("127.0.0.1", "localhost")
    if url == pg_url:
        pytest.skip("the test database URL has no 127.0.0.1 host to swap for a name")
    conn = await pg.connect(url, autocommit=True)
    try:
        assert await fetch(conn, "SELECT 1") == [(1,)]
    finally:
        await conn.close()


async def test_a_malformed_conninfo_is_a_programming_error():
    with pytest.raises(psycopg.ProgrammingError):
        await pg.connect("host=127.0.0.1 this is not a conninfo")


# -- the pool --


async def test_an_idle_connection_the_server_ended_is_replaced(pg_url):
    pool = pg.PgPool(pg_url, size=2)
    try:
        first = await pool.run(lambda c: fetch(c, "SELECT pg_backend_pid()"))
        assert pool.backend_pids == frozenset({first[0][0]})
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first[0][0],))
        await trio.sleep(0.2)
        second = await pool.run(lambda c: fetch(c, "SELECT pg_backend_pid()"))
        assert second != first
        assert pool.backend_pids == frozenset({second[0][0]})
    finally:
        await pool.close()


async def test_a_transaction_left_open_is_rolled_back_at_checkin(pg_url):
    schema = pgutil.new_schema(pg_url)
    pool = pg.PgPool(pg_url, size=1)
    try:

        async def leave_open(conn: pg.TrioConnection) -> None:
            await conn.execute("BEGIN")
            await conn.execute(
                f'INSERT INTO "{schema}".jobs (kind, queue, args, state, max_attempts, run_at, created_at)'
                " VALUES ('k', 'q', '{}', 'available', 1, 0, 0)"
            )

        await pool.run(leave_open)
        assert [c.pgconn.transaction_status for c in pool._idle] == [IDLE]
        assert await pool.run(lambda c: fetch(c, f'SELECT count(*) FROM "{schema}".jobs')) == [(0,)]
    finally:
        await pool.close()


async def test_durable_false_runs_with_synchronous_commit_off(pg_url):
    show = "SELECT current_setting('synchronous_commit'), pg_backend_pid()"
    pool = pg.PgPool(pg_url, size=2)
    try:
        # Room in the pool: each mode gets its own connection, nothing is switched back and forth.
        (off, pid_off), = await pool.run(lambda c: fetch(c, show), durable=False)
        (on, pid_on), = await pool.run(lambda c: fetch(c, show))
        assert (off, on) == ("off", "on") and pid_off != pid_on
        for _ in range(3):
            assert await pool.run(lambda c: fetch(c, show), durable=False) == [("off", pid_off)]
            assert await pool.run(lambda c: fetch(c, show)) == [("on", pid_on)]
    finally:
        await pool.close()
    pool = pg.PgPool(pg_url, size=1)
    try:
        # A full pool switches its connection: off with SET, back with RESET (the server's own
        # setting, here the default "on").
        (off, pid), = await pool.run(lambda c: fetch(c, show), durable=False)
        assert off == "off"
        assert await pool.run(lambda c: fetch(c, show)) == [("on", pid)]
    finally:
        await pool.close()


async def test_a_full_pool_waits_then_times_out(pg_url):
    pool = pg.PgPool(pg_url, size=1, acquire_timeout=0.3)
    try:
        async with pool.connection():
            with pytest.raises(trio.TooSlowError):
                await pool.run(lambda c: fetch(c, "SELECT 1"))
        assert await pool.run(lambda c: fetch(c, "SELECT 1")) == [(1,)]
    finally:
        await pool.close()


# -- the RW wait --


class CountingRW:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, target: Any, name: str) -> None:
        self.calls = 0
        original = getattr(target, name)

        async def counting(*args: Any) -> int:
            self.calls += 1
            result: int = await original(*args)
            return result

        monkeypatch.setattr(target, name, counting)


@pytest.mark.parametrize("epoll", [True, False], ids=["epoll", "two-tasks"])
async def test_a_large_message_is_sent_through_the_rw_wait(pg_url, monkeypatch, epoll):
    if epoll and pg.connection._EPOLL is None:
        pytest.skip("no epoll on this platform")
    if not epoll:
        monkeypatch.setattr(pg.connection, "_EPOLL", None)
        counter = CountingRW(monkeypatch, pg.connection, "_wait_rw_with_tasks")
    else:
        counter = CountingRW(monkeypatch, pg.TrioConnection, "_wait_rw")
    conn = await pg.connect(pg_url, autocommit=True)
    try:
        big = "x" * 32_000_000
        # The server sleeps through the first statement of the pipeline and reads nothing
        # meanwhile, so the 32 MB cannot all go out at once (without it a server that reads as
        # fast as the client writes, as on a loaded machine, took it all in one flush).
        async with conn.pipeline():
            await conn.execute("SELECT pg_sleep(0.3)")
            cur = await conn.execute("SELECT length(%s)", (big,))
        assert await cur.fetchall() == [(len(big),)]
        assert counter.calls > 0  # the send did not fit the socket buffers: psycopg asked for RW
    finally:
        await conn.close()


async def test_a_statement_that_completes_before_the_cancel_arrives_reports_its_result(pg_url, monkeypatch):
    # Cancel-atomic: an INSERT that committed is never reported as cancelled. The cancel request
    # is made to arrive too late (stubbed out), as when the statement ends just as the caller
    # is cancelled; the result comes back, and Cancelled waits for the next checkpoint.
    conn = await pg.connect(pg_url, autocommit=True)
    try:
        await conn.execute("CREATE TEMP TABLE landed (x int)")

        async def too_late(self: pg.TrioConnection) -> None:
            pass

        monkeypatch.setattr(pg.TrioConnection, "_send_cancel", too_late)
        returned = None
        with trio.CancelScope() as scope:
            scope.deadline = trio.current_time() + 0.1
            cur = await conn.execute("INSERT INTO landed SELECT 1 FROM pg_sleep(0.3) RETURNING x")
            returned = await cur.fetchone()
            await trio.lowlevel.checkpoint()
            pytest.fail("the cancellation did not take effect at the next checkpoint")
        assert returned == (1,), "the INSERT committed but the call raised Cancelled"
        assert scope.cancelled_caught
        assert await fetch(conn, "SELECT count(*) FROM landed") == [(1,)]
    finally:
        await conn.close()


async def test_a_statement_the_server_stops_has_no_effect(pg_url):
    conn = await pg.connect(pg_url, autocommit=True)
    try:
        await conn.execute("CREATE TEMP TABLE stopped (x int)")
        with trio.move_on_after(0.1) as scope:
            await conn.execute("INSERT INTO stopped SELECT 1 FROM pg_sleep(5)")
        assert scope.cancelled_caught
        assert await fetch(conn, "SELECT count(*) FROM stopped") == [(0,)]
    finally:
        await conn.close()


async def test_a_cancellation_during_the_rw_wait_leaves_the_connection_usable(pg_url, monkeypatch):
    conn = await pg.connect(pg_url, autocommit=True)
    original = pg.TrioConnection._wait_rw
    scope = trio.CancelScope()

    async def cancelling(self: pg.TrioConnection, fileno: int) -> int:
        scope.cancel()
        result: int = await original(self, fileno)
        return result

    monkeypatch.setattr(pg.TrioConnection, "_wait_rw", cancelling)
    try:
        answered = None
        with scope:
            cur = await conn.execute("SELECT length(%s)", ("x" * 32_000_000,))
            answered = await cur.fetchone()
        # Either the server stopped the statement (the scope caught Cancelled) or it had finished
        # first and the call returned its result: a call that took effect is never reported as
        # cancelled. Both leave the connection idle and usable.
        assert scope.cancelled_caught or answered == (32_000_000,)
        assert conn.pgconn.transaction_status == IDLE
        assert await fetch(conn, "SELECT 1") == [(1,)]
    finally:
        await conn.close()


# -- blocking mode under MockClock(autojump_threshold=0) --


def _virtual_time_during_a_query(url: str, blocking: bool) -> tuple[float, bool]:
    """(virtual seconds that passed during a 0.3 s query, whether a concurrent 10 s sleeper woke
    meanwhile), with the loop on MockClock(autojump_threshold=0)."""

    async def main() -> tuple[float, bool]:
        # Connect blocking either way (a Trio-waited connect would time out on virtual time).
        conn = await pg.connect(url, autocommit=True, blocking=True)
        conn._blocking = blocking
        woke = trio.Event()

        async def sleeper() -> None:
            await trio.sleep(10)
            woke.set()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(sleeper)
                await trio.testing.wait_all_tasks_blocked()
                t0 = trio.current_time()
                await fetch(conn, "SELECT pg_sleep(0.3)")
                result = (trio.current_time() - t0, woke.is_set())
                nursery.cancel_scope.cancel()
            return result
        finally:
            await conn.close()

    out: tuple[float, bool] = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return out


def test_blocking_mode_keeps_virtual_time_still_while_a_query_runs(pg_url):
    elapsed, woke = _virtual_time_during_a_query(pg_url, blocking=True)
    assert elapsed < 1 and not woke


def test_without_blocking_mode_virtual_time_jumps_during_a_query(pg_url):
    # Why blocking mode exists: a Trio wait on a socket looks like idleness to the autojump.
    elapsed, woke = _virtual_time_during_a_query(pg_url, blocking=False)
    assert elapsed >= 10 and woke


def test_a_runtime_with_blocking_io_runs_jobs_on_virtual_time(pg_url):
    app = nj.App()
    app.queue("q", max_workers=2, timeout=120)

    @app.job(queue="q")
    async def nap(ctx: nj.JobContext, seconds: float) -> None:
        await trio.sleep(seconds)

    schema = pgutil.new_schema(pg_url)

    async def main() -> tuple[float, nj.Receipt, nj.Receipt]:
        backend = DeterministicPostgres(pg_url, schema=schema, clock=trio.current_time, poll_interval=60.0)
        async with nj.open_runtime(app, backend=backend) as rt:
            t0 = trio.current_time()
            job_id = await nap.enqueue(seconds=30)
            receipt = await rt.wait(job_id, timeout=100)
            elapsed = trio.current_time() - t0
            many = await nap.enqueue_many([{"seconds": 0.1}] * (postgres_backend._COPY_AT + 5))  # the COPY path
            last = await rt.wait(many[-1], timeout=100)
            return elapsed, receipt, last

    t0 = time.perf_counter()
    elapsed, receipt, last = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert receipt.state is nj.JobState.COMPLETED and last.state is nj.JobState.COMPLETED
    assert 30 <= elapsed < 35  # the handler's sleep, on virtual time
    assert time.perf_counter() - t0 < 30  # and not in real time


# -- the backend's COPY path --


async def test_a_large_batch_goes_through_copy_with_the_same_rows_and_a_wakeup(pg_url):
    schema = pgutil.new_schema(pg_url)
    backend = PostgresBackend(pg_url, schema=schema)
    backend.check_budget(1)
    listener = psycopg.connect(pg_url, autocommit=True)
    listener.execute(f'LISTEN "{schema}_jobs"')
    await backend.open()
    try:
        now = backend.now()

        def batch(n: int, queue: str) -> list[NewJob]:
            return [
                NewJob("kind", queue, f'{{"n": {i}, "s": "a,b\\"c{{}}\\t"}}', i % 3, None if i % 2 else now + 1000, 5)
                for i in range(n)
            ]

        n_small, n_large = postgres_backend._COPY_AT - 1, max(250, postgres_backend._COPY_AT)
        small = await backend.insert_many(batch(n_small, "small"))  # one statement
        large = await backend.insert_many(batch(n_large, "large"))  # COPY
        for results in (small, large):
            ids = [r.id for r in results]
            assert ids == sorted(ids) and len(set(ids)) == len(ids) and not any(r.existing for r in results)
        with psycopg.connect(pg_url) as conn:
            rows = {
                queue: conn.execute(
                    f'SELECT kind, args::text, state, priority, max_attempts, run_at > created_at FROM "{schema}".jobs'
                    " WHERE queue = %s ORDER BY id",
                    (queue,),
                ).fetchall()
                for queue in ("small", "large")
            }
        assert rows["large"][:n_small] == rows["small"]
        assert len(rows["large"]) == n_large
        notified = {n.payload for n in listener.notifies(timeout=2, stop_after=2)}
        assert notified == {"small", "large"}
    finally:
        listener.close()
        await backend.close()


async def test_copy_returns_the_ids_the_rows_got_when_they_are_not_consecutive(pg_url):
    schema = pgutil.new_schema(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as admin:  # as if other inserts interleaved
        admin.execute(f'ALTER SEQUENCE "{schema}".jobs_id_seq INCREMENT BY 3')
    backend = PostgresBackend(pg_url, schema=schema)
    await backend.open()
    try:
        n = postgres_backend._COPY_AT + 10
        results = await backend.insert_many([NewJob("kind", "q", f'{{"n": {i}}}', 0, None, 5) for i in range(n)])
        with psycopg.connect(pg_url) as conn:
            rows = conn.execute(f'SELECT id, (args::jsonb->>\'n\')::int FROM "{schema}".jobs ORDER BY id').fetchall()
        ids = [r[0] for r in rows]
        assert [r.id for r in results] == ids
        assert all(b - a == 3 for a, b in zip(ids, ids[1:]))  # not one run: the list was fetched
        assert [r[1] for r in rows] == list(range(n))  # the jobs kept their order
    finally:
        await backend.close()


async def test_a_runtime_with_no_queue_workers_does_not_listen_for_new_jobs(pg_url):
    # It has no fetcher to wake: the jobs channel (every enqueue's NOTIFY, its own included)
    # would only cost it a wake-up per enqueue.
    seen = []

    class Recording(PostgresBackend):
        def _on_notify(self, channel: str, payload: str, sender_pid: int) -> None:
            seen.append(channel)
            super()._on_notify(channel, payload, sender_pid)

    schema = pgutil.new_schema(pg_url)
    app = nj.App()

    @app.job()
    async def noop(ctx: nj.JobContext) -> None:
        pass

    async with nj.open_runtime(app, backend=Recording(pg_url, schema=schema), queues=[]):
        with psycopg.connect(pg_url, autocommit=True) as other:
            other.execute("SELECT pg_notify(%s, 'default')", (f"{schema}_jobs",))
            other.execute("SELECT pg_notify(%s, 'f:1')", (f"{schema}_events",))
        with trio.fail_after(10):
            while not seen:
                await trio.sleep(0.01)
        await trio.sleep(0.2)
    assert seen == [f"{schema}_events"]
