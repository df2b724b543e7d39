"""Settings, each validated when built, and every tuning constant in one table.

| Constant | Default | Effect | Reason |
|---|---|---|---|
| `grace` | 20 s | how long shutdown waits for running jobs before cancelling them | the seed's rolling redeploy: long enough for most jobs, short enough for the orchestrator's kill |
| `flush_bound` | 5 s | how long shutdown gives cancelled jobs' cleanup and the final completer flush | shutdown must be bounded; cleanup runs shielded but never unbounded |
| `max_workers` ("default" queue) | 10 | jobs at once in the default queue | a pool per queue keeps a slow queue from starving another |
| `timeout` ("default" queue) | 60 s | hard per-attempt timeout (a Trio cancel scope) | River's default `JobTimeout` of 1 min; every wait is bounded |
| `max_attempts` | 25 | attempts before a failing job is discarded | River's count: with the default backoff, about three days of retries |
| `RetryPolicy` | 1 s x 2^(n-1), cap 6 h, +/-10 % jitter | delay before attempt n+1 | exponential so transient faults clear fast and outages are not hammered; jitter spreads a thundering herd |
| `max_waiters` | 64 per queue | receipts waited for at once; beyond it `wait` answers "not done" at once | the seed's in-request waiting: backpressure instead of an unbounded queue of waiters |
| `thread_limit` | 16 | concurrent `run_blocking` threads | blocking code must not take every core nor grow without bound |
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable

import attrs

from .errors import ConfigError

__all__ = ["QueueConfig", "RetryPolicy", "RuntimeSettings"]

DEFAULT_QUEUE = "default"


def _check_name(kind: str) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    def check(_inst: Any, _attr: attrs.Attribute[Any], value: Any) -> None:
        if not isinstance(value, str) or not value or len(value) > 128 or not value.isprintable():
            raise ConfigError(
                f"{kind} name must be a non-empty printable str of at most 128 characters, not {value!r}"
            )

    return check


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


def _non_negative(_inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{attr.name} must be a finite number >= 0, not {value!r}")


@attrs.frozen
class QueueConfig:
    """A named queue: its own worker pool and its hard per-attempt timeout.

    `timeout=None` means attempts in this queue have no deadline unless their job kind sets one.
    """

    name: str = attrs.field(validator=_check_name("queue"))
    max_workers: int = attrs.field(validator=_positive_int)
    timeout: float | None = attrs.field(validator=_timeout_validator)


@attrs.frozen
class RetryPolicy:
    """Exponential backoff with jitter: attempt n failed -> wait `base * factor**(n-1)`,
    capped at `cap`, then scaled by a random factor in [1 - jitter, 1 + jitter]."""

    base: float = attrs.field(default=1.0, validator=_non_negative)
    factor: float = attrs.field(default=2.0, validator=_non_negative)
    cap: float = attrs.field(default=6 * 3600.0, validator=_non_negative)
    jitter: float = attrs.field(default=0.1)

    @jitter.validator
    def _check_jitter(self, _attr: attrs.Attribute[Any], value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ConfigError(f"jitter must be a number in [0, 1), not {value!r}")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        exponent = min(max(attempt - 1, 0), 64)
        raw = min(self.cap, self.base * self.factor**exponent)
        if self.jitter:
            raw *= 1 + rng.uniform(-self.jitter, self.jitter)
        return max(raw, 0.0)


@attrs.frozen
class RuntimeSettings:
    """Settings of one running runtime (see the table at the top of this module)."""

    grace: float = attrs.field(default=20.0, validator=_non_negative)
    flush_bound: float = attrs.field(default=5.0, validator=_non_negative)
    max_waiters: int = attrs.field(default=64, validator=_positive_int)
    thread_limit: int = attrs.field(default=16, validator=_positive_int)
