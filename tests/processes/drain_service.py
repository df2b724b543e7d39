"""A service whose `main` has a request in flight when SIGTERM arrives: run by test_main_grace.py.

    python drain_service.py BACKEND_URL MAIN_GRACE REQUEST_SECONDS

`main` prints READY, then serves one request: it works for REQUEST_SECONDS, enqueues an index
job and waits for its receipt, then answers (prints ANSWERED and the job's state). It returns
once `rt.shutdown_requested` is set, as a server handed it as its shutdown trigger would.
"""

from __future__ import annotations

import sys

import trio

import nursery_jobs as nj

app = nj.App()


@app.job()
async def index(ctx: nj.JobContext, doc_id: int) -> None:
    await trio.sleep(0.05)


async def main(rt: nj.Runtime) -> None:
    print("READY", flush=True)
    try:
        await trio.sleep(float(sys.argv[3]))  # the request's own work, in flight at the signal
        job_id = await index.enqueue(doc_id=1)
        receipt = await rt.wait(job_id, timeout=5)
        print(f"ANSWERED {job_id} {receipt.state.value}", flush=True)
    except trio.Cancelled:
        print("REQUEST CANCELLED", flush=True)
        raise
    await rt.shutdown_requested.wait()
    print("MAIN RETURNED", flush=True)


if __name__ == "__main__":
    nj.run(main, app=app, backend=sys.argv[1], grace=5, main_grace=float(sys.argv[2]))
    print("EXITED CLEANLY", flush=True)
