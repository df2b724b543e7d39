"""The quickstart service: two queues, a few hundred jobs, retries, a snooze, a discard, progress
and a summary, on the embedded memory backend.

    .venv/bin/python examples/quickstart.py             # about 4 s, exits 0
    .venv/bin/python examples/quickstart.py --jobs 5000  # long enough to press Ctrl-C

Two queues, each with its own pool: "index" runs 4 jobs at once with a 30 s timeout, "webhook" 8
at once with a 15 s timeout (deliveries mostly wait on remote endpoints, so more run at once, and
each is cut sooner). A slow endpoint can fill the webhook pool but never delay indexing. The
work itself is simulated with `trio.sleep`; everything else is the real runtime.

Ctrl-C (SIGINT) or SIGTERM stops it gracefully: `nj.run` cancels `main`, stops claiming, gives the
running jobs up to `--grace` seconds, interrupts what is left, and returns None. A second signal
skips what is left of the grace. Either way the script prints what was cut and exits 0.

Docs: docs/quickstart.md walks through this file.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import trio

import nursery_jobs as nj

# -- declarations: no I/O, checked at import -------------------------------------------------------

app = nj.App()
app.queue("index", max_workers=4, timeout=30)
app.queue("webhook", max_workers=8, timeout=15)

# The default policy waits 1 s, 2 s, 4 s ... before attempts 2, 3, 4 ... A demo should not wait.
FAST_RETRY = nj.RetryPolicy(base=0.2, factor=2.0, cap=2.0, jitter=0.1)

ENDPOINTS = [f"https://hooks.example/{n:02d}" for n in range(20)]


def endpoint_for(event_id: int) -> str:
    """Mostly round robin; every 25th event goes to the endpoint of the one before it (so it
    waits its turn: one delivery per endpoint at a time), and every 50th to an endpoint that no
    longer exists."""
    if event_id % 50 == 10:
        return "https://gone.example/hook"
    return ENDPOINTS[(event_id - (event_id % 25 == 0)) % len(ENDPOINTS)]


class Demo:
    """What the simulated work needs to know, and what the handlers saw (one process, one Trio
    thread: plain attributes are safe)."""

    work_scale = 1.0
    """Multiplies every simulated duration; the tests raise it to have jobs still running."""
    snoozed: dict[str, int] = {"index": 0, "webhook": 0}
    throttled: set[int] = set()
    """Events whose endpoint answered 429 Too Many Requests once."""


class SearchEngineBusy(Exception):
    """A transient failure: the runtime retries the job after FAST_RETRY's backoff."""


async def simulated_work(seconds: float) -> None:
    await trio.sleep(seconds * Demo.work_scale)


def tokenize(text: str) -> str:
    """Stands for blocking, CPU-bound library code: it runs on a thread via nj.run_blocking."""
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


async def write_index(index: str, doc_id: int, token: str) -> None:
    await simulated_work(0.05 + (doc_id * 37 % 100) / 1000)


@app.job(queue="index", retry=FAST_RETRY)
async def index_doc(ctx: nj.JobContext, doc_id: int) -> None:
    """Index one document into the "raw" and "wiki" indexes at once."""
    if doc_id % 40 == 7 and ctx.attempt == 1:
        raise SearchEngineBusy(f"search engine busy while indexing doc {doc_id}")
    token = await nj.run_blocking(tokenize, f"document {doc_id}")
    # Children belong to this attempt: its timeout, a cancel or the shutdown cancels them too.
    async with ctx.children() as tasks:
        tasks.spawn(write_index, "raw", doc_id, token)
        tasks.spawn(write_index, "wiki", doc_id, token)


@app.job(
    queue="webhook",
    retry=FAST_RETRY,
    concurrency_key=lambda args: f"endpoint:{args['endpoint']}",
    max_concurrent=1,
)
async def deliver_webhook(ctx: nj.JobContext, endpoint: str, event_id: int) -> None:
    """POST one event to one endpoint. At most one delivery per endpoint runs at once, in every
    process: the next one for a busy endpoint is not started until the one before it ends."""
    if endpoint.startswith("https://gone."):
        raise nj.Discard(f"{endpoint} answered 410 Gone; not retrying")
    if event_id % 25 == 0 and event_id not in Demo.throttled:
        Demo.throttled.add(event_id)
        Demo.snoozed[ctx.queue] += 1
        raise nj.Snooze(0.05)  # 429: try again shortly; a snooze does not spend an attempt
    if event_id % 50 == 3 and ctx.attempt == 1:
        raise ConnectionResetError(f"{endpoint} reset the connection")
    await simulated_work(0.02 + (event_id * 53 % 60) / 1000)


# -- the service -----------------------------------------------------------------------------------


class Service:
    def __init__(self, jobs: int, grace: float) -> None:
        self.jobs = jobs
        self.grace = grace
        self.expected: dict[str, int] = {}
        self.started_at = 0.0
        self.at_signal: dict[str, nj.QueueStats] | None = None
        self.signal_at = 0.0
        self.final: dict[str, nj.QueueStats] | None = None
        self.rt: nj.Runtime | None = None

    async def main(self, rt: nj.Runtime) -> None:
        self.rt = rt  # kept for the report: after shutdown, rt.interrupted lists what was cut
        self.started_at = time.monotonic()
        n_index = self.jobs // 2
        n_webhook = self.jobs - n_index
        try:
            await index_doc.enqueue_many({"doc_id": i} for i in range(1, n_index))
            await deliver_webhook.enqueue_many(
                {"endpoint": endpoint_for(i), "event_id": i} for i in range(n_webhook)
            )
            # A request that needs its document indexed now: it jumps the queue and waits,
            # bounded, for the receipt. `done=False` after 2 s would mean "not yet", not an error.
            urgent = await index_doc.options(priority=10).enqueue(doc_id=n_index)
            receipt = await rt.wait(urgent, timeout=2.0)
            waited = time.monotonic() - self.started_at
            print(f"urgent doc {n_index}: {receipt.state.value} after {waited:.2f} s (queued behind {self.jobs - 1} jobs)")
            self.expected = {"index": n_index, "webhook": n_webhook}
            with trio.fail_after(max(60.0, self.jobs / 20)):
                self.final = await self.report_progress(rt)
        except trio.Cancelled:
            # The first signal cancels main. Take a snapshot for the report (shielded: this task is
            # cancelled, and stats() is a checkpoint), then let the runtime's shutdown run.
            self.signal_at = time.monotonic()
            with trio.CancelScope(shield=True):
                self.at_signal = await rt.stats()
            raise

    async def report_progress(self, rt: nj.Runtime) -> dict[str, nj.QueueStats]:
        next_line = trio.current_time() + 1.0
        while True:
            stats = await rt.stats()
            if all(final_count(stats[q]) >= n for q, n in self.expected.items()):
                return stats
            if trio.current_time() >= next_line:
                next_line += 1.0
                elapsed = time.monotonic() - self.started_at
                parts = [
                    f"{q} {s.completed}/{self.expected[q]} done, {s.running} running, {s.queued} queued"
                    for q, s in stats.items()
                    if q in self.expected
                ]
                print(f"[{elapsed:4.1f} s] " + " | ".join(parts), flush=True)
            await trio.sleep(0.1)

    def print_summary(self) -> None:
        assert self.final is not None
        elapsed = time.monotonic() - self.started_at
        print(f"\nsummary: all {self.jobs} jobs final in {elapsed:.2f} s")
        print(f"{'queue':<9} {'completed':>9} {'retried':>8} {'snoozed':>8} {'discarded':>9}")
        for q in self.expected:
            s = self.final[q]
            # `failed_attempts` counts attempts; those that did not end a job as discarded were retried.
            retried = s.failed_attempts - s.discarded
            print(f"{q:<9} {s.completed:>9} {retried:>8} {Demo.snoozed[q]:>8} {s.discarded:>9}")
        print("retried: failed attempts given another one; discarded: jobs failed for good")

    def print_shutdown(self) -> None:
        if self.at_signal is None:
            print("\nshutdown requested before the service started; nothing was enqueued; exit 0")
            return
        stopped_after = time.monotonic() - self.signal_at
        running = sum(s.running for s in self.at_signal.values())
        queued = sum(s.queued for s in self.at_signal.values())
        done = sum(s.completed for s in self.at_signal.values())
        at = self.signal_at - self.started_at
        print(f"\nshutdown requested at {at:.2f} s: graceful shutdown (grace {self.grace:g} s)")
        print(f"  {done} jobs had completed, {running} were running, {queued} were queued")
        cut = self.rt.interrupted if self.rt is not None else []
        if cut:
            shown = ", ".join(f"#{i}" for i in cut[:10]) + (" ..." if len(cut) > 10 else "")
            print(f"  interrupted: {len(cut)} running jobs were cut by the shutdown ({shown})")
        else:
            print("  interrupted: none, every running job finished within the grace")
        print(f"  not started: {queued} queued jobs (the memory backend loses them at exit; a durable one keeps them)")
        print(f"stopped {stopped_after:.2f} s after the signal; exit 0")


def final_count(s: nj.QueueStats) -> int:
    return s.completed + s.discarded + s.cancelled


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="The nursery_jobs quickstart service (memory backend).")
    parser.add_argument("--jobs", type=int, default=300, help="jobs to enqueue, half per queue (default 300)")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds running jobs get at shutdown (default 5)")
    parser.add_argument(
        "--work-scale", type=float, default=1.0, help="multiply every simulated duration (default 1)"
    )
    args = parser.parse_args(argv)
    if args.jobs < 2:
        parser.error(f"--jobs must be at least 2, not {args.jobs}")
    return args


def cli(argv: list[str]) -> int:
    args = parse_args(argv)
    Demo.work_scale = args.work_scale
    service = Service(args.jobs, args.grace)
    print(f"quickstart: {args.jobs} jobs on queues index (4 workers) and webhook (8 workers); Ctrl-C stops it")
    # nj.run starts Trio, opens the runtime, awaits main(rt) and shuts down. After a signal it
    # returns None instead of main's value, so the service still exits 0.
    nj.run(service.main, app=app, backend="memory://", grace=args.grace)
    if service.final is not None:
        service.print_summary()
    else:
        service.print_shutdown()
    return 0

if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
