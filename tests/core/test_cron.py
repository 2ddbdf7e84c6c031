"""The 5-field UTC cron parser of periodic jobs, against a minute-by-minute oracle."""

from __future__ import annotations

import datetime as dt

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from ledgerq.core.cron import parse_cron

MINUTE = 60 * 1_000_000_000
UTC = dt.UTC


def ns(*args: int) -> int:
    return int(dt.datetime(*args, tzinfo=UTC).timestamp()) * 1_000_000_000


def matches(fields: list[set[int]], day_rule_or: bool, t_ns: int) -> bool:
    """The oracle: whether the minute at ``t_ns`` matches, read off the calendar."""
    moment = dt.datetime.fromtimestamp(t_ns / 1e9, UTC)
    minutes, hours, days, months, weekdays = fields
    weekday = moment.isoweekday() % 7
    day_ok = (
        (moment.day in days or weekday in weekdays)
        if day_rule_or
        else (moment.day in days and weekday in weekdays)
    )
    return moment.minute in minutes and moment.hour in hours and moment.month in months and day_ok


def field(low: int, high: int) -> st.SearchStrategy[tuple[str, set[int]]]:
    """A field's text and the values it means, built from the same choices."""
    star = st.just(("*", set(range(low, high + 1))))
    step = st.integers(1, high - low + 1).map(lambda n: (f"*/{n}", set(range(low, high + 1, n))))
    one = st.integers(low, high).map(lambda v: (str(v), {v}))
    span = st.tuples(st.integers(low, high), st.integers(low, high), st.integers(1, 5)).map(
        lambda t: (
            f"{min(t[0], t[1])}-{max(t[0], t[1])}/{t[2]}",
            set(range(min(t[0], t[1]), max(t[0], t[1]) + 1, t[2])),
        )
    )
    listed = st.lists(one, min_size=2, max_size=3).map(
        lambda items: (",".join(i[0] for i in items), set().union(*(i[1] for i in items)))
    )
    return st.one_of(star, step, one, span, listed)


expressions = st.tuples(field(0, 59), field(0, 23), field(1, 31), field(1, 12), field(0, 6))
times = st.integers(ns(2020, 1, 1), ns(2030, 1, 1))


def _scan(fields: list[set[int]], or_rule: bool, start: int, step: int) -> int | None:
    """The first matching minute from ``start`` going by ``step`` (+-1 minute), within
    400 days: whole days that cannot match are skipped (their noon is tested, with every
    hour and minute allowed), the others walked minute by minute."""
    day_only = [set(range(60)), set(range(24)), *fields[2:]]
    day_ns = 1440 * MINUTE
    t = start
    for _ in range(400):
        noon = t // day_ns * day_ns + day_ns // 2
        if matches(day_only, or_rule, noon):
            day = t // day_ns
            while t // day_ns == day:
                if matches(fields, or_rule, t):
                    return t
                t += step
        else:
            t = (t // day_ns + 1) * day_ns if step > 0 else t // day_ns * day_ns - MINUTE
    return None


@settings(max_examples=400, deadline=None)
@given(expressions, times)
def test_next_and_last_tick_agree_with_the_calendar(
    parts: tuple[tuple[str, set[int]], ...], t_ns: int
) -> None:
    text = " ".join(p[0] for p in parts)
    fields = [p[1] for p in parts]
    or_rule = not parts[2][0].startswith("*") and not parts[4][0].startswith("*")
    possible = or_rule or any(
        day <= (29 if month == 2 else 30 if month in (4, 6, 9, 11) else 31)
        for day in fields[2]
        for month in fields[3]
    )
    if not possible:  # e.g. day 31 in February only
        with pytest.raises(ValueError, match="never matches"):
            parse_cron(text)
        return
    schedule = parse_cron(text)
    expected_next = _scan(fields, or_rule, (t_ns // MINUTE + 1) * MINUTE, MINUTE)
    if expected_next is not None:
        assert schedule.next_after(t_ns) == expected_next, text
    expected_last = _scan(fields, or_rule, t_ns // MINUTE * MINUTE, -MINUTE)
    if expected_last is not None:
        assert schedule.last_at_or_before(t_ns) == expected_last, text


@pytest.mark.parametrize(
    ("text", "after", "expected"),
    [
        ("0 0 29 2 *", ns(2097, 3, 1), ns(2104, 2, 29)),  # 2100 is not a leap year
        ("@yearly", ns(2026, 5, 5), ns(2027, 1, 1)),
        ("@weekly", ns(2026, 12, 2), ns(2026, 12, 6)),  # Sunday
        ("0 9 * jan,jul mon-fri", ns(2026, 1, 30, 10), ns(2026, 7, 1, 9)),
        ("30 2 1,15 * 5", ns(2026, 12, 1, 3), ns(2026, 12, 4, 2, 30)),  # day 1/15 OR Friday
        ("0 0 * * 7", ns(2026, 12, 2), ns(2026, 12, 6)),  # 7 is Sunday too
    ],
)
def test_known_ticks(text: str, after: int, expected: int) -> None:
    schedule = parse_cron(text)
    assert schedule.next_after(after) == expected
    assert schedule.last_at_or_before(expected) == expected
    assert schedule.last_at_or_before(expected - 1) < expected  # type: ignore[operator]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("* * * *", "must have 5 fields"),
        ("* * * * * *", "must have 5 fields"),
        ("60 * * * *", "minute field: 60 is outside 0-59"),
        ("* 24 * * *", "hour field"),
        ("* * 0 * *", "day of month field"),
        ("* * * 13 *", "month field"),
        ("* * * * 8", "day of week field"),
        ("*/0 * * * *", "step '0'"),
        ("5-1 * * * *", "runs backwards"),
        ("1,,2 * * * *", "empty item"),
        ("x * * * *", "'x' is not a number"),
        ("0 0 30 2 *", "never matches"),
        ("@often", "must have 5 fields"),
    ],
)
def test_bad_expressions_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_cron(text)


def test_a_cron_must_be_text() -> None:
    with pytest.raises(TypeError, match="cron must be a str"):
        parse_cron(b"* * * * *")


def test_the_rarest_expressions_find_their_ticks_or_never() -> None:
    # Feb 29 on a Sunday, Tuesday, Thursday or Saturday ("*/2" restricts the weekday,
    # and starts with "*": both fields must match).
    rare = parse_cron("0 0 29 2 */2")
    tick = rare.next_after(ns(2026, 1, 1))
    moment = dt.datetime.fromtimestamp(tick / 1e9, UTC)
    assert (moment.month, moment.day, moment.isoweekday() % 7 % 2) == (2, 29, 0)
    assert rare.last_at_or_before(tick) == tick
