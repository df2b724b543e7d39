"""The hand-written loop's own processes, for a baseline measured in several processes.

A baseline has to own what it runs without the runtime (see this package's doc), its worker
processes too: the runtime's side starts its processes through a job (`durable_side`), the
loop's side cannot. Each child speaks a line protocol on its stdin and stdout: it prints
``ready``, waits for a line, does its work, prints ``done``, and waits for a last line before it
exits. Every wait for a child's line is bounded.
"""

from __future__ import annotations

import select
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

__all__ = ["LoopProcesses", "loop_processes"]

LINE_BOUND = 300.0
"""Seconds to wait for one line of a child: a drain of the benchmark's size takes seconds."""


class LoopProcesses:
    def __init__(self, kids: list[subprocess.Popen[str]]) -> None:
        self.kids = kids

    @property
    def pids(self) -> list[int]:
        return [k.pid for k in self.kids]

    def expect(self, word: str) -> None:
        """Wait (bounded) until every child has printed `word`."""
        for k in self.kids:
            assert k.stdout is not None
            ready, _, _ = select.select([k.stdout], [], [], LINE_BOUND)
            line = k.stdout.readline().strip() if ready else None
            if line != word:
                got = "nothing" if line is None else repr(line)
                raise RuntimeError(f"loop process {k.pid} printed {got} where {word!r} was expected")

    def tell(self, word: str) -> None:
        for k in self.kids:
            assert k.stdin is not None
            k.stdin.write(word + "\n")
            k.stdin.flush()


@contextmanager
def loop_processes(cmd: Sequence[str], count: int) -> Iterator[LoopProcesses]:
    """Start `count` children running `cmd`, wait until each says ``ready``; on exit close their
    stdin and wait for them (at most 60 s each, then kill), and fail on a non-zero exit."""
    kids: list[subprocess.Popen[str]] = []
    failed: list[str] = []
    try:
        for _ in range(count):
            kids.append(subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        procs = LoopProcesses(kids)
        procs.expect("ready")
        yield procs
    finally:
        end = time.monotonic() + 60
        for k in kids:
            if k.stdin is not None:
                k.stdin.close()
            try:
                code = k.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                k.kill()
                code = k.wait()
            if code != 0:
                failed.append(f"{k.pid} exited with {code}")
    if failed:
        raise RuntimeError("loop processes failed: " + ", ".join(failed))
