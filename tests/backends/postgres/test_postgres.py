"""PostgreSQL-only behaviour: schema and migrations, the connection budget, transactions never
held across handler code, claim cost, prompt wake-ups, transactional enqueue, the asyncio
bridge, and surviving lost connections. Behaviour shared by all backends is in conformance/."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psycopg
import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends.postgres import LATEST_VERSION, PostgresBackend, migrate, schema_version
from nursery_jobs.cli import main as cli_main
from tests import pgutil


def _backend(url: str, schema: str | None = None, **kwargs) -> PostgresBackend:
    return PostgresBackend(url, schema=schema or pgutil.new_schema(url), **kwargs)


def test_migrate_cli_creates_then_reports_up_to_date(pg_url, capsys):
    schema = "cli_made"
    assert cli_main(["migrate", "--database-url", pg_url, "--schema", schema]) == 0
    assert "applied 0001_initial.sql" in capsys.readouterr().out
    assert cli_main(["migrate", "--database-url", f"{pg_url}?schema={schema}"]) == 0
    assert "up to date" in capsys.readouterr().out
    with psycopg.connect(pg_url) as conn:
        assert schema_version(conn, schema) == LATEST_VERSION


def test_migrate_refuses_a_schema_name_that_is_not_an_identifier(pg_url, capsys):
    assert cli_main(["migrate", "--database-url", pg_url, "--schema", 'x"; DROP TABLE y; --']) == 2
    assert "not a plain lower-case identifier" in capsys.readouterr().err
    with pytest.raises(nj.ConfigError):
        nj.open_backend(f"{pg_url}?schema=Bad-Name")


def test_console_script_runs(pg_url):
    exe = os.path.join(os.path.dirname(sys.executable), "nursery-jobs")
    proc = subprocess.run([exe, "migrate", "--database-url", pg_url, "--schema", "script_made"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr


_SECRET = "S3CRETpw"


@pytest.mark.parametrize(
    "url, code, says",
    [
        (f"postgresql://postgres:{_SECRET}@127.0.0.1/x?pool_size=abc", 2, "?pool_size= in the PostgreSQL URL"),
        (f"postgresql://postgres:S3CR%zz{_SECRET}@127.0.0.1/x", 2, "bad PostgreSQL URL: invalid percent-encoded token"),
        (f"postgresql://postgres:{_SECRET}@[::1/x", 2, "bad PostgreSQL URL"),
        (f"postgresql://postgres@127.0.0.1/x?password={_SECRET}&bogus=1", 2, "invalid URI query parameter"),
        (f"postgresql://postgres:{_SECRET}/x@127.0.0.1/x", 2, "percent-encode"),
        (f"postgresql://postgres:{_SECRET}@127.0.0.1/x?schema=a&schema=b", 2, "?schema= more than once"),
        (f"postgresql://postgres:{_SECRET}@127.0.0.1:1/x", 1, "database error"),
        (f"host=127.0.0.1 port=1 password={_SECRET} dbname=x", 1, "database error"),
    ],
)
def test_migrate_never_prints_the_password(url, code, says, capsys):
    assert cli_main(["migrate", "--database-url", url]) == code
    out, err = capsys.readouterr()
    assert says in err
    assert _SECRET not in out + err


def test_the_console_script_never_prints_the_password():
    exe = os.path.join(os.path.dirname(sys.executable), "nursery-jobs")
    proc = subprocess.run([exe, "migrate", "--database-url", f"postgresql://root:S3CR%zz{_SECRET}@127.0.0.1/x"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 2
    assert "bad PostgreSQL URL" in proc.stderr
    assert _SECRET not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "form",
    [
        "postgresql:///{db}?host=127.0.0.1&user=postgres&password=" + _SECRET,
        "postgresql:///{db}?host=/var/run/postgresql&user=postgres",
        "postgresql://postgres:" + _SECRET + "@127.0.0.1:1,127.0.0.1:5432/{db}",
    ],
)
def test_migrate_takes_every_libpq_url_form(pg_url, form, capsys):
    if "NJ_TEST_PG_URL" in os.environ:
        pytest.skip("the test server is not the local one (NJ_TEST_PG_URL is set)")
    schema = pgutil.new_schema(pg_url)  # migrated already: the command connects and finds it
    url = form.format(db=pg_url.rpartition("/")[2])
    assert cli_main(["migrate", "--database-url", f"{url}&schema={schema}" if "?" in url else f"{url}?schema={schema}"]) == 0
    out, err = capsys.readouterr()
    assert f"schema {schema!r}: up to date" in out, err
    assert _SECRET not in out + err


async def test_runtime_refuses_to_start_on_a_missing_schema(pg_url):
    app = nj.App()
    with pytest.raises(nj.ConfigError, match="nursery-jobs migrate --database-url"):
        async with nj.open_runtime(app, backend=f"{pg_url}?schema=never_migrated"):
            pass


async def test_runtime_refuses_a_schema_newer_than_itself(pg_url):
    schema = pgutil.new_schema(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'INSERT INTO "{schema}".migrations (version, name) VALUES (99, \'9999_future.sql\')')
    app = nj.App()
    with pytest.raises(nj.ConfigError, match=f"schema {schema!r} is at version 99, newer than this nursery_jobs"):
        async with nj.open_runtime(app, backend=f"{pg_url}?schema={schema}"):
            pass


async def test_unreachable_database_is_a_clear_error():
    app = nj.App()
    with pytest.raises(nj.BackendUnavailable, match="cannot connect to PostgreSQL.*check the URL"):
        async with nj.open_runtime(app, backend="postgresql://postgres@127.0.0.1:1/nothing"):
            pass


async def test_connection_budget_is_checked_at_start(pg_url):
    app = nj.App()
    app.queue("index", max_workers=4)
    app.queue("webhook", max_workers=8)
    with pytest.raises(nj.ConfigError, match=r"22 queue workers \+ 1 runtime \+ 1 listener = 24 connections, but pool_size 40 x pool_share 0.5 = 20"):
        async with nj.open_runtime(app, backend=f"{pg_url}?pool_size=40"):
            pass
    # trim the default queue and the same queues fit: 1 + 4 + 8 workers + 2 = 15 <= 20
    app2 = nj.App()
    app2.queue("default", max_workers=1)
    app2.queue("index", max_workers=4)
    app2.queue("webhook", max_workers=8)
    schema = pgutil.new_schema(pg_url)
    async with nj.open_runtime(app2, backend=f"{pg_url}?pool_size=40&schema={schema}"):
        pass


async def test_no_connection_or_transaction_is_held_while_a_handler_runs(pg_url):
    app = nj.App()
    seen = []
    backend = _backend(pg_url)

    @app.job()
    async def observe(ctx: nj.JobContext) -> None:
        await trio.sleep(0.2)  # let the completer and fetcher settle
        with psycopg.connect(pg_url, autocommit=True) as conn:
            in_tx = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND state LIKE 'idle in transaction%%' AND pid <> pg_backend_pid()"
            ).fetchone()[0]
        seen.append((backend.pool.checked_out, in_tx))

    async with nj.open_runtime(app, backend=backend) as rt:
        for _ in range(3):
            assert (await rt.wait(await observe.enqueue(), timeout=10)).done
    assert seen == [(0, 0)] * 3


async def test_claim_uses_the_partial_indexes_at_100k_rows(pg_url):
    """The backend's own claim statement (not a copy) reads `available` rows through
    `jobs_available` and due scheduled/retryable rows through `jobs_waiting`, never the table.
    (Cost at 1k vs 100k not-due rows: tests/backends/postgres/test_claim_cost.py.)"""
    backend = _backend(pg_url)
    schema = backend.schema
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".jobs (kind, queue, args, state, max_attempts, run_at, created_at, finalized_at)'
            " SELECT 'k', 'q', '{}', 'completed', 25, g, g, g FROM generate_series(1, 100000) g"
        )
        conn.execute(
            f'INSERT INTO "{schema}".jobs (kind, queue, args, state, max_attempts, run_at, created_at)'
            " SELECT 'k', 'q', '{}', 'available', 25, g, g FROM generate_series(1, 1000) g"
        )
        conn.execute(f'ANALYZE "{schema}".jobs')
        plan = "\n".join(
            r[0] for r in conn.execute(b"EXPLAIN " + backend._q["claim"], {"queue": "q", "now": 1e12, "limit": 100})
        )
    assert "jobs_available" in plan and "jobs_waiting" in plan and "Seq Scan" not in plan, plan


async def test_two_inserts_5ms_apart_both_start_without_waiting_for_a_poll(pg_url):
    # A fetch cooldown would drop the second wake-up of a write and leave that job waiting a full
    # poll. Polling is set to 60 s here, so only the wake-ups can start these jobs.
    app = nj.App()
    app.queue("index", max_workers=2, timeout=10, poll_interval=60)
    started = {}

    @app.job(queue="index")
    async def index(ctx: nj.JobContext, doc: str) -> None:
        started[doc] = time.perf_counter()

    async with nj.open_runtime(app, backend=_backend(pg_url, poll_interval=60)) as rt:
        for round_ in range(5):
            t0 = time.perf_counter()
            a = await index.enqueue(doc=f"raw{round_}")
            await trio.sleep(0.005)
            b = await index.enqueue(doc=f"wiki{round_}")
            for job_id in (a, b):
                assert (await rt.wait(job_id, timeout=30)).done
            # far below the 60 s poll: both were woken, neither waited for a poll
            assert started[f"wiki{round_}"] - t0 < 5


async def test_transactional_enqueue_on_the_callers_connection(pg_url):
    app = nj.App()
    ran = []

    @app.job()
    async def welcome(ctx: nj.JobContext, user: str) -> None:
        ran.append(user)

    backend = _backend(pg_url)
    async with nj.open_runtime(app, backend=backend) as rt:
        conn = await trio.to_thread.run_sync(psycopg.connect, pg_url)
        try:
            # rolled back: no job
            await trio.to_thread.run_sync(conn.execute, "SELECT 1")
            kept_out = await rt.enqueue_tx(conn, "welcome", {"user": "ghost"})
            await trio.to_thread.run_sync(conn.rollback)
            # committed: the job runs
            job_id = await rt.enqueue_tx(conn, "welcome", {"user": "ada"})
            await trio.sleep(0.3)
            assert ran == []  # not before the commit
            await trio.to_thread.run_sync(conn.commit)
            assert (await rt.wait(job_id, timeout=10)).state is nj.JobState.COMPLETED
            with pytest.raises(nj.JobNotFound):
                await rt.get_job(kept_out)
        finally:
            conn.close()
    assert ran == ["ada"]


async def test_survives_terminated_connections(pg_url):
    app = nj.App()
    app.queue("q", max_workers=4, timeout=10, poll_interval=60)

    @app.job(queue="q")
    async def work(ctx: nj.JobContext, n: int) -> None:
        await trio.sleep(0.01)

    backend = _backend(pg_url, poll_interval=60)
    async with nj.open_runtime(app, backend=backend) as rt:
        first = await work.enqueue_many([{"n": n} for n in range(20)])
        for job_id in first:
            assert (await rt.wait(job_id, timeout=10)).done
        with psycopg.connect(pg_url, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()[0]
        assert killed >= 2  # the listener and at least one pooled connection
        await trio.sleep(0.5)  # the listener notices and reconnects
        second = await work.enqueue_many([{"n": n} for n in range(20)])
        for job_id in second:
            assert (await rt.wait(job_id, timeout=20)).state is nj.JobState.COMPLETED


async def test_listen_comes_back_after_its_connection_is_terminated(pg_url):
    # Proves the LISTEN connection itself recovers: the job comes from another backend instance
    # (its own pool, as another process), after the worker's listener was terminated and had
    # reconnected, and polling is 60 s -- only a NOTIFY can start it within seconds.
    app = nj.App()
    app.queue("q", max_workers=2, timeout=10, poll_interval=60)
    started: dict[int, float] = {}

    @app.job(queue="q")
    async def work(ctx: nj.JobContext, n: int) -> None:
        started[ctx.id] = trio.current_time()

    schema = pgutil.new_schema(pg_url)
    worker = PostgresBackend(pg_url, schema=schema, poll_interval=60)
    web = PostgresBackend(pg_url, schema=schema, poll_interval=60)
    try:
        async with nj.open_runtime(app, backend=worker, queues=["q"]), nj.open_runtime(app, backend=web, queues=[]) as rt:
            warm = await rt.enqueue("work", {"n": 0})
            assert (await rt.wait(warm, timeout=20)).done
            with psycopg.connect(pg_url, autocommit=True) as admin:
                killed = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid() AND query ILIKE 'LISTEN%%'"
                ).fetchone()[0]
            assert killed >= 1  # the worker's listener (and the web process's)
            await trio.sleep(1.0)  # both reconnect (backoff starts at 0.1 s); the catch-up claim finds nothing
            t0 = trio.current_time()
            job_id = await rt.enqueue("work", {"n": 1})
            assert (await rt.wait(job_id, timeout=20)).state is nj.JobState.COMPLETED
            assert started[job_id] - t0 < 5.0, "the job waited for polling: LISTEN did not come back"
    finally:
        await worker.close()
        await web.close()


def test_the_postgres_backend_does_not_load_the_asyncio_bridge(pg_url):
    # trio-asyncio costs ~0.3 s to import: only an asyncio job kind or an async connection
    # passed to enqueue_tx loads it (and then fixes psycopg up whatever the import order).
    code = (
        "import sys, nursery_jobs.backends.postgres\n"
        "assert 'psycopg' in sys.modules and 'trio_asyncio' not in sys.modules, sorted(sys.modules)\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


async def test_asyncio_handler_runs_through_the_bridge_with_timeout_and_async_psycopg(pg_url):
    import asyncio

    app = nj.App()
    results = []

    @app.job(asyncio=True)
    async def aio_query(ctx: nj.JobContext, n: int) -> None:
        async with await psycopg.AsyncConnection.connect(pg_url) as aconn:
            cur = await aconn.execute("SELECT %s::int * 2", (n,))
            results.append((await cur.fetchone())[0])
        await asyncio.sleep(0)

    @app.job(asyncio=True, timeout=0.2, max_attempts=1)
    async def aio_slow(ctx: nj.JobContext) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            results.append("asyncio task cancelled")
            raise

    async with nj.open_runtime(app, backend=_backend(pg_url)) as rt:
        assert (await rt.wait(await aio_query.enqueue(n=21), timeout=10)).state is nj.JobState.COMPLETED
        receipt = await rt.wait(await aio_slow.enqueue(), timeout=10)
    assert receipt.error == "timed out after 0.2 s"
    assert results == [42, "asyncio task cancelled"]


async def test_a_process_ignores_the_echo_of_its_own_notifications(pg_url):
    # Its own inserts already woke its fetchers in-process; acting on the NOTIFY echo as well
    # made every enqueue cost two claims (measured by the PostgreSQL benchmark).
    claims = []

    class CountingBackend(PostgresBackend):
        async def claim(self, queue, limit):
            result = await super().claim(queue, limit)
            claims.append(len(result.jobs))
            return result

    app = nj.App()
    app.queue("q", max_workers=4, timeout=10, poll_interval=60)

    @app.job(queue="q")
    async def work(ctx: nj.JobContext) -> None:
        pass

    backend = CountingBackend(pg_url, schema=pgutil.new_schema(pg_url), poll_interval=60)
    async with nj.open_runtime(app, backend=backend) as rt:
        await trio.sleep(0.3)
        claims.clear()
        for _ in range(20):
            assert (await rt.wait(await work.enqueue(), timeout=10)).done
            await trio.sleep(0.02)  # let any echo arrive before the next enqueue
    assert sum(claims) == 20
    assert len(claims) <= 22, claims  # one claim per enqueue (a couple of strays at most)


async def test_a_finish_in_another_process_reaches_a_waiter_through_notify(pg_url):
    # Two backend instances have two pools and two listeners: like two processes. The web side
    # polls only every 60 s, so a prompt receipt proves the finish's NOTIFY reached it.
    app = nj.App()
    app.queue("q", max_workers=2, timeout=10, poll_interval=60)

    @app.job(queue="q")
    async def work(ctx: nj.JobContext) -> None:
        await trio.sleep(0.05)

    schema = pgutil.new_schema(pg_url)
    worker_backend = PostgresBackend(pg_url, schema=schema, poll_interval=60)
    web_backend = PostgresBackend(pg_url, schema=schema, poll_interval=60)
    async with nj.open_runtime(app, backend=worker_backend):
        async with nj.open_runtime(app, backend=web_backend, queues=[]) as web:
            for _ in range(3):
                job_id = await work.enqueue()
                t0 = time.perf_counter()
                assert (await web.wait(job_id, timeout=30)).state is nj.JobState.COMPLETED
                assert time.perf_counter() - t0 < 20  # not a 60 s poll


async def test_survives_a_server_restart(private_cluster):
    """Restart the PostgreSQL server under a running runtime: the pool drops its dead
    connections, the listener reconnects, and every job still completes. The server is this
    test's own private cluster (tests/pg_cluster.py): the machine's shared server is never
    restarted by the suite."""
    shared_started = _shared_server_started_at()
    url = private_cluster.url
    schema = "restart"
    migrate(url, schema)
    app = nj.App()
    app.queue("q", max_workers=4, timeout=30, poll_interval=60)  # only LISTEN can wake it quickly

    @app.job(queue="q")
    async def work(ctx: nj.JobContext, n: int) -> None:
        await trio.sleep(0.01)

    backend = PostgresBackend(url, schema=schema, poll_interval=60)
    async with nj.open_runtime(app, backend=backend) as rt:
        first = await work.enqueue_many([{"n": n} for n in range(10)])
        for job_id in first:
            assert (await rt.wait(job_id, timeout=10)).done
        pids_before = set(backend.pool.backend_pids)
        await trio.to_thread.run_sync(private_cluster.restart)
        # The first write after the restart succeeds: the pool finds the connections the server
        # ended (their sockets are readable: the goodbye, or EOF) before sending anything.
        with trio.fail_after(60):
            second = await work.enqueue_many([{"n": n} for n in range(10)])
        t0 = time.perf_counter()
        for job_id in second:
            assert (await rt.wait(job_id, timeout=30)).state is nj.JobState.COMPLETED
        assert time.perf_counter() - t0 < 30  # well under the 60 s poll: LISTEN came back
        # the restart really ended the connections the pool held: it now holds new ones
        assert pids_before and backend.pool.backend_pids and not pids_before & backend.pool.backend_pids
    assert _shared_server_started_at() == shared_started, "the shared server was restarted"


def _shared_server_started_at() -> object:
    try:
        with pgutil.admin_connect() as conn:
            return conn.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
    except psycopg.OperationalError:
        return None  # not reachable: this test does not need it
