"""`Cron`: a periodic schedule, parsed once, and the points in time it ticks at.

A schedule is a cron expression of 5 fields (minute hour day-of-month month day-of-week) or 6
(a seconds field first), a macro (`@yearly`/`@annually`, `@monthly`, `@weekly`, `@daily`/
`@midnight`, `@hourly`), or an interval (`@every 10m`, `@every 1h30m`, `@every 45s`). Ticks are
Unix times (seconds since the epoch, UTC) on whole seconds.

Cron expressions are evaluated by cronsim in the schedule's timezone (zoneinfo), with its
daylight-saving rules, which are Debian cron's:

- spring forward (a local hour is skipped): a job at a fixed time inside the skipped hour
  (``30 2 * * *``) runs once, at the first valid moment after it (03:00); ticks of a job with a
  wildcard minute or hour inside the skipped hour do not exist;
- fall back (a local hour repeats): a job at a fixed time inside the repeated hour runs once, at
  its first occurrence; a job with a wildcard minute or hour ticks in both occurrences (real
  elapsed time). A 6-field expression never gets the fixed-time rule (cronsim's choice: it is
  not Debian cron syntax).

`@every` intervals are absolute durations counted from the Unix epoch (ticks at whole multiples
of the interval), so every process computes the same ticks without talking to the others; the
timezone does not apply to them.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
from cronsim import CronSim, CronSimError

from .errors import ConfigError

__all__ = ["Cron", "parse_schedule"]

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_EVERY = re.compile(r"(?:(\d+)([smhd]))+")
_PART = re.compile(r"(\d+)([smhd])")

_REVERSE_STEPS = 64
"""How many earlier ticks `latest_in` steps back through before giving up (DST fix-ups)."""


def _zone(name: object) -> tzinfo:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"timezone must be an IANA name such as 'UTC' or 'Europe/Paris', not {name!r}")
    if name == "UTC":
        return timezone.utc
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            f"unknown timezone {name!r}: use an IANA name such as 'UTC' or 'Europe/Paris' "
            "(on a system without a zone database, install the tzdata package)"
        ) from None


@attrs.frozen
class Cron:
    """A parsed schedule (`parse_schedule`): `next_after(t)` and `latest_in(after, t)` on Unix
    times."""

    schedule: str
    """As declared."""
    timezone: str
    expression: str | None
    """The cron expression cronsim evaluates (a macro expanded); None for `@every`."""
    every: int | None
    """The interval in seconds for `@every`; None for a cron expression."""
    zone: tzinfo = attrs.field(repr=False)

    def next_after(self, t: float) -> float | None:
        """The first tick strictly after Unix time `t` (None: the expression never ticks again)."""
        if self.every is not None:
            return float((int(t // self.every) + 1) * self.every)
        start = datetime.fromtimestamp(int(t // 1), self.zone)
        try:
            return next(CronSim(self.expression or "", start)).timestamp()
        except StopIteration:
            return None

    def _before_or_at(self, t: float) -> float | None:
        """cronsim's latest tick at or before Unix time `t` (a candidate: see `latest_in`)."""
        if self.every is not None:
            return float(int(t // self.every) * self.every)
        start = datetime.fromtimestamp(int(t // 1), self.zone) + timedelta(seconds=1)
        try:
            return next(CronSim(self.expression or "", start, reverse=True)).timestamp()
        except StopIteration:
            return None

    def latest_in(self, after: float, t: float) -> float | None:
        """The latest tick of the forward sequence in ``(after, t]``, or None: found by stepping
        back from `t` (so a long downtime costs a few steps, not one per missed tick), then
        confirmed going forward, so that it is always a point `next_after` yields."""
        if t <= after:
            return None
        candidate = self._before_or_at(t)
        for _ in range(_REVERSE_STEPS):
            if candidate is None or candidate <= after - 1:
                return None
            best = None
            tick = self.next_after(max(after, candidate - 1))
            while tick is not None and tick <= t:
                best = tick
                tick = self.next_after(tick)
            if best is not None:
                return best if best > after else None
            candidate = self._before_or_at(candidate - 1)
        return None


def parse_schedule(schedule: object, timezone_name: object = "UTC") -> Cron:
    """The `Cron` for `schedule` in `timezone_name`; `ConfigError` saying what is wrong for an
    invalid expression, an interval that is not a whole number of seconds >= 1, an expression
    that never ticks, or an unknown timezone."""
    zone = _zone(timezone_name)
    assert isinstance(timezone_name, str)
    if not isinstance(schedule, str) or not schedule.strip():
        raise ConfigError(f"schedule must be a cron expression or a macro such as '@hourly', not {schedule!r}")
    text = " ".join(schedule.split())
    lowered = text.lower()
    if lowered.startswith("@every"):
        spec = lowered[len("@every") :].replace(" ", "")
        if not _EVERY.fullmatch(spec):
            raise ConfigError(
                f"schedule {schedule!r}: write an interval as '@every 10m', '@every 1h30m' or '@every 45s' "
                "(units s, m, h, d)"
            )
        seconds = sum(int(n) * _UNITS[u] for n, u in _PART.findall(spec))
        if seconds < 1:
            raise ConfigError(f"schedule {schedule!r}: the interval must be at least 1 s")
        return Cron(schedule, timezone_name, None, seconds, zone)
    if lowered.startswith("@"):
        expression = MACROS.get(lowered)
        if expression is None:
            raise ConfigError(
                f"schedule {schedule!r}: unknown macro; use one of {sorted(MACROS)} or '@every <interval>'"
            )
    else:
        expression = text
    if len(expression.split()) not in (5, 6):
        raise ConfigError(
            f"schedule {schedule!r} has {len(expression.split())} fields: a cron expression has 5 "
            "(minute hour day-of-month month day-of-week) or 6 (a seconds field first)"
        )
    try:
        CronSim(expression, datetime(2000, 1, 1, tzinfo=zone))
    except CronSimError as exc:
        raise ConfigError(f"invalid cron expression {schedule!r}: {exc}") from None
    cron = Cron(schedule, timezone_name, expression, None, zone)
    if cron.next_after(datetime(2000, 1, 1, tzinfo=timezone.utc).timestamp()) is None:
        raise ConfigError(f"cron expression {schedule!r} never ticks")
    return cron
