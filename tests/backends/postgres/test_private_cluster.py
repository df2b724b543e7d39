"""The private cluster (tests/pg_cluster.py) that the restart tests use instead of the shared
server: it is a real server of its own, it is gone after the test however the test ends, the
leftovers of a killed run are removed by the next one, and missing binaries fail under CI."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from tests import pg_cluster, pgutil


def _answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_it_is_a_server_of_its_own_and_is_removed_even_when_the_test_fails():
    with pytest.raises(RuntimeError, match="the test failed"):
        with pg_cluster.private_cluster() as cluster:
            root, port = cluster.root, cluster.port
            assert port != 5432 and str(root).startswith(tempfile.gettempdir())
            with psycopg.connect(cluster.url, connect_timeout=5) as conn:
                assert conn.execute("SHOW data_directory").fetchone()[0] == str(cluster.data)
                assert conn.execute("SHOW listen_addresses").fetchone()[0] == "127.0.0.1"
            raise RuntimeError("the test failed")
    assert not root.exists()
    assert not _answers(port)


def _cluster_owned_by(pid: int) -> pg_cluster.PrivateCluster:
    """A started cluster left as a run with process `pid` would leave it if killed outright."""
    bindir = pg_cluster.find_bindir()
    assert bindir is not None
    root = Path(tempfile.mkdtemp(prefix=pg_cluster.PREFIX))
    (root / "owner").write_text(pgutil.owner_tag(pid) + "\n")
    (root / "socket").mkdir()
    for path in (root, root / "socket"):
        pg_cluster._chown_to_postgres(path)
    cluster = pg_cluster.PrivateCluster(bindir, root, pg_cluster._free_port())
    cluster.initdb()
    cluster.start()
    return cluster


def test_a_killed_runs_cluster_is_removed_by_the_next_and_a_live_runs_is_kept(no_other_sweeps, private_cluster):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    left: pg_cluster.PrivateCluster | None = None
    try:
        left = _cluster_owned_by(holder.pid)
        assert _answers(left.port)
        assert left.root not in pg_cluster.remove_leftovers()  # its run is alive
        assert private_cluster.root not in pg_cluster.remove_leftovers()  # so is this one
        assert _answers(left.port) and private_cluster.running()
        holder.kill()
        holder.wait(timeout=30)
        assert left.root in pg_cluster.remove_leftovers()
        assert not left.root.exists() and not _answers(left.port)
        assert private_cluster.running()
    finally:
        holder.kill()
        holder.wait(timeout=30)
        if left is not None:
            pg_cluster._remove(left.root, left.bindir)


@pytest.mark.parametrize("ci", ["true", None])
def test_missing_server_binaries_fail_under_ci_and_skip_elsewhere(ci, monkeypatch, tmp_path):
    monkeypatch.setenv("NJ_TEST_PG_BINDIR", str(tmp_path / "no-such-bin"))
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci == "true" else pytest.skip.Exception
    with pytest.raises(expected, match="initdb"):
        with pg_cluster.private_cluster():
            pass
