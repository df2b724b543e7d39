"""The wake-up registry between processes sharing an SQLite file (`nursery_jobs.infra.wake`),
and the SQLite backend's use of it.

Two registries (or two backend instances) on one file stand for two processes: nothing crosses
between them but datagrams. Real sockets on real time, every wait bounded by `trio.fail_after`;
"nothing arrived" is never judged by waiting: a marker datagram is sent after the one that must
not arrive, and the receiver's next datagram must be the marker (a socket's queue is in order).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import stat
import tempfile
from contextlib import asynccontextmanager
from functools import partial
from typing import AsyncIterator

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import nursery_jobs as nj
from nursery_jobs.backends import CancelRequested, JobFinalized, JobsAvailable, NewJob, Outcome, OutcomeKind
from nursery_jobs.backends.sqlite import SqliteBackend
from nursery_jobs.infra import wake as wake_mod
from nursery_jobs.infra.wake import MAX_DATAGRAM, Wake, WakeRegistry, decode, encode, registry_dir
from tests.deterministic import DeterministicSqlite

MARKER = Wake(queues=("marker",))


@asynccontextmanager
async def serving(registry: WakeRegistry, *, works: bool = True) -> AsyncIterator[trio.MemoryReceiveChannel[Wake]]:
    send, receive = trio.open_memory_channel[Wake](math.inf)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(registry.serve, send.send_nowait, works=works))
        yield receive
        nursery.cancel_scope.cancel()


async def next_wake(inbox: trio.MemoryReceiveChannel[Wake], timeout: float = 5) -> Wake:
    with trio.fail_after(timeout):
        return await inbox.receive()


def sockets(registry: WakeRegistry) -> list[str]:
    assert registry.directory is not None
    try:
        return sorted(os.listdir(registry.directory))
    except FileNotFoundError:
        return []


@pytest.fixture
def home():
    """A directory with a short path: the registry lives beside a database file in it (the
    deeper pytest `tmp_path` often needs the temp-dir fallback, tested on its own below)."""
    import shutil

    path = tempfile.mkdtemp(prefix="njw", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def db(home: str) -> str:
    return os.path.join(home, "jobs.db")


# -- the registry ------------------------------------------------------------------------------


async def test_a_wake_reaches_the_other_process_and_never_its_sender(home) -> None:
    a, b = WakeRegistry(db(home)), WakeRegistry(db(home))
    assert a.directory == b.directory == db(home) + ".wake"
    async with serving(a) as inbox_a, serving(b) as inbox_b:
        assert a.send(Wake(("q",), (1,), (2,))) == 1  # one datagram, to b only
        assert await next_wake(inbox_b) == Wake(("q",), (1,), (2,))
        b.send(MARKER)
        assert await next_wake(inbox_a) == MARKER  # a's own datagram never came back to it


async def test_a_process_that_works_no_queue_hears_finalizations_only(home) -> None:
    a, web = WakeRegistry(db(home)), WakeRegistry(db(home))
    async with serving(web, works=False) as inbox:
        assert [n.endswith(".r.sock") for n in sockets(web)] == [True]
        assert a.send(Wake(("q",), (), (3,))) == 0  # nothing it cares about: not even a sendto
        assert a.send(Wake(("q",), (7, 8), (3,))) == 1
        assert await next_wake(inbox) == Wake((), (7, 8), ())


async def test_a_dead_socket_is_removed_by_the_next_sender_and_nothing_else_is(home) -> None:
    a = WakeRegistry(db(home))
    assert a.directory is not None
    os.mkdir(a.directory)
    stale = os.path.join(a.directory, "4242-0123456789ab1.w.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(stale)
    dead.close()  # what a SIGKILLed process leaves behind
    for other in ("notes.txt", "4242-zz.w.sock"):
        open(os.path.join(a.directory, other), "w").close()
    assert a.send(Wake(("q",))) == 0
    assert sockets(a) == ["4242-zz.w.sock", "notes.txt"]


async def test_a_full_receiver_never_blocks_a_sender(home) -> None:
    a = WakeRegistry(db(home))
    assert a.directory is not None
    os.mkdir(a.directory)
    path = os.path.join(a.directory, "4242-0123456789ab1.w.sock")
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # alive, never reads
    stuck.bind(path)
    try:
        delivered = [a.send(Wake(("q",))) for _ in range(2000)]
        assert sum(delivered) < 2000  # the queue filled up (EAGAIN): the rest was dropped
        assert os.path.exists(path)  # a full socket is alive: it is not removed
    finally:
        stuck.close()


GARBAGE = [
    b"",
    b"not json",
    b"\xff\xfe\x00\x01garbage",
    b"[" * 4000 + b"]" * 4000,  # nested too deep
    b"1" * 5000,  # an integer too long to parse
    b'{"v": 1, "s": "x", "q": ["' + b"a" * MAX_DATAGRAM + b'"]}',  # longer than a datagram may be
    b'["v", 1]',
    b'{"v": 2, "s": "x", "q": ["q"]}',
    b'{"v": true, "s": "x", "q": ["q"]}',
    b'{"v": 1, "q": ["q"]}',
    b'{"v": 1, "s": 5, "q": ["q"]}',
    b'{"v": 1, "s": "x", "q": "q", "f": "1,2", "c": {}}',
    b'{"v": 1, "s": "x", "f": [1e3, "5", true, -1, 0, 9223372036854775808, null]}',
    b'{"v": 1, "s": "x", "q": ["' + b"a" * 129 + b'", "\\u0000", "", 5, ["q"]]}',
    b'{"v": 1, "s": "x"}',
]


@pytest.mark.parametrize("data", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_decodes_to_nothing(data: bytes) -> None:
    assert decode(data) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=MAX_DATAGRAM + 10))
def test_no_bytes_crash_the_decoder(data: bytes) -> None:
    result = decode(data)
    assert result is None or isinstance(result, Wake)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=200),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.sampled_from("vsqfcx"), inner, max_size=6),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(JSONISH)
def test_no_json_value_crashes_the_decoder_and_what_it_keeps_is_well_formed(value) -> None:
    import json

    result = decode(json.dumps(value).encode())
    if result is not None:
        assert all(q is None or (isinstance(q, str) and 0 < len(q) <= 128 and q.isprintable()) for q in result.queues)
        assert all(type(i) is int and 0 < i < 2**63 for i in result.finalized + result.cancel)


def test_a_large_wake_is_split_into_datagrams_that_fit() -> None:
    big = Wake(tuple(f"queue-{i}-" + "x" * 100 for i in range(40)), tuple(range(1, 1001)), tuple(range(2**62, 2**62 + 250)))
    datagrams = encode("0123456789ab", big)
    assert all(len(d) <= MAX_DATAGRAM for d in datagrams)
    parts = [decode(d) for d in datagrams]
    assert all(p is not None for p in parts)
    assert [q for p in parts if p for q in p.queues] == [None]  # too many names: "any queue"
    assert [i for p in parts if p for i in p.finalized] == list(big.finalized)
    assert [i for p in parts if p for i in p.cancel] == list(big.cancel)
    assert encode("0123456789ab", Wake()) == []


async def test_garbage_datagrams_are_ignored_and_a_forged_own_token_too(home) -> None:
    a, b = WakeRegistry(db(home)), WakeRegistry(db(home))
    async with serving(b) as inbox:
        (name,) = sockets(b)
        assert b.directory is not None
        raw = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        forged = f'{{"v": 1, "s": "{b.token}", "q": ["q"]}}'.encode()
        mixed = b'{"v": 1, "s": "x", "q": ["good", "", null, "good"], "f": [5, "6", 7], "c": [true, 8]}'
        with raw, trio.fail_after(5):
            for data in [*GARBAGE, forged, mixed]:
                await raw.sendto(data, os.path.join(b.directory, name))  # waits while its queue is full
        assert await next_wake(inbox) == Wake(("good", None), (5, 7), (8,))
        a.send(MARKER)
        assert await next_wake(inbox) == MARKER


async def test_the_socket_file_goes_when_its_process_stops_serving(home) -> None:
    a, b = WakeRegistry(db(home)), WakeRegistry(db(home))
    async with serving(a):
        async with serving(b):
            assert len(sockets(a)) == 2
        assert len(sockets(a)) == 1  # b's went, a's stays
    assert not os.path.exists(db(home) + ".wake")  # the last one out removes the directory


async def test_the_socket_file_goes_when_a_listener_crashes_the_receiver(home) -> None:
    a, b = WakeRegistry(db(home)), WakeRegistry(db(home))

    def crash(wake: Wake) -> None:
        raise RuntimeError("listener failed")

    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="listener failed")):
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                await nursery.start(partial(b.serve, crash, works=True))
                assert len(sockets(b)) == 1
                a.send(Wake(("q",)))
                await trio.sleep_forever()
    assert not os.path.exists(db(home) + ".wake")


async def test_a_removed_socket_is_bound_again_and_every_queue_looks(home, autojump_clock, caplog) -> None:
    a, b = WakeRegistry(db(home)), WakeRegistry(db(home))
    async with serving(b) as inbox:
        (first,) = sockets(b)
        os.unlink(os.path.join(db(home) + ".wake", first))  # a /tmp cleaner, an operator
        t0 = trio.current_time()
        # bound again (virtual time), and every queue looks for work it may have missed
        assert await next_wake(inbox, timeout=60) == Wake(queues=(None,))
        assert trio.current_time() - t0 <= wake_mod.RECHECK_INTERVAL
        (second,) = sockets(b)
        assert second != first
        a.send(Wake(("q",)))
        assert await next_wake(inbox) == Wake(("q",))
    assert "was removed; binding a new one" in caplog.text


# -- where the registry lives --------------------------------------------------------------------


@pytest.fixture
def short_tempdir(monkeypatch):
    """A short system temp dir of this test's own (the fallback lives there)."""
    base = tempfile.mkdtemp(prefix="njw", dir="/tmp")
    monkeypatch.setattr(tempfile, "tempdir", base)
    yield base
    import shutil

    shutil.rmtree(base, ignore_errors=True)


async def test_a_long_database_path_falls_back_to_a_private_temp_dir(tmp_path, short_tempdir) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "jobs.db")
    link = tmp_path / "l"
    link.symlink_to(deep)
    a, b = WakeRegistry(path), WakeRegistry(str(link / "jobs.db"))  # two spellings of one file
    assert a.directory is not None and a.directory.startswith(short_tempdir + os.sep)
    assert b.directory == a.directory
    assert a.directory == registry_dir(path)  # every process computes the same place
    async with serving(a) as inbox:
        (name,) = sockets(a)
        assert len(os.fsencode(os.path.join(a.directory, name))) <= 103
        for d in (a.directory, os.path.dirname(a.directory)):
            st_ = os.lstat(d)
            assert stat.S_IMODE(st_.st_mode) == 0o700 and st_.st_uid == os.getuid()
        b.send(Wake(("q",)))
        assert await next_wake(inbox) == Wake(("q",))


async def test_a_fallback_directory_someone_else_could_write_is_refused(tmp_path, short_tempdir, caplog) -> None:
    path = str(tmp_path / ("d" * 120) / "jobs.db")
    a = WakeRegistry(path)
    assert a.directory is not None
    os.makedirs(os.path.dirname(a.directory), mode=0o777)
    os.chmod(os.path.dirname(a.directory), 0o777)
    async with serving(a):
        assert not os.path.exists(a.directory)
    assert "not a private directory of this user" in caplog.text


async def test_a_path_too_long_even_for_the_fallback_turns_wake_ups_off(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / ("t" * 90)))
    a = WakeRegistry(str(tmp_path / ("d" * 120) / "jobs.db"))
    assert a.directory is None
    caplog.set_level(logging.WARNING, logger="nursery_jobs")
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(a.serve, lambda w: None, works=True))  # starts, and waits
            assert a.send(Wake(("q",))) == 0
            nursery.cancel_scope.cancel()
    assert "wake-ups are off" in caplog.text


def test_nothing_to_share_has_no_registry() -> None:
    assert registry_dir(":memory:") is None
    assert registry_dir("") is None


# -- the SQLite backend --------------------------------------------------------------------------


async def test_every_write_that_makes_something_happen_tells_the_other_processes(home) -> None:
    backend = SqliteBackend(db(home), synchronous="NORMAL")
    other, marker = WakeRegistry(db(home)), WakeRegistry(db(home))
    await backend.open()
    try:
        async with serving(other) as inbox:

            async def says_nothing() -> None:
                marker.send(MARKER)
                assert await next_wake(inbox) == MARKER

            (first,) = await backend.insert_many([NewJob("k", "q", "{}", 0, None, 3)])
            assert await next_wake(inbox) == Wake(("q",))
            await backend.insert_many([NewJob("k", "later", "{}", 0, backend.now() + 3600, 3)])
            assert await next_wake(inbox) == Wake(("later",))  # the fetcher learns the due time by claiming
            (job,) = (await backend.claim("q", 1)).jobs
            await says_nothing()  # a claim makes nothing available
            await backend.finish_many([Outcome(job.id, job.attempt, OutcomeKind.RETRY, run_at=backend.now())])
            assert await next_wake(inbox) == Wake(("q",))  # a retry due now
            (job,) = (await backend.claim("q", 1)).jobs
            assert await backend.cancel(job.id) is nj.JobState.RUNNING
            assert await next_wake(inbox) == Wake(cancel=(job.id,))
            await backend.heartbeat([(job.id, job.attempt)])
            await says_nothing()
            await backend.finish_many([Outcome(job.id, job.attempt, OutcomeKind.COMPLETED)])
            assert await next_wake(inbox) == Wake(finalized=(first.id,))
            (second,) = await backend.insert_many([NewJob("k", "q", "{}", 0, None, 3)])
            assert await next_wake(inbox) == Wake(("q",))
            (job,) = (await backend.claim("q", 1)).jobs
            assert await backend.rescue(backend.now() + 1) == [second.id]
            assert await next_wake(inbox) == Wake(("q",))  # a rescued job is available again
            (job,) = (await backend.claim("q", 1)).jobs
            await backend.finish_many([Outcome(job.id, job.attempt, OutcomeKind.INTERRUPTED)])
            assert await next_wake(inbox) == Wake(("q",))  # an interrupted attempt given back
    finally:
        await backend.close()


async def test_the_backend_turns_a_datagram_into_hints_to_re_read(home) -> None:
    events: list[object] = []
    backend = SqliteBackend(db(home), synchronous="NORMAL")
    backend.add_listener(events.append)
    other = WakeRegistry(db(home))
    await backend.open()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.serve)
            other.send(Wake(("q", None), (5,), (6,)))
            with trio.fail_after(5):
                while len(events) < 4:
                    await trio.sleep(0.001)
            nursery.cancel_scope.cancel()
    finally:
        await backend.close()
    assert events == [JobsAvailable("q"), JobsAvailable(None), JobFinalized(5, None), CancelRequested(6, False)]


async def test_an_enqueue_only_backend_binds_for_receipts_only(home) -> None:
    backend = SqliteBackend(db(home))
    backend.check_budget(0)  # what open_runtime(..., queues=[]) says
    async with trio.open_nursery() as nursery:
        await nursery.start(backend.serve)
        (name,) = os.listdir(db(home) + ".wake")
        assert name.endswith(".r.sock")
        nursery.cancel_scope.cancel()
    await backend.close()


@pytest.mark.parametrize(
    ("cls", "kwargs"), [(DeterministicSqlite, {}), (SqliteBackend, {"wake": False})], ids=["blocking", "wake-off"]
)
async def test_blocking_mode_and_wake_off_have_no_sockets(home, cls, kwargs) -> None:
    backend = cls(db(home), synchronous="NORMAL", **kwargs)
    other, marker = WakeRegistry(db(home)), WakeRegistry(db(home))
    async with serving(other) as inbox:
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.serve)
            assert len(sockets(other)) == 1  # only the other one's
            await backend.insert_many([NewJob("k", "q", "{}", 0, None, 3)])
            marker.send(MARKER)
            assert await next_wake(inbox) == MARKER  # the insert sent nothing
            nursery.cancel_scope.cancel()
    await backend.close()


async def test_the_url_turns_wake_ups_off(home) -> None:
    other, marker = WakeRegistry(db(home)), WakeRegistry(db(home))
    backend = nj.open_backend(f"sqlite:///{db(home)}?wake=off")
    async with serving(other) as inbox:
        async with trio.open_nursery() as nursery:
            await nursery.start(backend.serve)
            assert len(sockets(other)) == 1  # it bound none
            await backend.insert_many([NewJob("k", "q", "{}", 0, None, 3)])
            marker.send(MARKER)
            assert await next_wake(inbox) == MARKER  # and its insert sent nothing
            nursery.cancel_scope.cancel()
    await backend.close()
    for url in (f"sqlite:///{db(home)}", f"sqlite:///{db(home)}?wake=on", f"sqlite:///{db(home)}?wake=OFF"):
        nj.open_backend(url)
    with pytest.raises(nj.ConfigError, match="wake must be 'on' or 'off'.*not 'maybe'"):
        nj.open_backend(f"sqlite:///{db(home)}?wake=maybe")


async def test_a_job_enqueued_elsewhere_starts_and_its_receipt_arrives_without_a_poll(home) -> None:
    """Two backend instances on one file, as two processes: the worker's queue and the web
    side's receipts poll every 30 s, so within the 10 s bound only a wake-up can do it."""
    app = nj.App()
    app.queue("q", max_workers=2, timeout=30, poll_interval=30)
    started: list[int] = []

    @app.job(queue="q")
    async def work(ctx: nj.JobContext) -> None:
        started.append(ctx.id)

    worker_backend, web_backend = SqliteBackend(db(home)), SqliteBackend(db(home))
    with trio.fail_after(20):
        async with nj.open_runtime(app, backend=worker_backend, grace=1):
            async with nj.open_runtime(app, backend=web_backend, queues=[], grace=1) as web:
                for _ in range(3):
                    with trio.fail_after(10):
                        job_id = await work.enqueue()
                        receipt = await web.wait(job_id, timeout=10)
                    assert receipt.state is nj.JobState.COMPLETED
                assert len(started) == 3
    await worker_backend.close()
    await web_backend.close()
