"""The retry policy: how long a failed delivery waits before the message comes back.

Options ``retry_delay``, ``retry_backoff``, ``retry_delay_max`` and ``retry_jitter``:
the n-th failed delivery of a message (a nack without ``delay``, an expired visibility
timeout, a lost lease) waits ``min(retry_delay * retry_backoff**(n-1), retry_delay_max)``
seconds, shortened by a random fraction of at most ``retry_jitter``.  The default,
``retry_delay=0``, redelivers at once and costs nothing: the reader then has no policy.
"""

from __future__ import annotations

import random

from ledgerq._options import Options

__all__ = ["RetryPolicy"]

_NS = 1_000_000_000


class RetryPolicy:
    """The delays of one queue's retry options, in nanoseconds."""

    __slots__ = ("_backoff", "_base", "_jitter", "_max", "_random")

    def __init__(self, base_s: float, backoff: float, max_s: float, jitter: float) -> None:
        self._base = base_s
        self._backoff = backoff
        self._max = max_s
        self._jitter = jitter
        self._random = random.Random()

    @classmethod
    def from_options(cls, options: Options) -> RetryPolicy | None:
        """The queue's policy, or None when failed deliveries come back at once."""
        if not options.retry_delay or not options.retry_delay_max:
            return None
        return cls(
            options.retry_delay,
            options.retry_backoff,
            options.retry_delay_max,
            options.retry_jitter,
        )

    def delay_s(self, failures: int) -> float:
        """Seconds the ``failures``-th failed delivery waits (before jitter)."""
        exponent = max(failures, 1) - 1
        try:
            delay = self._base * self._backoff**exponent
        except OverflowError:
            return self._max
        return min(delay, self._max)

    def delay_ns(self, failures: int) -> int:
        """Nanoseconds the ``failures``-th failed delivery waits, jitter applied."""
        delay = self.delay_s(failures)
        if self._jitter:
            delay *= 1.0 - self._jitter * self._random.random()
        return int(delay * _NS)
