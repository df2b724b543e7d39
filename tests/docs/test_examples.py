"""The examples are run as users run them: as subprocesses (the benchmarks: test_benchmark_ledger.py).

Every wait here is bounded (subprocess timeouts, a deadline on reading output). Speed is never
asserted: the shutdown bounds are the runtime's own promises (grace, flush_bound), not timings.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.py"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}

# The runtime's default flush_bound: how long shutdown gives cancelled attempts and the final flush.
FLUSH_BOUND = 5.0
# Slack for interpreter start-up and exit on a loaded 2-core machine; not a speed claim.
SLACK = 5.0


def run_quickstart(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(QUICKSTART), *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_quickstart(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(QUICKSTART), *args],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def read_until(proc: subprocess.Popen[bytes], pattern: str, timeout: float) -> str:
    """Read the child's stdout until a line matches `pattern`; fail after `timeout` seconds."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            seen += chunk
            if re.search(pattern, seen.decode(errors="replace"), re.MULTILINE):
                return seen.decode()
    proc.kill()
    _, err = proc.communicate(timeout=10)
    pytest.fail(f"no line matching {pattern!r} within {timeout} s; stdout:\n{seen.decode()}\nstderr:\n{err.decode()}")


def signal_and_wait(
    proc: subprocess.Popen[bytes], signals: list[signal.Signals], *, bound: float, pause: float = 0.3
) -> tuple[str, float]:
    """Send `signals` (with a short pause between them), then wait at most `bound` seconds for the
    process to exit. Returns its remaining stdout and the seconds from the first signal to exit."""
    sent_at = time.monotonic()
    for i, sig in enumerate(signals):
        if i:
            time.sleep(pause)
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=bound + SLACK)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
        pytest.fail(f"still running {bound + SLACK} s after {signals}; stdout:\n{out.decode()}\nstderr:\n{err.decode()}")
    took = time.monotonic() - sent_at
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out.decode()}\nstderr:\n{err.decode()}"
    assert "Traceback" not in err.decode(), err.decode()
    return out.decode(), took


def summary_rows(out: str) -> dict[str, dict[str, int]]:
    header = re.search(r"^queue\s+(.+)$", out, re.MULTILINE)
    assert header, out
    columns = header.group(1).split()
    rows = {}
    for queue in ("index", "webhook"):
        line = re.search(rf"^{queue}\s+([\d\s]+)$", out, re.MULTILINE)
        assert line, out
        rows[queue] = dict(zip(columns, map(int, line.group(1).split())))
    return rows


def test_quickstart_runs_to_completion_and_prints_the_summary() -> None:
    result = run_quickstart(timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    out = result.stdout
    assert "summary: all 300 jobs final" in out
    assert re.search(r"^urgent doc 150: completed after", out, re.MULTILINE), out
    rows = summary_rows(out)
    # Deterministic by construction: docs 7, 47, 87, 127 fail once; events 3, 53, 103 fail once;
    # events 10, 60, 110 go to an endpoint that answers 410 and are discarded.
    assert (rows["index"]["completed"], rows["index"]["retried"], rows["index"]["discarded"]) == (150, 4, 0)
    assert (rows["webhook"]["completed"], rows["webhook"]["retried"], rows["webhook"]["discarded"]) == (147, 3, 3)


def test_quickstart_jobs_flag_changes_the_work() -> None:
    result = run_quickstart("--jobs", "20", timeout=60)
    assert result.returncode == 0, result.stderr
    assert "summary: all 20 jobs final" in result.stdout
    assert summary_rows(result.stdout)["index"]["completed"] == 10


def test_sigint_shuts_down_gracefully_and_exits_0() -> None:
    grace = 5.0
    proc = start_quickstart("--jobs", "5000", "--grace", str(grace))
    head = read_until(proc, r"^\[\s*[\d.]+ s\] index", timeout=30)
    out, took = signal_and_wait(proc, [signal.SIGINT], bound=grace + FLUSH_BOUND)
    out = head + out
    assert "graceful shutdown (grace 5 s)" in out, out
    # Simulated jobs take at most 0.15 s: every running one finishes inside the grace.
    assert "interrupted: none" in out, out
    assert re.search(r"not started: \d+ queued jobs", out), out
    assert took < grace + SLACK, f"took {took:.1f} s to stop"


def test_sigterm_interrupts_what_outlives_the_grace() -> None:
    grace = 1.0
    # Jobs now take 0.8 to 6 s: those running at the signal outlive a 1 s grace.
    proc = start_quickstart("--jobs", "5000", "--work-scale", "40", "--grace", str(grace))
    head = read_until(proc, r"^\[\s*[\d.]+ s\] index", timeout=30)
    out, took = signal_and_wait(proc, [signal.SIGTERM], bound=grace + FLUSH_BOUND)
    out = head + out
    assert "graceful shutdown (grace 1 s)" in out, out
    cut = re.search(r"interrupted: (\d+) running jobs were cut by the shutdown", out)
    assert cut and int(cut.group(1)) >= 1, out


def test_second_signal_skips_the_grace() -> None:
    grace = 120.0
    proc = start_quickstart("--jobs", "5000", "--work-scale", "40", "--grace", str(grace))
    head = read_until(proc, r"^\[\s*[\d.]+ s\] index", timeout=30)
    # Without the second signal this would wait up to 120 s for jobs of up to 6 s.
    out, took = signal_and_wait(proc, [signal.SIGTERM, signal.SIGINT], bound=FLUSH_BOUND)
    out = head + out
    cut = re.search(r"interrupted: (\d+) running jobs were cut by the shutdown", out)
    assert cut and int(cut.group(1)) >= 1, out
    assert took < FLUSH_BOUND + SLACK, f"took {took:.1f} s to stop"


def test_memory_benchmark_is_importable_without_side_effects() -> None:
    code = "import benchmarks.memory_throughput as m; assert m.SMOKE.jobs < m.Sizes().jobs; print('ok')"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# -- the user docs: every block a user would copy is code that runs --------------------------------

DOCS = ROOT / "docs"
DOC_PAGES = ["index.md", "quickstart.md", "concepts.md", "shutdown.md", "testing.md", "resources.md", "concurrency.md", "batches.md"]
TESTING_EXAMPLE = ROOT / "tests" / "docs" / "test_docs_testing_example.py"
KIT_EXAMPLE = ROOT / "examples" / "test_service.py"
EXCERPT_SOURCES = [QUICKSTART, TESTING_EXAMPLE, KIT_EXAMPLE, ROOT / "examples" / "bulk_index.py"]


def python_blocks() -> list[tuple[str, int, str]]:
    blocks = []
    for page in DOC_PAGES:
        text = (DOCS / page).read_text()
        for match in re.finditer(r"^```python\n(.*?)^```$", text, re.MULTILINE | re.DOTALL):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append((page, line, match.group(1)))
    return blocks


BLOCKS = python_blocks()


def test_the_docs_have_python_blocks() -> None:
    assert len(BLOCKS) >= 10, [f"{page}:{line}" for page, line, _ in BLOCKS]


@pytest.mark.parametrize("page,line,code", BLOCKS, ids=[f"{page}:{line}" for page, line, _ in BLOCKS])
def test_every_python_block_in_the_docs_is_verbatim_source_or_runs(page: str, line: int, code: str, tmp_path: Path) -> None:
    """A block is either an excerpt, copied verbatim from a file the suite runs, or a complete
    program, which is run here and must exit 0."""
    if any(code in source.read_text() for source in EXCERPT_SOURCES):
        return
    script = tmp_path / "block.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"docs/{page}:{line} failed:\n{result.stdout}\n{result.stderr}"


@pytest.mark.parametrize("example", [KIT_EXAMPLE, TESTING_EXAMPLE], ids=lambda p: p.name)
def test_the_testing_page_includes_the_example_tests_verbatim(example: Path) -> None:
    page = (DOCS / "testing.md").read_text()
    assert f"```python\n{example.read_text()}```" in page, (
        f"docs/testing.md must include {example.relative_to(ROOT)} verbatim; copy the file into the page"
    )


def test_the_concepts_page_lists_every_tuning_constant() -> None:
    import attrs

    import nursery_jobs as nj
    from nursery_jobs import config

    assert config.__doc__ is not None
    in_table = set(re.findall(r"^\| `([a-z_]+)`", config.__doc__, re.MULTILINE))
    in_table |= set(re.findall(r"^\| `[a-z_]+` / `([a-z_]+)`", config.__doc__, re.MULTILINE))
    in_table |= set(re.findall(r" / `([a-z_]+)` \|", config.__doc__, re.MULTILINE))
    settings = {f.name for f in attrs.fields(nj.RuntimeSettings)}
    concepts = (DOCS / "concepts.md").read_text()
    missing = sorted(name for name in in_table | settings if f"`{name}`" not in concepts)
    assert not missing, f"docs/concepts.md does not list: {missing} (see nursery_jobs/config.py's table)"


def test_the_quickstart_page_shows_every_public_name_it_promises() -> None:
    import nursery_jobs as nj

    page = (DOCS / "quickstart.md").read_text()
    calls = ["App()", "app.queue(", "@app.job(", ".enqueue(", ".enqueue_many(", ".options(", "open_runtime(",
             "nj.run(", "rt.wait(", "rt.cancel(", "rt.get_job(", "rt.stats(", "run_blocking(", "ctx.children()"]
    assert [c for c in calls if c not in page] == []
    for name in ("App", "RetryPolicy", "JobContext", "Snooze", "Discard", "run_blocking", "open_runtime", "run"):
        assert name in nj.__all__
