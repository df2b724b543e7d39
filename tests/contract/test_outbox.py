"""`Outbox`, called directly: `publish`, `publish_tx` (in `transaction()` and on a connection of
the caller's own) and `relay`. An event exists only if its transaction commits; a pass claims at
most `limit` rows of its topics, makes their jobs and deletes them in one transaction, so a pass
cut anywhere changes nothing and two relays on one store never make an event's jobs twice.
Backends without the capability skip."""

from __future__ import annotations

import json

import pytest
import trio

from nursery_jobs.backends import JobsAvailable, NewJob, Outbox, OutboxEvent, OutboxPublished, TransactionalEnqueue
from tests.registry import Store, TestBackend

from .common import Q, listen, opened

TOPIC = "doc.written"


class Rollback(Exception):
    pass


def route(events):
    """One job per event, its args naming the event (as `Router` would with no subscriber
    options)."""
    return [[NewJob("work", Q, json.dumps({"n": json.loads(e.payload_json)}), 0, None, 5)] for e in events]


async def relayed_ns(backend) -> list[int]:
    """The `n` of every job in the queue (claiming them all)."""
    ns: list[int] = []
    while jobs := (await backend.claim(Q, 500)).jobs:
        ns += [json.loads(j.args_json)["n"] for j in jobs]
    return sorted(ns)


@pytest.fixture
def ob_backend(test_backend: TestBackend, make_backend):
    if not isinstance(make_backend(), Outbox):
        pytest.skip(f"the {test_backend.name} backend has no outbox")
    return make_backend


async def test_a_published_event_becomes_its_jobs_in_one_pass(ob_backend, autojump_clock) -> None:
    async with opened(ob_backend) as backend:
        events = listen(backend)
        await backend.publish([(TOPIC, "1"), (TOPIC, "2"), ("other.topic", "3")])
        assert events.of(OutboxPublished) == [OutboxPublished()]
        assert await backend.relay([TOPIC], route, 10) == 2
        assert JobsAvailable(Q) in events
        assert await relayed_ns(backend) == [1, 2]
        assert await backend.relay([TOPIC], route, 10) == 0  # deleted with the pass
        # A topic this relay does not subscribe to is left for another app's relay.
        assert await backend.relay(["other.topic"], route, 10) == 1
        assert await relayed_ns(backend) == [3]


async def test_a_rolled_back_publish_makes_no_job_and_a_committed_one_does(ob_backend, autojump_clock) -> None:
    async with opened(ob_backend) as backend:
        assert isinstance(backend, TransactionalEnqueue)
        events = listen(backend)
        with pytest.raises(Rollback):
            async with backend.transaction() as conn:
                await backend.publish_tx(conn, [(TOPIC, "1")])
                raise Rollback
        assert await backend.relay([TOPIC], route, 10) == 0
        async with backend.transaction() as conn:
            await backend.publish_tx(conn, [(TOPIC, "2")])
            assert events.of(OutboxPublished) == []  # not before the commit
        assert events.of(OutboxPublished) == [OutboxPublished()]
        assert await backend.relay([TOPIC], route, 10) == 1
        assert await relayed_ns(backend) == [2]


async def test_publish_on_a_connection_of_the_callers_own(test_backend: TestBackend, ob_backend) -> None:
    if test_backend.transaction is None:
        pytest.skip(f"the {test_backend.name} backend takes no connection of the caller's own")
    async with opened(ob_backend) as backend:
        with pytest.raises(Rollback):
            with test_backend.transaction(backend) as conn:
                await backend.publish_tx(conn, [(TOPIC, "1")])
                raise Rollback
        with test_backend.transaction(backend) as conn:
            await backend.publish_tx(conn, [(TOPIC, "2")])
            # The caller's transaction is open: no relay sees its event yet.
            with trio.move_on_after(5):
                assert await backend.relay([TOPIC], route, 10) == 0
        assert await backend.relay([TOPIC], route, 10) == 1
        assert await relayed_ns(backend) == [2]


@pytest.mark.parametrize("how", ["route raises", "cancelled"])
async def test_a_pass_cut_midway_loses_nothing(ob_backend, autojump_clock, how: str) -> None:
    async with opened(ob_backend) as backend:
        await backend.publish([(TOPIC, str(n)) for n in range(5)])
        routed: list[int] = []

        def cut(events):
            made = route(events)
            routed.extend(e.id for e in events)
            if how == "route raises":
                raise RuntimeError("the process died here")
            scope.cancel()  # honoured at the pass's next checkpoint: its insert or its commit
            return made

        with pytest.raises(RuntimeError) if how == "route raises" else _nothing():
            with trio.CancelScope() as scope:
                await backend.relay([TOPIC], cut, 3)
        assert len(routed) == 3
        jobs_now = (await backend.claim(Q, 100)).jobs
        if backend.never_yields and how == "cancelled":
            # A backend whose pass never yields finishes it: the three events are relayed once.
            assert len(jobs_now) == 3
            expected = 2
        else:
            assert jobs_now == []
            expected = 5
        assert await backend.relay([TOPIC], route, 10) == expected
        assert len(await relayed_ns(backend)) == expected


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


async def test_two_thousand_events_go_in_passes_of_at_most_the_limit(ob_backend, autojump_clock) -> None:
    async with opened(ob_backend) as backend:
        await backend.publish([(TOPIC, str(n)) for n in range(2000)])
        sizes = []
        while claimed := await backend.relay([TOPIC], route, 200):
            sizes.append(claimed)
        assert sizes == [200] * 10
        assert await relayed_ns(backend) == list(range(2000))


def opened_pair(store: Store, test_backend: TestBackend) -> tuple[Outbox, Outbox]:
    """Two instances on one store (two processes), skipping a backend without an outbox."""
    first, second = store.open(), store.open()
    if not isinstance(first, Outbox) or not isinstance(second, Outbox):
        pytest.skip(f"the {test_backend.name} backend has no outbox")
    return first, second


async def test_two_relays_on_one_store_never_relay_an_event_twice(store: Store, test_backend: TestBackend) -> None:
    first, second = opened_pair(store, test_backend)
    await first.open()
    await second.open()
    try:
        await first.publish([(TOPIC, str(n)) for n in range(300)])

        async def drain(backend) -> None:
            while await backend.relay([TOPIC], route, 7):
                await trio.sleep(0)

        async with trio.open_nursery() as nursery:
            for backend in (first, second, first, second):
                nursery.start_soon(drain, backend)
        assert await relayed_ns(first) == list(range(300))
    finally:
        await first.close()
        await second.close()


async def test_a_pass_claims_only_its_topics_and_its_limit(ob_backend, autojump_clock) -> None:
    async with opened(ob_backend) as backend:
        await backend.publish([("a", "1"), ("b", "2"), ("c", "3")])
        seen: list[OutboxEvent] = []

        def spy(events):
            seen.extend(events)
            return [[] for _ in events]

        assert await backend.relay(["a", "c"], spy, 10) == 2
        assert sorted((e.topic, e.payload_json) for e in seen) == [("a", "1"), ("c", "3")]
        assert await backend.relay([], spy, 10) == 0 and await backend.relay(["b"], spy, 0) == 0
        assert await relayed_ns(backend) == []


@pytest.mark.parametrize("role", ["works queues", "works none"])
async def test_serve_carries_a_publish_to_another_instance_on_the_same_store(
    store: Store, test_backend: TestBackend, autojump_clock, role
) -> None:
    """Another process's relay hears of a publish at once (PostgreSQL's NOTIFY, SQLite's wake-up
    socket), as a hint to pass -- also in a process that works no queue, whose relay runs too."""
    writer, reader = opened_pair(store, test_backend)
    reader.check_budget(10 if role == "works queues" else 0)
    await writer.open()
    await reader.open()
    try:
        heard = trio.Event()
        reader.add_listener(lambda e: heard.set() if isinstance(e, OutboxPublished) else None)
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.serve)
            await writer.publish([(TOPIC, "1")])
            with trio.fail_after(30):
                await heard.wait()
            nursery.cancel_scope.cancel()
    finally:
        await writer.close()
        await reader.close()
