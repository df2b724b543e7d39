"""The cache: `rt.cache` and `nj.cached`, the rules of keys, values, single-flight, cached
errors and stale-while-revalidate, in one place for every backend.

The problem. A read that is expensive (a query, a call to another service) and asked for by many
requests at once must be computed once, not once per request: a plain read-through cache computes
it once per *miss*, and when a popular key expires every request in flight misses together (the
dogpile). Go's ``singleflight`` answers for one process (the callers of a key wait for the one
call in flight and share its result, value or error); dogpile.cache serves the old value while one
caller makes the new one; Gitea caches an error's message so a failure is not recomputed by every
request. No Trio library does these, and the asyncio ones (cashews, aiocache) poll a lock.

What this module does, for a key, in `get_or_compute`:

1. **Read** the entry (bounded by `STORE_BOUND`; a store that fails or is slow is logged, at most
   once per `LOG_EVERY`, and the caller computes as if the key were missing: the cache is never
   the reason a request fails). A fresh value is returned, a fresh cached error raised as
   `CachedError`.
2. **Stale** (past `ttl`, within `stale_ttl`): the stale value is returned at once, and one
   refresh of the key runs in a task of the runtime (`Cache._refresh`), bounded by
   `wait_timeout`, at most `MAX_REFRESHES` at a time, with none of the caller's context (its
   request cache, its job). A refresh that fails keeps the stale value and is logged.
3. **Missing**: one computation per key in this process (a *flight*). The first caller leads:
   it runs ``fn()`` in its own task (its cancel scopes and context apply), stores the result
   and hands it to the callers that arrived meanwhile, who wait on the flight (each for at most
   its `wait_timeout`; then it raises `CacheWaitTimeout` or, with ``on_wait_timeout="compute"``,
   computes alone). Each waiter decodes its own copy of the JSON; an exception is re-raised in
   every waiter as the same object (with its original traceback, as asyncio's futures do). A
   leader cancelled (or stopped by a `BaseException`) before it ended hands the flight over at
   once: its waiters wake, the first of them leads (reading the store again first), the others
   wait on it; none of them is cancelled.
4. **Across processes** (a store with `CacheFlights`: PostgreSQL), the leader of each process
   asks for the key's flight in the store before computing: one process computes, the leaders
   of the others wait for its notification (bounded by their `wait_timeout`, looking again
   every `FLIGHT_POLL` for a notification lost or a leader that died) and then read the entry.

Values are JSON (`encode_value`: the rules of job args, so a value that memory would keep and
PostgreSQL would change is refused everywhere); a cached error is JSON too: its class's qualified
name, its bases' and its message, never a traceback. Keys are made safe here (`make_key`):
namespaced by the app and its version, and a long or unsafe key hashed behind a readable prefix.

Not done: a startup ping with retries (Gitea pings ten times at start): the runtime opens its
backend before anything else and fails at once if it cannot, and the cache uses that backend.
"""

from __future__ import annotations

import contextvars
import hashlib
import inspect
import json
import logging
import math
import secrets
import time
import types
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Generic, Iterator, Literal, ParamSpec, TypeVar

import attrs
import msgspec
import trio

from ._context import current_attempt, current_worker_box
from .backends.protocol import CacheEntry, CacheFlights, CacheStore
from .config import check_cache_key_part
from .errors import ArgsError, BackendError, BackendUnavailable, CachedError, CacheWaitTimeout, ConfigError, RuntimeClosed
from .infra.owner import TaskOwner
from .jobs import MAX_MESSAGE, clean_text, encode_args

__all__ = [
    "Cache",
    "CacheCheck",
    "CachedFunction",
    "RequestCache",
    "cached",
    "current_cache",
    "decode_value",
    "encode_value",
    "make_key",
]

log = logging.getLogger("nursery_jobs")

P = ParamSpec("P")
T = TypeVar("T")

MAX_TTL = 1e9
"""The longest `ttl`, `error_ttl` and `stale_ttl` (about 31 years), as for a retry's delay."""
KEY_LIMIT = 200
"""Keys longer than this (or with a byte outside printable ASCII, or a space) are hashed."""
DEFAULT_WAIT_TIMEOUT = 10.0
"""How long a caller waits for another's computation of its key by default."""
STORE_BOUND = 1.0
"""The longest `get_or_compute` waits for one store call before going on without it: a cache
that answers in more than a second is slower than most of what it caches."""
FLIGHT_POLL = 0.5
"""Across processes, a waiting leader reads the key again this often if no notification came."""
MAX_REFRESHES = 64
"""Stale-while-revalidate refreshes running at once, per runtime; past it a stale hit is served
without starting one (a later hit will)."""
REQUEST_CACHE_LIFETIME = 300.0
"""Gitea's guard: a request cache used for longer than 5 minutes is held by something that
outlived its request; it warns once and stops serving."""
REQUEST_CACHE_MAX = 1_000
"""Values one request cache keeps at most (further ones are computed, not kept)."""
SLOW_THRESHOLD = 0.030
"""`check()` calls a round trip slower than this slow (Gitea's `SlowCacheThreshold`, 30 ms)."""
LOG_EVERY = 10.0
"""A failing store is logged at most once per this many seconds per runtime."""
_CHECK_VALUE = "nursery_jobs cache check " + "0123456789abcdef" * 61
"""What `check()` writes and reads back: 1,000 characters, as Gitea's test value."""

_decode = msgspec.json.Decoder().decode


def make_key(prefix: str, key: object) -> str:
    """The stored key of `key` under `prefix` (``"<namespace>:<version>:"``).

    A key of at most `KEY_LIMIT` characters of printable ASCII without spaces is kept as it is,
    behind ``s-``; any other is replaced by its SHA-256, behind ``h-`` and its first 40
    characters with each unsafe one made ``_`` (so it stays readable, and what it held -- an
    e-mail address in a user's key -- is not stored as such). The two marks keep a key that
    looks like a hash from meeting one."""
    if not isinstance(key, str) or not key:
        raise ConfigError(f"a cache key must be a non-empty str, not {key!r}")
    if len(key) <= KEY_LIMIT and key.isascii() and key.isprintable() and " " not in key:
        return f"{prefix}s-{key}"
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    readable = "".join(c if "!" <= c <= "~" else "_" for c in key[:40])
    return f"{prefix}h-{readable}-{digest}"


def encode_value(value: Any) -> str:
    """The JSON text stored for `value`, or `ArgsError`: a value is what a job's args may hold
    (str, int, finite float, bool, None, and lists and dicts with str keys of those; no tuple,
    no object; nested at most 64 deep, at most 16 MiB), so it comes back equal from every
    backend."""
    try:
        text = encode_args({"v": value})
    except ArgsError as exc:
        raise ArgsError(str(exc).replace("job args", "a cache value", 1)) from None
    return text[5:-1]


def decode_value(text: str) -> Any:
    """The value stored as `text` (each call a new object)."""
    try:
        return _decode(text)
    except msgspec.DecodeError:
        # msgspec refuses the escaped lone surrogates that `encode_value` can write, and a row
        # another program wrote may be anything: the standard decoder has the last word.
        return json.loads(text)


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def encode_error(error: BaseException) -> str:
    """A cached error's JSON: its class's qualified name, its bases' up to `Exception`, and its
    message (cleaned, cut to 4,096 characters); nothing else of it."""
    if isinstance(error, CachedError):  # a cached error cached again: keep the original's
        type_name, bases, message = error.type_name, list(error.bases), error.message
    else:
        type_name = _qualname(type(error))
        bases = [_qualname(c) for c in type(error).__mro__[1:] if issubclass(c, Exception)]
        try:
            message = clean_text(str(error), MAX_MESSAGE)
        except Exception:  # the error's own __str__: anything may happen
            message = ""
    return json.dumps({"type": type_name, "bases": bases, "message": message}, separators=(",", ":"))


def decode_error(key: str, text: str) -> CachedError:
    try:
        data = json.loads(text)
        return CachedError(key, str(data["type"]), str(data["message"]), tuple(str(b) for b in data.get("bases", ())))
    except (ValueError, TypeError, KeyError, AttributeError):
        return CachedError(key, "unknown", f"an unreadable cached error: {clean_text(text, 200)}")


def _seconds(what: str, value: object, *, allow_none: bool) -> float:
    if value is None and allow_none:
        return 0.0
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not (0 <= value <= MAX_TTL if allow_none else 0 < value <= MAX_TTL)
    ):
        low = ">= 0 (or None)" if allow_none else "> 0"
        raise ConfigError(f"{what} must be a finite number of seconds {low} and at most {MAX_TTL:g}, not {value!r}")
    return float(value)


@attrs.frozen
class _Policy:
    ttl: float
    error_ttl: float
    stale_ttl: float
    wait_timeout: float
    compute_on_timeout: bool
    cache_errors: tuple[type[BaseException], ...]


_policies: dict[tuple[Any, ...], _Policy] = {}


def _policy(
    ttl: object, error_ttl: object, stale_ttl: object, wait_timeout: object, on_wait_timeout: object, cache_errors: object
) -> _Policy:
    """The checked settings of a call, kept per distinct set (a call on the hot path does not
    check them again)."""
    # The types too: True == 1 and hashes alike, and a bool is no number of seconds.
    args = (ttl, type(ttl), error_ttl, type(error_ttl), stale_ttl, type(stale_ttl), wait_timeout, type(wait_timeout),
            on_wait_timeout, cache_errors)  # fmt: skip
    try:
        found = _policies.get(args)
    except TypeError:  # an unhashable argument: checked below, and refused
        found = None
    if found is not None:
        return found
    errors = cache_errors if isinstance(cache_errors, tuple) else (cache_errors,)
    if not errors or not all(isinstance(e, type) and issubclass(e, Exception) for e in errors):
        raise ConfigError(f"cache_errors must be an Exception class or a tuple of them, not {cache_errors!r}")
    if on_wait_timeout not in ("raise", "compute"):
        raise ConfigError(f"on_wait_timeout must be 'raise' or 'compute', not {on_wait_timeout!r}")
    wait = _seconds("wait_timeout", wait_timeout, allow_none=False)
    policy = _Policy(
        _seconds("ttl", ttl, allow_none=False),
        _seconds("error_ttl", error_ttl, allow_none=True),
        _seconds("stale_ttl", stale_ttl, allow_none=True),
        wait,
        on_wait_timeout == "compute",
        errors,
    )
    if len(_policies) >= 1_000:
        _policies.clear()
    _policies[args] = policy
    return policy


@attrs.frozen
class CacheCheck:
    """What `rt.cache.check()` found: a delete, a put and a get of a 1,000-character value, timed
    (Gitea's cache test, for a health page or a metric)."""

    ok: bool
    """The round trip worked and the value came back unchanged."""
    slow: bool
    """It took longer than `slow_threshold` (or did not end within the check's timeout)."""
    seconds: float
    """How long the delete, put and get took (wall clock)."""
    slow_threshold: float
    backend: str
    """The backend's URL, password redacted."""
    error: str | None = None
    """What went wrong, when not `ok`."""


class RequestCache:
    """Values kept for one request (``with rt.cache.request_scope() as rc:``).

    While the scope is open, `get_or_compute` (and `nj.cached` functions) in the task that opened
    it look here before the shared cache and keep what they return here: a key asked for ten
    times in one request reads the store once. ``await rc.get_or_compute(key, fn)`` memoizes any
    value for the request alone (not JSON-checked: it never leaves the process; every call gets
    the same object). Other tasks -- children of the request, the runtime's refresh tasks -- do
    not see it implicitly; pass `rc` to use it there. A scope used `REQUEST_CACHE_LIFETIME` after
    it opened (5 min, Gitea's guard) warns once and stops serving: something holds it that
    outlived its request."""

    def __init__(self, lifetime: float = REQUEST_CACHE_LIFETIME) -> None:
        self._shared: dict[str, Any] = {}
        self._own: dict[str, Any] = {}
        self._opened = trio.current_time()
        self._lifetime = lifetime
        self._task = trio.lowlevel.current_task()
        self._dead = False

    def _live(self) -> bool:
        if self._dead:
            return False
        if trio.current_time() - self._opened > self._lifetime:
            self._dead = True
            self._shared.clear()
            self._own.clear()
            log.warning(
                "a request cache was used %g s after it was opened, longer than a request should live: it is "
                "probably held by a task that outlived its request; it serves nothing more",
                self._lifetime,
                extra={"event": "request_cache_expired", "lifetime": self._lifetime},
            )
            return False
        return True

    def _keep(self, values: dict[str, Any], key: str, value: Any) -> None:
        if len(values) < REQUEST_CACHE_MAX:
            values[key] = value

    async def get_or_compute(self, key: str, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()`` once per request for `key`; later calls return the same object."""
        if not isinstance(key, str):
            raise ConfigError(f"a request cache key must be a str, not {key!r}")
        if self._live() and key in self._own:
            await trio.lowlevel.checkpoint_if_cancelled()
            value: T = self._own[key]
            return value
        value = await fn()
        if self._live():
            self._keep(self._own, key, value)
        return value

    def forget(self, key: str) -> None:
        """Drop `key`'s request value."""
        self._own.pop(key, None)


_request: contextvars.ContextVar[RequestCache | None] = contextvars.ContextVar("nursery_jobs.request_cache", default=None)


def _request_here() -> RequestCache | None:
    rc = _request.get()
    if rc is None or rc._task is not trio.lowlevel.current_task() or not rc._live():
        return None
    return rc


class _Flight:
    """One computation of a key in this process, and what its waiters get from it."""

    __slots__ = ("done", "error", "handover", "refresh", "text", "waiters")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.text: str | None = None
        self.error: BaseException | None = None
        self.handover = False
        """The leader ended without a result (cancelled, or its own wait ran out): a waiter leads."""
        self.waiters = 0
        self.refresh = False
        """A stale-while-revalidate refresh: callers that find the stale entry do not wait for it."""


class Cache:
    """The runtime's cache (`rt.cache`): keys namespaced by the app, values as JSON, on the
    backend's `CacheStore`. Safe to call from any task of the service; every wait is bounded."""

    def __init__(
        self, store: CacheStore, *, namespace: str = "default", version: str = "1", owner: Callable[[], TaskOwner | None]
    ) -> None:
        """`owner`: the runtime's task owner, which runs the stale-while-revalidate refreshes
        (None once it is gone)."""
        self.store = store
        self.namespace = check_cache_key_part("namespace", namespace)
        self.version = check_cache_key_part("version", version)
        self._prefix = f"{namespace}:{version}:"
        self._owner = owner
        self._flights_store = store if isinstance(store, CacheFlights) else None
        self._id = secrets.token_hex(8)
        """This cache's owner id for the store's flights."""
        self._flights: dict[str, _Flight] = {}
        self._refreshing: dict[str, trio.CancelScope | None] = {}
        self._closed = False
        self._logged_at = -math.inf

    def __repr__(self) -> str:
        return f"<Cache {self._prefix!r} on {self.store.url}>"

    def key(self, key: str) -> str:
        """The key as stored: namespaced, versioned, made safe (`make_key`)."""
        return make_key(self._prefix, key)

    # -- plain calls --

    async def get(self, key: str, default: Any = None) -> Any:
        """The fresh value of `key`, or `default` when it has none (missing, expired, or stale).
        Raises `CachedError` when the key holds a cached error, and what the store raises
        (`BackendUnavailable`) when it cannot answer."""
        full = make_key(self._prefix, key)
        store = self.store
        entry = await store.get(full)
        if store.never_yields:
            await trio.lowlevel.checkpoint_if_cancelled()
        if entry is None or entry.fresh_until <= store.now():
            return default
        if entry.is_error:
            raise decode_error(key, entry.value)
        return decode_value(entry.value)

    async def set(self, key: str, value: Any, ttl: float) -> None:
        """Store `value` (JSON, see `encode_value`; else `ArgsError`) as `key`'s for `ttl`
        seconds, replacing what it held. Raises what the store raises when it cannot write."""
        policy_ttl = _seconds("ttl", ttl, allow_none=False)
        full = make_key(self._prefix, key)
        text = encode_value(value)
        now = self.store.now()
        await self.store.set(full, CacheEntry(text, False, now + policy_ttl, now + policy_ttl))
        self._forget_here(full)

    async def delete(self, key: str) -> None:
        """Remove `key`'s entry (idempotent), in this process's request cache too."""
        full = make_key(self._prefix, key)
        await self.store.delete(full)
        self._forget_here(full)

    def _forget_here(self, full: str) -> None:
        rc = _request.get()
        if rc is not None:
            rc._shared.pop(full, None)

    # -- get_or_compute --

    async def get_or_compute(
        self,
        key: str,
        fn: Callable[[], Awaitable[T]],
        ttl: float,
        *,
        error_ttl: float | None = None,
        stale_ttl: float | None = None,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        on_wait_timeout: Literal["raise", "compute"] = "raise",
        cache_errors: type[Exception] | tuple[type[Exception], ...] = Exception,
    ) -> T:
        """`key`'s value, computed by ``await fn()`` when the cache has none, once per key however
        many callers ask at once (in this process; on PostgreSQL, across processes).

        `ttl`: seconds the value is fresh. `error_ttl` (default None: errors are not kept):
        seconds an exception of `fn` that is one of `cache_errors` is kept; until then the key
        raises `CachedError` (its class and message) without calling `fn` -- keep only errors
        that stay true for a while (a missing row), never a timeout. `stale_ttl` (default None):
        seconds after `ttl` during which the old value is still returned at once while one task
        of the runtime computes the new one. `wait_timeout` (10 s): how long a caller waits for
        another caller's computation of `key`; past it, `CacheWaitTimeout`, or with
        ``on_wait_timeout="compute"`` it computes the value itself.

        The computation runs in the caller's task. The callers that waited for it get its value
        (each a copy) or its exception (the same object). If the computing caller is cancelled,
        another waiting caller computes at once; no waiter is cancelled. A store that fails or
        answers slowly (`STORE_BOUND`) is logged and the value computed without it. Raises
        `ArgsError` when `fn`'s value is not JSON (docs/cache.md lists what is)."""
        policy = _policy(ttl, error_ttl, stale_ttl, wait_timeout, on_wait_timeout, cache_errors)
        return await self._get_or_compute(key, make_key(self._prefix, key), fn, policy)

    async def _get_or_compute(self, key: str, full: str, fn: Callable[[], Awaitable[T]], policy: _Policy) -> T:
        rc = _request_here()
        if rc is not None and full in rc._shared:
            await trio.lowlevel.checkpoint_if_cancelled()
            kept: T = rc._shared[full]
            return kept
        flight = self._flights.get(full)
        if flight is not None and not flight.refresh:
            value: T = await self._flight(key, full, fn, policy)
        elif flight is None and not self.store.never_yields and full not in self._refreshing:
            # The read is the flight's first step: callers of a key that arrive while it is read
            # (or computed) wait for that one read (1,000 callers of a key read the store once).
            # While the key's refresh waits to start, its callers read on their own instead, so
            # that the reads of a busy key do not keep it from starting.
            value = await self._flight(key, full, fn, policy, read_first=True)
        else:
            entry = await self._read(full)
            if entry is None:
                value = await self._flight(key, full, fn, policy)
            else:
                if self.store.never_yields:
                    await trio.lowlevel.checkpoint_if_cancelled()
                value = self._found(key, full, fn, policy, entry)[0]
        if rc is not None:
            rc._keep(rc._shared, full, value)
        return value

    async def _read(self, full: str) -> CacheEntry | None:
        store = self.store
        if store.never_yields:
            return await store.get(full)
        with trio.move_on_after(STORE_BOUND):
            try:
                return await store.get(full)
            except (BackendUnavailable, BackendError) as exc:
                self._failed("read", exc)
                return None
        self._failed("read", None)
        return None

    def _failed(self, what: str, exc: BaseException | None) -> None:
        now = time.monotonic()
        if now - self._logged_at < LOG_EVERY:
            return
        self._logged_at = now
        cause = f"{type(exc).__name__}: {exc}" if exc is not None else f"no answer within {STORE_BOUND:g} s"
        log.warning(
            "cache %s on %s failed (%s); computing without the cache (logged at most every %g s)",
            what,
            self.store.url,
            cause,
            LOG_EVERY,
            extra={"event": "cache_unavailable", "backend": self.store.url, "operation": what},
        )

    async def _store_quietly(self, full: str, entry: CacheEntry | None, *, held: bool) -> None:
        """Write a computation's result (or free its flight: `entry` None), shielded and bounded,
        logging a failure: the caller has its value either way."""
        flights = self._flights_store
        if entry is None and (flights is None or not held):
            return
        with trio.CancelScope(shield=True), trio.move_on_after(STORE_BOUND) as bound:
            try:
                if flights is not None:
                    await flights.fill(full, self._id if held else "", entry)
                else:
                    assert entry is not None
                    await self.store.set(full, entry)
            except (BackendUnavailable, BackendError) as exc:
                self._failed("write", exc)
        if bound.cancelled_caught:
            self._failed("write", None)

    async def _flight(
        self, key: str, full: str, fn: Callable[[], Awaitable[T]], policy: _Policy, *, read_first: bool = False
    ) -> T:
        """Lead `key`'s flight (reading the store first if `read_first`), or wait for the one in
        progress; a flight handed over is led by the first of its waiters, which reads first."""
        deadline = trio.current_time() + policy.wait_timeout
        while True:
            flight = self._flights.get(full)
            if flight is None:
                flight = self._flights[full] = _Flight()
                return await self._lead(flight, key, full, fn, policy, deadline, read_first=read_first)
            flight.waiters += 1
            try:
                with trio.move_on_at(deadline):
                    await flight.done.wait()
            finally:
                flight.waiters -= 1
            if not flight.done.is_set():
                if not policy.compute_on_timeout:
                    raise CacheWaitTimeout(
                        f"cache key {key!r}: another caller's computation did not end within wait_timeout "
                        f"({policy.wait_timeout:g} s); raise wait_timeout, or pass on_wait_timeout='compute'"
                    )
                value, _text = await self._compute(key, full, fn, policy, held=False)
                return value
            if flight.handover:
                read_first = True
                continue
            if flight.error is not None:
                raise flight.error.with_traceback(flight.error.__traceback__)
            assert flight.text is not None
            got: T = decode_value(flight.text)
            return got

    async def _lead(
        self,
        flight: _Flight,
        key: str,
        full: str,
        fn: Callable[[], Awaitable[T]],
        policy: _Policy,
        deadline: float,
        *,
        read_first: bool = False,
        refresh: bool = False,
    ) -> T:
        """Compute `key` for `flight`'s waiters (registered as `full`'s flight by the caller)."""
        try:
            value: T
            value, text = await self._lead_work(flight, key, full, fn, policy, deadline, read_first, refresh)
        except BaseException as exc:
            if flight.handover or not isinstance(exc, Exception):
                flight.handover = True
            else:
                flight.error = exc
            raise
        else:
            if text is None:  # a refresh another process is making: nothing to hand on
                flight.handover = True
            flight.text = text
            return value
        finally:
            if self._flights.get(full) is flight:
                del self._flights[full]
            flight.done.set()

    async def _lead_work(
        self,
        flight: _Flight,
        key: str,
        full: str,
        fn: Callable[[], Awaitable[T]],
        policy: _Policy,
        deadline: float,
        read_first: bool,
        refresh: bool,
    ) -> tuple[Any, str | None]:
        if read_first or refresh:
            entry = await self._read(full)
            # A refresh computes unless another (here, or before it) already made the entry fresh.
            if entry is not None and (not refresh or entry.fresh_until > self.store.now()):
                return self._found(key, full, fn, policy, entry)
        flights = self._flights_store
        if flights is None:
            return await self._compute(key, full, fn, policy, held=False)
        with flights.watch(full) as watch:
            while True:
                try:
                    with trio.move_on_after(STORE_BOUND) as bound:
                        led, entry = await flights.lead(full, self._id, self.store.now() + policy.wait_timeout)
                except (BackendUnavailable, BackendError) as exc:
                    self._failed("lead", exc)
                    return await self._compute(key, full, fn, policy, held=False, flight=flight)
                if bound.cancelled_caught:
                    self._failed("lead", None)
                    return await self._compute(key, full, fn, policy, held=False, flight=flight)
                if led:
                    return await self._compute(key, full, fn, policy, held=True, flight=flight)
                if entry is not None and entry.fresh_until > self.store.now():
                    return self._found(key, full, fn, policy, entry)
                if refresh:
                    return None, None  # another process refreshes the key
                if trio.current_time() >= deadline:
                    if policy.compute_on_timeout:
                        return await self._compute(key, full, fn, policy, held=False, flight=flight)
                    flight.handover = True  # this caller's own wait ran out, not the key's computation
                    raise CacheWaitTimeout(
                        f"cache key {key!r}: another process's computation did not end within wait_timeout "
                        f"({policy.wait_timeout:g} s); raise wait_timeout, or pass on_wait_timeout='compute'"
                    )
                with trio.move_on_at(min(deadline, trio.current_time() + FLIGHT_POLL)):
                    await watch.wait()

    def _found(
        self, key: str, full: str, fn: Callable[[], Awaitable[Any]], policy: _Policy, entry: CacheEntry
    ) -> tuple[Any, str]:
        """What an entry read gives: its value (a stale one starts a refresh), or its error."""
        if entry.fresh_until <= self.store.now():
            self._refresh(key, full, fn, policy)
        if entry.is_error:
            raise decode_error(key, entry.value)
        return decode_value(entry.value), entry.value

    async def _compute(
        self, key: str, full: str, fn: Callable[[], Awaitable[T]], policy: _Policy, *, held: bool, flight: _Flight | None = None
    ) -> tuple[T, str]:
        """``await fn()``, and its value (or its error, when kept) stored; with a store flight
        `held`, freed in any case (at once when cancelled with no waiter here to take over)."""
        try:
            value = await fn()
        except Exception as exc:
            entry = None
            if policy.error_ttl and isinstance(exc, policy.cache_errors):
                now = self.store.now()
                entry = CacheEntry(encode_error(exc), True, now + policy.error_ttl, now + policy.error_ttl)
            await self._store_quietly(full, entry, held=held)
            raise
        except BaseException:
            if held and (flight is None or flight.waiters == 0):
                await self._store_quietly(full, None, held=True)
            raise
        try:
            text = encode_value(value)
        except ArgsError:
            if held:
                await self._store_quietly(full, None, held=True)
            raise
        now = self.store.now()
        fresh_until = now + policy.ttl
        await self._store_quietly(full, CacheEntry(text, False, fresh_until, fresh_until + policy.stale_ttl), held=held)
        return value, text

    # -- stale-while-revalidate --

    def _refresh(self, key: str, full: str, fn: Callable[[], Awaitable[Any]], policy: _Policy) -> None:
        """Start one refresh of a stale `key` in a task of the runtime, unless one of the key
        runs already, too many run, or the runtime is closing."""
        if self._closed or full in self._refreshing or len(self._refreshing) >= MAX_REFRESHES:
            return
        owner = self._owner()
        if owner is None:
            return
        self._refreshing[full] = None
        owner.spawn_detached(self._refresh_task, key, full, fn, attrs.evolve(policy, error_ttl=0.0), name="cache-refresh")

    async def _refresh_task(self, key: str, full: str, fn: Callable[[], Awaitable[Any]], policy: _Policy) -> None:
        # A task of the runtime, started from the caller's context: none of the caller's own
        # (its request cache, the job whose code it ran) comes with it.
        _request.set(None)
        current_attempt.set(None)
        current_worker_box.set(None)
        try:
            with trio.CancelScope(deadline=trio.current_time() + policy.wait_timeout) as scope:
                self._refreshing[full] = scope
                # A flight of the key in progress (the read that found the entry stale, or a
                # computation) ends first; no read starts a flight meanwhile (`_get_or_compute`).
                while (running := self._flights.get(full)) is not None:
                    await running.done.wait()
                if self._closed:
                    return
                flight = self._flights[full] = _Flight()
                flight.refresh = True
                try:
                    await self._lead(flight, key, full, fn, policy, scope.deadline, refresh=True)
                except Exception as exc:
                    log.warning(
                        "cache refresh of key %r failed (%s: %s); its stale value is served until it expires",
                        key,
                        type(exc).__name__,
                        exc,
                        extra={"event": "cache_refresh_failed", "key": key},
                    )
            if scope.cancelled_caught and not self._closed:
                log.warning(
                    "cache refresh of key %r did not end within wait_timeout (%g s); its stale value is served "
                    "until it expires",
                    key,
                    policy.wait_timeout,
                    extra={"event": "cache_refresh_failed", "key": key},
                )
        finally:
            self._refreshing.pop(full, None)

    def close(self) -> None:
        """Stop the refreshes in progress and start none (the runtime's shutdown calls it)."""
        self._closed = True
        for scope in list(self._refreshing.values()):
            if scope is not None:
                scope.cancel()

    # -- request scope and check --

    @contextmanager
    def request_scope(self, *, lifetime: float = REQUEST_CACHE_LIFETIME) -> Iterator[RequestCache]:
        """``with rt.cache.request_scope() as rc:`` around a request's handling: see
        `RequestCache`. Scopes nest (the inner one is used inside it)."""
        rc = RequestCache(lifetime)
        token = _request.set(rc)
        try:
            yield rc
        finally:
            _request.reset(token)
            rc._shared.clear()
            rc._own.clear()

    async def check(self, *, slow_threshold: float = SLOW_THRESHOLD, timeout: float = 5.0) -> CacheCheck:
        """Delete, put and get a 1,000-character value under a key of its own, timed: the
        store's health for a health page or a metric. Never raises for the store's failures
        (they are in the result's `error`); the whole check ends within `timeout` seconds."""
        threshold = _seconds("slow_threshold", slow_threshold, allow_none=False)
        bound = _seconds("timeout", timeout, allow_none=False)
        store = self.store
        full = make_key(self._prefix, f"nursery_jobs.check.{secrets.token_hex(8)}")
        error: str | None = None
        started = time.perf_counter()
        seconds = bound
        with trio.move_on_after(bound) as scope:
            try:
                await store.delete(full)
                now = store.now()
                await store.set(full, CacheEntry(encode_value(_CHECK_VALUE), False, now + 60, now + 60))
                got = await store.get(full)
                seconds = time.perf_counter() - started
                if got is None or decode_value(got.value) != _CHECK_VALUE:
                    error = "the value read back differs from the value written"
                await store.delete(full)
            except (BackendUnavailable, BackendError) as exc:
                seconds = time.perf_counter() - started
                error = f"{type(exc).__name__}: {exc}"
        if scope.cancelled_caught:
            error = f"no answer within {bound:g} s"
        return CacheCheck(error is None, seconds > threshold, seconds, threshold, store.url, error)


current_cache: contextvars.ContextVar[Cache | None] = contextvars.ContextVar("nursery_jobs.current_cache", default=None)
"""The cache of the runtime this task runs under (set by `open_runtime`), for `nj.cached`."""


def _cache_here(what: str) -> Cache:
    cache = current_cache.get()
    if cache is None:
        raise RuntimeClosed(
            f"{what} needs a running runtime with a cache, and this context has none; call it inside "
            "`async with nursery_jobs.open_runtime(app) as rt:` (or from a job)"
        )
    return cache


class CachedFunction(Generic[P, T]):
    """An async function whose results are cached (`nj.cached`): calling it is
    `rt.cache.get_or_compute` with the key of its arguments; `invalidate` deletes that key."""

    def __init__(self, fn: Callable[P, Awaitable[T]], policy: _Policy, key: Callable[P, str] | None) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise ConfigError(f"nj.cached decorates an async function, not {fn!r}")
        self.__wrapped__ = fn
        self.__name__ = getattr(fn, "__name__", "cached")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__doc__ = fn.__doc__
        self._fn = fn
        self._policy = policy
        self._key = key
        self._signature = inspect.signature(fn)
        self._name = f"{fn.__module__}.{self.__qualname__}"

    def __repr__(self) -> str:
        return f"<cached {self._name}>"

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        return self if instance is None else types.MethodType(self, instance)

    def key(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """The cache key of a call with these arguments (before namespacing): ``key=``'s
        answer, or the function's qualified name and its bound arguments as JSON."""
        if self._key is not None:
            key = self._key(*args, **kwargs)
            if not isinstance(key, str):
                raise ConfigError(f"the key function of {self._name} must return a str, not {key!r}")
            return key
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        try:
            return f"{self._name}:{encode_args(dict(bound.arguments))}"
        except ArgsError as exc:
            raise ArgsError(
                f"{self._name}: its arguments make no cache key ({exc}); pass key=lambda ...: '...' to nj.cached"
            ) from None

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        cache = _cache_here(f"{self._name} (nj.cached)")
        key = self.key(*args, **kwargs)
        fn = self._fn
        return await cache._get_or_compute(key, make_key(cache._prefix, key), lambda: fn(*args, **kwargs), self._policy)

    async def invalidate(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Delete the cached result of a call with these arguments."""
        await _cache_here(f"{self._name}.invalidate").delete(self.key(*args, **kwargs))


def cached(
    ttl: float,
    *,
    key: Callable[..., str] | None = None,
    error_ttl: float | None = None,
    stale_ttl: float | None = None,
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
    on_wait_timeout: Literal["raise", "compute"] = "raise",
    cache_errors: type[Exception] | tuple[type[Exception], ...] = Exception,
) -> Callable[[Callable[P, Awaitable[T]]], CachedFunction[P, T]]:
    """``@nj.cached(ttl=60)`` on an async function: each call goes through the cache of the
    runtime it runs under, as `rt.cache.get_or_compute` with the same settings (checked here,
    at decoration). The key is the function's qualified name and its arguments as JSON (which
    they must then be: ids, not objects), or ``key(*args, **kwargs)``'s str. Calls outside a
    runtime raise `RuntimeClosed`."""
    policy = _policy(ttl, error_ttl, stale_ttl, wait_timeout, on_wait_timeout, cache_errors)
    if key is not None and not callable(key):
        raise ConfigError(f"key must be a function of the call's arguments returning a str, not {key!r}")

    def decorate(fn: Callable[P, Awaitable[T]]) -> CachedFunction[P, T]:
        return CachedFunction(fn, policy, key)

    return decorate
