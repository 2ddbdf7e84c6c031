"""The segment manager: the append path, rotation, lookup, deletion; its recovery on
open is segment/recovery.py's (``Recovery``, a part of it written apart).

Only the newest segment is ever written.  Recovery on open trusts a sealed
segment's index (after checking its last point against the log with one small
read), and scans only the newest segment from its last index point to the end:
that is how a queue holding millions of messages reopens in milliseconds.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import os
import threading
from array import array
from collections.abc import Callable, Sequence
from itertools import accumulate

from ledgerq.format.entry import Entry, EntryFlags, decode_entry
from ledgerq.format.errors import CorruptRecord, IncompleteRecord
from ledgerq.format.index import (
    IndexEntry,
    encode_index_columns,
    encode_index_entry,
)
from ledgerq.segment.files import (
    StorageError,
    datasync,
    fsync_dir,
    pread_exact,
    storage_errors,
    write_all,
    write_parts,
)
from ledgerq.segment.index_file import write_index
from ledgerq.segment.layout import (
    Layout,
)
from ledgerq.segment.naming import (
    SEGMENTS_DIR,
)
from ledgerq.segment.recovery import Recovery
from ledgerq.segment.scanner import (
    CorruptRegion,
    EntryScanner,
)
from ledgerq.segment.segment import Segment
from ledgerq.segment.setaside import move_to_damaged, rename_segment

__all__ = ["SegmentManager"]

logger = logging.getLogger("ledgerq")

_BATCH_CONTINUES = int(EntryFlags.BATCH_CONTINUES)
_ANY_ID = (1 << 64) - 1  # above every id: "the newest point that checks out"


class SegmentManager(Recovery):
    """All segments of one queue directory; not thread-safe (the queue lock guards it)."""

    def __init__(
        self,
        directory: str,
        *,
        segment_size: int,
        index_interval: int,
        on_corrupt: Callable[[Segment, CorruptRegion], None] | None = None,
        on_gap: Callable[[int, int], None] | None = None,
        sync_on_rotate: bool = True,
    ) -> None:
        self.directory = os.path.join(directory, SEGMENTS_DIR)
        self.segment_size = segment_size
        self.index_interval = index_interval
        self.segments: list[Segment] = []
        self._first_ids: list[int] = []
        self._on_corrupt = on_corrupt
        # Called with (first, last) before a segment that leaves ids first..last unused
        # is created (the queue records the gap durably: see rotate()).
        self._on_gap = on_gap
        self.layout = Layout()  # after open: the files as found (gaps, copies, misnamed)
        self.set_aside: list[Segment] = []  # copies and overlaps found at open, not read
        self._misplaced: dict[int, Segment] = {}  # name id -> misnamed or set-aside segment
        self._log_fd: int | None = None  # None after close(), or a failed rotation
        # The writer, parked after a failed append whose cut failed too (see _undo).
        self._torn_fd: int | None = None
        self._closed = False
        self._fd_lock = threading.Lock()
        # With sync_on_rotate False (sync modes other than "always"), the fsyncs of a
        # rotation - the sealed log, its index, the directory - are left to the next
        # sync_active() (the interval flusher, sync(), close()) instead of stalling the
        # append that crossed segment_size.  Power loss before then is handled by
        # recovery: a sealed segment whose index or tail did not survive is rescanned.
        self._sync_on_rotate = sync_on_rotate
        self._unsynced_sealed: list[int] = []  # duplicated fds of sealed logs to fsync
        self._dir_dirty = False
        self._idx_fd: int | None = None
        self._idx_size = 0  # bytes of whole points in the open index (see _append_index)
        self._stale_indexes: set[int] = set()  # first ids of indexes not rewritten at open
        self._last_indexed_offset = -1
        self.truncated_bytes = 0
        self.log_next_id = 1  # after open: the id after the last entry found in the log
        self._reported: set[tuple[int, int]] = set()

    # ------------------------------------------------------------------ append path

    @property
    def active(self) -> Segment:
        """The segment appends go to."""
        return self.segments[-1]

    @property
    def next_id(self) -> int:
        """The id the next appended entry must carry."""
        active = self.segments[-1]
        return active.last_id + 1 if not active.is_empty else active.first_id

    def _create(self, first_id: int) -> None:
        if first_id in self._misplaced:
            self._clear_name(first_id)
        seg = Segment(self.directory, first_id)
        created = False
        try:
            fd = os.open(seg.log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            created = True
            os.close(fd)
            write_index(seg.idx_path, [], sealed=False, durable=False)
            # The new file's name must survive a power cut before entries in it are
            # acknowledged as durable: now, or at the next sync_active().
            if self._sync_on_rotate:
                fsync_dir(self.directory)
            else:
                self._dir_dirty = True
        except OSError as exc:
            if created:  # the retry's O_EXCL must not meet this half-made, empty segment
                with contextlib.suppress(OSError):  # else the retry fails clearly
                    self._unlink(seg)
            raise StorageError("create segment", seg.log_path, exc) from exc
        self.segments.append(seg)
        self._first_ids.append(first_id)
        self._last_indexed_offset = -1
        self._open_writer(seg)

    def _clear_name(self, name_id: int) -> None:
        """Free the file name of segment ``name_id`` for a new segment of that first id.

        The name is held by a misplaced file found at open: a misnamed segment in use
        is renamed to its content's name, a set-aside copy moved into ``damaged/``.
        """
        seg = self._misplaced.pop(name_id)
        if seg.deleted:
            return  # consumed and deleted by retention since: the name is free
        # (A renamed file keeps its inode: the read descriptors of readers stay valid.)
        with storage_errors("move a misplaced segment out of the way in", self.directory):
            if seg in self.set_aside:
                self.set_aside.remove(seg)
                where = move_to_damaged(self.directory, name_id)
                logger.warning(
                    "ledgerq: moved the set-aside segment file %s to %s (its name is needed)",
                    seg.log_path,
                    where,
                )
                return
            if seg.first_id in self._misplaced:
                self._clear_name(seg.first_id)
            rename_segment(self.directory, name_id, seg.first_id)
        old = seg.log_path
        seg.rename(self.directory, seg.first_id)
        logger.warning(
            "ledgerq: renamed the misnamed segment file %s to %s (its name is needed)",
            old,
            seg.log_path,
        )

    def _open_writer(self, seg: Segment) -> None:
        """Open ``seg``'s log and index for appending (both, or neither on an error)."""
        self._close_writer()
        with storage_errors("open segment", seg.log_path):
            log_fd = os.open(seg.log_path, os.O_WRONLY | os.O_APPEND)
            try:
                idx_fd = os.open(seg.idx_path, os.O_WRONLY | os.O_APPEND)
            except BaseException:
                os.close(log_fd)
                raise
        with self._fd_lock:
            self._log_fd = log_fd
        self._idx_fd = idx_fd
        # Where a failed point is cut back to; the recovered index ends with whole points.
        self._idx_size = os.lseek(idx_fd, 0, os.SEEK_END)
        if seg.first_id in self._stale_indexes:
            self._idx_fd = None  # not rewritten at open: no point appended after old ones
            os.close(idx_fd)
        if seg.index:
            self._last_indexed_offset = seg.index[-1].offset

    def _close_writer(self) -> None:
        with self._fd_lock:  # sync_active() must never fsync a closed (or reused) fd
            for name in ("_log_fd", "_torn_fd", "_idx_fd"):
                fd = getattr(self, name)
                if fd is not None:
                    setattr(self, name, None)
                    os.close(fd)

    def _note_appended(self, seg: Segment, message_id: int, timestamp: int, offset: int) -> bool:
        """Update what we know after an entry landed at ``offset``; True if indexed."""
        seg.last_id = message_id
        seg.last_offset = offset
        seg.last_timestamp = timestamp
        if (
            self._last_indexed_offset < 0
            or offset - self._last_indexed_offset >= self.index_interval
        ):
            seg.add_index_entry(IndexEntry(message_id, timestamp, offset))
            self._last_indexed_offset = offset
            return True
        return False

    def append_one(self, record: bytes, message_id: int, timestamp: int) -> bool:
        """Append one encoded entry (the hot path of :meth:`append`); True if it rotated."""
        fd = self._log_fd
        if fd is None:
            fd = self._resume_writer()
        seg = self.segments[-1]
        before = seg.size
        size = len(record)
        try:
            written = os.write(fd, record)
            if written != size:  # a short write: the rest, or the error that stopped it
                write_all(fd, memoryview(record)[written:])
        except OSError as exc:
            self._undo(fd, before)
            raise StorageError("append to", seg.log_path, exc) from exc
        seg.last_id = message_id
        seg.last_offset = before
        seg.last_timestamp = timestamp
        seg.size = before + size
        if before - self._last_indexed_offset >= self.index_interval or (
            self._last_indexed_offset < 0
        ):
            seg.add_index_entry(IndexEntry(message_id, timestamp, before))
            self._last_indexed_offset = before
            self._append_index(encode_index_entry(message_id, timestamp, before))
        if seg.size >= self.segment_size:
            self.rotate(message_id + 1, appended=True)
            return True
        return False

    def append(
        self, parts: list[bytes], sizes: Sequence[int], first_id: int, timestamp: int
    ) -> None:
        """Append encoded entries (ids ``first_id``... consecutive) in one ``writev``.

        ``parts`` concatenated are the entries, ``sizes`` their lengths.  The write
        reaches the OS before this returns (a killed process loses nothing);
        durability against power loss is the caller's sync policy.  On an OS error
        the file is cut back to where it was and :class:`StorageError` is raised:
        nothing of this call was appended.
        """
        fd = self._log_fd
        if fd is None:
            fd = self._resume_writer()
        seg = self.segments[-1]
        before = seg.size
        offsets = list(accumulate(sizes, initial=before))
        try:
            write_parts(fd, parts, offsets[-1] - before)
        except OSError as exc:
            self._undo(fd, before)
            raise StorageError("append to", seg.log_path, exc) from exc
        # offsets[i] is where entry i starts; offsets[-1] the new end of the segment.
        interval = self.index_interval
        last_indexed = self._last_indexed_offset
        count = len(sizes)
        i = (
            0
            if last_indexed < 0
            else bisect.bisect_left(offsets, last_indexed + interval, 0, count)
        )
        if i < count:
            if min(sizes) >= interval:
                # Entries of index_interval bytes or more (4 KiB messages): every one from
                # the first is a point - no per-entry search.
                ids = array("Q", range(first_id + i, first_id + count))
                point_offsets = array("Q", offsets[i:count])
            else:
                # Jump from point to point (bisect) instead of visiting every entry.
                picked = []
                while i < count:
                    picked.append(i)
                    i = bisect.bisect_left(offsets, offsets[i] + interval, i + 1, count)
                ids = array("Q", [first_id + j for j in picked])
                point_offsets = array("Q", [offsets[j] for j in picked])
            # Columns, not a tuple per point: profiled, the points' objects (and the
            # garbage collections they set off) were a fifth of a 4 KiB message's time.
            stamps = array("q", (timestamp,)) * len(ids)
            seg.add_index_columns(ids, stamps, point_offsets)
            self._last_indexed_offset = point_offsets[-1]
            index_blob = encode_index_columns(ids, stamps, point_offsets)
        else:
            index_blob = b""
        message_id = first_id + count
        seg.last_id = message_id - 1
        seg.last_offset = offsets[-2]
        seg.last_timestamp = timestamp
        seg.size = offsets[-1]
        if index_blob:
            self._append_index(index_blob)
        if seg.size >= self.segment_size:
            self.rotate(message_id, appended=True)

    def _append_index(self, blob: bytes) -> None:
        """Append points to the active segment's open index (best effort).

        The index is advisory until its segment is sealed: every reader checks a point
        against the log before using it, and recovery rebuilds it, so a failed write is
        no error of the append.  But a torn point would shift every point written after
        it: the whole file would then read as damaged, and the next open (and every
        lock-free reader) would scan the segment from its start.  So a failed write is
        cut back; if even that fails, no more points go to this file - the seal
        rewrites it whole from the points kept in memory.
        """
        fd = self._idx_fd
        if fd is None:
            return
        try:
            write_all(fd, blob)
        except OSError:
            try:
                os.ftruncate(fd, self._idx_size)
            except OSError:
                with self._fd_lock:
                    self._idx_fd = None
                os.close(fd)
            return
        self._idx_size += len(blob)

    def _undo(self, fd: int, size: int) -> None:
        """Cut the active log back to ``size`` after a failed append (``fd`` is its writer).

        On a full disk ``write()`` stores what fits before it fails; those bytes must go
        before anything else is appended, or the next entry would land after a torn one
        and recovery - which ends the log at the first bytes that are no entry - would
        cut it and everything after it.  If the cut itself fails, the writer is parked:
        appends refuse (:meth:`_resume_writer` retries the cut first) until it succeeds,
        and :meth:`sync_active` still syncs what was appended before.
        """
        try:
            os.ftruncate(fd, size)
        except OSError:
            logger.error(
                "ledgerq: could not cut back a failed append to %s; appends wait for the cut",
                self.segments[-1].log_path,
            )
            with self._fd_lock:
                self._log_fd, self._torn_fd = None, fd

    def rotate(self, next_first_id: int, *, appended: bool = False) -> None:
        """Seal the active segment (durably) and start a new one at ``next_first_id``.

        Raises :class:`StorageError` if a step fails.  Nothing written is lost then:
        the segment keeps its entries, and the next append finishes the rotation
        (:meth:`_resume_writer`) with the next id - the caller must count the entries
        it wrote before the rotation as appended (``next_id`` moved past them).

        ``appended``: the rotation follows an append that filled the segment, and that
        append stands - its caller returns the ids.  Then only a failed first step (the
        fsync that makes the entries durable, with ``sync_on_rotate``) raises; a later
        one - the sealed index or the next file refused by a full disk - is logged, and
        the next append finishes the rotation.
        """
        seg = self.segments[-1]
        natural = seg.last_id + 1 if not seg.is_empty else seg.first_id
        if next_first_id > natural and self._on_gap is not None:
            # Ids natural..next_first_id-1 will never be written: the queue records that
            # durably before the segment that leaves them out exists, so that the gap is
            # told apart from the ids of a segment file deleted by hand.
            self._on_gap(natural, next_first_id - 1)
        if seg.is_empty:
            # Nothing to seal: rename by recreating with the new first id.
            self._close_writer()
            self._unlink(seg)
            self.segments.pop()
            self._first_ids.pop()
            self._create(next_first_id)
            return
        self._sync_for_seal(seg)
        try:
            self._finish_rotation(seg, next_first_id)
        except StorageError as exc:
            if not appended:
                raise
            logger.warning(
                "ledgerq: could not finish a segment rotation (%s); the next append retries", exc
            )

    def _sync_for_seal(self, seg: Segment) -> None:
        """The first step of a rotation: make the active segment's data durable (or
        note it for the next sync).  If this raises, the segment stays active and open,
        and the next append's rotation retries."""
        fd = self._log_fd
        assert fd is not None
        with storage_errors("sync", seg.log_path):
            if self._sync_on_rotate:
                # A sealed segment is never rescanned: it must be whole.
                datasync(fd)
                return
            try:
                dup = os.dup(fd)
            except OSError:
                datasync(fd)  # no descriptor to sync it later with: now, then
                return
            with self._fd_lock:
                self._unsynced_sealed.append(dup)

    def _finish_rotation(self, seg: Segment, next_first_id: int) -> None:
        """Seal ``seg`` (its data synced) and create the next segment."""
        self._close_writer()
        # From here on a failure leaves no writer; _resume_writer() picks up from
        # whichever step failed.
        self._seal(seg, durable=self._sync_on_rotate)
        self._create(next_first_id)

    def _resume_writer(self) -> int:
        """The log descriptor to append to, after a rotation that failed half-way.

        If the active segment was sealed, its successor is created now; otherwise it
        is reopened, and the append that follows (the segment being full) rotates again.
        """
        assert not self._closed, "segment manager is closed"
        seg = self.segments[-1]
        torn = self._torn_fd
        if torn is not None:
            with storage_errors("cut back a failed append to", seg.log_path):
                os.ftruncate(torn, seg.size)
            with self._fd_lock:
                self._log_fd, self._torn_fd = torn, None
            return torn
        if seg.sealed:
            self._create(seg.last_id + 1)
        else:
            self._open_writer(seg)
        assert self._log_fd is not None
        return self._log_fd

    def _seal(self, seg: Segment, *, durable: bool) -> None:
        # A sealed index ends with its last entry, so the segment's id range is known.
        if seg.last_offset >= 0 and (not seg.index or seg.index[-1].offset != seg.last_offset):
            seg.add_index_entry(IndexEntry(seg.last_id, seg.last_timestamp, seg.last_offset))
        write_index(seg.idx_path, seg.index, sealed=True, durable=durable)
        self._stale_indexes.discard(seg.first_id)
        seg.sealed = True

    def sync(self) -> None:
        """fsync everything appended so far (see :meth:`sync_active`)."""
        self.sync_active()

    def sync_active(self) -> None:
        """:meth:`sync` callable from any thread without the queue lock (group commit).

        The descriptor is duplicated under a small lock of its own, so a rotation in
        another thread cannot close it mid-fsync; rotation fsyncs the segment it seals
        itself, so syncing the newest segment covers every write made before the call.
        """
        with self._fd_lock:
            writer = self._log_fd if self._log_fd is not None else self._torn_fd
            fd = os.dup(writer) if writer is not None else None
            sealed, self._unsynced_sealed = self._unsynced_sealed, []
            dir_dirty, self._dir_dirty = self._dir_dirty, False
        try:
            self._sync_sealed(sealed)  # segments sealed since the last sync come first
            if dir_dirty:
                with storage_errors("sync the directory", self.directory):
                    fsync_dir(self.directory)
            if fd is not None:
                with storage_errors("sync", self.segments[-1].log_path):
                    datasync(fd)
        except BaseException:
            if dir_dirty:
                self._dir_dirty = True  # an fsync of the directory is worth retrying
            raise
        finally:
            if fd is not None:
                os.close(fd)

    def _sync_sealed(self, fds: list[int]) -> None:
        """fsync and close the duplicated descriptors of sealed segments (all closed)."""
        try:
            for fd in fds:
                with storage_errors("sync a sealed segment in", self.directory):
                    datasync(fd)
        finally:
            for fd in fds:
                os.close(fd)

    # ------------------------------------------------------------------ reading

    def find(self, message_id: int) -> int:
        """Index in :attr:`segments` of the segment that holds (or would hold) ``message_id``."""
        i = bisect.bisect_right(self._first_ids, message_id) - 1
        return max(i, 0)

    def position_of(self, seg: Segment, message_id: int) -> tuple[int, int]:
        """Offset to start scanning ``seg`` for ``message_id``, and the id before it."""
        point = seg.locate(message_id)
        if point is None:
            return 0, seg.first_id - 1
        return point.offset, point.id - 1

    def read_entry_at(self, message_id: int, offset: int) -> Entry:
        """Read the entry ``message_id`` known to start at ``offset`` of its segment.

        Raises :class:`CorruptRecord` if it is no longer there or damaged.
        """
        seg = self.segments[self.find(message_id)]
        fd = seg.read_fd()
        data = os.pread(fd, 4096, offset)
        try:
            entry, _ = decode_entry(data, 0)
        except IncompleteRecord as exc:
            entry, _ = decode_entry(pread_exact(fd, exc.needed or 0, offset), 0)
        if entry.id != message_id:
            raise CorruptRecord(f"expected entry {message_id}, found {entry.id}", offset)
        return entry

    def read_entry(self, message_id: int) -> Entry | None:
        """The entry ``message_id``, read from the index point before it; None if the
        log does not hold it (never written, deleted, or damaged)."""
        seg = self.segments[self.find(message_id)]
        if seg.is_empty or not seg.first_id <= message_id <= seg.last_id:
            return None
        offset, after_id = self.position_of(seg, message_id)
        try:
            fd = seg.read_fd()
        except FileNotFoundError:
            return None
        scanner = EntryScanner(fd, offset, seg.size, after_id=after_id, boundaries=seg.boundaries())
        while (entry := scanner.next()) is not None:
            if entry.id >= message_id:
                return entry if entry.id == message_id else None
        return None

    def note_missing(self, seg: Segment) -> None:
        """A segment file of the view is gone from disk: raise (an exclusive owner
        deletes its files itself; a shared-mode manager reloads its view instead)."""
        raise FileNotFoundError(errno.ENOENT, "segment file deleted under the queue", seg.log_path)

    def refresh(self) -> None:
        """Bring the view up to date with the files (nothing to do for an exclusive owner)."""

    def first_id_at_or_after(self, timestamp_ns: int) -> int | None:
        """Id of the first entry whose timestamp is >= ``timestamp_ns``, or None.

        Uses each segment's last timestamp and its sparse index, so it reads at most
        one index interval of log.  Enqueue times are assumed not to go backwards
        (the wall clock stepping back can make it return a slightly later entry).
        """
        for seg in self.segments:
            if seg.is_empty or seg.last_timestamp < timestamp_ns:
                continue
            start, after_id = 0, seg.first_id - 1
            for point in seg.index:
                if point.timestamp >= timestamp_ns:
                    break
                start, after_id = point.offset, point.id - 1
            scanner = EntryScanner(
                seg.read_fd(), start, seg.size, after_id=after_id, boundaries=seg.boundaries()
            )
            while (entry := scanner.next()) is not None:
                if entry.timestamp >= timestamp_ns:
                    return entry.id
        return None

    # ------------------------------------------------------------------ deletion

    def delete_first(self) -> Segment:
        """Delete the oldest segment (never the active one) and return it.

        Raises :class:`StorageError` having changed nothing if its log cannot be
        deleted (the segment stays, and a later call tries again).
        """
        if len(self.segments) < 2:
            raise ValueError("the active segment cannot be deleted")
        seg = self.segments[0]
        with storage_errors("delete segment", seg.log_path), contextlib.suppress(FileNotFoundError):
            os.unlink(seg.log_path)
        self.segments.pop(0)
        self._first_ids.pop(0)
        # The index: best effort - one left behind without its log is deleted at open.
        with contextlib.suppress(OSError):
            self._unlink(seg)
        return seg

    def _unlink(self, seg: Segment) -> None:
        seg.deleted = True
        seg.close_read_fd()
        for path in (seg.log_path, seg.idx_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    @property
    def disk_bytes(self) -> int:
        """Bytes of segment log files."""
        return sum(s.size for s in self.segments)

    @property
    def total_entries(self) -> int:
        """Entries in all segments."""
        return sum(s.count for s in self.segments)

    def reopened(self) -> SegmentManager:
        """A new manager of the same directory and settings, not opened yet (to run the
        recovery again from the start after a failed :meth:`open`; close this one)."""
        manager = SegmentManager(
            os.path.dirname(self.directory),
            segment_size=self.segment_size,
            index_interval=self.index_interval,
            on_corrupt=self._on_corrupt,
            on_gap=self._on_gap,
            sync_on_rotate=self._sync_on_rotate,
        )
        manager.remember_reported(sorted(self._reported))
        return manager

    def close(self) -> None:
        """Close every file (does not sync; the queue decides that)."""
        self._closed = True
        self._close_writer()
        with self._fd_lock:
            sealed, self._unsynced_sealed = self._unsynced_sealed, []
        for fd in sealed:
            os.close(fd)
        for seg in self.segments:
            seg.close_read_fd()

    def _check(self) -> None:
        """Assert the manager's invariants (tests call this after every step)."""
        assert self.segments, "a manager always has an active segment"
        assert self._first_ids == [s.first_id for s in self.segments]
        for a, b in zip(self.segments, self.segments[1:], strict=False):
            assert a.sealed, f"{a} is not sealed but is not the newest"
            assert a.last_id < b.first_id, f"{a} overlaps {b}"
        for seg in self.segments:
            assert list(seg.index.ids) == sorted(set(seg.index.ids))
            if seg.index:
                assert seg.index[0].id >= seg.first_id
