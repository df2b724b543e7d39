"""PostgreSQL for tests: a throwaway database per test session, a fresh schema per test.

The server is the machine's local PostgreSQL (127.0.0.1:5432, trust auth), or NJ_TEST_PG_URL.
Off CI an unreachable server skips the PostgreSQL tests with a reason; under CI=true it fails
them, so a broken server can never turn the suite green by skipping.

The suite touches only what it made. Its databases are named `nj_test_<pid>` (and
`nj_test_<pid>_docs`) and carry an owner tag as their comment: the boot and PID namespace of the
host that made them, the pid, and that process's start time. The session's database is dropped
when the session ends, whether it passed, failed or was interrupted (Ctrl-C, and SIGTERM and
SIGHUP, which tests/conftest.py turns into Ctrl-C); a parallel run's controller also drops, once its
workers are down, the databases of those xdist killed mid-teardown (`drop_of_gone_workers`). Only a
SIGKILL of the run can leave one behind, so each
session first drops the leftovers that are certainly of a run that is gone (`drop_leftovers`):
the tag names this boot and PID namespace, and that pid is no longer the process that made it
(gone, or reused by another process). A database tagged by another host or container is left
alone. An untagged one (made before the tags, or by the benchmarks: `nj_bench_<name>_<pid>`,
benchmarks/pg_common.py) is dropped only if the server is on this host, its pid is not running
here, and nobody is connected to it.

Sweeps run at once: every session of the parallel suite (one per xdist worker, `nj_test_<worker
pid>`) sweeps when it first needs its database, private clusters sweep when made
(tests/pg_cluster.py), and other checkouts' runs on this host sweep too. A test that checks what
a sweep does to a run it has just killed must not have another sweep do it first, so every sweep
holds the host's sweep lock shared (`sweeping`) and such a test holds it alone
(`no_other_sweeps`, the `no_other_sweeps` fixture of tests/conftest.py); the sweeps of that test
and of its subprocesses go ahead under its hold.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import psycopg
import pytest

ADMIN_URL = os.environ.get("NJ_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
_counter = itertools.count(1)

TAG_PREFIX = "nursery_jobs test run: "
_TAG = re.compile(r"boot=(?P<boot>[\w-]+) pidns=(?P<pidns>\S+) pid=(?P<pid>\d+) start=(?P<start>\d+)")
_UNTAGGED = re.compile(r"nj_test_(\d+)(?:_docs)?|nj_bench_[a-z0-9_]+?_(\d+)")


# -- who made it, and are they gone --


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _pidns() -> str:
    return os.readlink("/proc/self/ns/pid")


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, or None if no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rpartition(")")[2].split()[19])  # field 22; the name before ")" may hold spaces


def owner_tag(pid: int | None = None) -> str:
    """The tag of process `pid` (this one by default) as the owner of something it made."""
    pid = os.getpid() if pid is None else pid
    start = _start_time(pid)
    assert start is not None, f"no process {pid}"
    return f"{TAG_PREFIX}boot={_boot_id()} pidns={_pidns()} pid={pid} start={start}"


def owner_is_gone(tag: str | None) -> bool:
    """True only if `tag` names a process of this boot and PID namespace that is not running."""
    if not tag or not tag.startswith(TAG_PREFIX):
        return False
    m = _TAG.fullmatch(tag[len(TAG_PREFIX) :])
    if m is None or m["boot"] != _boot_id() or m["pidns"] != _pidns():
        return False  # another host, boot or container: its processes cannot be seen from here
    return _start_time(int(m["pid"])) != int(m["start"])


def _pid_running_here(pid: int) -> bool:
    return _start_time(pid) is not None


def _server_is_on_this_host() -> bool:
    host = psycopg.conninfo.conninfo_to_dict(ADMIN_URL).get("host") or ""
    return host in ("", "localhost", "::1") or host.startswith("127.") or host.startswith("/")


# -- one sweep at a time, against a test that watches one --

SWEEP_LOCK = Path(tempfile.gettempdir()) / f"nj_test_sweep_{os.getuid()}.lock"
_SWEEP_HELD = "NJ_TEST_SWEEP_HELD"  # set while this process (and so its children) holds it alone
_LOCK_BOUND = 300.0  # seconds; the tests that hold it alone take seconds each


@contextmanager
def _flock(kind: int) -> Iterator[None]:
    fd = os.open(SWEEP_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + _LOCK_BOUND
        while True:
            try:
                fcntl.flock(fd, kind | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the sweep lock {SWEEP_LOCK} was held for over {_LOCK_BOUND:g} s: a test holding it "
                        "alone hung; end that run (or remove the file if no run is left)"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def sweeping() -> Iterator[None]:
    """Held around every sweep: shared with other sweeps, never during a `no_other_sweeps`."""
    if os.environ.get(_SWEEP_HELD):
        yield  # a test of this process or its parent holds it alone: this sweep is that test's
        return
    with _flock(fcntl.LOCK_SH):
        yield


@contextmanager
def no_other_sweeps() -> Iterator[None]:
    """No sweep of another test, session or run on this host runs inside this block; those of
    this process and the subprocesses it starts in the block do."""
    with _flock(fcntl.LOCK_EX):
        before = os.environ.get(_SWEEP_HELD)
        os.environ[_SWEEP_HELD] = "1"
        try:
            yield
        finally:
            if before is None:
                del os.environ[_SWEEP_HELD]
            else:
                os.environ[_SWEEP_HELD] = before


# -- the session's database --


def admin_connect() -> psycopg.Connection:
    return psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)


def unreachable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required in CI and cannot be reached: {reason}")
    pytest.skip(f"PostgreSQL not reachable: {reason}")


RUN_DIR = "NJ_TEST_RUN_DIR"
"""Set by a run's controller (tests/conftest.py) to a directory where each of its processes that
makes a database first leaves its pid, so the controller can drop what a killed worker left."""


def create_database(suffix: str = "") -> str:
    """A new empty database of this process, tagged as ours; returns its URL."""
    name = f"nj_test_{os.getpid()}{suffix}"
    if os.environ.get(RUN_DIR):
        (Path(os.environ[RUN_DIR]) / str(os.getpid())).touch()
    try:
        with admin_connect() as conn:
            # The name holds our pid: a database of that name is of a run that is gone.
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
            conn.execute(f"COMMENT ON DATABASE \"{name}\" IS '{owner_tag()}'")
    except psycopg.OperationalError as exc:
        unreachable(str(exc).strip())
    base, _, _ = ADMIN_URL.rpartition("/")
    return f"{base}/{name}"


def drop_database(url: str) -> None:
    name = url.rpartition("/")[2]
    with admin_connect() as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def database_names(pattern: str = "nj\\_%") -> dict[str, str | None]:
    """Databases whose name is LIKE `pattern`, with their comments."""
    with admin_connect() as conn:
        rows = conn.execute(
            "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database WHERE datname LIKE %s", (pattern,)
        ).fetchall()
    return {name: comment for name, comment in rows}


def _in_use(name: str) -> bool:
    # Asked first because DROP DATABASE waits 5 s for the users of a database before refusing.
    with admin_connect() as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)).fetchone()
    return bool(row and row[0])


def drop_leftovers() -> list[str]:
    """Drop the databases of earlier runs that are certainly ours and gone; return their names."""
    with sweeping():
        return _drop_leftovers()


def _drop_leftovers() -> list[str]:
    dropped: list[str] = []
    try:
        found = database_names()
    except psycopg.OperationalError:
        return dropped  # create_database reports the unreachable server
    for name, comment in found.items():
        if comment is not None and comment.startswith(TAG_PREFIX):
            if not owner_is_gone(comment):
                continue
            force = " WITH (FORCE)"  # what is still connected can only be that run's orphans
        else:
            m = _UNTAGGED.fullmatch(name)
            pid = m and int(m[1] or m[2])
            if comment is not None or not pid or not _server_is_on_this_host() or _pid_running_here(pid):
                continue
            if _in_use(name):
                continue
            force = ""  # untagged: never cut anyone off; in use means not a leftover
        try:
            with admin_connect() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"{force}')
        except psycopg.errors.ObjectInUse:
            continue
        dropped.append(name)
    return dropped


def drop_of_gone_workers(run_dir: Path) -> list[str]:
    """Drop the databases of the processes that left their pid in `run_dir` (`RUN_DIR`) and are
    gone; return their names.

    A worker drops its own database when its session ends, but a run stopped by a signal gives
    its workers only seconds for that (xdist's controller kills a worker still running 10 s after
    asking it to stop, and the worker interrupts itself only after 5), so on a loaded machine one
    can be killed mid-teardown. The controller calls this once its workers are down: what it finds
    then is certainly a leftover of its own run, dropped now rather than by a later sweep."""
    dropped: list[str] = []
    names = {f"nj_test_{entry.name}{suffix}" for entry in run_dir.iterdir() for suffix in ("", "_docs")}
    if not names:
        return dropped
    try:
        for name, comment in database_names("nj\\_test\\_%").items():
            if name in names and owner_is_gone(comment):
                with admin_connect() as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                dropped.append(name)
    except psycopg.OperationalError:
        pass  # the server is gone too: the next session's sweep drops them
    return dropped


def new_schema(url: str) -> str:
    """A fresh, migrated schema name in the test database."""
    from nursery_jobs.backends.postgres import migrate

    schema = f"t{next(_counter)}_{os.getpid()}"
    migrate(url, schema)
    return schema


def migrations() -> list[tuple[int, str]]:
    """The version and file name of every migration `migrate` applies, in order."""
    from nursery_jobs.backends.postgres import migrate

    return [(version, name) for version, name, _ in sys.modules[migrate.__module__]._migrations()]


def migrate_to(url: str, schema: str, version: int) -> list[str]:
    """Create or upgrade `schema` to `version`, as the `nursery-jobs migrate` of that version
    did: the real `migrate`, shown only the migrations up to `version`. Returns what it applied.

    A schema an older release made is the migrations' own work, not an unwinding of today's by
    hand, which every new migration would have to extend."""
    from nursery_jobs.backends.postgres import migrate, schema_version

    module = sys.modules[migrate.__module__]
    every = module._migrations
    with mock.patch.object(module, "_migrations", lambda: [m for m in every() if m[0] <= version]):
        applied = migrate(url, schema)
    with psycopg.connect(url, autocommit=True) as conn:
        reached = schema_version(conn, schema)
    expected = max(v for v, _ in migrations() if v <= version)
    assert reached == expected, (
        f"migrate_to({version}) left {schema!r} at version {reached}: `migrate` no longer reads its "
        f"migrations through {module.__name__}._migrations; make tests/pgutil.py's migrate_to hold it back there"
    )
    return applied


def schema_at(url: str, version: int) -> str:
    """A new schema name in the test database, migrated to `version` only (`migrate_to`)."""
    schema = f"t{next(_counter)}_{os.getpid()}"
    migrate_to(url, schema, version)
    return schema
