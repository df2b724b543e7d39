"""A worker service (and an enqueuer) for the process-level tests: a real OS process per worker.

    python worker.py work --backend URL --log-dir DIR [--drain 1.0] [--cap-sleep 0] ...
    python worker.py enqueue --backend URL --count 5000 [--sleep 0.01] [--raw KIND ARGS_JSON]...
    python worker.py enqueue-wait --backend URL --count 5 [--poll-interval 30] [--wait-timeout 10]

`work` runs `nj.run` on the given backend with one queue ("procs") and one job kind ("record"),
whose optional `key` argument is its concurrency key (at most one job of a key runs at once), and
one rate-limited kind ("rated", the same handler) whose `rkey` argument is its rate key (at most
`RATE.limit` starts per key in any `RATE.per` seconds).
Every execution of a `record` job appends JSON lines to ``DIR/exec-<pid>.jsonl``:
``{"ev": "start" | "end" | "cancelled", "id", "attempt", "pid", "n", "t"}``. Each line is one
`os.write` on an O_APPEND descriptor, so it is in the kernel before the job goes on: a SIGKILL
cannot lose it (``--fsync`` also syncs it to disk, which only an OS crash would need).

The process prints ``READY <pid>`` on stdout once the runtime is open, and exits 0 after SIGTERM
or SIGINT (graceful shutdown, see `nj.run`), or once it drains (``--drain X``: the backend has
had no available, scheduled, retryable or running job for X seconds, counted from the first time
this process saw work, or from start-up with ``--drain-from-start``). ``--max-lifetime`` bounds
its life whatever happens (exit code 3), so a test that dies cannot leave it running forever.
A `nj.NurseryJobsError` that reaches it (e.g. the backend is unusable at start-up) is printed as
one line, ``worker: <ErrorType>: <message>``, and exits 2, as a service would do it.

`enqueue` runs an enqueue-only runtime (``queues=[]``) and enqueues ``--count`` jobs with
`rt.enqueue_many` (``--keys K``: job n gets the key ``<--key-prefix><n % K>``); ``--raw KIND ARGS_JSON`` inserts a row through the backend directly
(`insert_many` with `NewJob`), bypassing the runtime's validation: that is how the tests store
rows a runtime would refuse (an unregistered kind, args that are not a JSON object). It prints
one line ``IDS <json list>`` with the ids in order (count first, then raw rows).

`enqueue-wait` is a web process: an enqueue-only runtime that enqueues one job at a time and
awaits its receipt (``rt.wait``, at most ``--wait-timeout`` s) before the next, its queue polling
every ``--poll-interval`` s, and stops at the first receipt that is not done. It prints
``RECEIPTS <json list>`` of ``[id, done, state, seconds]`` (seconds from enqueue to receipt, for
the reader: tests do not judge speed).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import trio

import nursery_jobs as nj
from nursery_jobs.backends import NewJob

QUEUE = "procs"
KIND = "record"
RATED = "rated"
RATE = nj.Rate(5, per=1.0)


class Recorder:
    """Appends one JSON line per event to this process's execution log."""

    def __init__(self, log_dir: str | None, fsync: bool) -> None:
        self.pid = os.getpid()
        self.fsync = fsync
        self.fd: int | None = None
        if log_dir is not None:
            path = os.path.join(log_dir, f"exec-{self.pid}.jsonl")
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, ev: str, ctx: nj.JobContext, n: int) -> None:
        if self.fd is None:
            return
        line = json.dumps({"ev": ev, "id": ctx.id, "attempt": ctx.attempt, "pid": self.pid, "n": n, "t": time.time()})
        os.write(self.fd, (line + "\n").encode())
        if self.fsync:
            os.fsync(self.fd)


def make_app(
    recorder: Recorder | None = None,
    *,
    max_workers: int = 8,
    timeout: float = 60.0,
    poll_interval: float | None = None,
    cap_sleep: float | None = None,
    min_sleep: float = 0.0,
) -> nj.App:
    app = nj.App()
    app.queue(QUEUE, max_workers=max_workers, timeout=timeout, poll_interval=poll_interval)

    @app.job(queue=QUEUE, concurrency_key=lambda args: args.get("key"), max_concurrent=1)
    async def record(ctx: nj.JobContext, n: int, sleep: float = 0.0, key: str | None = None) -> None:
        await run(ctx, n, sleep)

    @app.job(queue=QUEUE, name=RATED, rate=RATE, rate_key=lambda args: args.get("rkey"))
    async def rated(ctx: nj.JobContext, n: int, sleep: float = 0.0, rkey: str | None = None) -> None:
        await run(ctx, n, sleep)

    async def run(ctx: nj.JobContext, n: int, sleep: float) -> None:
        assert recorder is not None, "this app only enqueues"
        recorder.write("start", ctx, n)
        seconds = max(sleep if cap_sleep is None else min(sleep, cap_sleep), min_sleep)
        try:
            if seconds > 0:
                await trio.sleep(seconds)
            else:
                await trio.lowlevel.checkpoint()
        except BaseException:
            recorder.write("cancelled", ctx, n)
            raise
        recorder.write("end", ctx, n)

    return app


def _settings(args: argparse.Namespace) -> nj.RuntimeSettings:
    return nj.RuntimeSettings(
        heartbeat_interval=args.heartbeat_interval,
        rescue_after=args.rescue_after,
        rescue_interval=args.rescue_interval,
    )


def cmd_work(args: argparse.Namespace) -> int:
    recorder = Recorder(args.log_dir, args.fsync)
    app = make_app(
        recorder,
        max_workers=args.max_workers,
        timeout=args.timeout,
        poll_interval=args.poll_interval,
        cap_sleep=args.cap_sleep,
        min_sleep=args.min_sleep,
    )

    async def main(rt: nj.Runtime) -> int:
        print(f"READY {os.getpid()}", flush=True)
        start = trio.current_time()
        seen_work = args.drain_from_start
        idle_since: float | None = None
        while True:
            now = trio.current_time()
            if now - start > args.max_lifetime:
                print(f"max lifetime of {args.max_lifetime:g} s reached; exiting", file=sys.stderr, flush=True)
                return 3
            if args.drain is not None:
                q = (await rt.stats())[QUEUE]
                if q.queued + q.running > 0:
                    seen_work = True
                    idle_since = None
                elif seen_work:
                    if idle_since is None:
                        idle_since = now
                    elif now - idle_since >= args.drain:
                        print(f"DRAINED {os.getpid()}", flush=True)
                        return 0
            await trio.sleep(0.1)

    result = nj.run(main, app=app, backend=args.backend, grace=args.grace, settings=_settings(args))
    if result is None:
        print(f"STOPPED {os.getpid()}", flush=True)  # a signal ended it: graceful shutdown done
        return 0
    return int(result)


def cmd_enqueue(args: argparse.Namespace) -> int:
    app = make_app()

    async def main(rt: nj.Runtime) -> list[int]:
        ids: list[int] = []
        batch = 1000
        for first in range(args.first, args.first + args.count, batch):
            last = min(first + batch, args.first + args.count)
            many: list[dict[str, object]] = [{"n": n, "sleep": args.sleep} for n in range(first, last)]
            if args.keys:
                for job in many:
                    job["key"] = f"{args.key_prefix}{int(str(job['n'])) % args.keys}"
            if args.rate_keys:
                for job in many:
                    job["rkey"] = f"r{int(str(job['n'])) % args.rate_keys}"
            ids.extend(int(i) for i in await rt.enqueue_many(RATED if args.rate_keys else KIND, many))
        if args.raw:
            rows = [NewJob(kind, QUEUE, args_json, 0, None, 25) for kind, args_json in args.raw]
            ids.extend(r.id for r in await rt.backend.insert_many(rows))
        return ids

    ids = nj.run(main, app=app, backend=args.backend, queues=[], grace=1.0, settings=_settings(args))
    if ids is None:
        return 1
    print("IDS " + json.dumps(ids), flush=True)
    return 0


def cmd_enqueue_wait(args: argparse.Namespace) -> int:
    app = make_app(poll_interval=args.poll_interval)

    async def main(rt: nj.Runtime) -> list[list[object]]:
        out: list[list[object]] = []
        for n in range(args.count):
            t0 = time.monotonic()
            job_id = await rt.enqueue(KIND, {"n": n})
            receipt = await rt.wait(job_id, timeout=args.wait_timeout)
            out.append([int(job_id), receipt.done, receipt.state.value, round(time.monotonic() - t0, 4)])
            if not receipt.done:
                break  # a web request would give up here too
        return out

    receipts = nj.run(main, app=app, backend=args.backend, queues=[], grace=1.0, settings=_settings(args))
    if receipts is None:
        return 1
    print("RECEIPTS " + json.dumps(receipts), flush=True)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--backend", required=True, help="backend URL (postgresql://... or sqlite:////abs/path)")
        p.add_argument("--heartbeat-interval", type=float, default=5.0)
        p.add_argument("--rescue-after", type=float, default=60.0)
        p.add_argument("--rescue-interval", type=float, default=15.0)

    work = sub.add_parser("work", help="run a worker service")
    common(work)
    work.add_argument("--log-dir", required=True, help="where exec-<pid>.jsonl is appended")
    work.add_argument("--fsync", action="store_true", help="fsync every execution record")
    work.add_argument("--max-workers", type=int, default=8)
    work.add_argument("--timeout", type=float, default=60.0, help="the queue's per-attempt timeout")
    work.add_argument("--poll-interval", type=float, default=None, help="the queue's fallback poll period")
    work.add_argument("--grace", type=float, default=5.0)
    work.add_argument("--cap-sleep", type=float, default=None, help="sleep at most this long per job")
    work.add_argument("--min-sleep", type=float, default=0.0, help="sleep at least this long per job")
    work.add_argument("--drain", type=float, default=None, help="exit 0 after this many idle seconds")
    work.add_argument("--drain-from-start", action="store_true", help="count idleness from start-up")
    work.add_argument("--max-lifetime", type=float, default=120.0)
    work.set_defaults(fn=cmd_work)

    enqueue = sub.add_parser("enqueue", help="enqueue jobs with an enqueue-only runtime")
    common(enqueue)
    enqueue.add_argument("--count", type=int, default=0)
    enqueue.add_argument("--first", type=int, default=0, help="the n of the first job")
    enqueue.add_argument("--sleep", type=float, default=0.0, help="each job's sleep argument")
    enqueue.add_argument("--keys", type=int, default=0, help="give job n the concurrency key <prefix><n % KEYS>")
    enqueue.add_argument("--key-prefix", default="k")
    enqueue.add_argument("--rate-keys", type=int, default=0, help="jobs of the kind 'rated', job n with rate key r<n % K>")
    enqueue.add_argument("--raw", nargs=2, action="append", metavar=("KIND", "ARGS_JSON"), default=[])
    enqueue.set_defaults(fn=cmd_enqueue)

    waiter = sub.add_parser("enqueue-wait", help="enqueue jobs one at a time and await each receipt")
    common(waiter)
    waiter.add_argument("--count", type=int, default=1)
    waiter.add_argument("--poll-interval", type=float, default=None, help="the queue's fallback poll period")
    waiter.add_argument("--wait-timeout", type=float, default=10.0)
    waiter.set_defaults(fn=cmd_enqueue_wait)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format=fmt)
    try:
        return int(args.fn(args))
    except nj.NurseryJobsError as exc:
        # What a service would write: the library's own errors are meant to be read by people.
        # (Anything else, an ExceptionGroup included, propagates with its traceback: exit 1.)
        print(f"worker: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
