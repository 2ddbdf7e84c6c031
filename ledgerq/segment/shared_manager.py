"""The segment manager of a shared-mode handle: one log, appended to by many handles.

Every shared handle of a queue has its own :class:`SharedSegmentManager` - its own
view of the segments (what :class:`~ledgerq.segment.manager.SegmentManager` knows:
their ids, sizes, sparse indexes) and its own descriptors.  The handles agree through
two things only:

* the append lock (``segment.steplock``: a lock word of the state page taken with a
  compare-and-swap, or ``flock`` of ``shared/APPEND`` where ``atomicshm`` cannot be
  imported), held across one append: catch-up of the tail, the ``write()``, the index
  point, a rotation - never across the fsync that makes it durable
  (``sync="always"`` waits after the lock is released, so the handles of several
  processes overlap their fsyncs);
* the state page (``format.shared_state``): after each append the appender publishes
  the active segment's size and last entry, and bumps the *generation* when it
  creates a segment (rotation) or deletes one (retention).

A handle brings its view up to date with :meth:`refresh` before it decides anything:
one read of the page, and - only when the generation moved - a listing of
``segments/``.  Readers read up to the *published* size, which covers whole entries
and whole batches only, so no reader ever meets an append in flight.

Kill -9 at any step (see docs/architecture.md): the appender sets the page's
``writing`` word before it writes and clears it after publishing.  A handle that
takes the append lock and finds the word set knows that the previous holder died
(or failed and could not cut back what it wrote): it recovers the tail the way an
open recovers it - whole entries and whole batches after the published size are
kept (their enqueue never returned, but they are valid), a torn entry or an
incomplete batch is cut, a segment the dead rotation created is adopted - then
publishes and goes on.  Nothing is ever held by a file's mere existence.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import struct
from collections.abc import Callable

from ledgerq.format.checksum import checksum
from ledgerq.format.index import IndexEntry
from ledgerq.format.shared_state import (
    SLOT_RESERVE_SPENT,
    SLOT_WRITING,
    TAIL_FIELDS,
    TAIL_OFFSET,
    TAIL_TRAILER,
    SharedTail,
    decode_tail,
    encode_tail,
)
from ledgerq.segment.files import StorageError, storage_errors
from ledgerq.segment.index_file import read_index, write_index
from ledgerq.segment.layout import content_first_id
from ledgerq.segment.manager import SegmentManager
from ledgerq.segment.naming import list_segment_ids
from ledgerq.segment.scanner import CorruptRegion, EntryScanner
from ledgerq.segment.segment import Segment
from ledgerq.segment.shared_page import SharedPage
from ledgerq.segment.steplock import StepLock

__all__ = ["SharedSegmentManager"]

logger = logging.getLogger("ledgerq")

_TAIL_FIELDS = TAIL_FIELDS
_TAIL_TRAILER = TAIL_TRAILER
_TAIL_AT = TAIL_OFFSET
_WRITING_END = SLOT_WRITING + 8
_set_u64 = struct.Struct("<Q").pack_into
_checksum = checksum


def _read_error(exc: OSError, directory: str) -> StorageError:
    """An OS error met reading other handles' new segments (EIO), naming the file.

    Raised with the view as it was (what it has seen is noted only once read), so the
    next call reads them again.  (A ``try`` at the call sites, not a context manager:
    it costs nothing on the reader's path until something fails.)
    """
    return StorageError("read", exc.filename or directory, exc)


def _pop(segments: dict[int, Segment], name_id: int) -> Segment | None:
    return segments.pop(name_id, None)


class SharedSegmentManager(SegmentManager):
    """A :class:`SegmentManager` whose log other handles append to as well.

    ``page`` is the queue's state page and ``append_lock`` this handle's append lock
    (``segment.steplock``; :meth:`set_append_lock` once the page exists).
    ``claim_region(first_id, offset)`` is asked, under the append lock, whether a
    corrupt region is new to the queue (so that every handle counts it once, in
    total); the others are as for :class:`SegmentManager`.
    """

    def __init__(
        self,
        directory: str,
        *,
        page: SharedPage,
        append_lock: StepLock,
        segment_size: int,
        index_interval: int,
        on_corrupt: Callable[[Segment, CorruptRegion], None] | None = None,
        on_gap: Callable[[int, int], None] | None = None,
        claim_region: Callable[[int, int], bool] | None = None,
        sync_on_rotate: bool = True,
    ) -> None:
        super().__init__(
            directory,
            segment_size=segment_size,
            index_interval=index_interval,
            on_corrupt=on_corrupt,
            on_gap=on_gap,
            sync_on_rotate=sync_on_rotate,
        )
        self._page: SharedPage | None = None
        self._mm: mmap.mmap | None = None
        if page is not None:
            self.page = page
        self._append_lock = append_lock
        self._claim_region = claim_region
        self._append_depth = 0
        self.generation = 0  # the page's generation the view was built at
        self._writer_generation = -1  # the generation our writer descriptors were opened at
        self._torn = False  # a failed append could not be cut back: leave ``writing`` set
        self._appending = False  # between begin_append and end_append: the view is the truth
        # The page's bytes this view last matched: the tail (64 bytes) for refresh(), and
        # the tail with a clear ``writing`` word (72) as this handle last published it -
        # when the page still holds exactly that, nobody appended since: the fast path.
        self._seen = b""
        self._waited_for = b""  # the last tail wait_for_appender sent a waiter to look at
        self._published = b""

    def reopened(self) -> SharedSegmentManager:
        """A new manager like this one, not opened yet (the first handle's recovery run
        again after a full disk: see ``SegmentManager.reopened``)."""
        manager = SharedSegmentManager(
            os.path.dirname(self.directory),
            page=self._page,  # type: ignore[arg-type] # None until the recovery is done
            append_lock=self._append_lock,
            segment_size=self.segment_size,
            index_interval=self.index_interval,
            on_corrupt=self._on_corrupt,
            on_gap=self._on_gap,
            claim_region=self._claim_region,
            sync_on_rotate=self._sync_on_rotate,
        )
        manager.remember_reported(sorted(self._reported))
        return manager

    def set_append_lock(self, append_lock: StepLock) -> None:
        """Take appends with ``append_lock`` from now on (the session's page exists)."""
        assert not self._append_depth
        self._append_lock = append_lock

    def set_claim_region(self, claim_region: Callable[[int, int], bool]) -> None:
        """Count corrupt regions through ``claim_region`` from now on (the session started)."""
        self._claim_region = claim_region

    # ------------------------------------------------------------------ the append lock

    def lock_appends(self) -> None:
        """Take the append lock (re-entrant within this handle; the queue lock is held).

        Raises :class:`~ledgerq.QueueBusyError` when another handle holds it past this
        handle's budget (a stopped process: see ``segment.steplock``).
        """
        if not self._append_depth:
            self._append_lock.acquire()
        self._append_depth += 1

    @property
    def page(self) -> SharedPage:
        """The state page (the first handle attaches it once its recovery is done)."""
        page = self._page
        assert page is not None, "the state page is not attached yet"
        return page

    @page.setter
    def page(self, page: SharedPage) -> None:
        self._page = page
        self._mm = page.memory

    @property
    def reserve_spent(self) -> bool:
        """Whether the queue's disk reserve is spent (the page's ``reserve_spent`` word)."""
        mm = self._mm
        return mm is not None and mm[SLOT_RESERVE_SPENT] != 0

    def unlock_appends(self) -> None:
        """Release one :meth:`lock_appends`."""
        self._append_depth -= 1
        if not self._append_depth:
            self._append_lock.release()

    def wait_for_appender(self) -> bool:
        """Let an append under way in another handle end; True if this handle must look again.

        An appender's ``write()`` wakes the other processes' waiters (a file event) before
        it publishes the new tail in the page, which fires no event: a waiter that looked
        in between would wait for good.  The appender publishes before it releases the
        append lock, so taking that lock once waits for the publication.  True when the
        published tail is not the one this handle's last look took - once per tail, so a
        tail the view cannot take (a dead appender's, repaired by the next one) is not
        looked at in a loop.
        """
        if self._append_depth or self._mm is None:
            return False
        self.lock_appends()
        self.unlock_appends()
        raw = self.page.raw_tail()
        if raw == self._seen or raw == self._waited_for:
            return False
        self._waited_for = raw
        return True

    @property
    def holds_append_lock(self) -> bool:
        """Whether this handle holds ``shared/APPEND`` now."""
        return self._append_depth > 0

    # ------------------------------------------------------------------ the view

    def current_tail(self) -> SharedTail:
        """The tail as this view knows it (to publish)."""
        seg = self.segments[-1]
        return SharedTail(
            seg.name_id,
            seg.size,
            seg.last_id,
            seg.last_offset,
            seg.last_timestamp,
            self._last_indexed_offset,
            self.generation,
        )

    def publish(self, *, writing: int = 0) -> None:
        """Publish this view's tail, and set the ``writing`` word (append lock held)."""
        blob = encode_tail(self.current_tail(), writing)
        self.page.publish_raw(blob)
        self._seen = blob[:64]
        self._published = blob if not writing else b""

    def join(self) -> None:
        """Build the view of a log that other handles have open (takes the append lock).

        A dead appender's leftovers are recovered first (see the module).
        """
        self.lock_appends()
        try:
            tail = self._usable_tail()
            self._load_view(tail, arrange=True)
        finally:
            self.unlock_appends()

    def refresh(self) -> None:
        """Bring the view up to date with what the other handles published."""
        if self._appending:
            return  # this handle is the appender: its view is ahead of the page
        raw = self.page.raw_tail()
        if raw == self._seen:
            return  # nothing published since the last look
        tail = decode_tail(raw) or self.page.tail()
        if tail is None:
            self.lock_appends()
            try:
                tail = self._usable_tail()
            finally:
                self.unlock_appends()
            raw = encode_tail(tail)
        try:
            self._take(tail)
        except StorageError:
            raise
        except OSError as exc:
            raise _read_error(exc, self.directory) from exc
        self._seen = raw

    def _take(self, tail: SharedTail) -> None:
        """Make the view what ``tail`` says."""
        if tail.generation != self.generation:
            self._reload(tail)
            return
        seg = self.segments[-1]
        if tail.active_size != seg.size:
            seg.size = tail.active_size
            seg.last_id = tail.last_id
            seg.last_offset = tail.last_offset
            seg.last_timestamp = tail.last_ts

    def _usable_tail(self) -> SharedTail:
        """The published tail, after repairing what a dead appender left (append lock held)."""
        tail = self.page.tail()
        if tail is None or self.page.get(SLOT_WRITING):
            tail = self._recover(tail)
        return tail

    def _load_view(self, tail: SharedTail, *, arrange: bool = False) -> None:
        """Make the view the segments on disk up to the published active one.

        Segments already in the view are kept as they are (a cursor may be reading
        one: its descriptor must stay open); those gone from disk are marked deleted.
        """
        existing = {seg.name_id: seg for seg in self.segments}
        segments = []
        for name_id in list_segment_ids(self.directory):
            if name_id > tail.active_first:
                continue  # a segment being created after the tail was read
            try:
                if name_id == tail.active_first:
                    seg = _pop(existing, name_id) or Segment(self.directory, name_id)
                    self._take_tail(seg, tail)
                else:
                    seg = _pop(existing, name_id) or self._sealed_from_disk(name_id)
                    if not seg.sealed:
                        self._refresh_sealed(seg)
            except FileNotFoundError:
                continue  # deleted by retention meanwhile
            segments.append(seg)
        for gone in existing.values():
            gone.deleted = True
            gone.close_read_fd()
        if not segments or segments[-1].name_id != tail.active_first:
            raise StorageError(
                "find the active segment of",
                self.directory,
                OSError(errno.ENOENT, f"segment {tail.active_first} is missing"),
            )
        if self._log_fd is not None and self.segments and self.segments[-1] is not segments[-1]:
            self._retire_writer()
        if arrange:
            self._arrange(segments)  # the layout checks (and their warnings): at join only
        else:
            self.segments = segments
            self._first_ids = [seg.first_id for seg in segments]
        self.generation = tail.generation
        self.log_next_id = self.next_id

    def _take_tail(self, seg: Segment, tail: SharedTail) -> None:
        """Make ``seg`` (the active segment) what the tail says."""
        seg.read_fd()  # FileNotFoundError if it is gone
        seg.size = tail.active_size
        seg.last_id = tail.last_id
        seg.last_offset = tail.last_offset
        seg.last_timestamp = tail.last_ts
        seg.sealed = False
        if not seg.index or seg.index[-1].offset < tail.last_indexed:
            points, _ = read_index(seg.idx_path)
            seg.set_index([p for p in points if p.offset <= tail.last_offset])

    def _sealed_from_disk(self, name_id: int) -> Segment:
        """A segment that is no longer the active one: from its sealed index, or read."""
        seg = self._identify(name_id, trust_index=True)
        if not seg.sealed:
            self._scan_whole(seg)
        return seg

    def _refresh_sealed(self, seg: Segment) -> None:
        """``seg`` was the active segment of the view; another handle sealed it since."""
        fresh = self._sealed_from_disk(seg.name_id)
        try:
            seg.first_id = fresh.first_id
            seg.size = fresh.size
            seg.last_id = fresh.last_id
            seg.last_offset = fresh.last_offset
            seg.last_timestamp = fresh.last_timestamp
            seg.set_index(fresh.index)
            seg.missing = fresh.missing
            seg.sealed = True
        finally:
            fresh.close_read_fd()

    def _scan_whole(self, seg: Segment) -> None:
        """Learn a sealed segment's entries by reading it (its index did not check out).

        Read-only: the first handle of a session repaired what could be repaired.
        """
        fd = seg.read_fd()
        seg.size = os.fstat(fd).st_size
        seg.first_id = content_first_id(fd, seg.size, seg.name_id)
        scanner = EntryScanner(fd, 0, seg.size, after_id=seg.first_id - 1)
        points: list[IndexEntry] = []
        last_point = -1
        found = 0
        while (entry := scanner.next()) is not None:
            offset = scanner.pos - entry.size
            found += 1
            seg.last_id, seg.last_offset, seg.last_timestamp = entry.id, offset, entry.timestamp
            if last_point < 0 or offset - last_point >= self.index_interval:
                points.append(IndexEntry(entry.id, entry.timestamp, offset))
                last_point = offset
        seg.set_index(points)
        if not seg.is_empty:
            seg.missing = (seg.last_id - seg.first_id + 1) - found
        seg.sealed = True

    def _reload(self, tail: SharedTail) -> None:
        """The generation moved: segments were created or deleted by other handles."""
        self._load_view(tail)

    def _retire_writer(self) -> None:
        """Another handle sealed the segment our writer was on: keep it for the next sync."""
        with self._fd_lock:
            if self._log_fd is not None:
                # Our writes to it are not durable yet: sync_active() syncs it first.
                self._unsynced_sealed.append(os.dup(self._log_fd))
        self._close_writer()
        self._writer_generation = -1

    def note_missing(self, seg: Segment) -> None:
        """A segment of the view is gone from disk (deleted by another handle)."""
        self.lock_appends()
        try:
            tail = self._usable_tail()
        finally:
            self.unlock_appends()
        self.generation = -1  # force a reload even if the page's generation is the same
        self._reload(tail)
        seg.deleted = True

    # ------------------------------------------------------------------ appending

    def begin_append(self) -> None:
        """Take the append lock and bring the view (and the writer) up to the tail.

        After this returns, :meth:`end_append` must follow (it publishes and unlocks).
        The common case - this handle appended last - costs a comparison of the page's
        bytes with the ones it published.
        """
        if not self._append_depth:
            self._append_lock.acquire()
        self._append_depth += 1
        mm = self._mm
        assert mm is not None
        try:
            if mm[_TAIL_AT:_WRITING_END] != self._published:
                self._catch_up_reading()
        except BaseException:
            self.unlock_appends()  # (the word as it was: a dead appender's is repaired later)
            raise
        _set_u64(mm, SLOT_WRITING, 1)
        self._appending = True
        try:
            seg = self.segments[-1]
            if seg.size >= self.segment_size and seg.last_id:
                # A full segment left unrotated: by another handle, or by a rotation of
                # this one that failed half-way (a full disk) and closed the writer -
                # which is resumed first, finishing what that rotation had done.
                if self._log_fd is None and self._torn_fd is None:
                    self._resume_writer()
                    seg = self.segments[-1]
                if seg.size >= self.segment_size and seg.last_id:
                    self.rotate(seg.last_id + 1)
        except BaseException:
            # Nothing was appended and the view is what the disk holds (a rotation that
            # failed is finished by the next append): publish it, the word cleared.
            self.end_append()
            raise

    def catch_up_locked(self) -> None:
        """Bring the view up to the tail with the append lock held, to publish after.

        Not :meth:`refresh`: a tail a dead appender left (the ``writing`` word set) is
        repaired first, as the next appender would.  Whoever publishes clears the word;
        publishing a view that leaves the dead one's bytes outside the tail would let
        the next appender write after them, under ids they already carry.
        """
        if self._appending:
            return  # this handle is the appender: its view is ahead of the page
        mm = self._mm
        assert mm is not None
        if mm[_TAIL_AT:_WRITING_END] != self._published:
            self._catch_up_reading()

    def _catch_up_reading(self) -> None:
        try:
            self._catch_up_appender()
        except StorageError:
            raise
        except OSError as exc:
            raise _read_error(exc, self.directory) from exc

    def _catch_up_appender(self) -> None:
        """Another handle appended (or died appending) since this one published."""
        tail = self._usable_tail()
        if tail.generation != self.generation:
            self._reload(tail)
        seg = self.segments[-1]
        seg.size = tail.active_size
        seg.last_id = tail.last_id
        seg.last_offset = tail.last_offset
        seg.last_timestamp = tail.last_ts
        if self._writer_generation != self.generation or self._log_fd is None:
            self._open_writer(seg)
        self._last_indexed_offset = tail.last_indexed
        blob = encode_tail(tail, 0)
        self._seen = blob[:64]
        self._published = blob

    def end_append(self) -> None:
        """Publish the tail and release the append lock (after :meth:`begin_append`).

        The ``writing`` word is cleared with the same copy - unless a failed append could
        not be cut back: then it stays set, and the next appender repairs the tail.
        """
        try:
            seg = self.segments[-1]
            fields = _TAIL_FIELDS.pack(
                seg.name_id,
                seg.size,
                seg.last_id,
                seg.last_offset,
                seg.last_timestamp,
                self._last_indexed_offset,
                self.generation,
            )
            torn = self._torn
            blob = fields + _TAIL_TRAILER.pack(_checksum(fields), 0, 1 if torn else 0)
            mm = self._mm
            assert mm is not None
            mm[_TAIL_AT:_WRITING_END] = blob
            self._seen = blob[:64]
            self._published = b"" if torn else blob
        finally:
            self._appending = False
            self._append_depth -= 1
            if not self._append_depth:
                self._append_lock.release()

    def _open_writer(self, seg: Segment) -> None:
        if not os.path.exists(seg.idx_path):
            # A rotation killed between creating the log and its index (append lock held).
            with storage_errors("create the index of", seg.log_path):
                write_index(seg.idx_path, [], sealed=False, durable=False)
        super()._open_writer(seg)
        self._writer_generation = self.generation

    def _undo(self, fd: int, size: int) -> None:
        try:
            os.ftruncate(fd, size)
        except OSError:
            self._torn = True
            logger.error(
                "ledgerq: could not cut back a failed append in %s; the next append repairs it",
                self.directory,
            )

    def rotate(self, next_first_id: int, *, appended: bool = False) -> None:
        seg = self.segments[-1]
        if not seg.is_empty:
            # The index file holds the points of every appender; ours in memory only ours.
            points, _ = read_index(seg.idx_path)
            mine = {p.offset for p in points}
            merged = points + [p for p in seg.index if p.offset not in mine]
            merged.sort(key=lambda p: p.offset)
            seg.set_index([p for p in merged if p.offset <= seg.last_offset])
        try:
            super().rotate(next_first_id, appended=appended)
        finally:
            self.generation += 1  # (a half-done rotation too: the others list again)
        self._writer_generation = self.generation

    def delete_first(self) -> Segment:
        seg = super().delete_first()
        self.generation += 1
        return seg

    def report_corrupt(self, seg: Segment, region: CorruptRegion) -> None:
        key = (seg.first_id, region.start)
        if key in self._reported:
            return
        if self._claim_region is not None:
            self.lock_appends()
            try:
                fresh = self._claim_region(*key)
            finally:
                self.unlock_appends()
            if not fresh:
                self._reported.add(key)  # another handle counted it
                return
        super().report_corrupt(seg, region)

    # ------------------------------------------------------------------ a dead appender

    def _recover(self, tail: SharedTail | None) -> SharedTail:
        """Repair what an appender that died (or failed) left, and publish (append lock held).

        With a readable tail: the published active segment is recovered as an open
        recovers the newest segment (whole entries and whole batches after the
        published size kept, the rest cut), and a segment the dead rotation created
        after it is adopted as the active one.  With an unreadable tail (damaged page),
        the newest segment on disk is taken for the active one.
        """
        names = list_segment_ids(self.directory)
        if not names:
            raise StorageError(
                "recover the segments of",
                self.directory,
                OSError(errno.ENOENT, "no segment file"),
            )
        active_name = (
            tail.active_first if tail is not None and tail.active_first in names else names[-1]
        )
        generation = max(tail.generation if tail is not None else 0, self.generation) + 1
        existing = {seg.name_id: seg for seg in self.segments}
        if self._log_fd is not None:
            self._retire_writer()
        segments = []
        for name_id in names:
            if name_id >= active_name:
                continue
            try:
                seg = _pop(existing, name_id) or self._sealed_from_disk(name_id)
                if not seg.sealed:
                    self._refresh_sealed(seg)
            except FileNotFoundError:
                continue
            segments.append(seg)
        active = _pop(existing, active_name) or Segment(self.directory, active_name)
        self._recover_tail(active, is_newest=True)
        for name_id in [n for n in names if n > active_name]:
            newer = _pop(existing, name_id) or Segment(self.directory, name_id)
            with storage_errors("look at", newer.log_path):
                size = os.stat(newer.log_path).st_size
            if size == 0 and active.size >= self.segment_size and not active.is_empty:
                # A rotation died after creating its successor: finish it.
                self._seal(active, durable=self._sync_on_rotate)
                segments.append(active)
                active = newer
                continue
            if size == 0:
                logger.warning("ledgerq: removing the unused empty segment %s", newer.log_path)
                self._unlink(newer)
                continue
            logger.warning(
                "ledgerq: segment %s after the published active one holds entries; "
                "adopting it as the active segment",
                newer.log_path,
            )
            self._seal(active, durable=True)
            segments.append(active)
            active = newer
            self._recover_tail(active, is_newest=True)
        segments.append(active)
        for gone in existing.values():
            gone.deleted = True
            gone.close_read_fd()
        self.segments = segments
        self._first_ids = [s.first_id for s in segments]
        self.generation = generation
        self._writer_generation = -1
        self._last_indexed_offset = active.index[-1].offset if active.index else -1
        self.log_next_id = self.next_id
        self._torn = False
        published = self.current_tail()
        self.publish()
        logger.warning(
            "ledgerq: recovered the log tail of %s after a handle died while appending",
            self.directory,
        )
        return published
