"""Wake-ups between the processes of one host that share a database file: a registry of Unix
datagram sockets in a directory beside the file.

SQLite has no LISTEN/NOTIFY. Without help, a worker process learns of a job another process
enqueued only at its next poll (1 s: measured p50 0.5-0.7 s from enqueue to handler start,
against 0.6-2 ms in one process; with these wake-ups, 0.9-2.5 ms), and a web process
waiting on a receipt learns of the job's end only at its own next look. So every process that
serves the file binds one datagram socket in the registry directory,
``<db>.wake/<pid>-<token><n>.<role>.sock``, and a process whose write made something happen --
jobs available (an insert, a retry or snooze due now, a rescue, an interrupted job given back),
jobs final, a cancellation requested -- sends one small datagram to every other socket there
after its commit. The receiver turns it into the same hints a PostgreSQL notification gives,
re-reads the database, and never trusts the payload: a datagram only causes a claim, a re-read
of a job, or a re-read of a cancel flag.

Why sockets, and not the alternatives. A FIFO is a byte stream with one reader: it needs one FIFO
per receiver anyway (a registry like this one), framing, an open/write/close per message, and EOF
handling when the last writer goes. File-change notification (inotify) has no stdlib binding, is
Linux only, and fires on every write to the WAL -- heartbeats and claims included -- without
saying which queue or job it concerns; watching the WAL's mtime is just a faster poll. A datagram
keeps its boundaries, costs one non-blocking ``sendto`` per receiver, and tells a dead receiver
apart exactly: ``ECONNREFUSED`` means the socket file is there but no process holds it, so the
sender removes it (that is how a SIGKILLed process's file goes away).

Roles. A process that works queues binds a ``w`` socket and hears everything. One that works no
queue (an enqueue-only web process) binds an ``r`` socket and hears finalizations (and outbox
publishes, for its relay) only: it has no
fetcher to wake and runs no job to cancel, but its `rt.wait` receipts must arrive at once. It
binds whether or not it will ever wait: a runtime cannot know that in advance, and binding later,
at the first wait, would make that first receipt the slow one. So a sender costs one ``sendto``
per worker process per write that makes jobs available, and one per serving process per write
that finalizes jobs (outcomes are written in batches, so that is per batch, not per job).
Measured on a 2-vCPU VM (benchmarks/RESULTS.md, 2026-12-01): a send costs 5.5 us for the
directory listing when nobody listens, 15.6 us with one receiving process, and 4.4 us per
further one, beside a commit of 0.15-1 ms.

Costs never block. The sender's socket is non-blocking and the send is synchronous: no
checkpoint, so a cancelled caller cannot be interrupted between its commit and its wake-up (an
enqueue that committed is never reported as cancelled), and a receiver whose queue is full
(``EAGAIN``; Linux queues only ``net.unix.max_dgram_qlen`` datagrams per socket, 10 by default on
many kernels) simply misses that datagram. A lost datagram is why the poll stays: every fetcher
and every receipt waiter still looks at its poll interval, so a lost wake-up delays work by at
most that much, never for ever.

Own datagrams. A process already delivered its events in-process, so a sender skips its own
sockets (by the token in their names) and a receiver drops a datagram carrying its own token.
The token belongs to one backend instance: two instances on one file in one process hear each
other, like two processes.

Where the registry lives. Beside the file, from the file's real path (symlinks resolved, as
SQLite does for its WAL), when the longest socket path fits AF_UNIX's limit (108 bytes on Linux,
104 on macOS; 103 is used). Otherwise under the system temp dir, in a private directory of this
user keyed by a hash of the file's real path, ``<tmp>/nj-wake-<uid>/<hash>/``: every process
computes the same place from the same path, so they still find each other -- provided they see
the same temp dir (the same ``TMPDIR``, no private /tmp) and run as the same user. If that is too
long as well, wake-ups are off and the poll does the work. Abstract-namespace sockets (Linux)
were the other option for long paths; they cannot be listed, so a registry of them would need
marker files beside the database anyway, and anyone on the host could bind their names.

Lifetime. `WakeRegistry.serve` binds at start-up, before it reports started, receives until
cancelled, and removes its socket file on the way out, cancellation included (and the directory,
when it was the last one). Every wait is bounded: the receive loop looks every
`RECHECK_INTERVAL` seconds whether its socket file is still its own (a /tmp cleaner, an operator
emptying the directory) and binds again if not, after which every queue looks for work it may
have missed. Sockets are the only resource here: no task, no thread; the receive loop is the
caller's (the backend's `serve`, which the runtime runs as a service).

One host only. A file mounted by several hosts (which SQLite does not support well anyway: its
locking relies on the host's file locks and shared memory) gets wake-ups between the processes of
each host; the others are reached by the poll.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import stat
import tempfile
from typing import Any, Callable, NamedTuple, Sequence

import trio

__all__ = ["MAX_DATAGRAM", "RECHECK_INTERVAL", "Wake", "WakeRegistry", "decode", "encode", "registry_dir"]

log = logging.getLogger("nursery_jobs")

MAX_DATAGRAM = 8192
"""The largest datagram a receiver reads; a longer one is garbage and ignored."""
RECHECK_INTERVAL = 10.0
"""How often a receiver checks that its socket file is still there (and binds again if not)."""
_IDS_PER_DATAGRAM = 100  # 100 ids of at most 19 digits, twice, plus the queues: under MAX_DATAGRAM
_QUEUES_BYTES = 2048  # more queue names than this in one write: send "any queue" instead
_MAX_SOCKET_PATH = 103  # bytes; AF_UNIX's sun_path is 108 on Linux and 104 on macOS, NUL included
_MAX_QUEUE_NAME = 128
_MAX_ID = 2**63 - 1
_TOKEN_HEX = 12
_NAME = re.compile(r"\A[0-9]{1,10}-([0-9a-f]{%d})[0-9a-f]{1,8}\.([wr])\.sock\Z" % _TOKEN_HEX)
_LONGEST_NAME = 10 + 1 + _TOKEN_HEX + 8 + len(".w.sock")
_AF_UNIX: Any = getattr(socket, "AF_UNIX", None)
_DROPPED = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS, errno.ENOENT})


class Wake(NamedTuple):
    """What one write made happen, as far as other processes care."""

    queues: tuple[str | None, ...] = ()
    """Queues that may have jobs to claim (None: any queue)."""
    finalized: tuple[int, ...] = ()
    """Jobs that became final."""
    cancel: tuple[int, ...] = ()
    """Running jobs whose cancellation was requested."""
    outbox: bool = False
    """Outbox events were published: every process's relay may look."""


def registry_dir(db_path: str) -> str | None:
    """The registry directory of the database file at `db_path`, or None when this platform has
    no Unix sockets or no place whose socket paths fit (then wake-ups are off)."""
    if _AF_UNIX is None or db_path in ("", ":memory:"):
        return None
    real = os.path.realpath(db_path)
    beside = real + ".wake"
    if _fits(beside):
        return beside
    digest = hashlib.sha256(os.fsencode(real)).hexdigest()[:20]
    fallback = os.path.join(tempfile.gettempdir(), f"nj-wake-{os.getuid()}", digest)
    return fallback if _fits(fallback) else None


def _fits(directory: str) -> bool:
    return len(os.fsencode(directory)) + 1 + _LONGEST_NAME <= _MAX_SOCKET_PATH


def encode(token: str, wake: Wake) -> list[bytes]:
    """The datagrams that carry `wake` (none when it carries nothing), each under MAX_DATAGRAM."""
    queues: list[str | None] = list(dict.fromkeys(wake.queues))
    if len(json.dumps(queues)) > _QUEUES_BYTES:
        queues = [None]
    finalized = list(wake.finalized)
    cancel = list(wake.cancel)
    out: list[bytes] = []
    outbox = wake.outbox
    while queues or finalized or cancel or outbox:
        msg: dict[str, Any] = {"v": 1, "s": token}
        if outbox:
            msg["o"], outbox = 1, False
        if queues:
            msg["q"], queues = queues, []
        if finalized:
            msg["f"], finalized = finalized[:_IDS_PER_DATAGRAM], finalized[_IDS_PER_DATAGRAM:]
        if cancel:
            msg["c"], cancel = cancel[:_IDS_PER_DATAGRAM], cancel[_IDS_PER_DATAGRAM:]
        out.append(json.dumps(msg, separators=(",", ":")).encode())
    return out


def decode(data: bytes, own_token: str | None = None) -> Wake | None:
    """The `Wake` a datagram carries, or None for garbage, an empty one, or our own. Bounded: at
    most MAX_DATAGRAM bytes are parsed; entries that are not a queue name or a job id are dropped."""
    if len(data) > MAX_DATAGRAM:
        return None
    try:
        msg = json.loads(data)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deep, a huge number
        return None
    if not isinstance(msg, dict) or type(msg.get("v")) is not int or msg["v"] != 1:
        return None
    sender = msg.get("s")
    if not isinstance(sender, str) or sender == own_token:
        return None
    queues = tuple(dict.fromkeys(q for q in _items(msg.get("q")) if q is None or _is_queue(q)))
    finalized = tuple(i for i in _items(msg.get("f")) if _is_id(i))
    cancel = tuple(i for i in _items(msg.get("c")) if _is_id(i))
    outbox = msg.get("o") == 1
    if not (queues or finalized or cancel or outbox):
        return None
    return Wake(queues, finalized, cancel, outbox)


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _is_queue(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= _MAX_QUEUE_NAME and value.isprintable()


def _is_id(value: Any) -> bool:
    return type(value) is int and 0 < value <= _MAX_ID


class WakeRegistry:
    """One backend instance's side of the registry of the file at `db_path`: `send` after a
    write, `serve` to receive. `directory` None: wake-ups are off (both do nothing)."""

    def __init__(self, db_path: str) -> None:
        self.db_path = db_path
        self.directory = registry_dir(db_path)
        self.token = secrets.token_hex(_TOKEN_HEX // 2)
        self._binds = 0
        self._sender: socket.socket | None = None
        self._reported: set[str] = set()

    def __repr__(self) -> str:
        return f"<WakeRegistry {self.directory!r} token={self.token}>"

    # -- sending --

    def send(self, wake: Wake) -> int:
        """Send `wake` to every other serving process of the file; returns how many datagrams
        went out. Never blocks and never raises: whatever cannot be delivered now is dropped
        (the poll covers it); a socket nobody holds any more is removed."""
        directory = self.directory
        if directory is None:
            return 0
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return 0  # nobody serves this file (yet)
        except OSError as exc:
            self._report("list", f"cannot list the wake-up directory {directory!r} ({exc}); other processes poll")
            return 0
        to_workers: list[bytes] | None = None
        to_waiters: list[bytes] | None = None
        sent = 0
        for name in names:
            match = _NAME.match(name)
            if match is None or match.group(1) == self.token:
                continue
            if match.group(2) == "w":
                if to_workers is None:
                    to_workers = encode(self.token, wake)
                payloads = to_workers
            else:
                if to_waiters is None:
                    # An enqueue-only process runs a relay too (when its app subscribes).
                    to_waiters = encode(self.token, Wake(finalized=wake.finalized, outbox=wake.outbox))
                payloads = to_waiters
            if payloads:
                sent += self._send_to(os.path.join(directory, name), payloads)
        return sent

    def _send_to(self, path: str, payloads: Sequence[bytes]) -> int:
        sock = self._sender
        if sock is None:
            try:
                sock = self._sender = socket.socket(_AF_UNIX, socket.SOCK_DGRAM)
            except OSError as exc:
                self._report("socket", f"cannot open a socket for wake-ups ({exc}); other processes poll")
                return 0
            sock.setblocking(False)
        sent = 0
        for payload in payloads:
            try:
                sock.sendto(payload, path)
            except ConnectionRefusedError:
                # The file is there but no process holds its socket: it died without cleaning up.
                try:
                    os.unlink(path)
                    log.debug("removed the stale wake-up socket %s", path, extra={"event": "wake_stale_socket", "path": path})
                except OSError:
                    pass
                return sent
            except OSError as exc:
                if exc.errno not in _DROPPED:  # a full queue or a file just removed: expected
                    self._report(f"send-{exc.errno}", f"cannot send a wake-up to {path!r} ({exc}); it polls")
                return sent
            sent += 1
        return sent

    def _report(self, key: str, message: str) -> None:
        """Log a problem once per registry (at debug level after that): a send happens per write."""
        if key in self._reported:
            log.debug("%s", message, extra={"event": "wake_problem", "problem": key})
        else:
            self._reported.add(key)
            log.warning("%s", message, extra={"event": "wake_problem", "problem": key})

    def close(self) -> None:
        """Close the sending socket (a later send opens another)."""
        sock, self._sender = self._sender, None
        if sock is not None:
            sock.close()

    # -- receiving --

    async def serve(
        self,
        on_wake: Callable[[Wake], None],
        *,
        works: bool,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Bind this process's socket (role ``w`` if it `works` queues, else ``r``), report
        started, and call ``on_wake`` for every datagram from another process until cancelled.
        The socket file is removed on the way out. If no socket can be bound, says so once and
        waits (the poll does the work); the runtime must not fail over a missing hint."""
        role = "w" if works else "r"
        if self.directory is None:
            self._report(
                "off",
                f"wake-ups are off for SQLite database {self.db_path!r} (no Unix sockets here, or no "
                "socket path short enough): other processes' jobs and outcomes reach this one at its poll interval",
            )
            task_status.started()
            await trio.sleep_forever()
        bound: tuple[trio.socket.SocketType, str, int] | None = None
        try:
            bound = self._bind_or_report(self.directory, role)
            task_status.started()
            while True:
                if bound is None:
                    await trio.sleep(RECHECK_INTERVAL)
                else:
                    failed = False
                    with trio.move_on_after(RECHECK_INTERVAL):
                        sock = bound[0]
                        while True:
                            try:
                                data = await sock.recv(MAX_DATAGRAM + 1)
                            except OSError as exc:
                                self._report("recv", f"wake-up socket {bound[1]!r} failed ({exc}); binding a new one")
                                failed = True
                                break
                            wake = decode(data, self.token)
                            if wake is not None:
                                on_wake(wake)
                    if not failed and _still_ours(bound):
                        continue
                    if not failed:
                        self._report("lost", f"wake-up socket {bound[1]!r} was removed; binding a new one")
                    self._unbind(bound)
                    bound = None
                    if failed:
                        continue  # bind again after a pause, not in a tight loop
                bound = self._bind_or_report(self.directory, role)
                if bound is not None:
                    on_wake(Wake(queues=(None,)))  # deaf meanwhile: every queue looks again
        finally:
            if bound is not None:
                self._unbind(bound)

    def _bind_or_report(self, directory: str, role: str) -> tuple[trio.socket.SocketType, str, int] | None:
        try:
            return self._bind(directory, role)
        except OSError as exc:
            self._report(
                "bind",
                f"cannot bind a wake-up socket in {directory!r} ({exc}): other processes' jobs and "
                "outcomes reach this one at its poll interval",
            )
            return None

    def _bind(self, directory: str, role: str) -> tuple[trio.socket.SocketType, str, int]:
        """Bind synchronously (a local filesystem call; Trio's own `bind` would use a thread for
        it) and hand the socket to Trio. Another process may remove the directory between our
        mkdir and our bind (it left, and was the last): then make it again, a few times."""
        self._binds += 1
        path = os.path.join(directory, f"{os.getpid()}-{self.token}{self._binds & 0xFFFFFFFF:x}.{role}.sock")
        for attempt in range(3):
            self._make_directory(directory)
            raw = socket.socket(_AF_UNIX, socket.SOCK_DGRAM)
            try:
                raw.setblocking(False)
                raw.bind(path)
                ino = os.stat(path).st_ino
            except FileNotFoundError:
                raw.close()
                if attempt == 2:
                    raise
                continue
            except BaseException:
                raw.close()
                raise
            return trio.socket.from_stdlib_socket(raw), path, ino
        raise AssertionError("unreachable")  # pragma: no cover

    def _make_directory(self, directory: str) -> None:
        if directory.endswith(".wake"):  # beside the database: as shared as the file's own directory
            try:
                os.mkdir(directory)
            except FileExistsError:
                pass
            return
        # The temp-dir fallback: directories of this user's only, never ones someone else made
        # (another user could then read what goes through them, or plant sockets).
        _private_dir(os.path.dirname(directory))
        _private_dir(directory)

    def _unbind(self, bound: tuple[trio.socket.SocketType, str, int]) -> None:
        sock, path, ino = bound
        sock.close()
        if _still_ours(bound):
            try:
                os.unlink(path)
            except OSError:
                pass
        try:
            os.rmdir(os.path.dirname(path))  # only if we were the last one
        except OSError:
            pass


def _private_dir(path: str) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(errno.EACCES, "not a private directory of this user", path)


def _still_ours(bound: tuple[trio.socket.SocketType, str, int]) -> bool:
    try:
        return os.stat(bound[1]).st_ino == bound[2]
    except OSError:
        return False
