"""`rt.lock` never lets two blocks run at once: a holder frozen (SIGSTOP) past its ttl loses the
lock to another process, and once it resumes its block takes no step before it is cancelled,
whichever of the block and the lock's renewal task Trio runs first.

Two real processes (`lock_holder.py`) on one store: the holder steps inside its block; the test
freezes it while it is idle (its Trio loop blocked in ``epoll_wait`` with a timeout, so no step
of the block was under way, and on SQLite not inside a write transaction, which would keep the
other process out), lets the taker acquire, then resumes the holder. A step of the holder's block
that starts after the taker acquired is a block run unlocked.
"""

from __future__ import annotations

import platform
import random
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from tests.processes.procutil import Proc, Spawner, Store, wait_until

HOLDER = str(Path(__file__).with_name("lock_holder.py"))
ROUNDS = 20
TTL = 0.4
_EPOLL_WAITS = {"x86_64": {"232", "281", "441"}, "aarch64": {"22", "441"}}.get(platform.machine(), set())

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _EPOLL_WAITS, reason="reads a frozen process's syscall from /proc"
)


def _events(proc: Proc) -> list[tuple[str, int, float]]:
    out = []
    for line in proc.stdout().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((parts[0], int(parts[1]), float(parts[2])))
    return out


def _when(proc: Proc, event: str, n: int, timeout: float = 20.0) -> float:
    def seen() -> float | None:
        return next((t for e, m, t in _events(proc) if e == event and m == n), None)

    found: float = wait_until(seen, timeout=timeout, what=f"{proc.name}: {event} {n}\n{proc.describe()}", interval=0.005)
    return found


def _idle(pid: int) -> bool:
    """The stopped process's Trio thread is blocked in epoll_wait with a timeout: every task of
    it was waiting, none was between two checkpoints."""
    fields = Path(f"/proc/{pid}/task/{pid}/syscall").read_text().split()
    return fields[0] in _EPOLL_WAITS and int(fields[4], 16) != 0


def _write_locked(path: str) -> bool:
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc) and "busy" not in str(exc):
            raise
        return True
    finally:
        conn.close()


def _freeze_idle(proc: Proc, store: Store) -> None:
    for _ in range(500):
        proc.signal(signal.SIGSTOP)
        stat = Path(f"/proc/{proc.pid}/task/{proc.pid}/stat")
        wait_until(lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "T", timeout=5, what="the stop", interval=0.001)
        if _idle(proc.pid) and not (store.kind == "sqlite" and _write_locked(str(store.path))):
            return
        proc.signal(signal.SIGCONT)
        time.sleep(random.uniform(0.001, 0.005))
    pytest.fail(f"{proc.name} was never caught idle:\n{proc.describe()}")


def test_a_holder_frozen_past_its_ttl_takes_no_step_after_another_acquired(spawner: Spawner, tmp_path: Path, store: Store) -> None:
    folder = tmp_path / "signals"
    folder.mkdir()
    argv = (store.url, str(folder), str(ROUNDS), str(TTL))
    holder = spawner.script(HOLDER, "hold", *argv, name="holder")
    taker = spawner.script(HOLDER, "take", *argv, name="taker")
    holder.wait_ready()
    taker.wait_ready()
    acquired: dict[int, tuple[int, float]] = {}  # taker's round -> (holder's attempt, when the taker acquired)
    attempt = 0
    voided = 0
    while len(acquired) < ROUNDS:
        _when(holder, "ACQUIRED", attempt)
        wait_until(
            lambda: sum(e == "STEP" and n == attempt for e, n, _ in _events(holder)) >= 2,
            timeout=20, what=f"two steps of attempt {attempt}\n{holder.describe()}", interval=0.005,
        )  # fmt: skip
        time.sleep(random.uniform(0, TTL / 3))  # anywhere between two renewals
        _freeze_idle(holder, store)
        if any(e == "LOST" and n == attempt for e, n, _ in _events(holder)):  # lost before the freeze: a slow machine
            holder.signal(signal.SIGCONT)
            voided += 1
            assert voided <= ROUNDS, f"the holder keeps losing its lock unfrozen:\n{holder.describe()}"
            attempt += 1
            continue
        r = len(acquired)
        (folder / f"take-{r}").touch()
        acquired[r] = (attempt, _when(taker, "ACQUIRED", r))
        holder.signal(signal.SIGCONT)
        _when(holder, "LOST", attempt)
        (folder / f"free-{r}").touch()
        _when(taker, "RELEASED", r)
        attempt += 1

    events = _events(holder)
    late = {
        r: [t - at for e, n, t in events if e == "STEP" and n == k and t > at] for r, (k, at) in acquired.items()
    }
    late = {r: steps for r, steps in late.items() if steps}
    assert not late, (
        f"{len(late)} of {ROUNDS} rounds: the frozen holder's block took a step after the other process "
        f"acquired the lock (round: seconds after): {late}"
    )
