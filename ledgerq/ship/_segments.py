"""The destination's segments, as a shipper keeps them: :class:`DestSegment` (a copy's
files, its index points, its append log; loaded from its sealed index or rescanned on
resume) and :func:`take`, the next whole entries a scanner yields, never inside a batch.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

# A copy's files: its log appended to by whole entries, its index read and written.
from ledgerq.format.index import IndexEntry
from ledgerq.segment.appendlog import AppendLog
from ledgerq.segment.index_file import read_index, write_index
from ledgerq.segment.readonly import EntryFlags
from ledgerq.segment.scanner import EntryScanner, sealed_index_holds

__all__ = ["DestSegment", "Scan", "take"]

logger = logging.getLogger("ledgerq")

_BATCH_CONTINUES = int(EntryFlags.BATCH_CONTINUES)


@dataclass
class Scan:
    """What :func:`take` took: whole entries, and the damaged regions among them."""

    stop: int  # where the bytes taken end: after the last entry taken
    last_id: int
    entries: list[tuple[int, int, int, int]]  # offset, id, timestamp, size
    corrupt: list[tuple[int, int]]
    exhausted: bool  # the scanner has nothing more now


def take(scanner: EntryScanner, budget: int) -> Scan:
    """The next entries of ``scanner``: about ``budget`` bytes of them, ending at the end
    of a batch (never inside one), and the corrupt regions among them."""
    start, after_id = scanner.pos, scanner.last_id
    regions = len(scanner.corrupt)
    entries: list[tuple[int, int, int, int]] = []
    exhausted = True
    while (entry := scanner.next()) is not None:
        entries.append((scanner.pos - entry.size, entry.id, entry.timestamp, entry.size))
        if scanner.pos - start >= budget and not entry.flags & _BATCH_CONTINUES:
            exhausted = False
            break
    stop = entries[-1][0] + entries[-1][3] if entries else start
    corrupt = [(r.start, r.stop) for r in scanner.corrupt[regions:] if r.stop <= stop]
    return Scan(stop, entries[-1][1] if entries else after_id, entries, corrupt, exhausted)


@dataclass
class DestSegment:
    """One segment of the copy: its log and index files, what it holds so far, its points."""

    first_id: int
    log: str
    idx: str
    size: int = 0
    last_id: int = 0
    last_offset: int = -1
    last_ts: int = 0
    points: list[IndexEntry] = field(default_factory=list)
    sealed: bool = False
    # The copy's file, appended to as the source grew: a write that a full destination
    # disk cuts short is cut back before it raises, so the next pass (or run) never
    # appends after a torn entry.
    out: AppendLog | None = None
    index_dirty: bool = False
    published: bool = True  # False while the copy is still a .tmp file

    def note(self, offset: int, message_id: int, timestamp: int, interval: int) -> None:
        if not self.points or offset - self.points[-1].offset >= interval:
            self.points.append(IndexEntry(message_id, timestamp, offset))
            self.index_dirty = True
        self.last_id = message_id
        self.last_offset = offset
        self.last_ts = timestamp

    def write_index(self, *, sealed: bool) -> None:
        points = list(self.points)
        if (
            sealed
            and self.last_offset >= 0
            and (not points or points[-1].offset != self.last_offset)
        ):
            points.append(IndexEntry(self.last_id, self.last_ts, self.last_offset))
        # A sealed index is durable before the next segment exists (recovery trusts it);
        # an open one is a hint that readers check against the log.
        write_index(self.idx, points, sealed=sealed, durable=sealed)
        self.points = points
        self.index_dirty = False
        self.sealed = sealed

    def load_sealed(self) -> bool:
        """Take a sealed segment's range from its index, after checking its last point.

        A copy may end with damaged bytes copied as they are from a sealed source, so
        its last entry need not end the file.
        """
        points, sealed = read_index(self.idx)
        with open(self.log, "rb") as f:
            self.size = os.fstat(f.fileno()).st_size
            if not sealed_index_holds(f.fileno(), self.size, points, sealed, ends_log=False):
                return False
        last = points[-1]
        self.points = points
        self.last_id, self.last_offset, self.last_ts = last.id, last.offset, last.timestamp
        self.sealed = True
        return True

    def rescan(self, interval: int, *, cut: bool) -> None:
        """Find the entries of a destination segment; with ``cut``, cut an incomplete tail.

        Only the newest copy can end in our own interrupted append; an older one keeps
        its bytes (a damaged tail there was copied, as it is, from a sealed source).
        """
        fd = os.open(self.log, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            found = take(EntryScanner(fd, 0, size, after_id=self.first_id - 1), size)
        finally:
            os.close(fd)
        self.points = []
        for offset, message_id, timestamp, _ in found.entries:
            self.note(offset, message_id, timestamp, interval)
        if not cut:
            self.size = size
            return
        if found.stop < size:
            # Our own append cut short by a kill or a crash: never a complete entry.
            logger.warning(
                "ledgerq: ship cuts %d bytes of an incomplete copy at the end of %s",
                size - found.stop,
                self.log,
            )
            with open(self.log, "r+b") as f:
                f.truncate(found.stop)
                os.fsync(f.fileno())
        self.size = found.stop

    def open_for_append(self, path: str, fd: int) -> None:
        """Append to ``fd`` (the copy's file at ``path``, ``size`` bytes) from now on."""
        self.out = AppendLog(path, "the shipped copy")
        self.out.adopt(fd, self.size)

    def close(self) -> None:
        out, self.out = self.out, None
        if out is not None:
            out.close()
