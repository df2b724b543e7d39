"""The backends the test suites run on: one registration each.

The contract (`tests/contract/`), conformance (`tests/conformance/`) and property
(`tests/properties/`) suites take their backends from here and nowhere else, so a new backend
(MariaDB, say) is one module that opens it and one `register(TestBackend(...))` call: every
suite then runs on it under the id ``[<name>]``, with no edit to any suite.

A backend registered outside this file is named in the environment, as modules to import
before the suites are collected::

    NJ_TEST_BACKENDS=tests.outoftree.delegating pytest tests/contract -k delegate

Each module calls `register` when imported (`tests/outoftree/delegating.py` is one).

What a registration says (`TestBackend`):

- how to make a fresh throwaway store and open backend instances on it (`new_store`): a test
  that models a restart passes one instance to two runtimes, one that models two processes
  sharing a database opens two instances on one store (only where `Store.shared`);
- on which `MockClock` autojump threshold its tests run (`autojump`): 0 for a backend that
  never waits on a thread or a socket, more for one whose queries run on threads (the clock must
  not jump while a query runs), None when virtual time does not apply at all (those tests skip);
  a store may also say when an instance has a query in flight (`watch`), and the clock then
  never jumps while it has, however long the query takes on a loaded machine;
- how the property harness builds it (`harness`): one fresh, deterministic instance per
  Hypothesis example;
- how to write a row as something other than the runtime would (`damage`), for the damaged-row
  tests of backends whose rows others can write;
- for a backend with transactional enqueue, a connection of the caller's own (`transaction`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import itertools
import os
import sqlite3
import weakref
from typing import Any, Callable, ContextManager, Iterator, TypeVar

import attrs
import pytest
import trio
import trio.testing

import nursery_jobs as nj

__all__ = [
    "Damage", "Store", "TestBackend", "all_backends", "get", "names", "query_aware_clock", "register", "watch", "watched",
]  # fmt: skip

ENV = "NJ_TEST_BACKENDS"
B = TypeVar("B")


@attrs.frozen
class Store:
    """One throwaway store (a file, a schema): `open()` builds a new, unopened backend instance
    on it each call."""

    open: Callable[[], nj.Backend]
    shared: bool
    """True when instances opened on this store see one another's jobs, as processes sharing a
    database do (False: each instance is a store of its own, as memory is)."""


@attrs.frozen
class Damage:
    """Writing a row directly, as an operator's `UPDATE` or a damaged restore would."""

    write: Callable[[nj.Backend, int, str, tuple[Any, ...]], None]
    """`write(backend, job_id, assignments, params)`: run ``UPDATE jobs SET <assignments>`` on
    the job's row, `?` standing for each of `params`."""
    bad_errors: tuple[str, ...]
    """Three values of the `errors` column this backend can hold that are not an error list."""
    untyped: bool = False
    """The columns hold any type (SQLite: no check constraints), so scheduling columns can be
    made unreadable too."""


@attrs.frozen
class TestBackend:
    __test__ = False  # not a pytest test class

    name: str
    """The test id: ``test_x[<name>]``."""
    new_store: Callable[[pytest.FixtureRequest], Store]
    """A fresh throwaway store for the requesting test (removed when the test or session ends)."""
    autojump: float | None = 0.0
    """The `MockClock` autojump threshold its tests run with; None: not on virtual time."""
    harness: Callable[[pytest.FixtureRequest], Callable[[], nj.Backend]] | None = None
    """For the property harness: given the test's request, a function building a fresh backend
    per example, its calls on the Trio thread and its clock Trio's, so an example is
    deterministic under ``MockClock(autojump_threshold=0)``. None: not run by
    `tests/properties/test_durable.py` (memory: each property module runs on it itself, with
    the mutants)."""
    damage: Damage | None = None
    transaction: Callable[..., ContextManager[Any]] | None = None
    """For a backend whose `TransactionalEnqueue.insert_tx` takes a connection of the caller's
    own: ``with transaction(backend) as conn:`` such a connection in an open transaction
    (committed when the block ends, rolled back when it raises);
    ``transaction(backend, elsewhere=True)`` one that reaches another database or file."""
    commit_wakes: bool = False
    """A commit on the caller's own connection wakes every listener by itself (PostgreSQL's
    NOTIFY); False: the jobs are found by the next poll."""

    def make(self, request: pytest.FixtureRequest) -> nj.Backend:
        """A fresh backend on a fresh store."""
        return self.new_store(request).open()


_REGISTRY: dict[str, TestBackend] = {}


# -- virtual time that waits for queries in flight --

_IN_FLIGHT = pytest.StashKey[list[Callable[[], bool]]]()


def watch(request: pytest.FixtureRequest, backend: B, in_flight: Callable[[B], bool]) -> None:
    """Tell the test's `autojump_clock` how to see that `backend` has a query running (on a
    thread, or waiting on its socket): it does not jump while one is. Held weakly, so the
    backend (and the connections it holds) still goes when the test drops it."""
    ref = weakref.ref(backend)
    starting = _count_start_up(backend)

    def busy() -> bool:
        instance = ref()
        return instance is not None and (starting[0] > 0 or in_flight(instance))

    checks = watched(request)
    checks.append(busy)
    request.addfinalizer(checks.clear)
    request.addfinalizer(lambda: _collect_if_alive(ref))


def watched(request: pytest.FixtureRequest) -> list[Callable[[], bool]]:
    """The test's checks of its watched backends, as `query_aware_clock` takes them."""
    return request.node.stash.setdefault(_IN_FLIGHT, [])


def _count_start_up(backend: Any) -> list[int]:
    """Count the instance's `open` calls and `serve` start-ups in progress: they connect and
    check the schema on connections of their own, before the pool `in_flight` sees exists."""
    starting = [0]
    open_, serve = backend.open, backend.serve

    async def counted_open() -> None:
        starting[0] += 1
        try:
            await open_()
        finally:
            starting[0] -= 1

    async def counted_serve(*, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        pending = [True]

        def done() -> None:
            if pending[0]:
                pending[0] = False
                starting[0] -= 1

        class Status:
            def started(self, value: Any = None) -> None:
                done()
                task_status.started(value)

        starting[0] += 1
        try:
            await serve(task_status=Status())
        finally:
            done()

    backend.open, backend.serve = counted_open, counted_serve
    return starting


def _collect_if_alive(ref: weakref.ref[Any]) -> None:
    """A backend still alive after its test is held only by reference cycles (a traceback, a
    task): collect it now, so its pooled connections close now. Left to the garbage
    collector's own time, a worker held dozens, and four workers with other runs on the shared
    server ran it out of connections ("too many clients").

    The young generations first: the cycles are the test's own, almost always still there (313
    of 314 backends in a sample), and collecting them costs under a millisecond where a full
    collection of a worker's heap cost 0.1-0.5 s per test, over half the SQLite cases' time."""
    if ref() is not None:
        gc.collect(1)
    if ref() is not None:
        gc.collect()


def query_aware_clock(autojump_threshold: float, in_flight: list[Callable[[], bool]]) -> trio.testing.MockClock:
    """A `MockClock` whose autojump waits while a watched backend has a query in flight.

    The threshold alone says "a query answers within this much real time": on a loaded machine
    (parallel workers, other runs on two cores) a thread or a server can take longer, the
    clock then jumped to the next deadline mid-query, and a test saw a 35 s round-trip bound or
    a 3 s `move_on_after` expire during one insert. Trio's run loop calls the clock's
    `_autojump` once it has been idle for the threshold; while a query runs, this one does not
    jump, and the loop looks again after another threshold (or as soon as the answer wakes it).
    MockClock is final, so the method is replaced on the instance (MockClock's own tests patch
    its attributes the same way).
    """
    clock = trio.testing.MockClock(autojump_threshold=autojump_threshold)
    jump = clock._autojump
    # At threshold 0 the loop would look again at once, spinning on the GIL beside the very
    # thread it waits for: while a query runs it looks every millisecond instead (the query's
    # answer still wakes it at once).
    recheck = max(autojump_threshold, 0.001)

    def autojump_unless_a_query_runs() -> None:
        if any(busy() for busy in in_flight):
            if clock.autojump_threshold != recheck:
                clock.autojump_threshold = recheck
            return
        if clock.autojump_threshold != autojump_threshold:
            clock.autojump_threshold = autojump_threshold
        jump()

    clock._autojump = autojump_unless_a_query_runs  # type: ignore[method-assign]
    return clock


def register(backend: TestBackend) -> TestBackend:
    """Run every suite on `backend` too (registering a name again replaces it)."""
    _REGISTRY[backend.name] = backend
    return backend


_loaded = False


def _load_extra() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in filter(None, (m.strip() for m in os.environ.get(ENV, "").split(","))):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise RuntimeError(f"{ENV} names the module {module!r}, which cannot be imported ({exc}); fix the name or the module") from exc


def all_backends() -> list[TestBackend]:
    _load_extra()
    return list(_REGISTRY.values())


def names() -> list[str]:
    return [b.name for b in all_backends()]


def get(name: str) -> TestBackend:
    _load_extra()
    return _REGISTRY[name]


# -- memory --


def _memory_store(request: pytest.FixtureRequest) -> Store:
    return Store(nj.MemoryBackend, shared=False)


register(TestBackend("memory", _memory_store, autojump=0.0))


# -- SQLite --

_files = itertools.count(1)


def _sqlite_store(request: pytest.FixtureRequest) -> Store:
    from nursery_jobs.backends.sqlite import SqliteBackend

    path = str(request.getfixturevalue("tmp_path") / f"jobs-{next(_files)}.db")

    def open_instance() -> nj.Backend:
        backend = SqliteBackend(path, synchronous="NORMAL", clock=trio.current_time)
        # One process: every wake-up is pushed in-process, so the cross-process poll only
        # costs real time per virtual second here (each poll is a thread hop before autojump).
        backend.poll_interval = 60.0
        reading = _count_reads(backend)
        watch(request, backend, lambda instance: _sqlite_call_runs(instance, reading[0] > 0))
        return backend

    return Store(open_instance, shared=True)


def _count_reads(backend: Any) -> list[int]:
    """Count the calls on the backend's own connection that are reads: every one but a write
    transaction (`_tx`, which starts with ``BEGIN IMMEDIATE``). A read never waits for the write
    lock (WAL), so it is work under way whatever else holds the lock."""
    reading = [0]
    io, write = backend._io, backend._tx

    async def counted_io(fn: Callable[..., Any], *args: Any) -> Any:
        if fn == write:
            return await io(fn, *args)
        reading[0] += 1
        try:
            return await io(fn, *args)
        finally:
            reading[0] -= 1

    backend._io = counted_io
    return reading


def _sqlite_call_runs(backend: Any, reading: bool) -> bool:
    """A call runs on a thread: on the backend's transaction connection, on a caller's own
    connection (Trio's default limiter), or on the backend's connection -- a read (`reading`),
    or a write unless that one may be waiting for the write lock of the backend's own
    `transaction()` block. While a test holds the block open, a write of the runtime's (a claim)
    waits in SQLite's busy handler until the block commits, and the block ends only when virtual
    time goes on (the test's `trio.sleep` inside it). Counted as in flight, that wait held the
    clock for `busy_timeout` (10 s real) per retry, and the runtime retries with backoff: one test
    took 50-100 s whenever its worker's claim fell inside the block. A read does not wait for
    the lock, so it is counted in the block too: else the clock jumped while it ran (a
    `get_job`, `stats`, the relay's or the cancel hints' read beside an open block)."""
    if backend._tx_limiter.borrowed_tokens > 0:
        return True  # a statement of the transaction connection's
    if trio.to_thread.current_default_thread_limiter().borrowed_tokens > 0:
        return True  # a statement on a caller's own connection (`run_callers_io`), or another thread
    if backend._limiter.borrowed_tokens == 0:
        return False
    if reading:
        return True
    tx_conn = backend._tx_conn
    return not (tx_conn is not None and tx_conn.in_transaction)


def _sqlite_harness(request: pytest.FixtureRequest) -> Callable[[], nj.Backend]:
    from tests.deterministic import DeterministicSqlite

    folder = request.getfixturevalue("tmp_path_factory").mktemp("property-sqlite")

    def build() -> nj.Backend:
        backend = DeterministicSqlite(str(folder / f"example-{next(_files)}.db"), synchronous="NORMAL", clock=trio.current_time)
        backend.poll_interval = None  # one process: every wake-up is delivered in-process
        return backend

    return build


def _sqlite_damage(backend: nj.Backend, job_id: int, assignments: str, params: tuple[Any, ...]) -> None:
    from nursery_jobs.backends.sqlite import SqliteBackend

    assert isinstance(backend, SqliteBackend), backend
    with sqlite3.connect(backend.path) as conn:
        conn.execute(f"UPDATE nj_jobs SET {assignments} WHERE id = ?", (*params, job_id))
    conn.close()


@contextlib.contextmanager
def _sqlite_transaction(backend: nj.Backend, elsewhere: bool = False) -> Iterator[sqlite3.Connection]:
    from nursery_jobs.backends.sqlite import SqliteBackend

    assert isinstance(backend, SqliteBackend), backend
    path = backend.path + "-elsewhere.db" if elsewhere else backend.path
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("BEGIN")  # deferred, as Python's own transactions: the first write takes the lock
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    finally:
        conn.close()


register(
    TestBackend(
        "sqlite",
        _sqlite_store,
        # 0: every wait of its own is seen (`_sqlite_call_runs`): its calls run on its two
        # limiters' threads, a caller's connection on Trio's default limiter, and a wake-up
        # datagram is in the receiver's socket before the sender's call returns. With 0.05
        # each jump cost 50 ms of real time; the SQLite cases spent most of their time there.
        autojump=0.0,
        harness=_sqlite_harness,
        damage=Damage(_sqlite_damage, ("not json at all", '"a string"', '[1, {"attempt": "x"}]'), untyped=True),
        transaction=_sqlite_transaction,
    )
)


# -- PostgreSQL --
# Its queries run on threads, which MockClock's autojump cannot see: with a threshold of 0 the
# clock would jump while a query runs, so the clock jumps only after the loop has been idle for
# a while in real time, longer than any local query.


def _postgres_store(request: pytest.FixtureRequest) -> Store:
    from nursery_jobs.backends.postgres import PostgresBackend
    from tests import pgutil

    url = request.getfixturevalue("pg_url")
    schema = pgutil.new_schema(url)

    def open_instance() -> nj.Backend:
        backend = PostgresBackend(url, schema=schema, clock=trio.current_time, poll_interval=60.0)
        watch(request, backend, _pool_in_use)
        return backend

    return Store(open_instance, shared=True)


def _pool_in_use(backend: Any) -> bool:
    """A round trip runs on one of its pool's connections (a statement sent, its answer not
    all read), or a connection is being opened (a slot taken, no connection handed out for it
    yet). A connection merely checked out -- a caller's transaction, idle -- is not: virtual
    time must go on while a test holds one."""
    from psycopg.pq import TransactionStatus

    pool = backend._pool
    if pool is None:
        return False
    if pool.size - pool._slots.value > pool.checked_out:
        return True
    return any(conn.pgconn.transaction_status == TransactionStatus.ACTIVE for conn in list(pool._pids))


def _postgres_harness(request: pytest.FixtureRequest) -> Callable[[], nj.Backend]:
    from tests import pgutil
    from tests.deterministic import DeterministicPostgres

    url = request.getfixturevalue("pg_url")

    class QuietPostgres(DeterministicPostgres):
        """No LISTEN connection: with one process every NOTIFY is our own echo, which the
        backend drops anyway, and a listener's socket would be a wait autojump cannot see
        through."""

        async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            await trio.sleep_forever()

    def build() -> nj.Backend:
        return QuietPostgres(url, schema=pgutil.new_schema(url), clock=trio.current_time, poll_interval=None)

    return build


def _postgres_damage(backend: nj.Backend, job_id: int, assignments: str, params: tuple[Any, ...]) -> None:
    import psycopg
    import psycopg.sql

    from nursery_jobs.backends.postgres import PostgresBackend

    assert isinstance(backend, PostgresBackend), backend
    with psycopg.connect(backend.conninfo, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("UPDATE {}.jobs SET " + assignments.replace("?", "%s") + " WHERE id = %s").format(
                psycopg.sql.Identifier(backend.schema)
            ),
            (*params, job_id),
        )


@contextlib.contextmanager
def _postgres_transaction(backend: nj.Backend, elsewhere: bool = False) -> Iterator[Any]:
    import psycopg
    from psycopg.conninfo import make_conninfo

    from nursery_jobs.backends.postgres import PostgresBackend

    assert isinstance(backend, PostgresBackend), backend
    conninfo = make_conninfo(backend.conninfo, dbname="postgres") if elsewhere else backend.conninfo
    with psycopg.connect(conninfo) as conn, conn.transaction():
        yield conn


register(
    TestBackend(
        "postgres",
        _postgres_store,
        autojump=0.05,
        harness=_postgres_harness,
        damage=Damage(_postgres_damage, ('"a string"', '{"a": 1}', '[1, {"attempt": "x"}]')),
        transaction=_postgres_transaction,
        commit_wakes=True,
    )
)


# -- the fixtures every backend suite uses (its conftest imports them) --


@pytest.fixture(params=names())
def backend_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def test_backend(backend_name: str) -> TestBackend:
    return get(backend_name)


@pytest.fixture
def make_backend(test_backend: TestBackend, request: pytest.FixtureRequest) -> Callable[[], nj.Backend]:
    """A factory: each call a fresh backend on a fresh store. Call it once per test, and pass
    the same instance to two runtimes to model a restart."""
    return lambda: test_backend.make(request)


@pytest.fixture
def store(test_backend: TestBackend, request: pytest.FixtureRequest) -> Store:
    """One fresh store shared by the instances `store.open()` builds, as by several processes;
    skips on a backend whose instances cannot share one."""
    made = test_backend.new_store(request)
    if not made.shared:
        pytest.skip(f"the {test_backend.name} backend has no store that several instances share")
    return made


@pytest.fixture
def autojump_clock(test_backend: TestBackend, request: pytest.FixtureRequest) -> Any:
    """Virtual time (see `TestBackend.autojump`), never jumping while a query of the test's
    backends runs (`watch`); skips on a backend that does not run on it."""
    if test_backend.autojump is None:
        pytest.skip(f"the {test_backend.name} backend does not run on Trio's virtual clock")
    return query_aware_clock(test_backend.autojump, watched(request))


@pytest.fixture
def damage(test_backend: TestBackend) -> Damage:
    """The backend's way to write a row directly; skips on a backend whose rows only it writes."""
    if test_backend.damage is None:
        pytest.skip(f"the {test_backend.name} backend's rows are only ever written by itself")
    return test_backend.damage
