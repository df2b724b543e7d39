"""A search indexer that writes documents in bulk: one `@app.batch_job` call per batch of up to
50 documents, one bulk request to the search engine per call.

Each written document enqueues its own index job (as a request handler would); the runtime
collects them into batches: 50 at a time while a backlog waits, and at most 0.2 s after the
first one when they trickle in. The fake engine below is down for its first request (the handler
raises: every job of that batch fails one attempt and is retried with backoff), and refuses one
malformed document every time (the handler returns it as not handled: retried on its own attempt
count, then discarded once its 3 attempts are spent, while the rest of its batch completes).

Run it: `python examples/bulk_index.py` (the embedded memory backend; pass a URL to keep jobs,
e.g. `python examples/bulk_index.py sqlite:///jobs.db`).
"""

from __future__ import annotations

import sys
from typing import AsyncIterator, TypedDict

import attrs
import trio

import nursery_jobs as nj

app = nj.App()
app.queue("index", max_workers=2, timeout=30)


class Doc(TypedDict):
    doc_id: int
    title: str


@attrs.define
class SearchEngine:
    """A stand-in for Elasticsearch's or Meilisearch's bulk endpoint."""

    index: dict[int, str] = attrs.Factory(dict)
    requests: list[int] = attrs.Factory(list)
    """The size of each bulk request that reached the engine."""
    down_for: int = 1
    """Requests refused before the engine is up (as while it starts)."""

    async def bulk(self, docs: list[Doc]) -> set[int]:
        """Index `docs`; returns the ids it rejected."""
        await trio.sleep(0.05)  # one round trip for the whole batch
        if self.down_for > 0:
            self.down_for -= 1
            raise ConnectionError("search engine unavailable")
        self.requests.append(len(docs))
        rejected = {d["doc_id"] for d in docs if not d["title"]}
        self.index.update((d["doc_id"], d["title"]) for d in docs if d["doc_id"] not in rejected)
        return rejected


SEARCH = SearchEngine()


@app.resource
async def engine() -> AsyncIterator[SearchEngine]:
    yield SEARCH  # a real service opens its client here (and closes it after the last job)


@app.batch_job(queue="index", max_size=50, max_wait=0.2, max_attempts=3, retry=nj.RetryPolicy(base=0.5))
async def index_docs(ctx: nj.BatchContext, jobs: list[nj.BatchJob[Doc]]) -> list[nj.BatchJob[Doc]]:
    rejected = await ctx.resources[engine].bulk([job.args for job in jobs])
    return [job for job in jobs if job.args["doc_id"] in rejected]  # retried; the rest complete


async def main(rt: nj.Runtime) -> dict[str, object]:
    ids = []
    for n in range(120):  # a backlog: written faster than they are indexed
        ids.append(await index_docs.enqueue(doc_id=n, title="" if n == 7 else f"document {n}"))
    for n in range(120, 125):  # then a trickle: each waits at most max_wait for company
        await trio.sleep(0.5)
        ids.append(await index_docs.enqueue(doc_id=n, title=f"document {n}"))
    states: dict[str, int] = {}
    for job_id in ids:
        receipt = await rt.wait(job_id, timeout=30)
        states[receipt.state.value] = states.get(receipt.state.value, 0) + 1
    search = SEARCH
    summary: dict[str, object] = {
        "states": states,
        "indexed": len(search.index),
        "bulk_requests": search.requests,
        "malformed": (await rt.get_job(ids[7])).errors[-1].message,
    }
    print(f"{len(ids)} index jobs: {states}")
    print(f"{len(search.index)} documents indexed in {len(search.requests)} bulk requests of {search.requests}")
    print(f"document 7: {summary['malformed']}")
    return summary


if __name__ == "__main__":
    nj.run(main, app=app, backend=sys.argv[1] if len(sys.argv) > 1 else "memory://")
