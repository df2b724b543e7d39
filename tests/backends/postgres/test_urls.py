"""The PostgreSQL URL: what is taken out of it, what libpq gets, what `backend.url` shows, and
that a password in it never shows up anywhere (messages, reprs, `backend.url`, logs).

Server-free tests parse only; the others connect to the test server through each URL form
libpq accepts (TCP, the default socket, a named socket directory, several hosts)."""

from __future__ import annotations

import logging
import os
import shlex
import traceback
from typing import Any

import psycopg
import pytest
import trio

import nursery_jobs as nj
import nursery_jobs.infra.pg as pg
from nursery_jobs.backends.postgres import PostgresBackend, parse_postgres_url
from nursery_jobs.cli import main as cli_main
from tests import pgutil

SECRET = "S3CRETpw"
"""Every password in these tests contains it: it must appear nowhere the library writes."""

SOCKET_DIR = "/var/run/postgresql"


def _all_text(exc: BaseException) -> str:
    """Everything a traceback of `exc` would print: its message, and any chained cause shown."""
    return "".join(traceback.format_exception(exc)) + repr(exc)


def _chain_text(exc: BaseException) -> str:
    """Everything any error reachable from `exc` shows, hidden or not: the formatted traceback,
    and the str, repr, args and notes of every error in its chain (`__cause__`, `__context__`,
    even when suppressed, and a group's members), which a logging or error-reporting tool may
    walk on its own."""
    texts = ["".join(traceback.format_exception(exc))]
    pending, seen = [exc], set()
    while pending:
        error = pending.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        texts += [str(error), repr(error), *map(repr, error.args), *map(str, getattr(error, "__notes__", []))]
        pending += [e for e in (error.__cause__, error.__context__) if e is not None]
        pending += list(getattr(error, "exceptions", ()))
    return "\n".join(texts)


def _local_server_only() -> None:
    """URL forms that point at this machine's server by socket or by address need it to be the
    test server: skip them when the tests run against another one (NJ_TEST_PG_URL)."""
    if "NJ_TEST_PG_URL" in os.environ:
        pytest.skip("the test server is not the local one (NJ_TEST_PG_URL is set)")


def _db(pg_url: str) -> str:
    return pg_url.rpartition("/")[2]


# -- only the library's options leave the URL; the rest reaches libpq as written --


@pytest.mark.parametrize(
    "url",
    [
        "postgresql:///test?host=127.0.0.1",
        "postgresql:///test",
        "postgresql:///test?host=/var/run/postgresql",
        "postgresql://%2Fvar%2Frun%2Fpostgresql/test",
        "postgresql://127.0.0.1:5432,127.0.0.1:5433/test",
        "postgresql://u@[::1]:5432/test?sslmode=disable",
        "postgres://u@h/test?application_name=a+b&options=-c%20search_path%3Dx",
    ],
)
def test_a_url_without_our_options_reaches_libpq_byte_for_byte(url):
    assert parse_postgres_url(url)[0] == url


def test_our_options_are_taken_out_and_the_rest_kept_in_order():
    conninfo, opts = parse_postgres_url(
        "postgresql://u@h/db?sslmode=disable&schema=jobs&application_name=a+b&pool_size=4"
        "&options=-c%20x%3Dy&sch%65ma_x=1&poll_interval=0.5"
    )
    assert conninfo == "postgresql://u@h/db?sslmode=disable&application_name=a+b&options=-c%20x%3Dy&sch%65ma_x=1"
    assert opts == {"schema": "jobs", "pool_size": 4, "poll_interval": 0.5}
    # a URL of nothing but our options loses its "?" too
    assert parse_postgres_url("postgresql:///db?schema=jobs")[0] == "postgresql:///db"


@pytest.mark.parametrize(
    "query, name",
    [
        ("schema=x&schema=y", "schema"),
        ("pool_size=4&sslmode=disable&pool_size=4", "pool_size"),
        ("sch%65ma=x&schema=y", "schema"),  # libpq decodes keys: the same key twice
        ("sslmode=disable&sslmode=require", "sslmode"),
        ("host=/tmp&host=127.0.0.1", "host"),
    ],
)
def test_an_option_given_twice_is_refused_naming_it(query, name):
    with pytest.raises(nj.ConfigError, match=rf"\?{name}= more than once"):
        parse_postgres_url(f"postgresql://h/db?{query}")
    with pytest.raises(nj.ConfigError, match=rf"\?{name}= more than once"):
        nj.open_backend(f"postgresql://h/db?{query}")


# -- backend.url: which database, never the password --


@pytest.mark.parametrize(
    "url, shown",
    [
        (f"postgresql://root:{SECRET}@db.internal:6432/app?schema=jobs&sslmode=require",
         "postgresql://root@db.internal:6432/app?schema=jobs"),
        (f"postgresql://root@db.internal/app?password={SECRET}", "postgresql://root@db.internal/app?schema=nursery_jobs"),
        ("postgresql:///test?host=127.0.0.1", "postgresql://127.0.0.1/test?schema=nursery_jobs"),
        ("postgresql:///test", "postgresql:///test?schema=nursery_jobs"),
        ("postgresql:///test?host=/var/run/postgresql", "postgresql:///test?host=/var/run/postgresql&schema=nursery_jobs"),
        ("postgresql://%2Fvar%2Frun%2Fpostgresql:5433/test",
         "postgresql:///test?host=/var/run/postgresql&port=5433&schema=nursery_jobs"),
        ("postgresql://a:5432,b:5433/test", "postgresql://a:5432,b:5433/test?schema=nursery_jobs"),
        ("postgresql://a,b:5433/test?port=5432,5433", "postgresql://a:5432,b:5433/test?schema=nursery_jobs"),
        ("postgresql://[::1]:5432/test", "postgresql://[::1]:5432/test?schema=nursery_jobs"),
        ("postgresql://h/db?dbname=other&user=u%20x", "postgresql://u%20x@h/other?schema=nursery_jobs"),
        (f"host=db.internal port=5432 dbname=app user=root password={SECRET}",
         "postgresql://root@db.internal:5432/app?schema=nursery_jobs"),
    ],
)  # fmt: skip
def test_backend_url_names_the_database_and_never_the_password(url, shown):
    backend = nj.open_backend(url) if url.startswith("postgres") else PostgresBackend(url)
    assert backend.url == shown
    assert repr(backend) == f"<PostgresBackend {shown}>"


# -- statement_timeout: never sent as 0 (which the server reads as no limit at all) --


@pytest.mark.parametrize("seconds", [0.0009, 0.0001, 1e-9, 3_000_000])
def test_a_statement_timeout_the_server_cannot_honour_is_refused(seconds):
    with pytest.raises(nj.ConfigError, match=r"statement_timeout.*at least 0\.001 s"):
        PostgresBackend("postgresql://127.0.0.1/db", statement_timeout=seconds)
    with pytest.raises(nj.ConfigError, match=r"\?statement_timeout= in the PostgreSQL URL.*at least 0\.001 s"):
        nj.open_backend(f"postgresql://127.0.0.1/db?statement_timeout={seconds!r}")


@pytest.mark.parametrize(
    "seconds, ms", [(0.001, 1), (0.0015, 2), (0.0004, 1), (1.1, 1100), (7, 7000), (2_147_483, 2_147_483_000)]
)
def test_no_statement_timeout_is_sent_as_zero(seconds, ms):
    # 0.0004 s would pass a PgPool made directly: it still goes out as 1 ms, never as 0.
    options = pg.connection_params("postgresql://127.0.0.1/db", statement_timeout=seconds)["options"]
    assert options == f"-c statement_timeout={ms}"


def test_the_smallest_statement_timeout_is_accepted():
    assert PostgresBackend("postgresql://127.0.0.1/db", statement_timeout=0.001).statement_timeout == 0.001
    assert parse_postgres_url("postgresql://127.0.0.1/db?statement_timeout=0.001")[1]["statement_timeout"] == 0.001


# -- passwords: never in a message, a repr, backend.url or a log line --


_BAD_FOR_LIBPQ = [
    f"postgresql://root:S3CR%zzETpw{SECRET}@127.0.0.1/test",  # libpq quotes the bad token
    f"postgresql://root:{SECRET}%2D%zz@127.0.0.1/test",  # ... percent-encoded parts and all
    f"postgresql://root@127.0.0.1/test?password={SECRET}%zz",
    f"postgresql://root@127.0.0.1/test?pass%77ord={SECRET}%00",
    f"postgresql://root:{SECRET}@[::1/test",  # libpq quotes the whole URL
    f"postgresql://root:{SECRET}@127.0.0.1:5432/test?bogus=1",
    f"postgresql://root:{SECRET}@127.0.0.1:5432/test?sslmode",
    f"postgresql://root:{SECRET}/x@127.0.0.1/test",  # a raw '/' would make it a port
    f"postgresql://root:{SECRET}@x@127.0.0.1/test",  # a raw '@' would make part of it a host
    f"host=127.0.0.1 password='{SECRET}",
    f"host=127.0.0.1 password={SECRET} bogus=1",
]
"""URLs and conninfo strings libpq cannot parse (or, for a raw '/' or '@', would misread)."""

_BAD_URLS = [
    *[u for u in _BAD_FOR_LIBPQ if u.startswith("postgresql://")],
    f"postgresql://root:{SECRET}@127.0.0.1/test?pool_size=abc",
    f"postgresql://root:{SECRET}@127.0.0.1/test?poll_interval=soon",
    f"postgresql://root:{SECRET}@127.0.0.1/test?statement_timeout=0",
    f"postgresql://root:{SECRET}@127.0.0.1/test?schema=x&schema=y",
    f"postgresql://root:{SECRET}@127.0.0.1/test?schema=Bad-Name",
    f"mysql://root:{SECRET}@127.0.0.1/test",
    f"root:{SECRET}@127.0.0.1/test",
]
"""Bad backend URLs, each with a password."""


@pytest.mark.parametrize("url", _BAD_URLS)
def test_a_bad_url_is_refused_without_its_password(url):
    with pytest.raises(nj.ConfigError) as refused:
        nj.open_backend(url)
    assert SECRET not in _all_text(refused.value)


@pytest.mark.parametrize("conninfo", _BAD_FOR_LIBPQ)
def test_a_bad_conninfo_is_refused_at_construction_without_its_password(conninfo):
    with pytest.raises(nj.ConfigError, match="bad PostgreSQL URL") as refused:
        PostgresBackend(conninfo)
    assert SECRET not in _all_text(refused.value)


_PASSWORDS = ["Zq", "Zq@X/y", "Zq:X/w", "Z%zzq", "Z%41q", "ZqSECRETpw"]
"""Short ones, ones with '@', '/', ':' and '%' inside, and a long one: letters that occur in no
message, so any occurrence of them is the password."""

_SHAPES = [
    "postgresql://root:{pw}@127.0.0.1:1/test",  # parsed, or refused for a raw '@' or '/'; no server there
    "postgresql://root:{pw}%zz@127.0.0.1/test",  # libpq quotes the bad token
    "postgresql://root:{pw}@[::1/test",  # libpq quotes the whole URL
    "postgresql://root@127.0.0.1:1/test?password={pw}",
    "host=127.0.0.1 port=1 user=root password='{pw}'",
    "host=127.0.0.1 port=1 user=root password='{pw}",  # unterminated: libpq refuses it
]


@pytest.mark.parametrize("shape", _SHAPES)
@pytest.mark.parametrize("password", _PASSWORDS)
async def test_no_error_in_the_chain_of_a_refused_or_failed_url_shows_the_password(shape, password):
    url = shape.format(pw=password)
    with pytest.raises((nj.ConfigError, nj.BackendUnavailable)) as refused:
        with trio.fail_after(30):
            async with nj.open_runtime(nj.App(), backend=PostgresBackend(url) if shape.startswith("host=") else url):
                pass
    shown = _chain_text(refused.value)
    for form in {password, password.replace("%41", "A")}:
        assert form not in shown, shown


@pytest.mark.parametrize(
    "url, says",
    [
        ("postgresql://root:p@ss/word@127.0.0.1/db",
         "bad PostgreSQL URL: an '@' after the user and password; percent-encode '@' and '/' in a password "
         "or database name (%40, %2F)"),
        ("postgresql://root:p@127.0.0.1/db?pool_size=x", "?pool_size= in the PostgreSQL URL must be an int >= 2, not 'x'"),
        ("postgresql://root:a@[::1/db",
         'bad PostgreSQL URL: end of string reached when looking for matching "]" in IPv6 host address in URI: '
         '"postgresql://root:***@[::1/db"'),
        ("postgresql://root:e%zz@127.0.0.1/db", 'bad PostgreSQL URL: invalid percent-encoded token: "***"'),
    ],
)  # fmt: skip
def test_a_short_password_is_redacted_where_it_stands_and_the_message_reads_as_written(capsys, url, says):
    for argv in (["worker", "tests/processes/cli_app.py:app", "--backend", url], ["migrate", "--database-url", url]):
        assert cli_main(argv) == 2
        assert capsys.readouterr().err == f"nursery-jobs {argv[0]}: {says}\n"


async def test_no_password_in_anything_a_running_backend_shows(pg_url, caplog):
    _local_server_only()
    caplog.set_level(logging.DEBUG)
    schema = pgutil.new_schema(pg_url)
    # trust auth: the server ignores the password, so the URL connects and works
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:5432/{_db(pg_url)}?schema={schema}&sslmode=disable"
    app = nj.App()

    @app.job()
    async def noop(ctx: nj.JobContext) -> None:
        pass

    with trio.fail_after(30):
        async with nj.open_runtime(app, backend=url) as rt:
            receipt = await rt.wait(await noop.enqueue(), timeout=10)
            assert receipt.state is nj.JobState.COMPLETED
            shown = [rt.backend.url, repr(rt.backend), repr(rt)]
            with pytest.raises(nj.JobNotFound) as missing:
                await rt.get_job(10**12)
            shown.append(_all_text(missing.value))
    assert rt.backend.url == f"postgresql://postgres@127.0.0.1:5432/{_db(pg_url)}?schema={schema}"
    for text in [*shown, caplog.text]:
        assert SECRET not in text


async def test_no_password_in_a_connection_failure(caplog):
    caplog.set_level(logging.DEBUG)
    with trio.fail_after(30):
        with pytest.raises(nj.BackendUnavailable) as failed:
            async with nj.open_runtime(nj.App(), backend=f"postgresql://root:{SECRET}@127.0.0.1:1/nothing"):
                pass
    assert "cannot connect to PostgreSQL at postgresql://root@127.0.0.1:1/nothing?schema=nursery_jobs" in str(failed.value)
    assert SECRET not in _all_text(failed.value) + caplog.text


# -- the migrate hint: the URL as given, password redacted, ready to copy --


async def test_the_migrate_hint_carries_the_url_it_was_given(pg_url, capsys):
    _local_server_only()
    db = _db(pg_url)
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:5432/{db}?application_name=nj%20hint&schema=hint_made&pool_size=4"
    app = nj.App()
    with trio.fail_after(30):
        with pytest.raises(nj.ConfigError) as missing:
            async with nj.open_runtime(app, backend=url, queues=[]):
                pass
    message = str(missing.value)
    assert SECRET not in _all_text(missing.value)
    command = shlex.split(message.partition("`")[2].partition("`")[0])
    assert command == [
        "nursery-jobs", "migrate",
        "--database-url", f"postgresql://postgres:***@127.0.0.1:5432/{db}?application_name=nj%20hint",
        "--schema", "hint_made",
    ]  # fmt: skip
    assert message.endswith("first (with the password in place of ***)")
    # Copied, with the password put back, it migrates the schema the runtime wanted.
    command[3] = command[3].replace("***", SECRET)
    assert cli_main(command[1:]) == 0
    assert "schema 'hint_made': applied" in capsys.readouterr().out
    with trio.fail_after(30):
        async with nj.open_runtime(app, backend=url, queues=[]) as rt:
            assert rt.backend.url == f"postgresql://postgres@127.0.0.1:5432/{db}?schema=hint_made"


async def test_the_migrate_hint_without_a_password_is_the_url_itself(pg_url):
    url = f"{pg_url}?schema=never_migrated_hint"
    with trio.fail_after(30):
        with pytest.raises(nj.ConfigError) as missing:
            async with nj.open_runtime(nj.App(), backend=url, queues=[]):
                pass
    assert f"`nursery-jobs migrate --database-url {pg_url} --schema never_migrated_hint` first" in str(missing.value)
    assert str(missing.value).endswith("` first")


# -- every URL form libpq accepts really connects --


def _forms(db: str) -> list[tuple[str, str]]:
    """(URL, what backend.url shows for it) for the test database, one per form."""
    return [
        (f"postgresql:///{db}?host=127.0.0.1&port=5432&user=postgres",
         f"postgresql://postgres@127.0.0.1:5432/{db}"),
        (f"postgresql:///{db}?user=postgres",  # libpq's default: the local socket
         f"postgresql://postgres@/{db}"),
        (f"postgresql:///{db}?host={SOCKET_DIR}&user=postgres",
         f"postgresql://postgres@/{db}?host={SOCKET_DIR}"),
        (f"postgresql://postgres@%2Fvar%2Frun%2Fpostgresql:5432/{db}",
         f"postgresql://postgres@/{db}?host={SOCKET_DIR}&port=5432"),
        (f"postgresql://postgres@127.0.0.1:5432,127.0.0.1:5432/{db}",
         f"postgresql://postgres@127.0.0.1:5432,127.0.0.1:5432/{db}"),
        # the first host refuses: libpq moves on to the second
        (f"postgresql://postgres@127.0.0.1:1,127.0.0.1:5432/{db}?connect_timeout=5",
         f"postgresql://postgres@127.0.0.1:1,127.0.0.1:5432/{db}"),
        (f"postgres://postgres@127.0.0.1/{db}?application_name=nj%20urls+x",
         f"postgresql://postgres@127.0.0.1/{db}"),
    ]  # fmt: skip


@pytest.mark.parametrize("form", range(7))
async def test_each_libpq_url_form_connects_and_works(pg_url, form):
    _local_server_only()
    assert os.path.exists(f"{SOCKET_DIR}/.s.PGSQL.5432"), "the local server's socket is missing"
    db = _db(pg_url)
    url, shown = _forms(db)[form]
    schema = pgutil.new_schema(pg_url)
    sep = "&" if "?" in url else "?"
    backend = nj.open_backend(f"{url}{sep}schema={schema}&pool_size=6&poll_interval=60")
    assert isinstance(backend, PostgresBackend)
    assert backend.url == f"{shown}{'&' if '?' in shown else '?'}schema={schema}"
    app = nj.App()
    app.queue("q", max_workers=1)

    @app.job(queue="q")
    async def noop(ctx: nj.JobContext) -> None:
        pass

    async def whoami(conn: pg.TrioConnection) -> tuple[str, str]:
        cur = await conn.execute("SELECT current_database(), current_setting('application_name')")
        row = await cur.fetchone()
        assert row is not None
        return row[0], row[1]

    with trio.fail_after(30):
        async with nj.open_runtime(app, backend=backend, queues=["q"]) as rt:
            # the job's wake-up comes through the LISTEN connection (poll_interval=60)
            receipt = await rt.wait(await noop.enqueue(), timeout=10)
            assert receipt.state is nj.JobState.COMPLETED
            database, application = await backend.pool.run(whoami)
        await backend.close()
    assert database == db
    if "application_name" in url:
        assert application == "nj urls+x"  # libpq's decoding: %20 is a space, "+" is a "+"


# -- log lines: what libpq says about a connection is redacted before it is logged --


def _quoting_connect(real: Any) -> Any:
    """`pg.connect` that fails once, quoting the conninfo it was given (as libpq does for one
    it cannot read), then connects."""
    failed: list[str] = []

    async def connect(conninfo: str = "", **kwargs: Any) -> pg.TrioConnection:
        if not failed:
            failed.append(conninfo)
            raise psycopg.OperationalError(f'could not use "{conninfo}"')
        return await real(conninfo, **kwargs)

    return connect


async def test_the_listeners_log_lines_carry_no_password(pg_url, caplog, monkeypatch):
    _local_server_only()
    caplog.set_level(logging.DEBUG)
    monkeypatch.setattr(pg.listener, "connect", _quoting_connect(pg.connect))
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:5432/{_db(pg_url)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(pg.listen, url, ["nj_urls"], lambda *a: None, lambda: None)
            while "LISTEN connection re-established" not in caplog.text:
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    assert "LISTEN connection lost (could not use" in caplog.text
    assert SECRET not in caplog.text


@pytest.mark.parametrize("password", [SECRET, "Zq"])
async def test_a_retried_calls_log_lines_and_errors_carry_no_password(pg_url, caplog, password):
    _local_server_only()
    caplog.set_level(logging.DEBUG)
    url = f"postgresql://postgres:{password}@127.0.0.1:5432/{_db(pg_url)}"
    backend = PostgresBackend(url, schema=pgutil.new_schema(pg_url), outage_timeout=5)
    backend.check_budget(1)
    calls: list[int] = []

    async def lost_once(conn: pg.TrioConnection) -> str:
        calls.append(1)
        if len(calls) == 1:
            try:
                raise OSError(f"the socket to {url} was reset")
            except OSError:  # the driver's error, raised while handling the socket's: its context
                raise psycopg.OperationalError(f"connection to {url} lost")
        return "answered"

    with trio.fail_after(30):
        await backend.open()
        try:
            assert await backend._run(lost_once) == "answered"
            with pytest.raises(nj.BackendUnavailable) as failed:
                calls.clear()
                await backend._run(lost_once, retry=False)
        finally:
            await backend.close()
    assert "PostgreSQL call failed (connection to postgresql://postgres:***@127.0.0.1" in caplog.text
    assert password not in caplog.text + _chain_text(failed.value)


def test_the_librarys_options_are_keyword_arguments_of_the_backend():
    with pytest.raises(nj.ConfigError, match=r"\?schema=, \?pool_size= in the conninfo: PostgresBackend takes them as keyword"):
        PostgresBackend(f"postgresql://root:{SECRET}@h/db?schema=jobs&pool_size=4")
