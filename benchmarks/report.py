"""What every benchmark script prints and judges the same way: percentiles, the paired-round
ratio, the results table, and the closing lines (load, elapsed time, missed targets, --check).
No database imports, so the memory benchmark can use it too."""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Mapping, Sequence

__all__ = ["conclude", "load_average", "median_ratio", "percentile", "render_table"]


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def median_ratio(runtime: Sequence[float], baseline: Sequence[float]) -> float:
    """The judged ratio: the median of per-round (paired, back-to-back) ratios."""
    return statistics.median(r / b for r, b in zip(runtime, baseline))


def render_table(rows: Sequence[Sequence[str]]) -> str:
    """Rows of 4 cells (metric, value, target, result); the first row is the header."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def load_average() -> str:
    """The machine's 1, 5 and 15 minute load averages, as the closing and opening lines print
    them ("0.52 0.61 0.70")."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def conclude(verdicts: Mapping[str, bool], *, started: float, smoke: bool, check: bool) -> int:
    """Print the closing lines; the exit status is 1 only with --check and a missed target."""
    print(f"load average at end: {load_average()}")
    note = "; --smoke: sizes too small for the figures to mean anything" if smoke else ""
    print(f"\n({time.monotonic() - started:.1f} s{note})")
    failed = [name for name, ok in verdicts.items() if not ok]
    if failed:
        print(f"missed: {', '.join(failed)}")
        if check:
            print(f"FAIL: {', '.join(failed)}", file=sys.stderr)
            return 1
    return 0
