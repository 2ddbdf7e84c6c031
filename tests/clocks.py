"""A clock the test moves: for the time-based promises (delays, retry waits, leases, TTL).

Pass it as ``ledgerq.open(path, clock=...)``; nothing in ledgerq then reads the system's
clocks, so a test lets time pass with :meth:`SteppedClock.elapse` instead of sleeping.
"""

from __future__ import annotations

SECOND = 1_000_000_000


class SteppedClock:
    """A wall clock and a monotonic clock that move only when the test says so."""

    def __init__(self) -> None:
        self.wall_ns = 1_750_000_000 * SECOND
        self.mono_ns = 10 * 86_400 * SECOND  # an arbitrary origin, as the real one has

    def time_ns(self) -> int:
        return self.wall_ns

    def monotonic_ns(self) -> int:
        return self.mono_ns

    def elapse(self, seconds: float) -> None:
        """Real time passes: both clocks move."""
        self.wall_ns += int(seconds * SECOND)
        self.mono_ns += int(seconds * SECOND)
