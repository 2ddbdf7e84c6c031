"""The start-rate limit a queue's worker pools share: ``shared/ratelimit``.

``ledgerq.workers.run(..., rate_limit="N/s")`` promises at most N task starts in any
window of one period, across every pool on the machine that consumes the queue.  The
state is therefore in the queue directory, not in a process: a ring of the monotonic
times of the last N starts (a sliding-window log).  A start is granted when the oldest
of them is at least one period old, and its time then takes that slot::

    grant at t  <=>  ring[head] == 0  or  t - ring[head] >= period   (or ring[head] > t)
    then           ring[head] = t;  head = (head + 1) % N

so any N + 1 consecutive grants span at least one period - the promise, exactly, with
bursts of up to N allowed.  Each step costs O(1) (a header, one slot) whatever N is.

Concurrency and crashes.  A step is one read-modify-write under ``flock(LOCK_EX)`` on
the file, which the kernel drops when its holder dies, so a pool killed with -9 leaves
nothing held; and nothing else is held between steps: tokens are times, so a dead pool's
starts age out by themselves.  The times are ``CLOCK_MONOTONIC`` (one clock for every
process of the machine); the header records the boot (Linux's ``boot_id``), and a ring
from another boot - whose times mean nothing now - is cleared.  A slot in the future of
the reader's clock is treated the same way (free).  No fsync: this is coordination,
not data, and after a power cut the boot differs anyway.

The limit is the queue's: the file records N and the period, and the pool that starts
with a different one lays the ring out again (keeping the newest starts), so the last
pool started sets it for all.  The header also counts starts in fixed windows of one
period, from which the console shows the current rate without reading the ring.

Layout (little-endian; docs/format.md "Rate limit"): a 128-byte header, then N u64
slots.  Readers without the lock (the console) read the header alone; a torn read
there can only misstate the displayed rate for one refresh.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from ledgerq.segment.files import storage_errors
from ledgerq.segment.naming import SHARED_DIR, rate_limit_path

__all__ = [
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_COUNT",
    "SLOT",
    "VERSION",
    "Grant",
    "RateLimiter",
    "RateState",
    "read_rate_state",
]

MAGIC = b"LQRL"
VERSION = 1
# magic, version, count (N), period_ns, boot, head, starts, window_start_ns,
# window_starts, previous_window_starts; the rest of the 128 bytes reserved (zero).
HEADER = struct.Struct("<4sIQQQQQQQQ")
assert HEADER.size == 72
HEADER_SIZE = 128
SLOT = struct.Struct("<Q")
assert SLOT.size == 8
MAX_COUNT = 1_000_000  # N at most: the ring is 8 bytes a start (8 MB, a sparse file)

# magic, version, count, period_ns, boot, head, starts, window_start_ns, window_starts,
# previous_window_starts (HEADER's fields)
_Header = tuple[bytes, int, int, int, int, int, int, int, int, int]

_OPEN: weakref.WeakSet[RateLimiter] = weakref.WeakSet()


def _boot_id() -> int:
    """64 bits of this boot's id (Linux), or 0 where there is none."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as file:
            return int(file.read().strip().replace(b"-", b"")[:16], 16) or 1
    except (OSError, ValueError):
        return 0


_BOOT = _boot_id()


@dataclass(frozen=True, slots=True)
class Grant:
    """A granted start: where its time went, to take it back (:meth:`RateLimiter.cancel`)."""

    slot: int
    at_ns: int
    previous_ns: int


@dataclass(frozen=True, slots=True)
class RateState:
    """What the header says: the limit, all starts counted, and the current rate.

    ``rate`` is the starts in the last period (estimated from two fixed windows: the
    current one and the share of the previous one still inside the last period).
    """

    count: int
    period_ns: int
    starts: int
    rate: float

    @property
    def limit(self) -> str:
        """The limit as ``workers.run`` takes it: ``"20/s"`` (``/m``, ``/h``)."""
        unit = _UNITS.get(self.period_ns)
        return f"{self.count}/{unit}" if unit else f"{self.count} per {self.period_ns / 1e9:g} s"


_UNITS = {1_000_000_000: "s", 60_000_000_000: "m", 3_600_000_000_000: "h"}


def _rate(header: _Header, now_ns: int) -> float:
    period = header[3]
    start = header[7]
    current = header[8]
    previous = header[9]
    if period <= 0 or start > now_ns:
        return 0.0
    elapsed = now_ns - start
    if elapsed >= 2 * period:
        return 0.0
    if elapsed >= period:  # the current window ended: it is the previous one now
        previous, current, elapsed = current, 0, elapsed - period
    return float(current + previous * (1 - elapsed / period))


def read_rate_state(queue_dir: str, now_ns: int) -> RateState | None:
    """The rate limit of the queue at ``queue_dir`` (None: no pool ever had one), read
    without the lock; ``now_ns`` on the monotonic clock."""
    try:
        with open(rate_limit_path(queue_dir), "rb") as file:
            raw = file.read(HEADER.size)
    except OSError:
        return None
    if len(raw) < HEADER.size:
        return None
    header = HEADER.unpack(raw)
    if header[0] != MAGIC or header[1] != VERSION or not 0 < header[2] <= MAX_COUNT:
        return None
    return RateState(header[2], header[3], header[6], _rate(header, now_ns))


def _is_valid(header: _Header) -> bool:
    """Whether a header is this format's, of this boot, with a sane limit and head."""
    count, period, head = header[2], header[3], header[5]
    return (
        header[0] == MAGIC
        and header[1] == VERSION
        and header[4] == _BOOT
        and 0 < count <= MAX_COUNT
        and period > 0
        and head < count
    )


class RateLimiter:
    """At most ``count`` grants in any window of ``period_ns``, shared through the file
    ``shared/ratelimit`` of ``queue_dir`` by every limiter on it.

    ``clock()`` returns monotonic nanoseconds (``time.monotonic_ns``; tests inject one
    shared by every limiter).  Raises :class:`StorageError` when the file cannot be
    opened or written.
    """

    def __init__(
        self, queue_dir: str, count: int, period_ns: int, clock: Callable[[], int]
    ) -> None:
        if not 0 < count <= MAX_COUNT or period_ns <= 0:
            raise ValueError(f"a rate limit needs 0 < count <= {MAX_COUNT} and period > 0")
        self.path = rate_limit_path(queue_dir)
        self.count = count
        self.period_ns = period_ns
        self._clock = clock
        with storage_errors("open the rate limit file", self.path):
            os.makedirs(os.path.join(queue_dir, SHARED_DIR), exist_ok=True)
            self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        _OPEN.add(self)
        with self._locked():
            self._adopt()

    # ------------------------------------------------------------------ steps

    def acquire(self) -> Grant | int:
        """Grant a start now (a :class:`Grant`), or say in how many ns one may be.

        The limit is the file's: the last limiter created sets it for all.
        """
        with self._locked():
            header = self._current()
            count, period, head = header[2], header[3], header[5]
            now = self._clock()
            oldest = self._slot(head)
            if oldest and oldest <= now and now - oldest < period:
                return oldest + period - now
            self._write_slot(head, now)
            self._write_header(header, (head + 1) % count, 1, now)
            return Grant(head, now, oldest)

    def cancel(self, grant: Grant) -> bool:
        """Take back ``grant`` (its start did not happen), if no start came after it;
        whether it was taken back (else it stays counted: fewer starts, never more)."""
        with self._locked():
            header = self._current()
            count, head = header[2], header[5]
            if (grant.slot + 1) % count != head or self._slot(grant.slot) != grant.at_ns:
                return False
            self._write_slot(grant.slot, grant.previous_ns)
            self._write_header(header, grant.slot, -1, grant.at_ns)
            return True

    def state(self) -> RateState:
        """The header's figures now (under the lock)."""
        with self._locked():
            header = self._header()
            return RateState(header[2], header[3], header[6], _rate(header, self._clock()))

    def close(self) -> None:
        """Close the file (idempotent); the state stays for the other pools."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    # ------------------------------------------------------------------ the file

    @contextlib.contextmanager
    def _locked(self):  # type: ignore[no-untyped-def]
        fd = self._fd
        if fd is None:
            raise ValueError("the rate limiter is closed")
        with storage_errors("use the rate limit file", self.path):
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _current(self) -> _Header:
        """The header, valid: a damaged one (or none) is laid out again with ours."""
        header = self._header()
        if not _is_valid(header):
            header = self._adopt()
        return header

    def _header(self) -> _Header:
        assert self._fd is not None
        raw = os.pread(self._fd, HEADER.size, 0)
        if len(raw) < HEADER.size:
            return (b"", 0, 0, 0, 0, 0, 0, 0, 0, 0)
        return HEADER.unpack(raw)

    def _slot(self, index: int) -> int:
        assert self._fd is not None
        raw = os.pread(self._fd, SLOT.size, HEADER_SIZE + index * SLOT.size)
        return SLOT.unpack(raw)[0] if len(raw) == SLOT.size else 0

    def _write_slot(self, index: int, value: int) -> None:
        assert self._fd is not None
        os.pwrite(self._fd, SLOT.pack(value), HEADER_SIZE + index * SLOT.size)

    def _write_header(self, header: _Header, head: int, add: int, at_ns: int) -> None:
        """Write ``header`` with ``head`` and ``add`` more starts (counted in the window
        of ``at_ns``, which a new window opens when the current one is over)."""
        assert self._fd is not None
        starts = header[6] + add
        start = header[7]
        current = header[8]
        previous = header[9]
        count, period = int(header[2]), header[3]
        if start == 0 or at_ns < start or at_ns - start >= 2 * period:
            start, current, previous = at_ns, 0, 0
        elif at_ns - start >= period:
            start, current, previous = start + period, 0, current
        current = max(0, current + add)
        raw = HEADER.pack(
            MAGIC, VERSION, count, period, _BOOT, head, max(0, starts), start, current, previous
        )
        os.pwrite(self._fd, raw, 0)

    def _adopt(self) -> _Header:
        """Make the file hold this limiter's limit (lock held): a missing, damaged or
        other boot's file starts empty; another limit keeps the newest starts."""
        assert self._fd is not None
        header = self._header()
        valid = _is_valid(header)
        if valid and header[2] == self.count and header[3] == self.period_ns:
            return header
        kept: list[int] = []
        if valid:
            old = header[2]
            raw = os.pread(self._fd, old * SLOT.size, HEADER_SIZE)
            ring = [v for (v,) in SLOT.iter_unpack(raw[: len(raw) // 8 * 8])]
            ring += [0] * (old - len(ring))
            ordered = ring[header[5] :] + ring[: header[5]]  # oldest first
            kept = [v for v in ordered if v][-self.count :]
        else:
            header = (MAGIC, VERSION, 0, 0, _BOOT, 0, 0, 0, 0, 0)
        slots = kept + [0] * (self.count - len(kept))
        os.ftruncate(self._fd, HEADER_SIZE)
        os.ftruncate(self._fd, HEADER_SIZE + self.count * SLOT.size)
        # The kept starts fill slots 0.. in order; the oldest slot is then the next
        # free one, or slot 0 when the ring is full.
        if kept:
            os.pwrite(self._fd, b"".join(SLOT.pack(v) for v in slots), HEADER_SIZE)
        head = len(kept) % self.count
        # Reuse the counting path so the window figures stay; re-laid, count nothing.
        fresh = (MAGIC, VERSION, self.count, self.period_ns, _BOOT, head, *header[6:])
        self._write_header(fresh, head, 0, self._clock())
        return self._header()


def _close_in_child() -> None:
    """A forked child (a pool's worker) closes its copies: only the owner limits."""
    for limiter in list(_OPEN):
        with contextlib.suppress(OSError):
            limiter.close()


os.register_at_fork(after_in_child=_close_in_child)
