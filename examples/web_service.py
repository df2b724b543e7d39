"""A Trio web service with background work: an ASGI app on hypercorn's Trio worker, under `nj.run`.

    .venv/bin/pip install -e '.[web]'
    .venv/bin/python examples/web_service.py          # http://127.0.0.1:8000, jobs in web_service.db
    curl -s -X POST -d '{"text": "hello"}' http://127.0.0.1:8000/docs
    {"id": 1, "job": 1, "indexed": true}

`POST /docs` writes the document's row and enqueues its index job in one transaction
(`rt.transaction()`): both are committed, or neither is, so no document is ever left unindexed
by a crash between the two. It then waits up to 2 s for the job's receipt (`rt.wait`) and
answers whether the document is indexed yet (`false` only means "not yet": the job is durable
and runs anyway). `GET /docs/<id>` reads a document back through the cache (`rt.cache`): any
number of requests for one document at once read the database once, a document is served from
the cache for a minute, and one that does not exist is remembered as missing for 5 s (a POST
forgets what the cache held for its new id).

Shutdown drains. On SIGTERM (or Ctrl-C), `nj.run(main_grace=10)` does not cancel `main`: it sets
`rt.shutdown_requested`, which is hypercorn's `shutdown_trigger`, so the server stops accepting,
lets the requests in flight finish (each gets its full answer, within hypercorn's
`graceful_timeout`) and returns; the runtime keeps serving them meanwhile (transactions, receipts,
workers). Then the jobs' own grace runs as in any shutdown, and the process exits 0. A second
signal skips every grace.

Settings, from the environment: `JOBS_URL` (default `sqlite:///web_service.db`; a
``postgresql://`` URL works too, its schema migrated first with `nursery-jobs migrate`), `PORT`
(8000), `INDEX_SECONDS` (how long an index job takes, 0.05).

Docs: docs/transactions.md, "Embedding in a Trio web service", walks through this file;
docs/cache.md says what the cache does.
"""

from __future__ import annotations

import json
import os
from typing import Any, Awaitable, Callable

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

import nursery_jobs as nj

JOBS_URL = os.environ.get("JOBS_URL", "sqlite:///web_service.db")
PORT = int(os.environ.get("PORT", "8000"))
INDEX_SECONDS = float(os.environ.get("INDEX_SECONDS", "0.05"))
POSTGRES = JOBS_URL.startswith(("postgresql://", "postgres://"))

# The service's own table, in the jobs' database: the same transaction writes both.
CREATE_DOCS = (
    "CREATE TABLE IF NOT EXISTS docs (id bigserial PRIMARY KEY, body text NOT NULL)"
    if POSTGRES
    else "CREATE TABLE IF NOT EXISTS docs (id INTEGER PRIMARY KEY, body TEXT NOT NULL)"
)
P = "%s" if POSTGRES else "?"  # the database's own placeholder

app = nj.App()
# Requests wait on this queue's receipts: look for work every 0.1 s if a wake-up is ever missed.
app.queue("index", max_workers=4, timeout=30, poll_interval=0.1)


@app.job(queue="index")
async def index_doc(ctx: nj.JobContext, doc_id: int) -> None:
    await trio.sleep(INDEX_SECONDS)  # stands for an idempotent call to the search engine


# -- the web app: plain ASGI, so the example needs no framework -------------------------------------

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def respond(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def web_app(rt: nj.Runtime) -> Callable[[dict[str, Any], Receive, Send], Awaitable[None]]:
    async def asgi(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # nothing to open or close: the runtime owns the resources
            await receive()  # lifespan.startup
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        if method == "POST" and path == "/docs":
            await post_doc(rt, receive, send)
        elif method == "GET" and path.startswith("/docs/") and path[6:].isdigit():
            await get_doc(rt, int(path[6:]), send)
        else:
            await respond(send, 404, {"error": f"no route for {method} {path}"})

    return asgi


class NoSuchDoc(LookupError):
    """Kept by the cache for 5 s: a missing document stays missing for a while."""


async def post_doc(rt: nj.Runtime, receive: Receive, send: Send) -> None:
    try:
        text = json.loads(await read_body(receive))["text"]
        if not isinstance(text, str):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        await respond(send, 400, {"error": 'send a JSON object {"text": "..."}'})
        return
    # The row and its index job: committed together at the end of the block, or neither.
    async with rt.transaction() as conn:
        cur = await conn.execute(f"INSERT INTO docs (body) VALUES ({P}) RETURNING id", (text,))
        (doc_id,) = await cur.fetchone()
        job_id = await index_doc.enqueue_tx(conn, doc_id=doc_id)
    await rt.cache.delete(f"doc:{doc_id}")  # a "no such document" the cache kept for this id
    print(f"doc {doc_id} committed with job {job_id}", flush=True)
    receipt = await rt.wait(job_id, timeout=2.0)  # bounded: answers within 2 s, indexed or not
    await respond(send, 201, {"id": doc_id, "job": job_id, "indexed": receipt.state is nj.JobState.COMPLETED})


async def load_doc(rt: nj.Runtime, doc_id: int) -> str:
    async with rt.transaction() as conn:
        cur = await conn.execute(f"SELECT body FROM docs WHERE id = {P}", (doc_id,))
        row = await cur.fetchone()
    print(f"doc {doc_id} read from the database", flush=True)
    if row is None:
        raise NoSuchDoc(f"no document {doc_id}")
    return str(row[0])


async def get_doc(rt: nj.Runtime, doc_id: int, send: Send) -> None:
    try:
        text = await rt.cache.get_or_compute(
            f"doc:{doc_id}", lambda: load_doc(rt, doc_id), ttl=60, error_ttl=5, cache_errors=NoSuchDoc
        )
    except (NoSuchDoc, nj.CachedError):  # the one that looked, and those the cache told
        await respond(send, 404, {"error": f"no document {doc_id}"})
        return
    await respond(send, 200, {"id": doc_id, "text": text})


# -- the service ------------------------------------------------------------------------------------


async def main(rt: nj.Runtime) -> None:
    async with rt.transaction() as conn:
        await conn.execute(CREATE_DOCS)
    config = Config()
    config.bind = [f"127.0.0.1:{PORT}"]
    config.graceful_timeout = 5.0  # the requests in flight at SIGTERM: well inside main_grace
    print(f"READY http://127.0.0.1:{PORT} jobs in {rt.backend.url}", flush=True)
    # Returns once shutdown_requested is set and the requests in flight have been answered.
    await serve(web_app(rt), config, shutdown_trigger=rt.shutdown_requested.wait)  # type: ignore[arg-type]
    print("server drained", flush=True)


if __name__ == "__main__":
    nj.run(main, app=app, backend=JOBS_URL, main_grace=10)
    print("exited cleanly", flush=True)
