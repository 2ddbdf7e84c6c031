"""What a page's query string or form says: filters, ids, rates - checked.

Every value a person types is parsed here and a bad one raises :class:`FormError`
with a sentence for the page; nothing unparsed goes further.  Durations take the
CLI's forms (``30s``, ``10m``, ``2h``, ``7d``, ``1w`` or plain seconds).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from ledgerq import tools

__all__ = ["FilterForm", "FormError", "parse_duration", "parse_ids", "parse_positive"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_IDS = 10_000  # ids one "requeue selected" may name (a page shows at most 500)


class FormError(ValueError):
    """A value a person gave that the console cannot use; the text says why."""


def parse_duration(text: str, what: str) -> float:
    """Seconds in ``text`` (see the module); :class:`FormError` naming ``what``."""
    match = _DURATION.match(text)
    if match is None:
        raise FormError(f"{what}: {text!r} is not a duration; write e.g. 30s, 10m, 2h or 7d")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]


def parse_positive(text: str, what: str) -> float:
    """A number > 0 (a rate, a delay); :class:`FormError` naming ``what``."""
    try:
        value = float(text)
    except ValueError:
        raise FormError(f"{what}: {text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise FormError(f"{what} must be a number above 0, not {text}")
    return value


def parse_ids(values: Iterable[str]) -> tuple[int, ...]:
    """Message ids given as form values (each a positive integer)."""
    ids = []
    for text in values:
        if not text.isdigit() or int(text) < 1:
            raise FormError(f"{text!r} is not a message id")
        ids.append(int(text))
        if len(ids) > MAX_IDS:
            raise FormError(f"more than {MAX_IDS:,} ids selected; use 'requeue matching'")
    return tuple(ids)


@dataclass(frozen=True, slots=True)
class FilterForm:
    """The DLQ page's filter as typed (to show back in the form) and as parsed.

    ``reason`` is text unless ``regex``; ``older_than`` a duration; ``header`` one
    ``KEY=VALUE``; ``attempts`` a count.  Empty fields are no condition.
    """

    reason: str = ""
    regex: bool = False
    older_than: str = ""
    header: str = ""
    attempts: str = ""

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str, str]]) -> FilterForm:
        """The form's fields from query or form pairs (other names ignored)."""
        values = dict(pairs)
        return cls(
            reason=values.get("reason", "").strip(),
            regex=values.get("regex", "") in ("1", "on", "true"),
            older_than=values.get("older_than", "").strip(),
            header=values.get("header", "").strip(),
            attempts=values.get("attempts", "").strip(),
        )

    def query(self) -> list[tuple[str, str]]:
        """The non-empty fields, for links that keep the filter."""
        pairs = [
            ("reason", self.reason),
            ("regex", "1" if self.regex and self.reason else ""),
            ("older_than", self.older_than),
            ("header", self.header),
            ("attempts", self.attempts),
        ]
        return [(k, v) for k, v in pairs if v]

    def parsed(self) -> tools.DeadLetterFilter:
        """The filter, checked (:class:`FormError` for a bad field)."""
        older = parse_duration(self.older_than, "older than") if self.older_than else None
        headers: tuple[tuple[str, str], ...] = ()
        if self.header:
            try:
                headers = (tools.parse_header_condition(self.header),)
            except ValueError as exc:
                raise FormError(f"header: {exc}") from None
        attempts = None
        if self.attempts:
            if not self.attempts.isdigit():
                raise FormError(f"attempts: {self.attempts!r} is not a whole number")
            attempts = int(self.attempts)
        try:
            return tools.DeadLetterFilter(
                reason=self.reason or None,
                regex=self.regex,
                older_than=older,
                headers=headers,
                attempts_at_least=attempts,
            )
        except ValueError as exc:
            raise FormError(str(exc)) from None
