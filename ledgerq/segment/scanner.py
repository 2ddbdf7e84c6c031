"""Sequential reading of entries from a log file, with corruption skipping.

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

from ledgerq.format.checksum import recovery_crc_allowance
from ledgerq.format.entry import (
    ENTRY_HEADER,
    KNOWN_FLAGS,
    MAX_ENTRY_SIZE,
    MIN_ENTRY_SIZE,
    Entry,
    decode_entry,
)
from ledgerq.format.errors import CorruptRecord, IncompleteRecord

__all__ = ["CorruptRegion", "EntryScanner"]

_CHUNK = 256 * 1024
_SEARCH_WINDOW = 1 << 20  # bytes of the file a resynchronisation reads at a time
_unpack_header = ENTRY_HEADER.unpack_from

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
        boundaries: list[int] | None = None,
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
            or rtype == 0
            or rtype > 3
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
