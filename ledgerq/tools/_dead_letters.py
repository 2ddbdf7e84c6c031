"""Dead letters picked and moved: the filter ``ledgerq dlq`` and the console share, the
requeue, and the pacing of a long run of ids.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ledgerq._queue import Queue
from ledgerq._types import Message

# The headers the dead-letter feature writes on every message it moves (docs/dlq.md).
DEAD_LETTER_HEADERS = (
    "dlq.original_id",
    "dlq.retry_count",
    "dlq.failure_reason",
    "dlq.last_failure",
)


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Which dead-lettered messages an operation picks: every condition given must hold.

    ``ledgerq dlq list|requeue|purge`` and the web console (``ledgerq ui``) choose
    with this one class, so a filter means the same in both.  Conditions:

    * ``reason``: the last failure reason (header ``dlq.failure_reason``) contains a
      match of this regular expression, ignoring case - or, with ``regex=False``,
      contains this text, ignoring case;
    * ``older_than``: the message was dead-lettered more than this many seconds ago
      (its timestamp in the dead-letter queue is when it arrived there);
    * ``headers``: the message has each of these headers with exactly this value;
    * ``attempts_at_least``: it failed at least this many deliveries (header
      ``dlq.retry_count``).

    An empty filter matches every message.  Raises ``ValueError`` for a reason that is
    not a valid regular expression, a negative or non-finite age and attempts below 0.
    """

    reason: str | None = None
    regex: bool = True
    older_than: float | None = None
    headers: tuple[tuple[str, str], ...] = ()
    attempts_at_least: int | None = None
    _pattern: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.reason is not None and self.reason != "":
            source = self.reason if self.regex else re.escape(self.reason)
            try:
                pattern = re.compile(source, re.IGNORECASE)
            except re.error as exc:
                raise ValueError(
                    f"the reason {self.reason!r} is not a valid regular expression: {exc}"
                ) from None
            object.__setattr__(self, "_pattern", pattern)
        if self.older_than is not None and not (
            math.isfinite(self.older_than) and self.older_than >= 0
        ):
            raise ValueError(f"older_than must be a number of seconds >= 0, got {self.older_than}")
        if self.attempts_at_least is not None and self.attempts_at_least < 0:
            raise ValueError(f"attempts_at_least must be >= 0, got {self.attempts_at_least}")
        object.__setattr__(self, "headers", tuple((str(k), str(v)) for k, v in self.headers))

    @property
    def is_empty(self) -> bool:
        """Whether it has no condition (it matches every message)."""
        return (
            self._pattern is None
            and self.older_than is None
            and not self.headers
            and self.attempts_at_least is None
        )

    def matches(self, message: Message, now_ns: int | None = None) -> bool:
        """Whether the dead-lettered ``message`` meets every condition.

        ``now_ns`` (ns since the epoch, default now) is the time ages are measured
        from: pass one value for a whole listing, so that it does not drift.
        """
        headers = message.headers
        if self._pattern is not None and not self._pattern.search(
            headers.get("dlq.failure_reason", "")
        ):
            return False
        for key, value in self.headers:
            if headers.get(key) != value:
                return False
        if self.attempts_at_least is not None:
            count = headers.get("dlq.retry_count", "")
            if not (count.isdigit() and int(count) >= self.attempts_at_least):
                return False
        if self.older_than is not None:
            now = time.time_ns() if now_ns is None else now_ns
            if now - message.timestamp <= self.older_than * 1e9:
                return False
        return True

    def describe(self) -> str:
        """The conditions in words (``"reason matching /timeout/, older than 600s"``)."""
        parts = []
        if self._pattern is not None:
            shown = f"/{self.reason}/" if self.regex else repr(self.reason)
            parts.append(f"reason {'matching' if self.regex else 'containing'} {shown}")
        if self.older_than is not None:
            parts.append(f"dead-lettered more than {self.older_than:g}s ago")
        parts.extend(f"header {key}={value}" for key, value in self.headers)
        if self.attempts_at_least is not None:
            parts.append(f"at least {self.attempts_at_least} failed deliveries")
        return ", ".join(parts) if parts else "every message"


def parse_header_condition(text: str) -> tuple[str, str]:
    """``"K=V"`` as the header condition ``(K, V)``; ``ValueError`` without a ``=`` or a key."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"{text!r} is not a header condition; write KEY=VALUE")
    return key, value


def requeue_dead_letters(queue: Queue, ids: Iterable[int] | None, *, delay: float | None) -> int:
    """``queue.requeue_dlq(ids)``, the messages first delivered no earlier than ``delay``
    seconds from now when ``delay`` is given; return how many moved."""
    return queue.requeue_dlq(ids, delay=delay)


def paced(
    ids: Sequence[int],
    rate: float | None,
    apply: Callable[[list[int]], int],
    *,
    should_stop: Callable[[], bool] | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Call ``apply`` on consecutive slices of ``ids`` at most ``rate`` ids per second.

    Returns the sum of what ``apply`` returned.  Without a rate, one call takes them
    all.  With one, each slice holds at most a tenth of a second's worth (at least one
    id) and starts no earlier than its share of the time since the first one - the
    schedule is kept against the clock, so a slow ``apply`` does not add up to a
    lower rate, and a burst never exceeds one slice.  ``should_stop`` is asked before
    each slice after the first; True ends the run early (``ledgerq ui``'s cancel).
    """
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a number of messages per second > 0, got {rate}")
    chosen = list(ids)
    if not chosen:
        return 0
    if rate is None:
        return apply(chosen)
    step = max(1, min(len(chosen), int(rate / 10)))
    start = monotonic()
    done = 0
    for offset in range(0, len(chosen), step):
        if offset:
            if should_stop is not None and should_stop():
                break
            wait = start + offset / rate - monotonic()
            if wait > 0:
                sleep(wait)
        done += apply(chosen[offset : offset + step])
    return done
