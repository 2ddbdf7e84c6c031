"""The queue's clock: wall-clock times that never jump while the queue is open.

Every time a queue stores - an entry's timestamp and ``expires_at``, the end of a
dedup window, a failure's time - is nanoseconds since the epoch, so that it means
the same after a restart.  The wall clock, though, is stepped: by NTP, by hand, by a
device that boots in 1970.  Read for each decision, a step back of a day kept a 3 s
TTL message alive for a day, a step forward expired an hour-long TTL at once, and
starvation promotion, dedup windows and retention by age jumped with it.  So a
queue reads one clock of its own::

    at open:     base = max(wall clock, the newest timestamp in the log)
    while open:  now  = base + (monotonic clock - monotonic clock at open)

and uses it for every stamp and every decision (timestamps, expiries, TTL checks,
dedup windows, starvation, retention by age, lease deadlines).  What follows:

* a step of the system clock while the queue is open changes nothing;
* across a restart the queue's time never goes back below what the log holds: a
  step back cannot make a stored TTL, window or age longer than it was;
* a step forward takes effect at the next open, as real downtime would;
* timestamps in the log never decrease, so the sparse index's search by time
  (``seek_time``) stays exact.

The price: while the queue is open its time drifts from the wall clock by however
much the wall clock was stepped (or slewed) since the open; and when the wall clock
was ahead when messages were written, the queue's time stays ahead of it until it
catches up.  Times are the queue's own, consistent with each other, which is what
its decisions compare.

The clock is injectable (``ledgerq.open(path, clock=...)``): tests step the wall
clock or advance the monotonic one without sleeping.  It is not a stored option.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["SYSTEM_CLOCK", "Clock", "QueueClock", "SystemClock", "check_clock"]

_CLOCK_SAMPLES = 8  # reads of the wall clock at most, to start a queue's clock
_CLOSE_NS = 200_000  # monotonic reads this close around it: the wall clock is taken


@runtime_checkable
class Clock(Protocol):
    """The time sources of a queue: ``time.time_ns`` and ``time.monotonic_ns`` by default."""

    def time_ns(self) -> int:
        """Wall-clock time: nanoseconds since the epoch (may be stepped)."""
        ...

    def monotonic_ns(self) -> int:
        """Monotonic time in nanoseconds (never goes back; its origin is arbitrary)."""
        ...


class SystemClock:
    """The system's clocks (the default)."""

    # staticmethod of a builtin: the hot paths call time.monotonic_ns itself, no wrapper.
    time_ns = staticmethod(time.time_ns)
    monotonic_ns = staticmethod(time.monotonic_ns)


SYSTEM_CLOCK: Clock = SystemClock()


def check_clock(clock: object) -> Clock:
    """``clock`` if it has ``time_ns()`` and ``monotonic_ns()`` returning ints, else TypeError."""
    for name in ("time_ns", "monotonic_ns"):
        method = getattr(clock, name, None)
        if not callable(method):
            raise TypeError(
                f"clock must have time_ns() and monotonic_ns() methods (like the time "
                f"module), got {type(clock).__name__} without {name}()"
            )
        value = method()
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"clock.{name}() must return an int (ns), got {type(value).__name__}")
    assert isinstance(clock, Clock)
    return clock


class QueueClock:
    """One queue's time (see the module docstring), fixed at open.

    ``now_ns()`` is ``offset_ns + monotonic_ns()``: the hot paths copy both into the
    queue and add them inline (one clock read, as ``time.time_ns()`` was).
    """

    __slots__ = ("monotonic_ns", "offset_ns")

    def __init__(self, source: Clock, floor_ns: int) -> None:
        """Start at the later of ``source``'s wall clock and ``floor_ns`` (the newest
        time the queue has stored)."""
        # The wall clock is read between two reads of the monotonic one, and again if
        # they are far apart: a process preempted between its reads (a loaded machine)
        # started its clock ahead by the time it waited, and the processes of a shared
        # queue compare each other's lease deadlines with their own clocks - it expired
        # the others' leases that much early (issue 25 item 7: 230 ms of a 250 ms lease).
        wall, after, gap = 0, 0, -1
        for _ in range(_CLOCK_SAMPLES):
            before = source.monotonic_ns()
            read = source.time_ns()
            later = source.monotonic_ns()
            if gap < 0 or later - before < gap:
                wall, after, gap = read, later, later - before
            if gap <= _CLOSE_NS:
                break
        # (Against ``after``: the wall clock was read before it, so never ahead.)
        self.offset_ns = max(wall, floor_ns) - after
        self.monotonic_ns = source.monotonic_ns

    def now_ns(self) -> int:
        """The queue's time: nanoseconds since the epoch, never decreasing."""
        return self.offset_ns + self.monotonic_ns()

    def lease_time(self) -> float:
        """Seconds of the monotonic clock: the basis of lease deadlines."""
        return self.monotonic_ns() * 1e-9
