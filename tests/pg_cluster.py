"""A private PostgreSQL cluster for the tests that restart, stop or reconfigure a server.

The machine's server on 127.0.0.1:5432 is shared with everything else on the host: a test that
restarted it would cut off its users' work. A test that needs to do that to a server gets its
own: `initdb` in a temporary directory, a free port on 127.0.0.1, its unix socket inside that
directory, trust auth, and no durability (fsync off: it lives for one test). It is stopped and
its directory removed when the test ends, failed or interrupted; a run killed outright leaves
the directory with its owner tag (tests/pgutil.py), and the next cluster made on this host stops
and removes those whose owner is gone.

The server binaries come from NJ_TEST_PG_BINDIR or the newest `/usr/lib/postgresql/<v>/bin`.
`initdb` refuses to run as root, so as root every server command runs as the `postgres` system
user (`runuser -u postgres --`) in a directory that user owns. Off CI, missing binaries skip the
test with the reason; under CI=true they fail it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests import pgutil

PREFIX = "nj_pgcluster_"
_COMMAND_BOUND = 120  # seconds for one initdb / pg_ctl call on a loaded 2-core machine


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"a private PostgreSQL cluster is required in CI and cannot be made: {reason}")
    pytest.skip(f"no private PostgreSQL cluster: {reason}")


def find_bindir() -> Path | None:
    if os.environ.get("NJ_TEST_PG_BINDIR"):
        return Path(os.environ["NJ_TEST_PG_BINDIR"])
    found = sorted(
        (p for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    return found[-1] if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    """One cluster in `root`: `data/` (the cluster), `socket/`, `server.log` and `owner`."""

    def __init__(self, bindir: Path, root: Path, port: int) -> None:
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.socket_dir = root / "socket"
        self.log = root / "server.log"
        self.port = port
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(self.bindir / tool), *args]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_COMMAND_BOUND)
        if done.returncode != 0:
            log = self.log.read_text()[-4000:] if self.log.exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({done.returncode}):\n{done.stdout}{done.stderr}{log}")

    def initdb(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.socket_dir}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                "shared_buffers = 16MB\nmax_connections = 50\n"
            )

    def pg_ctl(self, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", *args)

    def start(self) -> None:
        self.pg_ctl("start")

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("stop", "-m", mode)

    def restart(self) -> None:
        """Restart the server: every connection to it is ended."""
        self.pg_ctl("restart", "-m", "fast")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()


def _chown_to_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(path, user.pw_uid, user.pw_gid)


def _remove(root: Path, bindir: Path | None) -> None:
    data = root / "data"
    if bindir is not None and (data / "postmaster.pid").exists():
        argv = [str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "-t", "60", "stop"]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        subprocess.run(argv, capture_output=True, timeout=_COMMAND_BOUND)
    shutil.rmtree(root, ignore_errors=True)


def remove_leftovers(bindir: Path | None = None) -> list[Path]:
    """Stop and remove the clusters of earlier runs on this host whose owner is gone."""
    with pgutil.sweeping():
        return _remove_leftovers(bindir)


def _remove_leftovers(bindir: Path | None) -> list[Path]:
    removed = []
    for root in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        owner = root / "owner"
        if root.is_dir() and owner.exists() and pgutil.owner_is_gone(owner.read_text().strip()):
            _remove(root, bindir or find_bindir())
            removed.append(root)
    return removed


@contextmanager
def private_cluster() -> Iterator[PrivateCluster]:
    """A started private cluster, stopped and removed when the block ends, however it ends."""
    bindir = find_bindir()
    if bindir is None or not (bindir / "initdb").exists():
        _missing("no PostgreSQL server binaries (initdb) in /usr/lib/postgresql/<version>/bin or NJ_TEST_PG_BINDIR")
    assert bindir is not None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            _missing("running as root and there is no `postgres` system user to run initdb as")
        if shutil.which("runuser") is None:
            _missing("running as root and there is no runuser to run initdb as `postgres`")
    remove_leftovers(bindir)
    root = Path(tempfile.mkdtemp(prefix=PREFIX))
    try:
        (root / "owner").write_text(pgutil.owner_tag() + "\n")
        (root / "socket").mkdir()
        for path in (root, root / "socket"):
            _chown_to_postgres(path)
        for attempt in range(3):
            cluster = PrivateCluster(bindir, root, _free_port())
            if attempt == 0:
                cluster.initdb()
            else:  # the port was taken between choosing and binding it: choose again
                conf = (cluster.data / "postgresql.conf").read_text()
                (cluster.data / "postgresql.conf").write_text(conf + f"port = {cluster.port}\n")
            try:
                cluster.start()
                break
            except RuntimeError:
                if attempt == 2 or "could not bind" not in cluster.log.read_text():
                    raise
        yield cluster
    finally:
        _remove(root, bindir)
