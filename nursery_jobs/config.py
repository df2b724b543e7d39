"""Settings, each validated when built, and every tuning constant in one table.

| Constant | Default | Effect | Reason |
|---|---|---|---|
| `grace` | 20 s | how long shutdown waits for running jobs before cancelling them | a rolling redeploy stops every process in turn: 20 s lets most jobs finish; a job cut at the end is interrupted, not failed, and on a durable backend runs again, so a longer grace would only slow the deploy and risk the process manager's kill |
| `flush_bound` | 5 s | how long shutdown gives cancelled jobs' cleanup and the final completer flush | shutdown must be bounded; cleanup runs shielded but never unbounded |
| `resource_bound` | 5 s | how long each `@app.resource` may take to open at start-up, and to close at shutdown | every wait has a bound: a resource that hangs at start-up is an error naming it, one that hangs at close is cancelled and reported while the others still close |
| `max_workers` ("default" queue) | 10 (at most 10,000 per queue) | jobs at once in the default queue | a pool per queue keeps a slow queue from starving another; each worker is a task, so past 10,000 run more processes |
| `timeout` ("default" queue) | 60 s | hard per-attempt timeout (a Trio cancel scope) | River's default `JobTimeout` of 1 min; every wait is bounded |
| `max_attempts` | 25 | attempts before a failing job is discarded | River's count: with the default backoff, about three days of retries |
| `RetryPolicy` | 1 s x 2^(n-1), cap 6 h (at most 1e9 s), +/-10 % jitter | delay before attempt n+1 | exponential so transient faults clear fast and outages are not hammered; jitter spreads a thundering herd |
| `max_waiters` | 64 per queue | receipts waited for at once; beyond it `wait` answers "not done" at once | a request waits for a receipt for a second or two at most; in a burst, answering "not done yet" at once keeps requests fast and memory bounded, where an unbounded pile of waiters would hold every request open |
| `thread_limit` | 16 | concurrent `run_blocking` threads | blocking code must not take every core nor grow without bound |
| `heartbeat_interval` | 5 s (at least 0.01 s) | how often a process renews the claim on its running jobs | often enough that `rescue_after` can be short |
| `rescue_after` | 60 s | a running job whose heartbeat is older is made available again by any process | River's 1 h default leaves crashed jobs stuck for an hour; a heartbeat makes a short bound safe |
| `rescue_interval` | 15 s | how often each process looks for stale running jobs | a quarter of `rescue_after`: a crashed job waits at most ~1.25 x `rescue_after` |
| `keep_completed` / `keep_cancelled` / `keep_discarded` | 24 h / 24 h / 7 days | final jobs are deleted this long after they ended | River's periods: discarded jobs are what an operator investigates, so they stay longest |
| `retention_interval` | 5 min (at least 1 s) | how often retention runs | deletes in small, frequent batches instead of one large sweep; a shorter interval only spins a DELETE loop |
| `blocked_loop_warning` | 0.25 s | a task step that holds the Trio loop longer is logged as a warning naming its job (id, kind, queue) and how long it held the loop; `None` turns the watch off | a quarter second is a stall a user notices, and far above any step that awaits as it should (microseconds) or a garbage collection; the watch costs about 4 % of a no-op job's CPU, less of any real job's, so it is on by default |
| `max_length` (per queue) | None: unbounded | jobs of the queue waiting to start (available, scheduled, retryable) past which an enqueue waits, then fails with `QueueFull` | Gitea's bounded queue: a backlog that grows without bound is an outage that has not been noticed yet; the bound turns it into an error at the producer |
| `push_timeout` (per queue) | 5 s (0 to 3,600 s) | how long `enqueue`/`enqueue_many` wait for room in a full bounded queue before `QueueFull`; `enqueue_tx`, the relay and the periodic scheduler never wait | Gitea's `pushBlockTime`: the caller is often a request, which must never hang on a full queue; a few seconds absorb a burst, longer is an outage |
| `relay_batch` | 200 | outbox rows one relay pass claims at most (one short transaction each) | a 2,000-event import becomes ten short transactions, never one long one that holds locks and a connection; 200 rows are a few milliseconds of inserts |
| `relay_interval` | 1 s (at least 0.01 s) | how often a relay looks for events when no wake-up came | a publish wakes its own process's relay at once and, on PostgreSQL, every other's by NOTIFY; the poll covers a lost or absent wake-up (SQLite's other processes, a caller's own connection) |
| `poll_interval` | backend's (memory: none; SQLite and PostgreSQL: 1 s); at least 0.01 s | fallback fetch when no wake-up arrives, and how often a receipt awaited in another process looks again; `QueueConfig.poll_interval` overrides per queue (awaited queues: 0.1 s) | wake-ups from other processes can be lost or absent; polling bounds the delay |
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable

import attrs

from .errors import ConfigError

__all__ = ["QueueConfig", "Rate", "RetryPolicy", "RuntimeSettings"]

DEFAULT_QUEUE = "default"
MAX_DELAY = 1e9
"""The longest retry delay a policy may set (~31 years): every delay a valid policy computes is
a finite time that every backend stores."""


def _check_name(kind: str) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(_inst: Any, _attr: attrs.Attribute[Any], value: Any) -> None:
        check_name(kind, value)

    return check


def check_name(kind: str, value: Any) -> str:
    """A queue or job kind name: a non-empty printable str of at most 128 characters (no NUL, no
    control character, no lone surrogate: every backend stores it as text and logs show it)."""
    if not isinstance(value, str) or not value or len(value) > 128 or not value.isprintable():
        raise ConfigError(f"{kind} name must be a non-empty printable str of at most 128 characters, not {value!r}")
    return value


PRIORITY_RANGE = (-(2**31), 2**31 - 1)
"""Priorities every backend stores: a 32-bit signed int (PostgreSQL's `integer`)."""
MAX_UNIQUE_KEY = 1_000
"""The longest unique key, in UTF-8 bytes: PostgreSQL's unique index refuses entries over ~2.7 KB,
and a key is an identity, not a payload (hash a long one)."""


def check_priority(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"priority must be an int, not {value!r}")
    low, high = PRIORITY_RANGE
    if not low <= value <= high:
        raise ConfigError(f"priority must be between {low} and {high} (a 32-bit int), not {value!r}")
    return value


def check_unique_key(value: Any, what: str = "unique_key", error: type[Exception] = ConfigError) -> str:
    """A key (a unique key, a concurrency key): a non-empty str that every backend stores as
    text and indexes, at most `MAX_UNIQUE_KEY` bytes of UTF-8, else `error` naming `what`."""
    if not isinstance(value, str) or not value:
        raise error(f"{what} must be a non-empty str, not {value!r}")
    if "\x00" in value:
        raise error(f"{what} must not contain NUL, not {value[:100]!r}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise error(f"{what} must be valid text (it holds a lone surrogate): {value[:100]!r}") from None
    if size > MAX_UNIQUE_KEY:
        raise error(
            f"{what} is {size:,} bytes, over the limit of {MAX_UNIQUE_KEY:,}; use a hash of a long key "
            f"(for example hashlib.sha256(key.encode()).hexdigest()): {value[:60]!r}..."
        )
    return value


CACHE_KEY_PARTS = {"namespace": 64, "version": 32}
"""The longest cache namespace and version (`App.cache_keys`): every stored key starts with both."""


def check_cache_key_part(what: str, value: Any) -> str:
    """A cache namespace or version: 1 to `CACHE_KEY_PARTS[what]` ASCII letters, digits, ``_ . -``
    (no ``:``, which separates them in a stored key)."""
    limit = CACHE_KEY_PARTS[what]
    if (
        not isinstance(value, str)
        or not 1 <= len(value) <= limit
        or not value.isascii()
        or not all(c.isalnum() or c in "_.-" for c in value)
    ):
        raise ConfigError(f"the cache {what} must be 1 to {limit} ASCII letters, digits, '_', '.' or '-', not {value!r}")
    return value


MAX_CONCURRENT = 2**31 - 1
"""The largest `max_concurrent` and `global_max_workers`: a 32-bit int, as PostgreSQL stores it."""


def check_limit(what: str, value: Any) -> int:
    """A concurrency limit: an int from 1 to `MAX_CONCURRENT`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENT:
        raise ConfigError(f"{what} must be an int from 1 to {MAX_CONCURRENT}, not {value!r}")
    return value


def _rate_limit(_inst: Any, _attr: attrs.Attribute[Any], value: Any) -> None:
    check_limit("Rate's limit (starts per window)", value)


def _as_seconds(value: Any) -> Any:
    """An int number of seconds as a float (what every backend stores); anything else as it is,
    for the validator to judge."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value) if abs(value) < 2**1000 else math.inf
    return value


def _rate_per(_inst: Any, _attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"Rate's per (the window, in seconds) must be a finite number > 0, not {value!r}")


@attrs.frozen
class Rate:
    """A rate limit: at most `limit` starts per key in any window of `per` seconds, across every
    process (`@app.job(rate=nj.Rate(100, per=60), rate_key=...)`, docs/rate_limits.md). Every
    attempt's start counts: a retry is one more request to whatever the key names."""

    limit: int = attrs.field(validator=_rate_limit)
    per: float = attrs.field(converter=_as_seconds, validator=_rate_per)


def check_timeout(what: str, value: Any, *, allow_none: bool) -> float | None:
    """A timeout in seconds: a positive finite number (or None where that means 'no timeout')."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{what} must be a finite number of seconds > 0, not {value!r}")
    return float(value)


def _timeout_validator(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    check_timeout(attr.name, value, allow_none=True)


def _positive_int(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{attr.name} must be an int >= 1, not {value!r}")


MAX_WORKERS = 10_000
"""Workers of one queue in one process: each is a task; past this, run more processes."""


def _worker_count(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    _positive_int(_inst, attr, value)
    if value > MAX_WORKERS:
        raise ConfigError(
            f"{attr.name} must be at most {MAX_WORKERS:,} (one task each), not {value!r}; run more processes "
            "for more concurrency"
        )


def _at_least(low: float) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """A finite number of seconds >= `low`: a timer below it would make its loop spin."""

    def check(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < low:
            raise ConfigError(f"{attr.name} must be a finite number of seconds >= {low:g}, not {value!r}")

    return check


def _poll_interval(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    _timeout_validator(_inst, attr, value)
    if value is not None and value < MIN_POLL_INTERVAL:
        raise ConfigError(f"{attr.name} must be at least {MIN_POLL_INTERVAL:g} s (or None), not {value!r}")


MIN_POLL_INTERVAL = 0.01
"""A queue polls at most 100 times a second when no wake-up comes: polling faster only spins."""


def _non_negative(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{attr.name} must be a finite number >= 0, not {value!r}")


def _flag(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{attr.name} must be True or False, not {value!r}")


@attrs.frozen
class QueueConfig:
    """A named queue: its own worker pool and its hard per-attempt timeout.

    `timeout=None` means attempts in this queue have no deadline unless their job kind sets one.
    """

    name: str = attrs.field(validator=_check_name("queue"))
    max_workers: int = attrs.field(validator=_worker_count)
    timeout: float | None = attrs.field(validator=_timeout_validator)
    poll_interval: float | None = attrs.field(default=None, validator=_poll_interval)
    """Fallback fetch period for this queue; None uses the backend's."""
    global_max_workers: int | None = attrs.field(default=None)
    """At most this many jobs of the queue run at once across every process (None: no limit
    but each process's `max_workers`)."""

    @global_max_workers.validator
    def _check_global(self, _attr: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            check_limit("global_max_workers", value)
    claim_ahead: bool = attrs.field(default=True, validator=_flag)
    """Claim jobs for workers still running (durable backends, queues of 2 workers or more)."""
    max_length: int | None = attrs.field(default=None)
    """At most this many jobs of the queue wait to start (available, scheduled, retryable) for
    an enqueue to be accepted (None: no bound); see `rules.check_room`."""
    push_timeout: float = attrs.field(default=5.0)
    """How long `enqueue` waits for room in a full bounded queue before `QueueFull`."""

    @max_length.validator
    def _check_max_length(self, _attr: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            check_limit("max_length", value)

    @push_timeout.validator
    def _check_push_timeout(self, _attr: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ConfigError(
                f"push_timeout must be a finite number of seconds >= 0 (0: never wait), not {value!r}; "
                "an enqueue into a full queue never waits without a bound"
            )
        if value > MAX_PUSH_TIMEOUT:
            raise ConfigError(
                f"push_timeout must be at most {MAX_PUSH_TIMEOUT:g} s, not {value!r}: an enqueue holds its caller "
                "(often a request) while it waits"
            )


PUSH_POLL = (0.01, 0.25)
"""An enqueue waiting for room in a full queue looks again after 10 ms, doubling up to 250 ms
(Gitea's Redis queue: 50 ms to 2 s): room made by any process is seen within 250 ms, and a
waiter costs at most four insert attempts a second."""
MAX_PUSH_TIMEOUT = 3600.0
"""The longest `push_timeout`: an hour is already far past any request's patience."""


@attrs.frozen
class RetryPolicy:
    """Exponential backoff with jitter: attempt n failed -> wait `base * factor**(n-1)`,
    capped at `cap`, then scaled by a random factor in [1 - jitter, 1 + jitter]."""

    base: float = attrs.field(default=1.0, validator=_non_negative)
    factor: float = attrs.field(default=2.0, validator=_non_negative)
    cap: float = attrs.field(default=6 * 3600.0, validator=_non_negative)
    jitter: float = attrs.field(default=0.1)

    @cap.validator
    def _check_cap(self, _attr: attrs.Attribute[Any], value: Any) -> None:
        if value > MAX_DELAY:
            raise ConfigError(
                f"cap must be at most {MAX_DELAY:g} s (about {MAX_DELAY / (365 * 86400):.0f} years), not {value!r}; "
                "a job that should never run again is discarded, not retried"
            )

    @jitter.validator
    def _check_jitter(self, _attr: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ConfigError(f"jitter must be a number in [0, 1), not {value!r}")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based): finite and in
        ``[0, cap * (1 + jitter)]`` for every policy that validates and every attempt."""
        exponent = min(max(attempt - 1, 0), 64)
        try:
            grown = self.factor**exponent
        except OverflowError:  # factor=1e200 at the third failure: past any cap
            grown = math.inf
        if self.base == 0:
            raw = 0.0
        else:
            raw = self.cap if grown == math.inf else min(self.cap, self.base * grown)
        if self.jitter:
            raw *= 1 + rng.uniform(-self.jitter, self.jitter)
        return max(raw, 0.0)


@attrs.frozen
class RuntimeSettings:
    """Settings of one running runtime (see the table at the top of this module)."""

    grace: float = attrs.field(default=20.0, validator=_non_negative)
    flush_bound: float = attrs.field(default=5.0, validator=_non_negative)
    resource_bound: float = attrs.field(default=5.0, validator=_at_least(0.001))
    max_waiters: int = attrs.field(default=64, validator=_positive_int)
    thread_limit: int = attrs.field(default=16, validator=_positive_int)
    heartbeat_interval: float = attrs.field(default=5.0, validator=_at_least(0.01))
    rescue_after: float = attrs.field(default=60.0, validator=_non_negative)
    rescue_interval: float = attrs.field(default=15.0, validator=_at_least(0.01))
    keep_completed: float = attrs.field(default=24 * 3600.0, validator=_non_negative)
    keep_cancelled: float = attrs.field(default=24 * 3600.0, validator=_non_negative)
    keep_discarded: float = attrs.field(default=7 * 24 * 3600.0, validator=_non_negative)
    retention_interval: float = attrs.field(default=300.0, validator=_at_least(1.0))
    blocked_loop_warning: float | None = attrs.field(default=0.25, validator=_timeout_validator)
    """Warn when one task step holds the Trio loop longer than this many seconds (None: never)."""
    relay_batch: int = attrs.field(default=200, validator=_positive_int)
    """Outbox rows one relay pass claims at most."""
    relay_interval: float = attrs.field(default=1.0, validator=_at_least(0.01))
    """How often the relay looks for events when no wake-up came."""

    def __attrs_post_init__(self) -> None:
        if self.rescue_after < 3 * self.heartbeat_interval:
            raise ConfigError(
                f"rescue_after ({self.rescue_after:g} s) must be at least 3 x heartbeat_interval "
                f"({self.heartbeat_interval:g} s), or live jobs would be rescued while still running"
            )
