"""Named locks across processes: `rt.lock` (waits, bounded) and `rt.try_lock` (never waits).

A lock is a row in the store (`LockStore`) with a random owner token and an expiry `ttl`
seconds ahead on the backend's clock. While held it is renewed every ``ttl / 3``; a holder that
crashes stops renewing, and the lock frees itself at most `ttl` after its last renewal.

Fencing, for `rt.lock`: the block runs inside a cancel scope whose deadline is the end of the
hold as this process last had it confirmed: the Trio time at which the acquiring or renewing
request was *sent*, plus `ttl`, minus `clock_margin(ttl)` (so an answer that took long only makes
it earlier, and the deadline is never later than the expiry the store holds). Only a renewal the
store confirmed moves it forward. The deadline is Trio's own, so it holds whatever order Trio
runs the renewal task and the block in: a process frozen (SIGSTOP, a stalled VM, a blocked loop)
past it resumes with the scope already cancelled, and the block's next checkpoint raises
`Cancelled`. A renewal the store refuses (the lock expired and may be another's) cancels the
scope at once. Either way `LockLost` is raised where the block ends. The lock is released when
the block ends, whatever ended it (shielded, bounded by `RELEASE_BOUND`; if the release cannot
be made, the lock expires on its own).

Each acquisition has a fencing token (`HeldLock.token`, `Release.token`), which the store draws
from a counter that only grows (`LockStore.acquire_lock`): a holder that lost the lock has a
smaller one than the holder that took it, so a store the block writes to can refuse a stale
holder's writes, which no deadline can stop once they are on the wire.

`rt.try_lock` has no block to cancel: its renewal is a task of the runtime, and a lost hold is
logged and set on `release.lost`. Code that must never run unlocked uses
``async with rt.lock(name, timeout=0):``, which also never waits.
"""

from __future__ import annotations

import logging
import math
import secrets
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

import attrs
import trio

from ..backends import LockStore
from ..config import check_unique_key
from ..errors import ConfigError, LockLost, LockTimeout
from ..infra.owner import TaskOwner, open_owner

__all__ = ["CLOCK_MARGIN", "HeldLock", "Locks", "Release", "RELEASE_BOUND", "clock_margin"]

log = logging.getLogger("nursery_jobs")

RELEASE_BOUND = 5.0
"""The longest a release (at the end of a block, or `release()`) waits for the store."""
MAX_POLL = 1.0
"""The longest `rt.lock` waits between two tries while another holds the lock."""
CLOCK_MARGIN = 1.0
"""The most a hold is cut short of its ttl (`clock_margin`)."""


def clock_margin(ttl: float) -> float:
    """How much earlier than the store's expiry a hold ends in this process: a tenth of the ttl,
    at most `CLOCK_MARGIN`. It covers the difference between this process's clock and the clock
    of a process that reads the expiry (each backend writes and compares expiries on the clock
    of the process making the call), and the rate difference between Trio's monotonic clock and
    the wall clock over one ttl."""
    return min(CLOCK_MARGIN, ttl / 10)


def _check(name: object, ttl: object, timeout: object = 0.0) -> None:
    check_unique_key(name, "a lock name")  # the rule of every stored key: each backend stores it as text
    for what, value, low in (("ttl", ttl, 0.1), ("timeout", timeout, 0.0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
            raise ConfigError(f"lock {what} must be a finite number of seconds >= {low:g}, not {value!r}")


@attrs.frozen
class HeldLock:
    """What ``async with rt.lock(name) as lock:`` gives its block: the lock's `name` and this
    acquisition's fencing `token`."""

    name: str
    token: int
    """An int >= 1, larger than the token of every acquisition of `name` before this one on the
    store (through releases, expiries and restarts): a holder that lost the lock has a smaller
    token than the one that took it. Send it with each write to another store, which keeps the
    largest token it has seen and refuses a smaller one (docs/locks.md)."""


def _fence(store: LockStore, answer: object) -> int | None:
    """`acquire_lock`'s answer: a token, or None when the lock is another's."""
    if answer is None:
        return None
    if isinstance(answer, int) and not isinstance(answer, bool) and answer >= 1:
        return answer
    raise ConfigError(
        f"{type(store).__name__}.acquire_lock returned {answer!r}, not a fencing token (an int >= 1) or None: "
        "it implements the LockStore protocol of an older nursery_jobs (see LockStore.acquire_lock)"
    )


def _log_lost(name: str, reason: str) -> None:
    log.error("lock %r was lost: %s; its block is cancelled", name, reason, extra={"event": "lock_lost", "lock": name})


def _ignore(_until: float) -> None:
    pass


class Release:
    """`try_lock`'s release: ``await release()`` frees the lock (idempotent; does nothing when the
    lock was not acquired). `lost` is set if the hold was lost before the release."""

    def __init__(self, locks: Locks | None, name: str, owner: str, token: int | None) -> None:
        self._locks, self._name, self._owner = locks, name, owner
        self.token = token
        """This acquisition's fencing token (`HeldLock.token`); None when it was not acquired."""
        self.lost = trio.Event()
        self._stop = trio.CancelScope()
        self._done = locks is None

    async def __call__(self) -> None:
        if self._done:
            await trio.lowlevel.checkpoint()
            return
        self._done = True
        self._stop.cancel()
        assert self._locks is not None
        await self._locks._release(self._name, self._owner)


class Locks:
    """The runtime's locks on `store`. `owner` (the runtime's task owner) runs `try_lock`'s
    renewals."""

    def __init__(self, store: LockStore, owner: Callable[[], TaskOwner | None]) -> None:
        self._store = store
        self._owner = owner

    async def _acquire(self, name: str, owner: str, ttl: float, timeout: float) -> tuple[float, int]:
        """Take the lock within `timeout` (`LockTimeout`); returns when its hold ends (Trio clock,
        `clock_margin` before the store's expiry) and its fencing token."""
        give_up = trio.current_time() + timeout
        delay = 0.05
        while True:
            sent = trio.current_time()
            token = await self._try(name, owner, ttl)
            if token is not None:
                return sent + ttl - clock_margin(ttl), token
            if trio.current_time() + delay > give_up:
                raise LockTimeout(
                    f"lock {name!r} is held by another holder and was not freed within {timeout:g} s; "
                    "raise timeout=, or use rt.try_lock to go on without it"
                )
            await trio.sleep(delay)
            delay = min(delay * 2, MAX_POLL, ttl / 3)

    async def _try(self, name: str, owner: str, ttl: float) -> int | None:
        answer = await self._store.acquire_lock(name, owner, ttl)
        try:
            return _fence(self._store, answer)
        except ConfigError:
            await self._release(name, owner)
            raise

    async def _release(self, name: str, owner: str) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(RELEASE_BOUND) as bound:
            try:
                await self._store.release_lock(name, owner)
            except Exception:
                log.exception(
                    "releasing lock %r failed; it expires on its own",
                    name,
                    extra={"event": "lock_release_failed", "lock": name},
                )
        if bound.cancelled_caught:
            log.warning(
                "releasing lock %r took over %g s; it expires on its own",
                name,
                RELEASE_BOUND,
                extra={"event": "lock_release_failed", "lock": name},
            )

    async def _renew(
        self, name: str, owner: str, ttl: float, until: float, on_lost: Callable[[str], None],
        on_renewed: Callable[[float], None], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:  # fmt: skip
        """Renew every ttl/3 until cancelled, calling `on_renewed` with the hold's new end after each
        renewal the store confirmed; call `on_lost` once the hold is lost."""
        task_status.started()
        while True:
            await trio.sleep(max(0.0, min(ttl / 3, until - trio.current_time())))
            held: bool | None = None
            while held is None:
                sent = trio.current_time()
                if sent >= until:
                    on_lost("it could not be renewed before it expired")
                    return
                with trio.move_on_at(until):
                    try:
                        held = await self._store.renew_lock(name, owner, ttl)
                    except Exception as exc:
                        log.warning(
                            "renewing lock %r failed (%s); retrying until it expires",
                            name,
                            exc,
                            extra={"event": "lock_renew_failed", "lock": name},
                        )
                        await trio.sleep(min(ttl / 10, max(0.0, until - trio.current_time())))
            if not held:
                on_lost("it had expired, and may be another holder's")
                return
            until = sent + ttl - clock_margin(ttl)
            on_renewed(until)

    @asynccontextmanager
    async def hold(self, name: str, ttl: float, timeout: float) -> AsyncIterator[HeldLock]:
        _check(name, ttl, timeout)
        owner_id = secrets.token_hex(16)
        until, token = await self._acquire(name, owner_id, ttl, timeout)
        why: list[str] = []
        try:
            try:
                async with open_owner(f"lock:{name}") as owner:

                    def lost(reason: str) -> None:
                        why.append(reason)
                        _log_lost(name, reason)
                        owner.cancel_scope.cancel()

                    def renewed(new_until: float) -> None:
                        owner.cancel_scope.deadline = new_until

                    await owner.start(self._renew, name, owner_id, ttl, until, lost, renewed, name="renew")
                    owner.cancel_scope.deadline = until
                    if trio.current_time() >= until:
                        raise LockLost(
                            f"lock {name!r} was taken, but the store confirmed it only after its hold had "
                            "expired; its block did not run"
                        )
                    try:
                        yield HeldLock(name, token)
                    finally:
                        if owner.cancel_scope.cancel_called and not why:  # its deadline passed
                            why.append("it could not be renewed before it expired")
                            _log_lost(name, why[0])
                        owner.cancel_scope.cancel()  # the block is over: stop renewing
            except BaseExceptionGroup as group:  # the block's own error, alone in the owner's group
                if len(group.exceptions) == 1:
                    raise group.exceptions[0] from None
                raise
        finally:
            await self._release(name, owner_id)
        if why:
            raise LockLost(f"lock {name!r} was lost while held ({why[0]}); the block was cancelled at that point")

    async def try_lock(self, name: str, ttl: float) -> tuple[bool, Release]:
        _check(name, ttl)
        owner_id = secrets.token_hex(16)
        sent = trio.current_time()
        token = await self._try(name, owner_id, ttl)
        if token is None:
            return False, Release(None, name, owner_id, None)
        release = Release(self, name, owner_id, token)
        owner = self._owner()
        if owner is None:  # no runtime task owner (it is shutting down): the lock lives its ttl
            return True, release

        def lost(reason: str) -> None:
            release.lost.set()
            log.error(
                "lock %r (rt.try_lock) was lost: %s", name, reason, extra={"event": "lock_lost", "lock": name}
            )

        async def renew(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with release._stop:
                await self._renew(name, owner_id, ttl, sent + ttl - clock_margin(ttl), lost, _ignore, task_status=task_status)

        await owner.start(renew, name=f"lock:{name}")
        return True, release
