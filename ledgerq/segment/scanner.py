"""Sequential reading of entries from a log file, with corruption skipping.

Three things live here: :class:`EntryScanner`, the scanner every reader of a log uses;
:class:`TailScanner`, the same for a log another process may be appending to (it
stops at an append or a batch still in flight instead of searching past it); and
:func:`checked_start`, where to start scanning for an id (a sparse-index point whose
entry really is there).

The scanner reads the file in large chunks (one ``pread`` per chunk, never one
per entry) and decodes entries from the buffer.  When it meets bytes that are not
a valid entry it *resynchronises*: it looks for the next offset where a valid
entry with a larger id starts, trying every byte offset up to the next sparse
index point (a known entry boundary) - so a flipped bit costs one entry, not the
rest of the segment, even when the flip hit a length field.  The checksum work it
spends on offsets that turn out not to hold an entry is capped in proportion to the
bytes scanned (see ``recovery_crc_allowance``), so a crafted file cannot make it quadratic.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence

from ledgerq.format.checksum import recovery_crc_allowance
from ledgerq.format.entry import (
    ENTRY_HEADER,
    KNOWN_FLAGS,
    KNOWN_TYPE_BYTES,
    MAX_ENTRY_SIZE,
    MIN_ENTRY_SIZE,
    Entry,
    EntryFlags,
    decode_entry,
)
from ledgerq.format.errors import CorruptRecord, DecodeError, IncompleteRecord
from ledgerq.format.index import IndexEntry
from ledgerq.segment.files import pread_exact

__all__ = [
    "CorruptRegion",
    "EntryScanner",
    "TailScanner",
    "checked_point",
    "checked_start",
    "entry_id_at",
    "sealed_index_holds",
]

_CHUNK = 256 * 1024
_SEARCH_WINDOW = 1 << 20  # bytes of the file a resynchronisation reads at a time
_unpack_header = ENTRY_HEADER.unpack_from
_LENGTH_SIZE = 4
_BATCH_CONTINUES = int(EntryFlags.BATCH_CONTINUES)

# Resynchronising checksums each plausible entry after bad bytes over the length it
# claims.  Honest damage holds few such headers - a flipped bit, a torn tail or zeroed
# pages are followed by real entries, or by bytes whose "lengths" rarely fit in the
# file - but a crafted file can put a header claiming the rest of the file at every
# offset, and checking them all is quadratic (a 1 MiB tail: 25 GB of CRC).  So the
# bytes a scanner checksums in vain - candidates that fail, and the entries at the bad
# offsets themselves - are capped by format.checksum.recovery_crc_allowance of the
# bytes it covers.  A candidate longer than what is left is not checked: it is taken
# for garbage, so once a crafted file has used up the allowance the rest of it reads as
# a torn tail (or as garbage up to the next index point).  Honest recovery stays far
# below the cap and finds what it always found; tests/fuzz measure the crafted case.


class CorruptRegion:
    """Bytes ``[start, stop)`` of a file that held no valid entry."""

    __slots__ = ("start", "stop")

    def __init__(self, start: int, stop: int) -> None:
        self.start = start
        self.stop = stop

    def __repr__(self) -> str:
        return f"CorruptRegion({self.start}, {self.stop})"


class EntryScanner:
    """Read entries from ``fd`` between ``pos`` and ``end`` (exclusive).

    :meth:`next` returns the next valid entry or ``None`` at the end.  After
    ``None``, :attr:`pos` is where reading stopped and :attr:`incomplete` tells
    whether the bytes from there to ``end`` are the start of an entry that is
    not all there (a torn tail, or an append still in progress).  Corrupt
    regions that were skipped are appended to :attr:`corrupt`.
    """

    def __init__(
        self,
        fd: int,
        pos: int,
        end: int,
        *,
        after_id: int = 0,
        boundaries: Sequence[int] | None = None,
        chunk_size: int = _CHUNK,
    ) -> None:
        self.fd = fd
        self.pos = pos
        self.end = end
        self.last_id = after_id
        self.incomplete = False
        self.corrupt: list[CorruptRegion] = []
        self._boundaries = boundaries or []
        self._chunk = chunk_size
        self._buf = b""
        self._buf_start = pos
        self._origin = pos
        self._wasted_crc = 0  # bytes checksummed where no entry turned out to be

    def extend(self, end: int) -> None:
        """Allow reading up to ``end`` (the file has grown)."""
        if end > self.end:
            self.end = end
            self.incomplete = False

    def seek(self, pos: int, after_id: int) -> None:
        """Continue reading at ``pos``; the next entry must have an id > ``after_id``."""
        self.pos = pos
        self.last_id = after_id
        self.incomplete = False
        if not (self._buf_start <= pos <= self._buf_start + len(self._buf)):
            self._buf = b""
            self._buf_start = pos

    def _fill(self, needed: int) -> bool:
        """Make at least ``needed`` bytes from pos available; False if the file ends first."""
        available_in_file = self.end - self.pos
        if needed > available_in_file:
            return False
        have = self._buf_start + len(self._buf) - self.pos
        if have >= needed:
            return True
        size = min(max(needed, self._chunk), available_in_file)
        data = os.pread(self.fd, size, self.pos)
        while len(data) < size:  # short reads are legal; loop until the file really ends
            more = os.pread(self.fd, size - len(data), self.pos + len(data))
            if not more:
                break
            data += more
        self._buf = data
        self._buf_start = self.pos
        return len(data) >= needed

    def next(self) -> Entry | None:
        """Return the next valid entry, skipping corrupt regions; None at the end."""
        while True:
            if self.pos >= self.end:
                return None
            rel = self.pos - self._buf_start
            if rel < 0 or rel >= len(self._buf):
                if not self._fill(min(ENTRY_HEADER.size, self.end - self.pos)):
                    self.incomplete = True
                    return None
                rel = 0
            try:
                entry, stop = decode_entry(self._buf, rel)
            except IncompleteRecord as exc:
                needed = exc.needed or ENTRY_HEADER.size
                if self._fill(needed):
                    continue
                # The entry claims to run past the end: a torn tail - unless a valid
                # entry follows, in which case the length field itself is corrupt.
                if not self._resync(self.pos):
                    self.incomplete = True
                    return None
                continue
            except CorruptRecord:
                if not self._resync(self.pos):
                    self.incomplete = True
                    return None
                continue
            if entry.id <= self.last_id:
                # Valid bytes in the wrong place (e.g. a stale copy); not this log's next entry.
                if not self._resync(self.pos):
                    self.incomplete = True
                    return None
                continue
            self.pos = self._buf_start + stop
            self.last_id = entry.id
            return entry

    def _resync(self, bad: int) -> bool:
        """Find the next valid entry after ``bad``; record the skipped region.

        Returns False (and records nothing) when no valid entry follows before
        ``end``: then the bytes from ``bad`` on are a torn or garbage tail.
        """
        self._wasted_crc += self._checksummed_at(bad)
        limit = self.end
        for boundary in self._boundaries:
            if boundary > bad:
                limit = boundary
                break
        found = self._search(bad + 1, limit)
        if found is None:
            if limit < self.end:
                found = limit  # a sparse index point is a known entry boundary
            else:
                return False
        self.corrupt.append(CorruptRegion(bad, found))
        self.seek(found, self.last_id)
        return True

    def _search(self, start: int, limit: int) -> int | None:
        """Return the first offset in [start, limit) where a valid, newer entry starts."""
        at = start
        while at < limit:  # a window at a time: the span can be a whole segment
            stop = min(at + _SEARCH_WINDOW, limit)
            # The header of an entry starting near the window's end must be read whole.
            data = os.pread(self.fd, stop - at + ENTRY_HEADER.size, at)
            for rel in range(min(stop - at, len(data))):
                if self._is_entry_at(data, rel, at):
                    return at + rel
            at = stop
        return None

    def _is_entry_at(self, data: bytes, rel: int, base: int) -> bool:
        if len(data) - rel < ENTRY_HEADER.size:
            return False
        length, rtype, flags, message_id, _ = _unpack_header(data, rel)
        if (
            length < MIN_ENTRY_SIZE
            or length > MAX_ENTRY_SIZE
            or rtype not in KNOWN_TYPE_BYTES
            or flags & ~KNOWN_FLAGS
            or message_id <= self.last_id
            or base + rel + length > self.end
            or length > self._crc_allowance()
        ):
            return False
        record = data if rel + length <= len(data) else None
        if record is None:
            record = os.pread(self.fd, length, base + rel)
            start = 0
        else:
            start = rel
        try:
            decode_entry(record, start)
        except (CorruptRecord, IncompleteRecord):
            self._wasted_crc += length
            return False
        return True

    def _crc_allowance(self) -> int:
        """Bytes this scanner may still checksum in vain (see the module's notes)."""
        return recovery_crc_allowance(self.end - self._origin) - self._wasted_crc

    def _checksummed_at(self, bad: int) -> int:
        """Bytes :meth:`next` checksummed at ``bad`` before giving up on it there.

        :func:`decode_entry` checks the CRC of any entry whose length is possible and
        fits in the data; an entry too long or short for that cost nothing.
        """
        rel = bad - self._buf_start
        if rel < 0 or len(self._buf) - rel < 4:
            return 0
        length = int.from_bytes(self._buf[rel : rel + 4], "little")
        fits = MIN_ENTRY_SIZE <= length <= MAX_ENTRY_SIZE and bad + length <= self.end
        return length if fits else 0


class TailScanner(EntryScanner):
    """An :class:`EntryScanner` for a log that another process may be appending to.

    The plain scanner takes bytes that are not a valid entry for damage and searches
    every later offset for the next entry.  At the live end of the newest segment they
    are almost always an append in progress: the owner's ``write()`` is not atomic for
    readers.  Searching inside it wastes time on a large entry, and could take a valid
    entry embedded in its payload for the next one.  Two rules make this scanner stop
    there instead:

    * ``patient``: an entry whose header is plausible (a known type and flags, an id
      above the last one, a possible length) and whose declared length runs past
      ``end`` stops the scan; :attr:`waiting` is then True and :attr:`pos` is where the
      entry starts.  The caller decides how long to be patient (a sealed segment, where
      nothing will complete the entry, never is; see ``readonly_tail.SegmentTail``).
    * ``whole_batches``: the entries of a batch (all but its last carry
      ``BATCH_CONTINUES``) are returned only once its last entry has been read.  A batch
      whose end is not there yet - being written, or cut by the owner's recovery, which
      treats a batch as all-or-nothing - stops the scan at its first entry:
      :attr:`held_batch` is then True and :attr:`pos` is the batch's start.

    After an entry is returned, ``pos - entry.size`` is where it starts, as with the
    plain scanner.  Corrupt regions met inside a batch that is held back are reported
    (in :attr:`corrupt`) only when the scan passes them for good.
    """

    def __init__(
        self,
        *,
        fd: int,
        pos: int,
        end: int,
        after_id: int,
        boundaries: Sequence[int] | None = None,
        patient: bool,
        whole_batches: bool,
    ) -> None:
        # All keyword arguments: the two rules are always said, never defaulted.
        super().__init__(fd, pos, end, after_id=after_id, boundaries=boundaries)
        self.patient = patient
        self.whole_batches = whole_batches
        self.waiting = False
        self.held_batch = False
        self._ready: deque[tuple[Entry, int]] = deque()  # the rest of a batch read whole

    def seek(self, pos: int, after_id: int) -> None:
        self._ready.clear()
        super().seek(pos, after_id)

    def next(self) -> Entry | None:
        """Return the next valid entry; None at the end, at an entry in flight, or at a
        batch whose last entry is not there yet (see the class)."""
        ready = self._ready
        if ready:
            held, self.pos = ready.popleft()
            self.last_id = held.id
            return held
        if self.waiting or self.held_batch:
            self.waiting = self.held_batch = False  # what the previous None said
        entry = _scan_next(self)
        if entry is None or not entry.flags & _BATCH_CONTINUES or not self.whole_batches:
            return entry
        return self._whole_batch(entry)

    def _whole_batch(self, first: Entry) -> Entry | None:
        """Read ahead to the end of the batch ``first`` begins; return ``first`` if the
        batch is all there, else go back to its start and return None."""
        first_end = self.pos
        start = first_end - first.size
        regions = len(self.corrupt)
        rest: list[tuple[Entry, int]] = []
        add = rest.append
        while (entry := _scan_next(self)) is not None:
            add((entry, self.pos))
            if not entry.flags & _BATCH_CONTINUES:
                self._ready.extend(rest)
                self.pos, self.last_id = first_end, first.id
                return first
        del self.corrupt[regions:]  # met again, and reported, when the scan comes back
        waiting = self.waiting
        self.seek(start, first.id - 1)
        self.waiting = waiting
        self.held_batch = self.incomplete = True
        return None

    def _resync(self, bad: int) -> bool:
        if self.patient and self._is_in_flight(bad):
            self.waiting = True
            return False
        return super()._resync(bad)

    def _is_in_flight(self, at: int) -> bool:
        """Whether the bytes at ``at`` may be the start of an entry still being written."""
        available = self.end - at
        head = os.pread(self.fd, min(ENTRY_HEADER.size, available), at)
        if len(head) < _LENGTH_SIZE:
            return True  # not even the length is there yet
        length = int.from_bytes(head[:_LENGTH_SIZE], "little")
        if not MIN_ENTRY_SIZE <= length <= MAX_ENTRY_SIZE or length <= available:
            return False  # impossible, or all there and still invalid: damage
        if len(head) < ENTRY_HEADER.size:
            return True
        _, rtype, flags, message_id, _ = _unpack_header(head)
        return rtype in KNOWN_TYPE_BYTES and not flags & ~KNOWN_FLAGS and message_id > self.last_id


_scan_next = EntryScanner.next  # the plain scanner's step, without super()'s lookup


# ---------------------------------------------------------------------- where to start


def entry_id_at(fd: int, offset: int, size: int) -> int:
    """Id of the valid entry starting at ``offset`` and ending by ``size``, or -1."""
    head = os.pread(fd, ENTRY_HEADER.size, offset)
    if len(head) < ENTRY_HEADER.size:
        return -1
    length = int.from_bytes(head[:_LENGTH_SIZE], "little")
    if not MIN_ENTRY_SIZE <= length <= MAX_ENTRY_SIZE or offset + length > size:
        return -1
    try:
        entry, _ = decode_entry(os.pread(fd, length, offset), 0)
    except DecodeError:
        return -1
    return entry.id


def checked_point(
    fd: int,
    points: Sequence[IndexEntry],
    size: int,
    target: int,
    *,
    outside_batch: bool = False,
) -> int:
    """Position in ``points`` of the last sparse-index point at or before ``target``
    whose entry really is there; -1 when none is.

    A point counts when its id is at most ``target``, its entry lies within the first
    ``size`` bytes of the log, and the valid entry at its offset has its id - an index
    is a hint, and a stale or damaged point must cost a longer scan, never a wrong
    start.  With ``outside_batch`` the entry must also end a batch (or be none), so
    that a scan from there never begins inside a batch it may have to drop whole.
    """
    for i in range(len(points) - 1, -1, -1):
        point = points[i]
        if point.id > target or point.offset >= size:
            continue
        if outside_batch:
            head = os.pread(fd, ENTRY_HEADER.size, point.offset)
            if len(head) == ENTRY_HEADER.size and head[5] & _BATCH_CONTINUES:
                continue
        if entry_id_at(fd, point.offset, size) == point.id:
            return i
    return -1


def checked_start(
    fd: int, points: Sequence[IndexEntry], size: int, target: int, first_id: int
) -> tuple[int, int]:
    """Where to scan a segment from to meet id ``target``: ``(offset, id before it)``.

    The offset of the point :func:`checked_point` finds, or the segment's start
    (``first_id`` is the segment's first id) when none checks out.
    """
    i = checked_point(fd, points, size, target)
    if i < 0:
        return 0, first_id - 1
    return points[i].offset, points[i].id - 1


def sealed_index_holds(
    fd: int, size: int, points: Sequence[IndexEntry], sealed: bool, *, ends_log: bool = True
) -> bool:
    """Whether a sealed index gives its segment's id range without a scan of the log.

    It must be sealed, start at offset 0, and its last point must be a valid entry
    within the log's ``size`` bytes (one small read checks it) - with ``ends_log``, the
    entry that ends them exactly (a segment the queue sealed ends with its last entry;
    bytes after it are damage that a scan must report).
    """
    if not sealed or not points or points[0].offset != 0:
        return False
    last = points[-1]
    if last.offset >= size:
        return False
    tail = pread_exact(fd, size - last.offset, last.offset)
    try:
        entry, stop = decode_entry(tail, 0)
    except DecodeError:
        return False
    return entry.id == last.id and (stop == len(tail) or not ends_log)
