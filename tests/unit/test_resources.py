"""`@app.resource`: opened before any queue starts, closed after the last attempt has ended.

On the memory backend under the autojump MockClock, so the order of every open, use and close
relative to the grace and the unwinding is checked at exact virtual instants.
"""

from __future__ import annotations

import logging
from typing import AsyncIterator

import pytest
import trio
import trio.testing

import nursery_jobs as nj


class Client:
    """Stands for an HTTP client: refuses to be used once closed."""

    def __init__(self, name: str, events: list) -> None:
        self.name = name
        self.events = events
        self.closed = False

    def use(self, who: str) -> None:
        assert not self.closed, f"{who} used {self.name} after it was closed"
        self.events.append((f"use {self.name}", who, trio.current_time()))


def _app(events: list) -> tuple[nj.App, nj.Resource[Client], nj.Resource[Client]]:
    app = nj.App()

    @app.resource
    async def http() -> AsyncIterator[Client]:
        client = Client("http", events)
        events.append(("open http", None, trio.current_time()))
        try:
            yield client
        finally:
            client.closed = True
            events.append(("close http", None, trio.current_time()))

    @app.resource
    async def db() -> AsyncIterator[Client]:
        events.append(("open db", None, trio.current_time()))
        client = Client("db", events)
        yield client
        client.closed = True
        events.append(("close db", None, trio.current_time()))

    @app.job(timeout=None)
    async def work(ctx: nj.JobContext, seconds: float) -> None:
        events.append(("start", ctx.id, trio.current_time()))
        ctx.resources.http.use(f"job {ctx.id}")
        try:
            await trio.sleep(seconds)
            ctx.resources["db"].use(f"job {ctx.id}")
            events.append(("done", ctx.id, trio.current_time()))
        finally:
            if ctx.cancel_reason == "shutdown":
                # Cleanup during the unwinding still has the resources.
                with trio.move_on_after(1, shield=True):
                    await trio.sleep(0.5)
                    ctx.resources[db].use(f"cleanup of job {ctx.id}")

    return app, http, db


def _names(events: list) -> list[str]:
    return [name for name, _, _ in events]


async def test_resources_open_in_order_before_the_queues_and_close_in_reverse_after_the_grace(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list = []
    app, _, _ = _app(events)
    async with nj.open_runtime(app, grace=10) as rt:
        assert _names(events) == ["open http", "open db"]
        await rt.enqueue("work", {"seconds": 8})
        await trio.sleep(1)
        t_shutdown = trio.current_time()
    # The job ran through the grace (8 s from t=0) with its resources open, then they closed.
    assert _names(events) == ["open http", "open db", "start", "use http", "use db", "done", "close db", "close http"]
    done_at = events[5][2]
    assert done_at == 8 > t_shutdown
    assert events[6][2] == events[7][2] == done_at


async def test_an_attempt_unwinding_after_the_grace_still_sees_open_resources(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list = []
    app, _, _ = _app(events)
    async with nj.open_runtime(app, grace=2) as rt:
        job_id = await rt.enqueue("work", {"seconds": 3600})
        await trio.sleep(1)
    assert rt.interrupted == [job_id]
    assert _names(events) == ["open http", "open db", "start", "use http", "use db", "close db", "close http"]
    cleanup = events[4]
    assert cleanup[1] == f"cleanup of job {job_id}"
    # Grace from t=1 to t=3, the cleanup's 0.5 s of unwinding, and only then the closes.
    assert cleanup[2] == 3.5
    assert events[5][2] == events[6][2] == 3.5


async def test_typed_access_and_the_mapping_view(autojump_clock: trio.testing.MockClock) -> None:
    events: list = []
    app, http, db = _app(events)
    seen: dict = {}

    @app.job()
    async def look(ctx: nj.JobContext) -> None:
        client: Client = ctx.resources[http]  # typed: Resource[Client] gives a Client
        seen["same"] = client is ctx.resources.http is ctx.resources["http"]
        seen["names"] = list(ctx.resources)
        seen["repr"] = repr(ctx.resources)
        with pytest.raises(AttributeError, match="no resource named 'mail' is open"):
            ctx.resources.mail
        with pytest.raises(KeyError, match="no resource named 'mail' is open"):
            ctx.resources["mail"]
        with pytest.raises(AttributeError, match="read-only"):
            ctx.resources.http = None

    async with nj.open_runtime(app) as rt:
        receipt = await rt.wait(await look.enqueue(), timeout=5)
    assert receipt.state is nj.JobState.COMPLETED, receipt
    assert seen == {"same": True, "names": ["http", "db"], "repr": "<Resources ['db', 'http']>"}
    assert repr(http) == "<Resource 'http'>" and app.resources == {"http": http, "db": db}


async def test_a_resource_that_fails_to_open_is_a_start_up_error_naming_it_and_nothing_is_claimed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events: list = []
    app, _, _ = _app(events)

    @app.resource
    async def mail() -> AsyncIterator[None]:
        raise OSError("connection refused")
        yield

    backend = nj.MemoryBackend()
    async with nj.open_runtime(app, backend=backend, queues=[]) as rt:  # enqueue-only: opens no resource
        job_id = await rt.enqueue("work", {"seconds": 0})
    with pytest.raises(nj.ResourceError, match=r"resource 'mail' failed to open: OSError: connection refused") as info:
        async with nj.open_runtime(app, backend=backend):
            raise AssertionError("not reached")
    assert isinstance(info.value.__cause__, OSError)
    assert _names(events) == ["open http", "open db", "close db", "close http"]
    job = await backend.get_job(job_id)
    assert job.state is nj.JobState.AVAILABLE and job.attempt == 0


async def test_a_resource_that_hangs_opening_fails_at_resource_bound(autojump_clock: trio.testing.MockClock) -> None:
    app = nj.App()

    @app.resource
    async def slow() -> AsyncIterator[None]:
        await trio.sleep(3600)
        yield

    t0 = trio.current_time()
    with pytest.raises(nj.ResourceError, match=r"resource 'slow' did not open within resource_bound \(2 s\)"):
        async with nj.open_runtime(app, settings=nj.RuntimeSettings(resource_bound=2)):
            raise AssertionError("not reached")
    assert trio.current_time() - t0 == 2


async def test_a_resource_that_does_not_yield_is_a_start_up_error() -> None:
    app = nj.App()

    @app.resource
    async def empty() -> AsyncIterator[None]:
        if False:
            yield

    with pytest.raises(nj.ResourceError, match=r"resource 'empty' failed to open: RuntimeError: generator didn't yield"):
        async with nj.open_runtime(app):
            raise AssertionError("not reached")


def _closing_app(events: list, failing: str) -> nj.App:
    app = nj.App()

    @app.resource
    async def first() -> AsyncIterator[str]:
        yield "first"
        events.append(("close first", None, trio.current_time()))

    @app.resource
    async def broken() -> AsyncIterator[str]:
        yield "broken"
        if failing == "raise":
            raise OSError("flush failed")
        await trio.sleep(3600)  # hangs

    @app.resource
    async def last() -> AsyncIterator[str]:
        yield "last"
        events.append(("close last", None, trio.current_time()))

    return app


@pytest.mark.parametrize("failing", ["raise", "hang"])
async def test_a_close_that_fails_or_hangs_is_reported_and_the_others_still_close(
    failing: str, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    events: list = []
    app = _closing_app(events, failing)
    expected = (
        r"resource 'broken' failed to close: OSError: flush failed"
        if failing == "raise"
        else r"resource 'broken' did not close within resource_bound \(3 s\): its close was cancelled"
    )
    with caplog.at_level(logging.ERROR, logger="nursery_jobs"):
        with pytest.raises(nj.ResourceError, match=expected):
            async with nj.open_runtime(app, settings=nj.RuntimeSettings(resource_bound=3)):
                t0 = trio.current_time()
    assert _names(events) == ["close last", "close first"]
    assert events[1][2] - t0 == (0 if failing == "raise" else 3)
    assert [r.getMessage() for r in caplog.records if "broken" in r.getMessage()] == [
        expected.replace("\\", "") + "; the other resources still close"
    ]


async def test_a_close_failure_does_not_hide_the_bodys_own_error(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    events: list = []
    app = _closing_app(events, "raise")
    with caplog.at_level(logging.ERROR, logger="nursery_jobs"):
        with pytest.raises(BaseExceptionGroup) as info:  # the body runs inside the runtime's task tree
            async with nj.open_runtime(app):
                raise KeyError("the body's")
    assert info.group_contains(KeyError, match="the body's")
    assert not info.group_contains(nj.ResourceError)
    assert _names(events) == ["close last", "close first"]
    assert "resource 'broken' failed to close: OSError: flush failed" in caplog.text


async def test_tests_replace_resources_by_name(autojump_clock: trio.testing.MockClock) -> None:
    events: list = []
    app, http, _ = _app(events)
    fake = Client("fake", events)
    async with nj.open_runtime(app, resources={"http": fake}) as rt:
        receipt = await rt.wait(await rt.enqueue("work", {"seconds": 1}), timeout=5)
    assert receipt.state is nj.JobState.COMPLETED
    assert _names(events) == ["open db", "start", "use fake", "use db", "done", "close db"]  # http never opened


@pytest.mark.parametrize(
    "resources,match",
    [
        ({"mail": object()}, r"resources \['mail'\] are not declared in the app \(declared: \['db', 'http'\]\)"),
        ([("http", object())], "resources must be a mapping of resource name to value, not list"),
    ],
)
async def test_replacing_an_undeclared_resource_is_a_config_error(resources: object, match: str) -> None:
    app, _, _ = _app([])
    with pytest.raises(nj.ConfigError, match=match):
        async with nj.open_runtime(app, resources=resources):  # type: ignore[arg-type]
            raise AssertionError("not reached")


def test_declaration_errors_are_config_errors_naming_the_fix() -> None:
    app = nj.App()

    async def plain() -> None: ...

    with pytest.raises(nj.ConfigError, match="must be an async generator function"):
        app.resource(plain)  # type: ignore[arg-type]

    async def needs(url: str) -> AsyncIterator[None]:
        yield

    with pytest.raises(nj.ConfigError, match=r"resource 'needs' must take no arguments \(it takes \['url'\]\)"):
        app.resource(needs)

    async def keys() -> AsyncIterator[None]:
        yield

    with pytest.raises(nj.ConfigError, match="cannot be read as ctx.resources.keys"):
        app.resource(keys)

    async def http() -> AsyncIterator[None]:
        yield

    app.resource(http)
    with pytest.raises(nj.ConfigError, match="resource 'http' is declared twice"):
        app.resource(http)


def test_resource_bound_must_be_positive() -> None:
    with pytest.raises(nj.ConfigError, match="resource_bound must be a finite number of seconds"):
        nj.RuntimeSettings(resource_bound=0)


async def test_resources_close_after_the_last_outcome_is_written(autojump_clock: trio.testing.MockClock) -> None:
    backend = nj.MemoryBackend()
    app = nj.App()
    states_at_close: list[nj.JobState] = []
    ids: list[int] = []

    @app.resource
    async def http() -> AsyncIterator[str]:
        yield "client"
        states_at_close.extend([(await backend.get_job(i)).state for i in ids])

    @app.job(timeout=None)
    async def work(ctx: nj.JobContext, seconds: float) -> None:
        assert ctx.resources.http == "client"
        await trio.sleep(seconds)

    async with nj.open_runtime(app, backend=backend, grace=5) as rt:
        ids.extend([await rt.enqueue("work", {"seconds": 2}), await rt.enqueue("work", {"seconds": 3600})])
        await trio.sleep(1)
    assert states_at_close == [nj.JobState.COMPLETED, nj.JobState.AVAILABLE]  # finished; interrupted, given back
