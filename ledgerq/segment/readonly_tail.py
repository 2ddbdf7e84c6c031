"""Reading the log another process appends to: one segment, or the whole log as it grows.

:class:`SegmentTail` is one segment log opened read-only, with what a lock-free reader
tracks about it (its identity, the size at the last look, whether it is sealed, and how
long the reader has been patient with an entry that looks half-written).
:class:`LogTail` walks a queue's segments in id order and returns the entries appended
since the last look, across rotations - what ``ledgerq.follow`` yields, and what a
process that shares a queue will catch up with.  :func:`last_complete_id` is the id of
the last whole entry of a queue now.  What they may rely on from the owner is set out
in ``ledgerq.segment.readonly``.
"""

from __future__ import annotations

import bisect
import io
import logging
import os
import time

from ledgerq._errors import CorruptionError, IncompatibleFormatError, NotAQueueError
from ledgerq.format.entry import Entry
from ledgerq.segment.index_file import read_index, read_index_tail
from ledgerq.segment.layout import SegmentDirectory, SegmentFile, subtract_ranges
from ledgerq.segment.meta import MetaStore
from ledgerq.segment.naming import SEGMENTS_DIR, idx_path, log_path
from ledgerq.segment.scanner import EntryScanner, TailScanner, checked_start

__all__ = ["IN_FLIGHT_GRACE_S", "LogTail", "SegmentTail", "last_complete_id", "log_skipped"]

logger = logging.getLogger("ledgerq")

# How long an entry that looks half-written may stay so - or how long ago the file may
# have last been written to - before its bytes are treated as damage and searched past
# (a real append finishes in far less).
IN_FLIGHT_GRACE_S = 1.0
_IN_FLIGHT_GRACE_NS = int(IN_FLIGHT_GRACE_S * 1e9)
_ANY_ID = (1 << 64) - 1


def log_skipped(path: str, start: int, stop: int) -> None:
    """Log bytes ``[start, stop)`` of ``path`` that a reader skipped as corrupt."""
    logger.warning(
        "ledgerq: skipped %d corrupt bytes in %s at offset %d", stop - start, path, start
    )


class SegmentTail:
    """One segment log a lock-free reader has open (read-only), and what it knows of it.

    The descriptor stays open, so a segment that retention deletes while it is read is
    still read to its end.  A ``FileIO`` owns it, so it is closed (with a
    ``ResourceWarning``) even if the object is dropped without :meth:`close`.  Raises
    ``FileNotFoundError`` when the segment does not exist (any more).  ``first_id`` is
    the id of its first entry, ``name_id`` the id its file name says when that is
    another (a misnamed file, read by its content: see ``segment.layout``).
    """

    def __init__(self, segments_dir: str, first_id: int, name_id: int | None = None) -> None:
        self.first_id = first_id
        name_id = first_id if name_id is None else name_id
        self.path = log_path(segments_dir, name_id)
        self.file = io.FileIO(self.path, "rb")
        try:
            self.fd = self.file.fileno()
            st = os.fstat(self.fd)
            self.identity = (st.st_dev, st.st_ino)
            self.size = st.st_size  # the size at the last look
            self.mtime_ns = st.st_mtime_ns  # and the time of the last write then
            # Read the index after the log's size: the owner appends to the log before
            # the index, so every point read refers to bytes below a size seen later.
            self.points, _ = read_index(idx_path(segments_dir, name_id))
        except BaseException:
            self.file.close()
            raise
        self.boundaries = [point.offset for point in self.points]
        self.sealed = False  # a newer segment exists: ``size`` is final
        self.stuck_pos = -1  # where an entry that looks half-written was first met
        self.stuck_since = 0.0

    def refresh(self) -> int:
        """Look at the file's size (and mtime) again; return the size."""
        st = os.fstat(self.fd)
        self.size = st.st_size
        self.mtime_ns = st.st_mtime_ns
        return self.size

    def is_present(self, *, hint: str = "") -> bool:
        """Whether the file is still at its path; :class:`CorruptionError` (ending with
        ``hint``, what the reader may do about it) if another file is."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        if (st.st_dev, st.st_ino) != self.identity:
            raise CorruptionError(
                "the segment file being read was replaced by another file: the queue was "
                f"rewritten or restored under this reader{hint}",
                self.path,
            )
        return True

    def start_for(self, target: int) -> tuple[int, int]:
        """Where to scan from to meet id ``target``: ``(offset, id before it)``."""
        return checked_start(self.fd, self.points, self.size, target, self.first_id)

    def scanner(self, pos: int, after_id: int, *, whole_batches: bool = True) -> TailScanner:
        """A fresh scanner from ``pos`` to the size at the last look, patient while an
        entry there may still be being appended (:meth:`may_be_in_flight`)."""
        return TailScanner(
            fd=self.fd,
            pos=pos,
            end=self.size,
            after_id=after_id,
            boundaries=self.boundaries,
            patient=self.may_be_in_flight(pos),
            whole_batches=whole_batches,
        )

    def may_be_in_flight(self, pos: int) -> bool:
        """Whether an entry at ``pos`` that runs past the end may still be being appended.

        Not in a sealed segment, not once the file has gone unwritten for the grace
        period (by its mtime), and not once the reader has waited that long at ``pos``
        (the mtime may come from another clock, on a network file system).
        """
        if self.sealed or time.time_ns() - self.mtime_ns >= _IN_FLIGHT_GRACE_NS:
            return False
        return not (
            self.stuck_pos == pos and time.monotonic() - self.stuck_since >= IN_FLIGHT_GRACE_S
        )

    def note_stop(self, pos: int, *, waiting: bool) -> None:
        """A scan stopped at ``pos``: ``waiting`` at an entry that looks half-written."""
        if not waiting:
            self.stuck_pos = -1
        elif self.stuck_pos != pos:
            self.stuck_pos = pos
            self.stuck_since = time.monotonic()

    def patience_left(self) -> float | None:
        """Seconds until the half-written entry a scan stopped at counts as damage (None:
        the last scan did not stop at one)."""
        if self.stuck_pos < 0 or self.sealed:
            return None
        by_wait = self.stuck_since + IN_FLIGHT_GRACE_S - time.monotonic()
        by_mtime = (self.mtime_ns + _IN_FLIGHT_GRACE_NS - time.time_ns()) / 1e9
        return max(0.0, min(by_wait, by_mtime))

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
        self.file.close()


class LogTail:
    """The entries of a queue's log with id >= ``from_id``, in id order, as they are
    appended by the process that owns the queue (read without its lock).

    :meth:`next_entry` returns the next whole, valid entry already on disk, or None:
    then wait for a change (``readonly.watch_segments``) - at most
    :meth:`patience_left` seconds - and call again.  It never creates, writes,
    truncates or locks anything.  Entries of every record type are returned (a view
    skips the reserved ones); a batch's entries only once its last one is written;
    corrupt bytes are skipped and logged.

    It fails fast with :class:`CorruptionError` when it would otherwise silently miss or
    misread data: the file it reads shrinks below what it has read, is replaced, or is
    deleted while it is the newest segment; or the next segment was deleted before it
    could be opened.  Segment files are taken in the order of their contents
    (``segment.layout``): a misnamed file is read under its entries' ids, a copy is
    skipped.  Not thread-safe.
    """

    def __init__(self, queue_dir: str, from_id: int = 1) -> None:
        self.path = queue_dir
        self.segments_dir = os.path.join(queue_dir, SEGMENTS_DIR)
        self._directory = SegmentDirectory(self.segments_dir)
        self.next_id = from_id  # the lowest id not yet passed
        self.segment_path: str | None = None  # the log file being read
        self._seg: SegmentTail | None = None
        self._scanner: TailScanner | None = None
        self._at_end = False  # the scanner stopped at ``size``: look again before reading
        self._tail_reported = False

    def next_entry(self) -> Entry | None:
        """The next entry that is already on disk, or None (then wait and call again)."""
        while True:
            seg = self._seg
            if seg is None:
                if not self._open_first():
                    return None
                continue
            if self._at_end and not self._refresh():
                entry = None
            else:
                scanner = self._scanner
                assert scanner is not None
                entry = scanner.next()
                if scanner.corrupt:
                    for region in scanner.corrupt:
                        log_skipped(seg.path, region.start, region.stop)
                    scanner.corrupt.clear()
                if entry is None:
                    self._at_end = True
                    seg.note_stop(scanner.pos, waiting=scanner.waiting)
            if entry is None:
                if self._leave_segment():
                    continue
                return None
            if entry.id < self.next_id:
                continue  # before from_id (scanning from an index point)
            self.next_id = entry.id + 1
            return entry

    def patience_left(self) -> float | None:
        """Seconds until a half-written entry waited at counts as damage (None: none)."""
        return self._seg.patience_left() if self._seg is not None else None

    def close(self) -> None:
        """Release the open segment (idempotent); a later read opens it again."""
        seg, self._seg, self._scanner = self._seg, None, None
        self.segment_path = None
        if seg is not None:
            seg.close()

    # ------------------------------------------------------------------ one segment

    def _enter(self, seg: SegmentTail, target: int) -> None:
        """Read ``seg`` from the checked index point at or before id ``target``."""
        self._seg = seg
        self.segment_path = seg.path
        self._scanner = seg.scanner(*seg.start_for(target))
        self._at_end = False
        self._tail_reported = False

    def _refresh(self, *, force: bool = False) -> bool:
        """Look at the file's size again; True if there may be more to read.

        Raises :class:`CorruptionError` if the file shrank below what was read.
        """
        seg, scanner = self._seg, self._scanner
        assert seg is not None
        assert scanner is not None
        before = seg.size
        size = seg.refresh()
        if size < scanner.pos:
            raise CorruptionError(
                f"the segment file was truncated to {size} bytes under this reader, "
                f"which had read {scanner.pos} bytes of it (up to message {scanner.last_id}): "
                "messages it returned are gone. The owner cuts a log only to undo an append "
                "that failed (e.g. disk full); anything else truncating queue files is a bug. "
                "Once the queue is sound, read again from the last id you trust",
                seg.path,
                size,
            )
        lapsed = scanner.waiting and scanner.patient and not seg.may_be_in_flight(scanner.pos)
        if size == before and not force and not lapsed:
            return False
        # A new scanner at the same position: its buffer may hold the bytes of an
        # incomplete tail that a recovering owner has since cut and written again.
        self._scanner = seg.scanner(scanner.pos, scanner.last_id)
        self._at_end = False
        return True

    # ------------------------------------------------------------------ between segments

    def _leave_segment(self) -> bool:
        """At the end of what the segment holds: move on, or say to wait (False)."""
        seg, scanner = self._seg, self._scanner
        assert seg is not None
        assert scanner is not None
        # Look at our file's path before listing: the owner creates a segment's
        # successor before it can delete it, so a listing taken after our file was
        # found gone shows that successor (or a later one) - unless the file was
        # removed while it was the newest.
        present = self._is_present(seg)
        later = [f for f in self._list_segments() if f.first_id > seg.first_id]
        if not later:
            if not present and os.fstat(seg.fd).st_size > 0:
                raise CorruptionError(
                    "the newest segment file was deleted while this reader was reading it "
                    f"(after message {scanner.last_id}); its owner never deletes the "
                    "segment it appends to, so the queue was removed or tampered with - "
                    "anything written to it since is lost to readers",
                    seg.path,
                )
            return self._refresh()
        if not seg.sealed:
            # A newer segment exists, so this one is sealed and its size is final (the
            # owner creates the next file only after its last write here).  Read to that
            # size, now without waiting at an incomplete entry: nothing will complete it.
            seg.sealed = True
            self._refresh(force=True)
            return True
        if self._refresh():
            return True
        scanner = self._scanner
        assert scanner is not None
        if scanner.pos < seg.size and not self._tail_reported:
            self._tail_reported = True
            log_skipped(seg.path, scanner.pos, seg.size)
        successor = later[0].first_id
        if successor > scanner.last_id + 1 and seg.size > 0 and not self._is_present(seg):
            # Ids jump, and our (finished) segment has been deleted meanwhile: retention
            # may have deleted whole segments after it before we could open them.
            raise CorruptionError(
                f"messages after id {scanner.last_id} may have been deleted (by the owner's "
                f"retention) before this reader read them: the next segment starts at id "
                f"{successor}; read with enough retention (retention_max_age) to keep "
                "up, or read again from a later id",
                seg.path,
            )
        if successor > scanner.last_id + 1 and scanner.last_id:
            self._report_gap(scanner.last_id + 1, successor - 1, seg.path, later[0].file_name)
        try:
            following = SegmentTail(self.segments_dir, successor, later[0].name_id)
        except FileNotFoundError:
            # Deleted between the listing and now: an empty segment dropped by a
            # restarting owner, or retention - look again (the checks above tell which).
            if not self._is_present(seg):
                raise CorruptionError(
                    f"segment {successor} was deleted (by the owner's retention) before this "
                    f"reader could read it; messages from id {successor} on may be lost to "
                    "it - read with enough retention (retention_max_age) to keep up",
                    os.path.join(self.segments_dir, later[0].file_name),
                ) from None
            return True
        seg.close()
        self._enter(following, max(self.next_id, successor))
        return True

    def _report_gap(self, first: int, last: int, before: str, after: str) -> None:
        """Warn about ids ``first..last`` missing between two segments, unless the owner
        recorded them in ``meta.json`` as a gap it made (or a repair as known lost)."""
        try:
            meta = MetaStore(self.path).load()
        except (NotAQueueError, IncompatibleFormatError):
            return  # the owner rebuilds a damaged meta.json; nothing to judge by
        floor = meta.gaps_from if meta.gaps_from is not None else meta.next_id
        explained = [*meta.gaps, *meta.known_lost]
        for lo, hi in subtract_ranges(max(first, floor), last, explained):
            logger.warning(
                "ledgerq: ids %d-%d are missing between the segment files %s and %s "
                "(a segment file deleted or moved?); reading on after them",
                lo,
                hi,
                before,
                after,
            )

    def _is_present(self, seg: SegmentTail) -> bool:
        return seg.is_present(hint=f" - read again from id {self.next_id} if that is intended")

    def _open_first(self) -> bool:
        """Open the segment holding ``next_id`` (or the oldest one); False if none yet."""
        while True:
            files = self._list_segments()
            if not files:
                return False
            ids = [f.first_id for f in files]
            found = files[max(bisect.bisect_right(ids, self.next_id) - 1, 0)]
            try:
                seg = SegmentTail(self.segments_dir, found.first_id, found.name_id)
            except FileNotFoundError:
                continue  # deleted by retention meanwhile: list again
            self._enter(seg, max(self.next_id, found.first_id))
            return True

    def _list_segments(self) -> list[SegmentFile]:
        """The segment files to read, in id order (copies left out)."""
        try:
            return self._directory.layout().used
        except FileNotFoundError:
            raise CorruptionError(
                "the queue's segments directory was removed while this reader was reading "
                f"it (after message {self.next_id - 1})",
                self.segments_dir,
            ) from None


def last_id_in_file(seg_dir: str, f: SegmentFile, *, live: bool) -> int:
    """The id of the last valid entry of the segment file ``f`` in ``seg_dir`` (0: none).

    Reads from the last of its final index points that checks out (never the whole
    index).  ``live``: as a reader beside a writer must - an append in flight at the end
    is not counted, nor the entries of a batch whose last entry is not written yet (the
    owner's recovery would cut them).  A file that is gone counts as empty.
    """
    try:
        fd = os.open(os.path.join(seg_dir, f.file_name), os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        size = os.fstat(fd).st_size
        points = read_index_tail(idx_path(seg_dir, f.name_id))
        pos, after = checked_start(fd, points, size, _ANY_ID, f.first_id)
        scanner: EntryScanner
        if live:
            scanner = TailScanner(
                fd=fd,
                pos=pos,
                end=size,
                after_id=after,
                boundaries=[p.offset for p in points if p.offset > pos],
                patient=True,
                whole_batches=True,
            )
        else:
            scanner = EntryScanner(fd, pos, size, after_id=after)
        last = 0
        while (entry := scanner.next()) is not None:
            last = entry.id
        return last
    finally:
        os.close(fd)


def last_complete_id(queue_dir: str) -> int:
    """The id of the last complete, valid entry of a queue now (0 if it has none).

    An empty newest segment (just rotated) defers to the one before it; see
    :func:`last_id_in_file` for what "complete" means beside a writer.
    """
    seg_dir = os.path.join(queue_dir, SEGMENTS_DIR)
    try:
        files = SegmentDirectory(seg_dir).layout().used
    except FileNotFoundError:
        return 0
    for f in reversed(files):
        last = last_id_in_file(seg_dir, f, live=True)
        if last:
            return last
    return 0
