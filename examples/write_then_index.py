"""Write a document, publish its event, answer within 2 s whether it is indexed yet.

    .venv/bin/python examples/write_then_index.py     # jobs and documents in write_then_index.db

A request (`write_doc`) does, in one transaction: insert the document's row, enqueue its index
job (`enqueue_tx`: the request knows that job's id, so it can wait for it) and publish the
`doc.written` event (`nj.publish`) for every other follow-up, here the owner's notification; a
webhook or an audit log would subscribe the same way, with no change to the request. All three
commit together or not at all. After the commit the request waits up to 2 s for the index job's
receipt and answers ``{"id": ..., "indexed": true|false}``; `false` means "not yet": the job is
committed and runs anyway.

Why the index job is enqueued, not subscribed: a receipt is a job's, and an event's jobs do not
exist when the request publishes -- a relay makes them a moment after the commit, in whichever
process claims the event. The job a request waits for is the one it enqueues itself.

Backpressure: at most `max_waiters` (64) requests wait for receipts of one queue at once. The
65th gets its answer at once, `indexed: false`, instead of joining a pile of waiters that would
hold every request open. `main` shows it: one document is indexed within its 2 s; then 65 long
documents arrive together while the index workers are busy with them (each takes 3 s): 64
requests wait their 2 s and answer false, the 65th answers false at once.

Settings, from the environment: `JOBS_URL` (default `sqlite:///write_then_index.db`; a
``postgresql://`` URL works too, its schema migrated first with `nursery-jobs migrate`).

Docs: docs/outbox.md; run by tests/docs/test_write_then_index.py.
"""

from __future__ import annotations

import os
from typing import Any

import trio

import nursery_jobs as nj
from nursery_jobs.infra.owner import open_owner  # the one way to run tasks at once (the spawn lint)

JOBS_URL = os.environ.get("JOBS_URL", "sqlite:///write_then_index.db")
POSTGRES = JOBS_URL.startswith(("postgresql://", "postgres://"))
CREATE_DOCS = (
    "CREATE TABLE IF NOT EXISTS documents (id bigserial PRIMARY KEY, owner text NOT NULL, body text NOT NULL)"
    if POSTGRES
    else "CREATE TABLE IF NOT EXISTS documents (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, body TEXT NOT NULL)"
)
P = "%s" if POSTGRES else "?"  # the database's own placeholder
WAIT = 2.0  # how long a request waits for its document's index job

app = nj.App()
# Requests wait on this queue's receipts: look for work every 0.1 s if a wake-up is ever missed.
app.queue("index", max_workers=4, timeout=30, poll_interval=0.1)
app.queue("notify", max_workers=2, timeout=30)
notified: list[tuple[str, int]] = []


@app.job(queue="index")
async def index_doc(ctx: nj.JobContext, doc_id: int, chars: int) -> None:
    # Stands for an idempotent call to the search engine: longer documents take longer.
    await trio.sleep(0.05 if chars < 10_000 else 3.0)


@app.subscribe("doc.written", args=lambda p: {"doc_id": p["doc_id"], "owner": p["owner"]})
@app.job(queue="notify")
async def notify_owner(ctx: nj.JobContext, doc_id: int, owner: str) -> None:
    notified.append((owner, doc_id))  # stands for the mail to the owner


async def write_doc(rt: nj.Runtime, owner: str, text: str) -> dict[str, Any]:
    """One request: the row, its index job and its event in one transaction; then the answer."""
    async with rt.transaction() as conn:
        cur = await conn.execute(f"INSERT INTO documents (owner, body) VALUES ({P}, {P}) RETURNING id", (owner, text))
        (doc_id,) = await cur.fetchone()
        job_id = await index_doc.enqueue_tx(conn, doc_id=doc_id, chars=len(text))
        await nj.publish(conn, "doc.written", {"doc_id": doc_id, "owner": owner, "chars": len(text)})
    receipt = await rt.wait(job_id, timeout=WAIT)
    return {"id": doc_id, "indexed": receipt.done and receipt.state is nj.JobState.COMPLETED}


async def burst(rt: nj.Runtime, requests: int) -> list[tuple[dict[str, Any], float]]:
    """`requests` long documents written at once: each answer with how long it took."""
    answers: list[tuple[dict[str, Any], float]] = []

    async def one(n: int) -> None:
        start = trio.current_time()
        answer = await write_doc(rt, f"owner{n}@example.com", "x" * 20_000)
        answers.append((answer, trio.current_time() - start))

    async with open_owner("burst") as requests_at_once:  # what a web server does for its requests
        for n in range(requests):
            requests_at_once.spawn(one, n, name=f"request {n}")
    return answers


async def main(rt: nj.Runtime) -> None:
    async with rt.transaction() as conn:
        await conn.execute(CREATE_DOCS)
    print("one document:", await write_doc(rt, "ada@example.com", "hello"))
    answers = await burst(rt, rt.settings.max_waiters + 1)
    at_once = [a for a, took in answers if took < WAIT / 2]
    waited = [a for a, took in answers if took >= WAIT / 2]
    print(f"burst of {len(answers)}: {len(waited)} waited {WAIT:g} s, {len(at_once)} answered at once;",
          f"indexed within the wait: {sum(a['indexed'] for a, _ in answers)}")  # fmt: skip
    with trio.fail_after(10):
        while len(notified) < len(answers) + 1:  # every event became its owner's notification
            await trio.sleep(0.05)
    print("owners notified:", len(notified))


if __name__ == "__main__":
    nj.run(main, app=app, backend=JOBS_URL)
