"""The outbox through the runtime: `nj.publish` in `rt.transaction()`, `rt.publish`,
`@app.subscribe` (fan-out, `filter=`, `args=`) and the relay service (woken by a publish, in
passes of at most `relay_batch`, stopped first at shutdown). Backends without an outbox skip."""

from __future__ import annotations

import logging

import pytest
import trio

import nursery_jobs as nj
from nursery_jobs.backends import Outbox

TOPIC = "doc.written"
# The durable test backends poll every 60 s: only a publish's wake-up makes a job sooner.
SLOW_POLL = nj.RuntimeSettings(relay_interval=60.0)


@pytest.fixture
def ob_backend(make_backend, backend_name):
    backend = make_backend()
    if not isinstance(backend, Outbox):
        pytest.skip(f"the {backend_name} backend has no outbox")
    return backend


class Rollback(Exception):
    pass


def fan_out_app(seen: list[tuple[str, object]]) -> nj.App:
    app = nj.App()

    @app.subscribe(TOPIC)
    @app.job()
    async def index(ctx: nj.JobContext, doc_id: int) -> None:
        seen.append(("index", doc_id))

    @app.subscribe(TOPIC, filter=lambda p: p["doc_id"] % 2 == 0, args=lambda p: {"n": p["doc_id"] * 10})
    @app.job()
    async def notify_even(ctx: nj.JobContext, n: int) -> None:
        seen.append(("notify_even", n))

    @app.subscribe(TOPIC, filter=lambda p: p["missing"])
    @app.job()
    async def broken(ctx: nj.JobContext, doc_id: int) -> None:
        seen.append(("broken", doc_id))

    @app.job()
    async def not_subscribed(ctx: nj.JobContext, doc_id: int) -> None:
        seen.append(("not_subscribed", doc_id))

    return app


async def settle(rt: nj.Runtime, jobs: int) -> None:
    """Until `jobs` jobs are completed (bounded)."""
    with trio.fail_after(30):
        while sum(s.completed for s in (await rt.stats()).values()) < jobs:
            await trio.sleep(0.1)


async def test_each_committed_event_becomes_one_job_of_every_subscriber(ob_backend, autojump_clock, caplog) -> None:
    seen: list[tuple[str, object]] = []
    app = fan_out_app(seen)
    with caplog.at_level(logging.ERROR, logger="nursery_jobs"):
        async with nj.open_runtime(app, backend=ob_backend, settings=SLOW_POLL) as rt:
            async with rt.transaction() as conn:
                await nj.publish(conn, TOPIC, {"doc_id": 2})
            with pytest.raises(Rollback):
                async with rt.transaction() as conn:
                    await nj.publish(conn, TOPIC, {"doc_id": 4})
                    raise Rollback
            await rt.publish(TOPIC, {"doc_id": 3})
            started = trio.current_time()
            await settle(rt, 3)
            assert trio.current_time() - started < 30  # woken by the publish, not by the 60 s poll
            await trio.sleep(1)
            assert await ob_backend.relay([TOPIC], lambda events: [[] for _ in events], 10) == 0
    assert sorted(seen) == [("index", 2), ("index", 3), ("notify_even", 20)]
    dropped = [r for r in caplog.records if getattr(r, "event", None) == "outbox_job_dropped"]
    assert [(r.kind, r.reason) for r in dropped] == [("broken", "KeyError: 'missing'")] * 2


async def test_an_event_no_subscriber_here_wants_is_kept_for_an_app_that_does(ob_backend, autojump_clock) -> None:
    seen: list[tuple[str, object]] = []
    other = nj.App()

    @other.subscribe("mail.sent")
    @other.job()
    async def archive(ctx: nj.JobContext, to: str) -> None:
        seen.append(("archive", to))

    async with nj.open_runtime(fan_out_app(seen), backend=ob_backend) as rt:
        await rt.publish("mail.sent", {"to": "ada@example.com"})
        await trio.sleep(5)
    assert seen == []
    async with nj.open_runtime(other, backend=ob_backend) as rt:
        await settle(rt, 1)
    assert seen == [("archive", "ada@example.com")]


async def test_the_relay_passes_in_batches_and_stops_first(ob_backend, autojump_clock) -> None:
    app = nj.App()

    @app.subscribe(TOPIC)
    @app.job()
    async def index(ctx: nj.JobContext, doc_id: int) -> None:
        pass

    assert isinstance(ob_backend, Outbox)
    settings = nj.RuntimeSettings(relay_batch=50, relay_interval=60.0)
    async with nj.open_runtime(app, backend=ob_backend, settings=settings, queues=[]) as rt:
        assert rt.relay is not None
        await ob_backend.publish([(TOPIC, '{"doc_id": %d}' % n) for n in range(120)])
        with trio.fail_after(30):
            while (await rt.stats())["default"].queued < 120:
                await trio.sleep(0.1)
        assert rt.relay.passes == 3  # 50 + 50 + 20
        rt.begin_shutdown()
        await ob_backend.publish([(TOPIC, '{"doc_id": 120}')])  # another process's event
        await trio.sleep(5)
        assert (await rt.stats())["default"].queued == 120  # the relay stopped first
    assert await ob_backend.relay([TOPIC], lambda events: [[] for _ in events], 10) == 1  # kept


async def test_publish_checks_its_arguments(ob_backend, autojump_clock) -> None:
    async with nj.open_runtime(nj.App(), backend=ob_backend) as rt:
        with pytest.raises(nj.ConfigError, match="topic name"):
            await rt.publish("", {"a": 1})
        with pytest.raises(nj.ArgsError, match="event payload"):
            await rt.publish(TOPIC, {"a": float("nan")})
        with pytest.raises(nj.ConfigError, match="publish"):
            await nj.publish(object(), TOPIC, {"a": 1})
        await rt.publish(TOPIC, [1, "two", None])  # any JSON value: an `args=` mapping reads it
        rt.begin_shutdown()
        with pytest.raises(nj.RuntimeClosed):
            await rt.publish(TOPIC, {"a": 1})
    with pytest.raises(nj.RuntimeClosed):
        await nj.publish(object(), TOPIC, {"a": 1})
