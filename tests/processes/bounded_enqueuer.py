"""An enqueuer of a bounded queue, run as its own OS process by test_bounded_queues.py.

    python bounded_enqueuer.py BACKEND_URL MAX_LENGTH COUNT START_AT

Waits until the wall clock reaches START_AT (so that every process starts enqueueing at the
same moment), then tries COUNT single enqueues into the queue "bounded" (`max_length`
MAX_LENGTH, `push_timeout=0`, no workers anywhere) and prints ``ACCEPTED <n> REFUSED <m>``.
"""

from __future__ import annotations

import sys
import time

import trio

import nursery_jobs as nj

app = nj.App()
app.queue("bounded", max_workers=1, max_length=int(sys.argv[2]), push_timeout=0)


@app.job(queue="bounded")
async def item(ctx: nj.JobContext, n: int) -> None:
    pass


async def main(rt: nj.Runtime) -> None:
    await trio.sleep(max(0.0, float(sys.argv[4]) - time.time()))
    accepted = refused = 0
    for n in range(int(sys.argv[3])):
        try:
            await item.enqueue(n=n)
            accepted += 1
        except nj.QueueFull:
            refused += 1
    print(f"ACCEPTED {accepted} REFUSED {refused}", flush=True)


if __name__ == "__main__":
    nj.run(main, app=app, backend=sys.argv[1], queues=[])
