"""Maintenance work on a schedule: periodic jobs that every process runs, with no leader, and a lock.

    .venv/bin/python examples/maintenance.py                               # about 5 s, exits 0
    .venv/bin/python examples/maintenance.py --backend sqlite:///jobs.db   # run it in two shells

Two schedules on one "maintenance" queue: a short heartbeat every other second (so there is
something to watch) and a nightly purge at 03:30 Paris time that, after a downtime, runs once for
the night it missed. Start the script in several shells on one SQLite file or PostgreSQL
database: each tick is still enqueued once, by whichever process gets there first. At the end
it prints what `rt.periodic()` knows of each schedule, holding a lock that every process shares
while it reads them.

Docs: docs/periodic.md, docs/locks.md.
"""

from __future__ import annotations

import argparse
import sys

import trio

import nursery_jobs as nj

app = nj.App()
app.queue("maintenance", max_workers=1, timeout=600)


@app.periodic("*/2 * * * * *")  # 6 fields: the first is seconds
@app.job(queue="maintenance")
async def heartbeat(ctx: nj.JobContext) -> None:
    print(f"heartbeat job {ctx.id}", flush=True)


@app.periodic("30 3 * * *", timezone="Europe/Paris", missed="run_once")
@app.job(queue="maintenance")
async def purge_old_sessions(ctx: nj.JobContext, older_than_days: int = 30) -> None:
    await trio.sleep(0.1)  # the real work: DELETE FROM sessions WHERE last_seen < now() - ...


async def main(rt: nj.Runtime, seconds: float) -> list[nj.PeriodicInfo]:
    await trio.sleep(seconds)
    # One report at a time across every process on the store (docs/locks.md).
    async with rt.lock("maintenance-report", ttl=10, timeout=5):
        schedules = await rt.periodic()
    for info in schedules:
        last = info.last_tick.isoformat() if info.last_tick else "never"
        outcome = info.last_outcome.value if info.last_outcome else "-"
        print(f"{info.name} ({info.schedule}, {info.timezone}): last tick {last}, its job {outcome}; "
              f"next {info.next_tick.isoformat() if info.next_tick else '-'}")  # fmt: skip
    return schedules


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="memory://")
    parser.add_argument("--seconds", type=float, default=5.0)
    options = parser.parse_args()
    nj.run(lambda rt: main(rt, options.seconds), app=app, backend=options.backend)
    sys.exit(0)
