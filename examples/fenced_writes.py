"""Fenced writes: a lock's fencing token lets another store refuse a stale holder's write.

    .venv/bin/python examples/fenced_writes.py                              # about 1 s, exits 0
    .venv/bin/python examples/fenced_writes.py --backend sqlite:///jobs.db

Two holders of the lock "nightly-report" in turn write the report to a store the lock does not
reach (`ReportStore`, here in memory; in a service, a table with a `fence` column). The first
holder hands its write to a job, which a backlog delays: by the time it runs, the first block
has ended and the second holder has taken the lock and written its report. The store keeps the
largest token it has seen and refuses a write with a smaller one, so the late write changes
nothing. A write on its way (in a queue, on the wire, from a process frozen past its ttl) is
what no deadline can stop; its token is what fences it.

Docs: docs/locks.md (fencing tokens).
"""

from __future__ import annotations

import argparse
import sys

import trio

import nursery_jobs as nj

app = nj.App()
LOCK = "nightly-report"
BACKLOG = 0.5
"""How long the first holder's write waits before it runs (a busy queue, a retry)."""


class ReportStore:
    """The other store: one report, with the largest token of the writes it took."""

    def __init__(self) -> None:
        self.report: str | None = None
        self.fence = 0
        self.refused: list[tuple[str, int]] = []

    def write(self, body: str, token: int) -> bool:
        """Take `body` if `token` is larger than every token seen so far. In SQL, one statement:
        ``UPDATE reports SET body = %s, fence = %s WHERE id = %s AND fence < %s``."""
        if token <= self.fence:
            self.refused.append((body, token))
            return False
        self.report, self.fence = body, token
        return True


REPORTS = ReportStore()


def write(body: str, token: int) -> bool:
    stored = REPORTS.write(body, token)
    print(f"{body!r} with token {token}: {'stored' if stored else f'refused (the store has seen token {REPORTS.fence})'}")
    return stored


@app.job()
async def write_report(ctx: nj.JobContext, body: str, token: int) -> bool:
    return write(body, token)


async def main(rt: nj.Runtime) -> ReportStore:
    async with rt.lock(LOCK, ttl=10, timeout=5) as lock:
        print(f"holder 1 took {lock.name!r} with token {lock.token}; its write waits in a backlog")
        late = await write_report.options(delay=BACKLOG).enqueue(body="report by holder 1", token=lock.token)
    async with rt.lock(LOCK, ttl=10, timeout=5) as lock:
        print(f"holder 2 took {lock.name!r} with token {lock.token}")
        write("report by holder 2", lock.token)
    receipt = await rt.wait(late, timeout=5 + BACKLOG)
    assert receipt.done, receipt
    print(f"the report: {REPORTS.report!r} (token {REPORTS.fence})")
    return REPORTS


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="memory://")
    options = parser.parse_args()
    nj.run(main, app=app, backend=options.backend)
    sys.exit(0)
