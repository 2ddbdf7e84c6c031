"""A read position that walks entries across segments in id order."""

from __future__ import annotations

from ledgerq.format.entry import Entry
from ledgerq.segment.manager import SegmentManager
from ledgerq.segment.scanner import EntryScanner
from ledgerq.segment.segment import Segment

__all__ = ["LogCursor"]


class LogCursor:
    """Reads the entries with id >= a start id, in order, never past what was appended.

    Corrupt entries are skipped (and reported to the manager); segments deleted
    under the cursor (retention dropping unconsumed data) are jumped over.
    """

    def __init__(self, manager: SegmentManager, start_id: int) -> None:
        self._manager = manager
        self.next_id = max(start_id, 1)
        self.last_offset = -1  # offset of the entry next() returned last, in its segment
        self._seg: Segment | None = None
        self._scanner: EntryScanner | None = None
        self._position(self.next_id)

    def _position(self, target: int) -> None:
        manager = self._manager
        seg = manager.segments[manager.find(target)]
        if target < seg.first_id:
            target = seg.first_id
        offset, after_id = manager.position_of(seg, target)
        try:
            fd = seg.read_fd()
        except FileNotFoundError:
            # Deleted by another shared-mode handle's retention since the view was made:
            # the manager drops it from the view (an exclusive one raises).
            manager.note_missing(seg)
            self._position(max(target, manager.segments[0].first_id))
            return
        self._seg = seg
        self._scanner = EntryScanner(
            fd, offset, seg.size, after_id=after_id, boundaries=seg.boundaries()
        )
        self._skip_to = target
        self.next_id = target

    def clone(self) -> LogCursor:
        """An independent cursor at the same position (for peeking)."""
        return LogCursor(self._manager, self.next_id)

    def seek(self, message_id: int) -> None:
        """Move so that the next entry returned is the first with id >= ``message_id``."""
        self._position(max(message_id, 1))

    def next(self) -> Entry | None:
        """Return the next entry, or None when every appended entry has been read."""
        manager = self._manager
        while True:
            seg, scanner = self._seg, self._scanner
            assert seg is not None
            assert scanner is not None
            if seg.deleted:
                # Our segment was deleted (retention); continue at the oldest one left.
                self._position(max(self.next_id, manager.segments[0].first_id))
                continue
            if scanner.end < seg.size:
                scanner.extend(seg.size)
            entry = scanner.next()
            if scanner.corrupt:
                for region in scanner.corrupt:
                    manager.report_corrupt(seg, region)
                scanner.corrupt.clear()
            if entry is not None:
                if entry.id < self._skip_to:
                    continue
                self.next_id = entry.id + 1
                self.last_offset = scanner.pos - entry.size
                return entry
            if seg is manager.segments[-1]:
                return None  # caught up with the writer
            if scanner.incomplete:
                manager.report_torn_sealed(seg, scanner.pos)
            # Sealed segment finished: go on with the next one.
            i = manager.find(seg.first_id)
            following = manager.segments[i + 1]
            self._position(max(self.next_id, following.first_id))
