"""Five-field cron expressions in UTC: parsing, and the ticks before and after a time.

``minute hour day-of-month month day-of-week``, as Vixie cron reads them: each field
is ``*``, a number, a range ``a-b``, a step ``*/n``, ``a-b/n`` or ``a/n`` (from ``a`` to
the field's end), or a comma-separated list of those; months may be named
``jan``-``dec`` and days ``sun``-``sat`` (day 0 and 7 are both Sunday).  When both
day fields are restricted (neither starts with ``*``) a day matches if *either* does,
as in cron.  The macros ``@hourly``, ``@daily`` (``@midnight``), ``@weekly``,
``@monthly`` and ``@yearly`` (``@annually``) stand for their five fields.

Times are nanoseconds since the epoch, read in UTC: no time zone, so no daylight
saving gaps or repeats.  Why a parser of our own and not ``croniter``: see
docs/dependencies.md (we need both directions, UTC only, and a dependency-free core).
"""

from __future__ import annotations

import datetime as _dt

__all__ = ["NEVER_NS", "CronSchedule", "parse_cron"]

_MINUTE_NS = 60 * 1_000_000_000
_EPOCH = _dt.date(1970, 1, 1).toordinal()
# How far a search for a tick looks.  Most expressions match within a year; the rarest
# valid one is Feb 29 on some weekdays when both day fields must match (the weekday
# field starts with "*", as "*/2" does): a few times a century, the leap years 2100,
# 2200 and 2300 skipped.  Past this, a tick counts as never (NEVER_NS).
_HORIZON_DAYS = 366 * 100
NEVER_NS = 1 << 70  # later than any time a queue stores (int64 ns end in 2262)

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {
    m: i
    for i, m in enumerate(
        ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1
    )
}
_DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
# (name, low, high, names) of each field, in order.
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)
_MONTH_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # Feb: in a leap year


def _value(text: str, field: str, low: int, high: int, names: dict[str, int]) -> int:
    found = names.get(text.lower())
    if found is not None:
        return found
    if not text.isdigit():
        raise ValueError(f"cron {field} field: {text!r} is not a number from {low} to {high}")
    number = int(text)
    if not low <= number <= high:
        raise ValueError(f"cron {field} field: {number} is outside {low}-{high}")
    return number


def _parse_field(text: str, field: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) == 0:
                raise ValueError(f"cron {field} field: step {step_text!r} must be a number >= 1")
            step = int(step_text)
        if base == "*":
            first, last = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            first = _value(a, field, low, high, names)
            last = _value(b, field, low, high, names)
            if first > last:
                raise ValueError(f"cron {field} field: range {base!r} runs backwards")
        elif base:
            first = _value(base, field, low, high, names)
            last = high if slash else first
        else:
            raise ValueError(f"cron {field} field: empty item in {text!r}")
        values.update(range(first, last + 1, step))
    return values


class CronSchedule:
    """A parsed cron expression: :meth:`next_after` and :meth:`last_at_or_before`."""

    __slots__ = ("_any_day", "_days", "_hours", "_minutes", "_months", "_weekdays", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        fields = _MACROS.get(text.strip().lower(), text).split()
        if len(fields) != 5:
            raise ValueError(
                f"cron expression {text!r} must have 5 fields (minute hour day-of-month "
                f"month day-of-week), got {len(fields)}; e.g. '*/5 * * * *'"
            )
        parsed = [_parse_field(f, *spec) for f, spec in zip(fields, _FIELDS, strict=True)]
        self._minutes = sorted(parsed[0])
        self._hours = sorted(parsed[1])
        self._days = parsed[2]
        self._months = parsed[3]
        self._weekdays = {d % 7 for d in parsed[4]}
        day_star, weekday_star = fields[2].startswith("*"), fields[4].startswith("*")
        # cron's rule: when both day fields are restricted, either may match; when one
        # starts with ``*``, both must (the ``*`` one matching every day, or its step's).
        self._any_day = not (day_star or weekday_star)
        if not any(d <= _MONTH_DAYS[m] for m in self._months for d in self._days) and not (
            self._any_day
        ):
            raise ValueError(f"cron expression {text!r} never matches (no such day in its months)")

    def _day_matches(self, day: _dt.date) -> bool:
        if day.month not in self._months:
            return False
        weekday = (day.weekday() + 1) % 7  # cron counts from Sunday
        if self._any_day:
            return day.day in self._days or weekday in self._weekdays
        return day.day in self._days and weekday in self._weekdays

    def next_after(self, t_ns: int) -> int:
        """The first tick (a whole minute matching every field) strictly after ``t_ns``;
        :data:`NEVER_NS` if there is none in the next 100 years."""
        start = t_ns // _MINUTE_NS + 1  # minutes since the epoch
        ordinal, minute_of_day = divmod(start, 24 * 60)
        hour0, minute0 = divmod(minute_of_day, 60)
        for offset in range(_HORIZON_DAYS):
            day = _dt.date.fromordinal(_EPOCH + ordinal + offset)
            if not self._day_matches(day):
                continue
            for hour in self._hours:
                if offset == 0 and hour < hour0:
                    continue
                for minute in self._minutes:
                    if offset == 0 and hour == hour0 and minute < minute0:
                        continue
                    return (((ordinal + offset) * 24 + hour) * 60 + minute) * _MINUTE_NS
        return NEVER_NS  # (a job of such an expression never fires: nothing breaks)

    def last_at_or_before(self, t_ns: int) -> int | None:
        """The last tick at or before ``t_ns`` (None if none in the 100 years before)."""
        end = t_ns // _MINUTE_NS
        ordinal, minute_of_day = divmod(end, 24 * 60)
        hour0, minute0 = divmod(minute_of_day, 60)
        for offset in range(_HORIZON_DAYS):
            if ordinal - offset + _EPOCH < 1:
                return None
            day = _dt.date.fromordinal(_EPOCH + ordinal - offset)
            if not self._day_matches(day):
                continue
            for hour in reversed(self._hours):
                if offset == 0 and hour > hour0:
                    continue
                for minute in reversed(self._minutes):
                    if offset == 0 and hour == hour0 and minute > minute0:
                        continue
                    return (((ordinal - offset) * 24 + hour) * 60 + minute) * _MINUTE_NS
        return None


def parse_cron(text: object) -> CronSchedule:
    """A :class:`CronSchedule`; ``TypeError`` if ``text`` is not a str, ``ValueError``
    (saying which field and why) if it is not a valid 5-field expression."""
    if type(text) is not str:
        raise TypeError(f"cron must be a str such as '0 * * * *', got {type(text).__name__}")
    return CronSchedule(text)
