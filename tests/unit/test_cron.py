"""`nursery_jobs.cron`: schedules parsed once, their ticks, and the daylight-saving rules."""

from __future__ import annotations

from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

import nursery_jobs as nj
from nursery_jobs.cron import Cron, parse_schedule

UTC = timezone.utc
NY = ZoneInfo("America/New_York")


def _t(*parts: int, tz: object = UTC) -> float:
    return datetime(*parts, tzinfo=tz).timestamp()  # type: ignore[arg-type, misc]


def _ticks(cron: Cron, start: float, end: float) -> list[datetime]:
    out, t = [], cron.next_after(start)
    while t is not None and t <= end:
        out.append(datetime.fromtimestamp(t, cron.zone))
        t = cron.next_after(t)
    return out


def test_five_fields_macros_seconds_and_intervals_tick_where_expected() -> None:
    at = _t(2026, 1, 1, 12, 3)
    assert parse_schedule("*/5 * * * *").next_after(at) == _t(2026, 1, 1, 12, 5)
    assert parse_schedule("@hourly").next_after(at) == _t(2026, 1, 1, 13)
    assert parse_schedule("@daily").next_after(at) == parse_schedule("@midnight").next_after(at) == _t(2026, 1, 2)
    assert parse_schedule("@weekly").next_after(at) == _t(2026, 1, 4)  # a Sunday
    assert parse_schedule("@monthly").next_after(at) == _t(2026, 2, 1)
    assert parse_schedule("@yearly").next_after(at) == parse_schedule("@annually").next_after(at) == _t(2027, 1, 1)
    assert parse_schedule("*/10 * * * * *").next_after(at + 1) == at + 10  # seconds first
    every = parse_schedule("@every 10m")
    assert every.every == 600 and every.next_after(at) == _t(2026, 1, 1, 12, 10)  # from the epoch
    assert parse_schedule("@every 1h30m").every == 5400
    assert parse_schedule("@every 45s").next_after(0) == 45.0


def test_next_after_is_strictly_after_and_latest_in_is_within_the_window() -> None:
    cron = parse_schedule("* * * * *")
    minute = _t(2026, 1, 1, 12, 0)
    assert cron.next_after(minute) == minute + 60
    assert cron.next_after(minute - 0.5) == minute
    assert cron.latest_in(minute - 600, minute) == minute  # at the tick itself
    assert cron.latest_in(minute - 600, minute + 59.9) == minute
    assert cron.latest_in(minute, minute + 59) is None  # (after, t]: the tick at `after` is not in it
    # a year of minutely ticks: found stepping back, not one step per tick
    assert cron.latest_in(minute - 365 * 86400, minute + 30) == minute


@pytest.mark.parametrize(
    "schedule, needle",
    [
        ("* * *", "has 3 fields"),
        ("* * * * * * *", "has 7 fields"),
        ("61 * * * *", "Bad minute"),
        ("0 0 30 2 *", "Bad day-of-month"),
        ("@fortnightly", "unknown macro"),
        ("@every", "write an interval"),
        ("@every 10 minutes", "write an interval"),
        ("@every 0s", "at least 1 s"),
        ("", "must be a cron expression"),
        (5, "must be a cron expression"),
    ],
)
def test_an_invalid_schedule_is_a_config_error_saying_what_is_wrong(schedule: object, needle: str) -> None:
    with pytest.raises(nj.ConfigError, match=needle):
        parse_schedule(schedule)


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "", None, "../etc/passwd"])
def test_an_unknown_timezone_is_a_config_error(zone: object) -> None:
    with pytest.raises(nj.ConfigError, match="timezone"):
        parse_schedule("@daily", zone)


def test_ticks_are_computed_in_the_schedules_timezone() -> None:
    paris = parse_schedule("0 9 * * *", "Europe/Paris")
    assert paris.next_after(_t(2026, 1, 1)) == _t(2026, 1, 1, 8)  # 09:00 CET = 08:00 UTC
    assert paris.next_after(_t(2026, 7, 1)) == _t(2026, 7, 1, 7)  # 09:00 CEST = 07:00 UTC


def test_spring_forward_a_fixed_time_in_the_skipped_hour_runs_once_at_the_first_valid_moment() -> None:
    # 2026-03-08, New York: 02:00 EST becomes 03:00 EDT; 02:30 does not exist that day.
    cron = parse_schedule("30 2 * * *", "America/New_York")
    ticks = _ticks(cron, _t(2026, 3, 6, 12, tz=NY), _t(2026, 3, 10, 12, tz=NY))
    assert [(d.day, d.hour, d.minute) for d in ticks] == [(7, 2, 30), (8, 3, 0), (9, 2, 30), (10, 2, 30)]
    # a wildcard hour has no ticks in the skipped hour, and loses none elsewhere
    half = parse_schedule("*/30 * * * *", "America/New_York")
    ticks = _ticks(half, _t(2026, 3, 8, 1, 10, tz=NY), _t(2026, 3, 8, 3, 40, tz=NY))
    assert [(d.hour, d.minute) for d in ticks] == [(1, 30), (3, 0), (3, 30)]
    assert all(b.timestamp() - a.timestamp() == 1800 for a, b in zip(ticks, ticks[1:]))


def test_fall_back_a_fixed_time_in_the_repeated_hour_runs_once_a_wildcard_runs_in_both() -> None:
    # 2026-11-01, New York: 02:00 EDT becomes 01:00 EST; 01:00-01:59 happens twice.
    cron = parse_schedule("30 1 * * *", "America/New_York")
    ticks = _ticks(cron, _t(2026, 10, 31, 12, tz=NY), _t(2026, 11, 2, 12, tz=NY))
    assert [(d.day, d.hour, d.minute, d.utcoffset().total_seconds() / 3600) for d in ticks] == [  # type: ignore[union-attr]
        (1, 1, 30, -4.0),  # the first 01:30 only
        (2, 1, 30, -5.0),
    ]
    half = parse_schedule("*/30 * * * *", "America/New_York")
    ticks = _ticks(half, _t(2026, 11, 1, 0, 40, tz=NY), _t(2026, 11, 1, 6, 35, tz=UTC))
    assert [(d.hour, d.minute, d.fold) for d in ticks] == [(1, 0, 0), (1, 30, 0), (1, 0, 1), (1, 30, 1)]
    assert all(b.timestamp() - a.timestamp() == 1800 for a, b in zip(ticks, ticks[1:]))


def test_latest_in_agrees_with_the_forward_sequence_across_dst() -> None:
    cron = parse_schedule("30 2 * * *", "America/New_York")
    day_after = _t(2026, 3, 8, 12, tz=NY)
    assert cron.latest_in(day_after - 3 * 86400, day_after) == _t(2026, 3, 8, 3, 0, tz=NY)
    fall = parse_schedule("30 1 * * *", "America/New_York")
    assert fall.latest_in(_t(2026, 10, 31, tz=NY), _t(2026, 11, 1, 12, tz=NY)) == _t(2026, 11, 1, 5, 30)
