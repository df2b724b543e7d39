"""examples/web_service.py as a real process: POST requests, and a SIGTERM while one is in flight;
GET requests through the cache.

The request in flight at the signal must get its whole answer, the process must exit 0, and
nothing may be lost: every document's row and its index job are in the database afterwards,
each job completed or still queued. Forty requests at once for one document read the database
once, and a missing document is read once while the cache remembers it, until a POST makes it. On SQLite (a file in tmp) and on PostgreSQL (a fresh schema
of the session's throwaway database; unreachable: skipped off CI, failed under CI=true).
Every wait is bounded; the process is killed and reaped when the test ends, whatever happened.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests import pgutil

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "web_service.py"
INDEX_SECONDS = 0.5  # each index job: the request waiting on it is in flight for about this long


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(predicate: Any, timeout: float, what: str, proc: subprocess.Popen[bytes], out: Path, err: Path) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout} s (exit {proc.poll()}):\n{out.read_text()}\n{err.read_text()}")
        time.sleep(0.02)


def get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def post(port: int, text: str) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("POST", "/docs", body=json.dumps({"text": text}), headers={"content-type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
def jobs_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jobs.db'}"
    import psycopg

    url = request.getfixturevalue("pg_url")
    # The example's `docs` table is in the session database's own schema: each test starts
    # with none, so its ids start at 1 whatever test ran there before.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS docs")
    return f"{url}{'&' if '?' in url else '?'}schema={pgutil.new_schema(url)}"


def stored(jobs_url: str) -> tuple[dict[int, str], dict[int, tuple[str, int]]]:
    """(doc id -> text, job id -> (state, doc id)) read straight from the database."""
    if jobs_url.startswith("sqlite"):
        with sqlite3.connect(jobs_url[len("sqlite:///") :]) as conn:
            docs = dict(conn.execute("SELECT id, body FROM docs").fetchall())
            jobs = conn.execute("SELECT id, state, args FROM nj_jobs").fetchall()
        conn.close()
    else:
        import psycopg

        base, _, schema = jobs_url.rpartition("schema=")
        with psycopg.connect(base.rstrip("?&")) as conn:
            docs = dict(conn.execute("SELECT id, body FROM docs").fetchall())
            jobs = conn.execute(f'SELECT id, state, args FROM "{schema}".jobs').fetchall()
    return docs, {i: (state, json.loads(args)["doc_id"]) for i, state, args in jobs}


def test_sigterm_while_a_request_waits_answers_it_and_loses_nothing(jobs_url, tmp_path):
    port = free_port()
    out, err = tmp_path / "web.out", tmp_path / "web.err"
    env = {**os.environ, "JOBS_URL": jobs_url, "PORT": str(port), "INDEX_SECONDS": str(INDEX_SECONDS), "PYTHONUNBUFFERED": "1"}
    with open(out, "wb") as fout, open(err, "wb") as ferr:
        proc = subprocess.Popen([sys.executable, str(EXAMPLE)], stdin=subprocess.DEVNULL, stdout=fout, stderr=ferr, env=env)
    try:
        # hypercorn logs this once its socket listens (the example's READY line comes before).
        listening = f"Running on http://127.0.0.1:{port}"
        wait_for(lambda: listening in err.read_text(), 20, "listening socket", proc, out, err)
        assert post(port, "first") == (201, {"id": 1, "job": 1, "indexed": True})

        answer: list[tuple[int, dict[str, Any]]] = []
        request = threading.Thread(target=lambda: answer.append(post(port, "in flight")))
        request.start()
        # Its row and job are committed and it waits for the receipt: now the signal.
        wait_for(lambda: "doc 2 committed with job 2" in out.read_text(), 20, "second commit", proc, out, err)
        proc.send_signal(signal.SIGTERM)
        request.join(20)
        assert not request.is_alive(), "the request in flight got no answer"
        assert proc.wait(20) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert answer == [(201, {"id": 2, "job": 2, "indexed": True})]
    text = out.read_text()
    assert text.index("doc 2 committed") < text.index("server drained") < text.index("exited cleanly")
    assert "Traceback" not in err.read_text()
    docs, jobs = stored(jobs_url)
    assert docs == {1: "first", 2: "in flight"}
    assert sorted(doc for _, doc in jobs.values()) == [1, 2]  # one index job per document
    assert all(state in ("completed", "available", "scheduled") for state, _ in jobs.values()), jobs


def test_reads_of_a_document_go_through_the_cache(jobs_url, tmp_path):
    port = free_port()
    out, err = tmp_path / "web.out", tmp_path / "web.err"
    env = {**os.environ, "JOBS_URL": jobs_url, "PORT": str(port), "INDEX_SECONDS": "0", "PYTHONUNBUFFERED": "1"}
    with open(out, "wb") as fout, open(err, "wb") as ferr:
        proc = subprocess.Popen([sys.executable, str(EXAMPLE)], stdin=subprocess.DEVNULL, stdout=fout, stderr=ferr, env=env)
    try:
        listening = f"Running on http://127.0.0.1:{port}"
        wait_for(lambda: listening in err.read_text(), 20, "listening socket", proc, out, err)
        assert get(port, "/docs/1") == (404, {"error": "no document 1"})
        assert get(port, "/docs/1") == (404, {"error": "no document 1"})  # remembered: not read again
        assert post(port, "cached")[0] == 201  # forgets the missing document 1
        answers: list[tuple[int, dict[str, Any]]] = []
        readers = [threading.Thread(target=lambda: answers.append(get(port, "/docs/1"))) for _ in range(40)]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(20)
        assert answers == [(200, {"id": 1, "text": "cached"})] * 40
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, err.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert out.read_text().count("doc 1 read from the database") == 2  # once missing, once there
    assert "Traceback" not in err.read_text()
