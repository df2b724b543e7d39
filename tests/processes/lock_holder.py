"""One side of the frozen-holder test (`test_lock_fencing.py`), in its own OS process.

``hold URL DIR ROUNDS TTL``: attempt after attempt (until killed), takes the lock and steps
inside its block (``trio.sleep(STEP)``, then a line) until the lock is lost, then takes it
again; ROUNDS is not used.
``take URL DIR ROUNDS TTL``: for each round, waits for the file ``DIR/take-<round>``, takes the
lock, holds it until the file ``DIR/free-<round>`` appears, then releases it.

Each line on stdout is ``EVENT N TIME`` (N: the holder's attempt or the taker's round; TIME:
`time.time()`, one clock for both processes on one machine): ACQUIRED, STEP (written as the step
starts), LOST, RELEASED. Every wait is bounded.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import trio

import nursery_jobs as nj

NAME = "frozen-holder"
STEP = 0.02
BOUND = 60.0


def say(event: str, round_: int) -> None:
    print(f"{event} {round_} {time.time():.6f}", flush=True)


async def wait_for(path: Path) -> None:
    with trio.fail_after(BOUND):
        while not path.exists():
            await trio.sleep(0.005)


async def hold(rt: nj.Runtime, ttl: float) -> None:
    for r in itertools.count():
        try:
            async with rt.lock(NAME, ttl=ttl, timeout=BOUND):
                say("ACQUIRED", r)
                with trio.fail_after(BOUND):
                    while True:
                        await trio.sleep(STEP)
                        say("STEP", r)
        except nj.LockLost:
            say("LOST", r)


async def take(rt: nj.Runtime, folder: Path, rounds: int, ttl: float) -> None:
    for r in range(rounds):
        await wait_for(folder / f"take-{r}")
        async with rt.lock(NAME, ttl=ttl, timeout=BOUND):
            say("ACQUIRED", r)
            await wait_for(folder / f"free-{r}")
        say("RELEASED", r)


async def main(role: str, url: str, folder: Path, rounds: int, ttl: float) -> None:
    async with nj.open_runtime(nj.App(), backend=url, queues=[]) as rt:
        print("READY", flush=True)
        if role == "hold":
            await hold(rt, ttl)
        else:
            await take(rt, folder, rounds, ttl)


if __name__ == "__main__":
    role, url, folder, rounds, ttl = sys.argv[1:]
    assert role in ("hold", "take"), role
    trio.run(main, role, url, Path(folder), int(rounds), float(ttl))
