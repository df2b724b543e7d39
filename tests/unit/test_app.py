"""Declaration-time and enqueue-time errors: bad input fails at the edge, with a message that
says what was wrong and what to do."""

from __future__ import annotations

import datetime
import math

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.app import EnqueueOptions


def test_default_queue_always_exists():
    app = nj.App()
    assert app.queues["default"] == nj.QueueConfig("default", max_workers=10, timeout=60.0)
    app.queue("default", max_workers=3, timeout=None)
    assert app.queues["default"].max_workers == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_workers": 0}, "max_workers must be an int >= 1, not 0"),
        ({"max_workers": 2.5}, "max_workers must be an int >= 1"),
        ({"max_workers": 1, "timeout": 0}, "timeout must be a finite number of seconds > 0, not 0"),
        ({"max_workers": 1, "timeout": float("inf")}, "finite"),
        ({"max_workers": 1, "timeout": "30"}, "timeout must be a number of seconds"),
    ],
)
def test_bad_queue_settings(kwargs, message):
    with pytest.raises(nj.ConfigError, match=message):
        nj.App().queue("index", **kwargs)


def test_queue_declared_twice_or_after_its_jobs():
    app = nj.App()
    app.queue("index", max_workers=1)
    with pytest.raises(nj.ConfigError, match="declared twice"):
        app.queue("index", max_workers=2)

    @app.job()
    async def uses_default(ctx):
        pass

    with pytest.raises(nj.ConfigError, match="before the jobs that use it"):
        app.queue("default", max_workers=2)


def test_unknown_queue_in_a_job():
    app = nj.App()
    with pytest.raises(nj.ConfigError, match=r"unknown queue 'indx'.*app.queue\('indx'"):

        @app.job(queue="indx")
        async def index(ctx):
            pass


def test_duplicate_job_name():
    app = nj.App()

    @app.job()
    async def send(ctx):
        pass

    with pytest.raises(nj.ConfigError, match="'send' is registered twice; pass name="):

        @app.job(name="send")
        async def send_again(ctx):
            pass


def test_sync_handler_is_refused():
    app = nj.App()
    with pytest.raises(nj.ConfigError, match="must be an `async def`.*run_blocking"):

        @app.job()
        def blocking(ctx):
            pass


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout": -1}, "job timeout must be"),
        ({"max_attempts": 0}, "max_attempts must be an int >= 1"),
        ({"priority": "high"}, "priority must be an int"),
        ({"priority": 2**40}, "32-bit"),
        ({"name": "with\x00nul"}, "job name must be a non-empty printable str"),
        ({"name": "k" * 10_000}, "at most 128 characters"),
        ({"name": "tab\tname"}, "printable"),
        ({"name": ""}, "job name must be"),
        ({"rate": nj.Rate(5, per=1)}, "rate needs a rate_key"),
        ({"rate_key": lambda args: "k"}, "rate_key needs a rate"),
        ({"rate_key": "endpoint", "rate": nj.Rate(5, per=1)}, "rate_key must be a function"),
        ({"rate_key": lambda args: "k", "rate": (5, 60)}, r"rate must be an nj.Rate\(limit, per=seconds\)"),
    ],
)
def test_bad_job_settings(kwargs, message):
    with pytest.raises(nj.ConfigError, match=message):

        @nj.App().job(**kwargs)
        async def job(ctx):
            pass


def _app() -> tuple[nj.App, nj.JobKind]:
    app = nj.App()

    @app.job()
    async def index_doc(ctx: nj.JobContext, doc_id: int, tags: list | None = None) -> None:
        pass

    return app, index_doc


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"doc_id": (1, 2)}, "do not survive a JSON round trip"),
        ({"doc_id": object()}, "not JSON-serialisable"),
        ({"doc_id": float("nan")}, "not JSON-serialisable"),
        ({"doc_id": {1: "a"}}, "do not survive a JSON round trip"),
        ({}, "do not fit job 'index_doc'"),
        ({"doc_id": 1, "extra": 2}, "do not fit job 'index_doc'"),
    ],
)
async def test_bad_args_are_refused_at_enqueue(args, message):
    app, index_doc = _app()
    async with nj.open_runtime(app) as rt:
        with pytest.raises(nj.ArgsError, match=message):
            await rt.enqueue("index_doc", args)
        with pytest.raises(nj.ArgsError, match=message):
            await index_doc.enqueue(**args)
        with pytest.raises(nj.ArgsError):
            await index_doc.enqueue_many([{"doc_id": 1}, args])
        assert (await rt.stats())["default"].queued == 0  # one bad mapping rejects the batch


async def test_unknown_kind_and_bad_options():
    app, index_doc = _app()
    async with nj.open_runtime(app) as rt:
        with pytest.raises(nj.UnknownJob, match="no job kind named 'index'.*register it with @app.job"):
            await rt.enqueue("index", {})
        with pytest.raises(nj.ConfigError, match="delay= or run_at=, not both"):
            await rt.enqueue("index_doc", {"doc_id": 1}, delay=1, run_at=datetime.datetime.now(datetime.timezone.utc))
        with pytest.raises(nj.ConfigError, match="delay must be"):
            await index_doc.options(delay=-1).enqueue(doc_id=1)
        with pytest.raises(nj.ConfigError, match="priority must be an int"):
            await rt.enqueue("index_doc", {"doc_id": 1}, priority=1.5)
        with pytest.raises(nj.ArgsError, match="must be a mapping"):
            await rt.enqueue("index_doc", [1])


async def test_enqueue_outside_a_runtime_says_where_to_call_it():
    _, index_doc = _app()
    with pytest.raises(nj.RuntimeClosed, match="open_runtime"):
        await index_doc.enqueue(doc_id=1)


async def test_kind_is_still_callable_directly_for_unit_tests():
    app = nj.App()

    @app.job()
    async def double(ctx, n: int) -> int:
        return n * 2

    assert await double(None, n=4) == 8


def test_bad_backend_urls():
    for url, message in [
        ("sqlite3:///x", "unsupported backend URL scheme 'sqlite3'"),
        ("memory", "has no scheme"),
        ("memory://somewhere", "takes no location"),
    ]:
        with pytest.raises(nj.ConfigError, match=message):
            nj.open_backend(url)


async def test_snooze_and_discard_validate_their_arguments():
    for bad in (-1, math.nan, math.inf):
        with pytest.raises(nj.ConfigError, match=f"Snooze seconds must be finite and >= 0, not {bad!r}"):
            nj.Snooze(bad)
    with pytest.raises(TypeError):
        nj.Snooze("soon")  # type: ignore[arg-type]
    assert nj.Discard("gone").reason == "gone"
    await trio.lowlevel.checkpoint()


def test_job_id_prints_as_a_plain_number():
    job_id = nj.JobId.of(5, existing=True)
    assert (str(job_id), f"{job_id}", "%s" % job_id, repr(job_id)) == ("5", "5", "5", "JobId(5, existing=True)")
    assert job_id == 5 and job_id.existing and not nj.JobId.of(6).existing
    assert isinstance(job_id, nj.JobId) and not hasattr(job_id, "__dict__")


async def test_unique_key_is_refused_for_enqueue_many():
    app, index_doc = _app()
    async with nj.open_runtime(app):
        with pytest.raises(nj.ConfigError, match="unique_key applies to enqueue"):
            await index_doc.options(unique_key="same").enqueue_many([{"doc_id": 1}])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: nj.RuntimeSettings(retention_interval=0), "retention_interval must be a finite number of seconds >= 1"),
        (lambda: nj.RuntimeSettings(retention_interval=0.5), "retention_interval"),
        (lambda: nj.RuntimeSettings(heartbeat_interval=0), "heartbeat_interval must be"),
        (lambda: nj.RuntimeSettings(rescue_interval=1e-9), "rescue_interval must be"),
        (lambda: nj.App().queue("q", max_workers=10**6), "at most 10,000"),
        (lambda: nj.App().queue("q", max_workers=2, poll_interval=1e-6), "poll_interval must be at least 0.01"),
    ],
)
def test_settings_that_would_spin_or_degrade_are_refused(make, message):
    with pytest.raises(nj.ConfigError, match=message):
        make()


async def test_queues_given_as_a_str_is_refused():
    app = nj.App()
    app.queue("index", max_workers=1)
    with pytest.raises(nj.ConfigError, match=r"a str is read letter by letter: did you mean \['index'\]"):
        async with nj.open_runtime(app, queues="index"):  # type: ignore[arg-type]
            pass


def test_subscribe_declarations_are_checked():
    app = nj.App()

    @app.job()
    async def index(ctx, doc_id: int) -> None:
        pass

    assert app.subscribe("doc.written")(index) is index
    assert [s.kind for s in app.subscriptions["doc.written"]] == [index]
    with pytest.raises(nj.ConfigError, match="twice"):
        app.subscribe("doc.written")(index)
    with pytest.raises(nj.ConfigError, match="topic name"):
        app.subscribe("")
    with pytest.raises(nj.ConfigError, match="filter must be a function"):
        app.subscribe("t", filter=True)  # type: ignore[arg-type]
    with pytest.raises(nj.ConfigError, match="above @app.job"):

        @app.subscribe("t")  # type: ignore[arg-type]
        async def plain(ctx) -> None:
            pass

    with pytest.raises(nj.ConfigError, match="not a kind of this app"):
        nj.App().subscribe("t")(index)


def test_the_router_drops_only_the_job_it_cannot_make(caplog):
    from nursery_jobs.backends import OutboxEvent
    from nursery_jobs.services.relay import Router

    app = nj.App()

    @app.subscribe("t")
    @app.job()
    async def needs_id(ctx, doc_id: int) -> None:
        pass

    @app.subscribe("t", args=lambda p: {"text": str(p)})
    @app.job()
    async def takes_any(ctx, text: str) -> None:
        pass

    router = Router(app.subscriptions, lambda: 0.0)
    assert router.topics == ["t"]
    made = router([OutboxEvent(1, "t", '{"doc_id": 1}'), OutboxEvent(2, "t", "[1]"), OutboxEvent(3, "t", "not json")])
    assert [[j.kind for j in jobs] for jobs in made] == [["needs_id", "takes_any"], ["takes_any"], []]
    reasons = [(r.outbox_event, r.kind) for r in caplog.records if getattr(r, "event", None) == "outbox_job_dropped"]
    assert reasons == [(2, "needs_id"), (3, "needs_id"), (3, "takes_any")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0,), "limit"),
        ((2**31,), "limit"),
        ((True,), "limit"),
        ((1.5,), "limit"),
        ((5, 0), "per"),
        ((5, -1.0), "per"),
        ((5, float("inf")), "per"),
        ((5, float("nan")), "per"),
        ((5, "60"), "per"),
        ((5, 10**400), "per"),
    ],
)
def test_a_bad_rate_is_a_config_error_naming_the_field(args, message):
    with pytest.raises(nj.ConfigError, match=f"Rate's {message}"):
        nj.Rate(args[0], per=args[1] if len(args) > 1 else 1)


def test_a_rate_keeps_its_window_as_float_seconds():
    assert nj.Rate(100, per=60) == nj.Rate(limit=100, per=60.0)
    assert isinstance(nj.Rate(1, per=1).per, float)


def test_a_job_with_a_rate_stores_its_key_and_rate_with_each_job():
    app = nj.App()

    @app.job(rate=nj.Rate(3, per=10), rate_key=lambda args: args.get("host"), concurrency_key=lambda args: "c")
    async def fetch(ctx, host=None):
        pass

    one = fetch.new_job({"host": "a"}, EnqueueOptions(), 0.0)
    none = fetch.new_job({"host": None}, EnqueueOptions(), 0.0)
    many = fetch.new_jobs([{"host": "b"}, {}], EnqueueOptions(), 0.0)
    assert (one.rate_key, one.rate_limit, one.rate_per, one.concurrency_key) == ("a", 3, 10.0, "c")
    assert (none.rate_key, none.rate_limit, none.rate_per) == (None, None, None)  # no limit for this job
    assert [(j.rate_key, j.rate_limit) for j in many] == [("b", 3), (None, None)]


@pytest.mark.parametrize(
    "url, meant",
    [
        ("memory", "memory://"),
        (":memory:", "memory://"),
        ("jobs.db", "sqlite:///jobs.db"),
        ("/var/lib/service/jobs.sqlite3", "sqlite:////var/lib/service/jobs.sqlite3"),
        ("data/jobs", "sqlite:///data/jobs"),
        ("sqlite:/jobs.db", "sqlite:///jobs.db"),
        ("postgresql:app@db.internal/app", "postgresql://app@db.internal/app"),
        ("app:pw@db.internal:5432/app", "postgresql://app:***@db.internal:5432/app"),
        ("db.internal:5432/app", "postgresql://db.internal:5432/app"),
        ("host=db.internal port=5432 dbname=app user=root password='a b'", "postgresql://root:***@db.internal:5432/app"),
    ],
)
def test_a_url_without_a_scheme_suggests_the_one_it_looks_like(url: str, meant: str) -> None:
    with pytest.raises(nj.ConfigError) as refused:
        nj.open_backend(url)
    message = str(refused.value)
    assert f"has no scheme; did you mean {meant!r}? (supported: 'memory://', 'postgres://'" in message, message
    assert "pw" not in message and "a b" not in message and "a%20b" not in message
