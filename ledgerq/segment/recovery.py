"""Recovery: what the segment manager does on open (a part of it written apart).

Only the newest segment is ever written, so only it can end torn.  Recovery
(``open``):

1. **identifies** every segment file by its content - its first entry's id, not its
   name (``_identify``) - and **arranges** them (segment/layout.py: the chain, gaps,
   copies and overlaps set aside, misnamed files);
2. **trusts a sealed segment's index** after checking its last point against the log
   with one small read (``_load_sealed``); an index that does not check out is
   rebuilt by a scan;
3. **scans the newest segment's tail** from its last index point that checks out to the
   end (``_recover_tail``, ``_scan_tail``), cutting a torn last entry and a batch whose
   last entry never reached the log (all or nothing), unless the bytes past the cut
   hold an older entry - another segment's message, perhaps its only copy - in which
   case the segment is set aside instead;
4. reports damage in the middle (``report_corrupt``), once per region.

That is how a queue holding millions of messages reopens in milliseconds.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from ledgerq.format.entry import EntryFlags
from ledgerq.format.index import (
    IndexEntry,
)
from ledgerq.segment.files import (
    StorageError,
    make_durable_dir,
)
from ledgerq.segment.index_file import read_index, write_index
from ledgerq.segment.layout import (
    DAMAGED_DIR,
    Layout,
    SegmentFile,
    arrange,
    content_first_id,
    newest_first,
)
from ledgerq.segment.naming import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TMP_SUFFIX,
    list_segment_ids,
)
from ledgerq.segment.scanner import (
    CorruptRegion,
    EntryScanner,
    checked_point,
    entry_id_at,
    sealed_index_holds,
)
from ledgerq.segment.segment import Segment

__all__ = ["Recovery"]

logger = logging.getLogger("ledgerq")

_BATCH_CONTINUES = int(EntryFlags.BATCH_CONTINUES)
_ANY_ID = (1 << 64) - 1  # above every id: "the newest point that checks out"


def _holds_older_entry(fd: int, start: int, end: int, below: int) -> bool:
    """Whether a valid entry with an id below ``below`` starts in bytes ``[start, end)``
    of the log ``fd``: a message of another segment, perhaps its only copy."""
    # One scanner for the whole search, so that its checksum allowance (see scanner.py)
    # bounds the work on a crafted tail, as it bounds the recovery scan itself.
    scanner = EntryScanner(fd, start, end, after_id=0)
    while (entry := scanner.next()) is not None:
        if entry.id < below:
            return True
        scanner.seek(scanner.pos, 0)  # an entry of this segment (cut with the tail): go on
    return False


class _BatchStart:
    """Where a batch began during a recovery scan, and the segment as it was before it."""

    __slots__ = (
        "found",
        "index_length",
        "last_id",
        "last_indexed_offset",
        "last_offset",
        "last_timestamp",
        "offset",
    )

    def __init__(self, offset: int, found: int, seg: Segment, last_indexed_offset: int) -> None:
        self.offset = offset
        self.found = found  # entries found before it
        self.last_id = seg.last_id
        self.last_offset = seg.last_offset
        self.last_timestamp = seg.last_timestamp
        self.index_length = len(seg.index)
        self.last_indexed_offset = last_indexed_offset

    def forget_rest(self, seg: Segment) -> None:
        """Make ``seg`` end just before the batch again (its entries and index points)."""
        seg.last_id = self.last_id
        seg.last_offset = self.last_offset
        seg.last_timestamp = self.last_timestamp
        seg.set_index(seg.index[: self.index_length])


class Recovery:
    """The recovery of :class:`~ledgerq.segment.manager.SegmentManager` (a mixin: its
    methods take the manager as ``self``)."""

    # The manager's state it reads and sets (see SegmentManager.__init__).
    directory: str  # the segments/ directory
    segments: list[Segment]
    layout: Layout
    set_aside: list[Segment]
    log_next_id: int
    truncated_bytes: int
    _first_ids: list[int]
    _misplaced: dict[int, Segment]
    _stale_indexes: set[int]
    _last_indexed_offset: int
    _reported: set[tuple[int, int]]
    _on_corrupt: Callable[[Segment, CorruptRegion], None] | None

    if TYPE_CHECKING:  # the manager's own methods, which recovery calls

        def _create(self, first_id: int) -> None: ...
        def _open_writer(self, seg: Segment) -> None: ...
        def _seal(self, seg: Segment, *, durable: bool) -> None: ...
        def _unlink(self, seg: Segment) -> None: ...
        def rotate(self, next_first_id: int, *, appended: bool = False) -> None: ...
        def _note_appended(
            self, seg: Segment, message_id: int, timestamp: int, offset: int
        ) -> bool: ...

    def open(self, min_next_id: int = 1) -> None:
        """Find, check and recover the segments; make the newest one writable.

        ``min_next_id`` is the lowest id the next append may take (ids are never
        reused, even when a torn tail was cut off).  Segment files are taken by their
        content (``segment.layout``): a misnamed file is read under its entries' ids,
        a copy or an overlapping file is set aside (left in place, read by nobody,
        logged) - nothing that holds a valid entry is deleted or cut because of its
        ids.  The gaps between the segments are left in :attr:`layout` for the queue
        to judge (it knows which gaps it made on purpose).
        """
        make_durable_dir(self.directory)
        self._remove_leftovers()
        names = list_segment_ids(self.directory)
        segments = [
            self._identify(name_id, trust_index=i < len(names) - 1)
            for i, name_id in enumerate(names)
        ]
        # The active segment is the newest by content - not by name: a copy of an old
        # segment under a later name must not be scanned as a tail (and cut).
        active = max(segments, key=newest_first, default=None)
        for seg in segments:
            if seg is not active and not seg.sealed:
                self._recover_tail(seg, is_newest=False)
                self._seal(seg, durable=True)
        if active is not None:
            self._recover_tail(active, is_newest=True)
        # An empty segment other than the active one holds nothing; drop it.
        for seg in segments:
            if seg.is_empty and seg is not active:
                self._unlink(seg)
        self._arrange([s for s in segments if not s.is_empty or s is active])
        if not self.segments:
            self.log_next_id = 1
            self._create(max(1, min_next_id))
            return
        last = self.segments[-1]
        natural = last.last_id + 1 if not last.is_empty else last.first_id
        self.log_next_id = natural
        if last is active and not last.is_misnamed:
            self._open_writer(last)
        else:
            # Never append to a misnamed file (the ids appended would make its name lie
            # more) nor to a sealed one: the next segment starts after it.
            if not last.sealed:
                self._seal(last, durable=True)
            self._create(natural)
        if min_next_id > natural:
            # Ids were handed out before a crash that lost them: keep them unused by
            # starting a new segment at min_next_id (ids inside a segment are consecutive).
            self.rotate(min_next_id)

    def _identify(self, name_id: int, *, trust_index: bool) -> Segment:
        """The segment in the log named ``name_id``, with its content's first id.

        A sealed segment whose index holds (``_load_sealed``) is taken from its index,
        whose first point names the first entry (checked against the log when it is
        not the file's name); any other is identified by one read of its first entry.
        """
        seg = Segment(self.directory, name_id)
        if trust_index and self._load_sealed(seg):
            first = seg.index[0].id
            if first == name_id or entry_id_at(seg.read_fd(), 0, seg.size) == first:
                seg.first_id = first
                return seg
            seg.sealed = False  # the index is not this log's: identify it from the log
            seg.last_id, seg.last_offset = 0, -1
            seg.set_index([])
        seg.size = os.stat(seg.log_path).st_size
        seg.first_id = content_first_id(seg.read_fd(), seg.size, name_id)
        return seg

    def _arrange(self, segments: list[Segment]) -> None:
        """Keep the segments :func:`arrange` uses, in id order; log the misplaced ones."""
        by_name = {seg.name_id: seg for seg in segments}
        self.layout = arrange(
            SegmentFile(s.name_id, s.first_id, s.size, s.last_id) for s in segments
        )
        self.segments = [by_name[f.name_id] for f in self.layout.used]
        self._first_ids = [s.first_id for s in self.segments]
        self.set_aside = [by_name[f.name_id] for f, _ in self.layout.set_aside]
        self._misplaced = {s.name_id: s for s in self.set_aside}
        for seg in self.segments:
            if seg.is_misnamed:
                self._misplaced[seg.name_id] = seg
                logger.warning(
                    "ledgerq: segment file %s holds ids %d-%d, not ids from %d as its name "
                    "says (renamed, swapped or copied by hand?); it is read by its content. "
                    "`ledgerq verify --repair` renames it",
                    seg.log_path,
                    seg.first_id,
                    seg.last_id,
                    seg.name_id,
                )
        for f, holder in self.layout.set_aside:
            seg = by_name[f.name_id]
            seg.close_read_fd()
            logger.warning(
                "ledgerq: segment file %s holds ids %s, which %s holds already (a copy, "
                "or another history); it is set aside and not read. `ledgerq verify "
                "--repair` moves it into %s/",
                seg.log_path,
                f.ids(),
                by_name[holder.name_id].log_path,
                os.path.join(self.directory, DAMAGED_DIR),
            )

    def _remove_leftovers(self) -> None:
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            orphan_index = name.endswith(INDEX_SUFFIX) and not os.path.exists(
                path.removesuffix(INDEX_SUFFIX) + LOG_SUFFIX
            )
            if name.endswith(TMP_SUFFIX) or orphan_index:
                os.unlink(path)

    def _load_sealed(self, seg: Segment) -> bool:
        """Load a sealed segment from its index; False if the index cannot be trusted."""
        seg.size = os.stat(seg.log_path).st_size
        entries, sealed = read_index(seg.idx_path)
        if not sealed_index_holds(seg.read_fd(), seg.size, entries, sealed):
            return False
        last = entries[-1]
        seg.set_index(entries)
        seg.last_id = last.id
        seg.last_offset = last.offset
        seg.last_timestamp = last.timestamp
        seg.sealed = True
        return True

    def _recover_tail(self, seg: Segment, *, is_newest: bool) -> None:
        """Scan a segment from its last trustworthy index point; cut a torn tail.

        Only the newest segment can have a torn tail (every other one was fsynced
        before it was sealed): invalid bytes at the end of an older one are
        corruption - reported and left in place, never cut.  A batch whose last entry
        is missing (its entries end the scan still flagged BATCH_CONTINUES) is cut in
        any segment: a batch is all-or-nothing, and since a batch is written whole
        into one segment before any rotation, only a lost tail can end a segment
        inside one.
        """
        seg.size = os.stat(seg.log_path).st_size
        entries, _ = read_index(seg.idx_path)
        fd = seg.read_fd()
        # Start at the newest index point whose entry is there.  If the scan then ends
        # inside a batch that may have begun before that point, scan again from a point
        # outside any batch, so the whole batch can be cut (rare: only a torn batch).
        before_scan = (seg.last_id, seg.last_offset, seg.last_timestamp)
        start, after_id, points = self._trusted_start(fd, seg, entries, outside_batch=False)
        scanner, found, batch = self._scan_tail(fd, seg, points, start, after_id)
        if batch is not None and batch.offset == start and start > 0:
            seg.last_id, seg.last_offset, seg.last_timestamp = before_scan
            start, after_id, points = self._trusted_start(fd, seg, entries, outside_batch=True)
            scanner, found, batch = self._scan_tail(fd, seg, points, start, after_id)
        end = scanner.pos
        if batch is not None:
            found = batch.found
            end = batch.offset
            batch.forget_rest(seg)
            self._last_indexed_offset = batch.last_indexed_offset
        for region in scanner.corrupt:
            if region.start < end:
                self.report_corrupt(seg, region)
        if batch is not None:
            self._cut(seg, end, "an incomplete batch and what follows it")
        elif end < seg.size and (
            not is_newest or _holds_older_entry(fd, end, seg.size, seg.first_id)
        ):
            # In a sealed segment, or holding valid entries of earlier segments (whose
            # ids do not follow on, so the scan stopped at them): damage to report,
            # never a torn tail to cut - recovery never cuts a valid entry for its id.
            self.report_corrupt(seg, CorruptRegion(end, seg.size))
        elif end < seg.size:
            self._cut(seg, end, "incomplete data")
        if not seg.is_empty and start == 0:
            seg.missing = (seg.last_id - seg.first_id + 1) - found
        # Rewrite the index as recovered (it is small: 24 bytes per index_interval of log).
        try:
            write_index(seg.idx_path, seg.index, sealed=False, durable=False)
        except StorageError as exc:
            # A full disk must not make the queue unopenable, and the index can wait: the
            # old file stays (every reader checks a point against the log before using
            # it), no point is appended to it, and the seal writes it whole.
            logger.warning("ledgerq: %s; the index is rewritten when its segment is sealed", exc)
            self._stale_indexes.add(seg.first_id)

    def _scan_tail(
        self, fd: int, seg: Segment, points: list[IndexEntry], start: int, after_id: int
    ) -> tuple[EntryScanner, int, _BatchStart | None]:
        """Read ``seg`` from ``start`` to its end, noting each entry as appended.

        Returns the scanner (its ``pos`` is where the valid entries end), how many
        entries it found, and the start of the batch still open at the end, if any.
        """
        seg.set_index(points)
        seg.sealed = False
        self._last_indexed_offset = start if points else -1
        scanner = EntryScanner(fd, start, seg.size, after_id=after_id, boundaries=None)
        found = 0
        batch: _BatchStart | None = None  # the first entry of a batch whose end is unread
        while True:
            entry = scanner.next()
            if entry is None:
                break
            offset = scanner.pos - entry.size
            if not entry.flags & _BATCH_CONTINUES:
                batch = None
            elif batch is None:
                batch = _BatchStart(offset, found, seg, self._last_indexed_offset)
            found += 1
            self._note_appended(seg, entry.id, entry.timestamp, offset)
        return scanner, found, batch

    def _trusted_start(
        self, fd: int, seg: Segment, points: list[IndexEntry], *, outside_batch: bool
    ) -> tuple[int, int, list[IndexEntry]]:
        """Where to start scanning ``seg``: (offset, id before it, the points up to it).

        The newest index point whose entry really is there - and, with
        ``outside_batch``, ends a batch (no BATCH_CONTINUES), so that the scan never
        starts inside a batch it may have to cut whole.
        """
        i = checked_point(fd, points, seg.size, _ANY_ID, outside_batch=outside_batch)
        if i < 0:
            return 0, seg.first_id - 1, []
        return points[i].offset, points[i].id - 1, list(points[: i + 1])

    def _cut(self, seg: Segment, offset: int, what: str) -> None:
        """Truncate ``seg``'s log at ``offset`` (durably) and log it."""
        cut = seg.size - offset
        logger.warning(
            "ledgerq: truncating %d bytes of %s at the end of %s (offset %d)",
            cut,
            what,
            seg.log_path,
            offset,
        )
        with open(seg.log_path, "r+b") as f:
            f.truncate(offset)
            os.fsync(f.fileno())
        seg.size = offset
        self.truncated_bytes += cut

    def report_torn_sealed(self, seg: Segment, pos: int) -> None:
        """A sealed segment ends with bytes that are not a whole entry."""
        if pos < seg.size:
            self.report_corrupt(seg, CorruptRegion(pos, seg.size))

    @property
    def reported_regions(self) -> list[tuple[int, int]]:
        """(segment first id, offset) of every corrupt region reported, still on disk."""
        live = set(self._first_ids)
        return sorted(key for key in self._reported if key[0] in live)

    def remember_reported(self, regions: list[tuple[int, int]]) -> None:
        """Regions counted in an earlier run: not to be counted again."""
        self._reported.update(regions)

    def report_corrupt(self, seg: Segment, region: CorruptRegion) -> None:
        """Log and count a skipped region once, however many readers meet it."""
        key = (seg.first_id, region.start)
        if key in self._reported:
            return
        self._reported.add(key)
        logger.warning(
            "ledgerq: skipped %d corrupt bytes in %s at offset %d",
            region.stop - region.start,
            seg.log_path,
            region.start,
        )
        if self._on_corrupt is not None:
            self._on_corrupt(seg, region)
