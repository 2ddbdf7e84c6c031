"""``ledgerq.follow``: read a queue that another process owns, without taking its lock.

A follower is a read-only tail of the log, in the manner of SEJ's scanner: it opens
segment files read-only, never creates, writes, truncates or locks anything in the
queue directory, and reads what the owner appends, waiting (inotify, or polling
where that is missing) at the end of the newest segment.

What it can rely on, from the owner's side (see ``docs/format.md``):

* the owner only appends, one ``write()`` per enqueue or batch, so bytes of a log
  below a size the follower has seen never change - except when the owner's
  recovery cuts a torn tail: an incomplete entry, or the whole entries of a batch
  whose last entry is missing (the follower waits at the start of such a batch);
* ids inside a segment are consecutive, and between segments they only increase;
* a segment is sealed (its last write done) before the next segment's file is
  created, so once a newer ``.log`` exists, the older file's size is final;
* only sealed segments are ever deleted, oldest first, and the active (newest)
  one only when it is empty (a restart replacing it);
* a segment file name is never reused.

So the follower keeps its segment open (an unlinked file stays readable through
its descriptor): a segment that retention deletes while the follower is in it is
still read to its end.  It fails fast with :class:`CorruptionError` when it would
otherwise silently miss or misread data: the file it reads shrinks below what it
has read, is replaced, or is deleted while it is the newest segment; or the next
segment was deleted before the follower could open it.
"""

from __future__ import annotations

import bisect
import io
import logging
import math
import os
import struct
import time
from collections import deque
from types import TracebackType

from ledgerq._errors import CorruptionError, NotAQueueError
from ledgerq._options import Options
from ledgerq._types import Message, Priority
from ledgerq.core.meta import META_NAME, MetaStore
from ledgerq.features.compression import ZstdDecompression
from ledgerq.format.entry import (
    ENTRY_HEADER,
    KNOWN_FLAGS,
    MAX_ENTRY_SIZE,
    MIN_ENTRY_SIZE,
    Entry,
    EntryFlags,
    RecordType,
    decode_entry,
)
from ledgerq.format.errors import DecodeError
from ledgerq.format.index import IndexEntry, decode_index
from ledgerq.segment.naming import SEGMENTS_DIR, idx_path, list_segment_ids, log_path
from ledgerq.segment.scanner import EntryScanner
from ledgerq.segment.watch import DirectoryWatcher, WatchMode, open_watcher

__all__ = ["Follower", "follow"]

logger = logging.getLogger("ledgerq")

# A follower has no max_message_size of its own; this bounds what a (damaged) zstd
# frame may decompress to, like the queue does with its option.
_MAX_PAYLOAD = 1 << 30
# How long an entry that looks half-written may stay so - or how long ago the file
# may have last been written to - before its bytes are treated as damage and
# searched past (a real append finishes in far less).
_IN_FLIGHT_GRACE_S = 1.0
_IN_FLIGHT_GRACE_NS = int(_IN_FLIGHT_GRACE_S * 1e9)
_LOG_SUFFIX = ".log"
_WATCH_MODES = ("auto", "inotify", "poll")
_PRIORITIES = tuple(Priority)
_DATA = int(RecordType.DATA)
_COMPRESSED = int(EntryFlags.COMPRESSED)
_BATCH_CONTINUES = int(EntryFlags.BATCH_CONTINUES)
_KNOWN_TYPES = frozenset(int(t) for t in RecordType)
_LENGTH = struct.Struct("<I")


class _TailScanner(EntryScanner):
    """An :class:`EntryScanner` that waits at an entry still being appended.

    The plain scanner treats an entry that runs past the end of the data as a torn
    tail or a damaged length and searches every later byte offset for a valid
    entry.  At the live end of the newest segment that is almost always an append
    in progress: searching inside it wastes time on a large entry and could even
    take a valid entry embedded in its payload for the next one.  While
    ``patient``, an entry whose header is plausible and whose declared length runs
    past the end stops the scan instead (``waiting`` is then True).
    """

    def __init__(
        self,
        fd: int,
        pos: int,
        end: int,
        *,
        after_id: int,
        boundaries: list[int],
        patient: bool,
    ) -> None:
        super().__init__(fd, pos, end, after_id=after_id, boundaries=boundaries)
        self.patient = patient
        self.waiting = False

    def _resync(self, bad: int) -> bool:
        if self.patient and self._is_in_flight(bad):
            self.waiting = True
            return False
        return super()._resync(bad)

    def _is_in_flight(self, at: int) -> bool:
        available = self.end - at
        head = os.pread(self.fd, min(ENTRY_HEADER.size, available), at)
        if len(head) < _LENGTH.size:
            return True  # not even the length is there yet
        (length,) = _LENGTH.unpack_from(head, 0)
        if not MIN_ENTRY_SIZE <= length <= MAX_ENTRY_SIZE or length <= available:
            return False  # impossible, or all there and still invalid: damage
        if len(head) < ENTRY_HEADER.size:
            return True
        _, rtype, flags, message_id, _ = ENTRY_HEADER.unpack(head)
        return rtype in _KNOWN_TYPES and not flags & ~KNOWN_FLAGS and message_id > self.last_id


class _OpenSegment:
    """One segment log the follower has open (read-only), and where it is in it."""

    def __init__(self, segments_dir: str, first_id: int) -> None:
        self.first_id = first_id
        self.path = log_path(segments_dir, first_id)
        # A FileIO owns the descriptor, so it is closed (with a ResourceWarning) even if
        # the follower is dropped without close().  Raises FileNotFoundError.
        self.file = io.FileIO(self.path, "rb")
        try:
            self.fd = self.file.fileno()
            st = os.fstat(self.fd)
            self.identity = (st.st_dev, st.st_ino)
            self.size = st.st_size  # the size at our last look
            self.mtime_ns = st.st_mtime_ns  # and the time of the last write then
            self.index = _read_index(idx_path(segments_dir, first_id))
        except BaseException:
            self.file.close()
            raise
        self.boundaries = [point.offset for point in self.index]
        self.sealed = False  # a newer segment exists: ``size`` is final
        self.at_end = False  # the scanner returned None at ``size``: look again before reading
        self.tail_reported = False
        self.stuck_pos = -1  # where an entry that looks half-written was first met
        self.stuck_since = 0.0
        self.scanner = self.new_scanner(0, first_id - 1)

    def new_scanner(self, pos: int, after_id: int) -> _TailScanner:
        """A fresh scanner from ``pos`` (no bytes buffered from an earlier look)."""
        self.at_end = False
        return _TailScanner(
            self.fd,
            pos,
            self.size,
            after_id=after_id,
            boundaries=self.boundaries,
            patient=self.may_be_in_flight(pos),
        )

    def may_be_in_flight(self, pos: int) -> bool:
        """Whether an entry at ``pos`` that runs past the end may still be being appended.

        Not in a sealed segment, not once the file has gone unwritten for the grace
        period (by its mtime), and not once the follower has waited that long at
        ``pos`` (the mtime may come from another clock, on a network file system).
        """
        if self.sealed or time.time_ns() - self.mtime_ns >= _IN_FLIGHT_GRACE_NS:
            return False
        return not (
            self.stuck_pos == pos and time.monotonic() - self.stuck_since >= _IN_FLIGHT_GRACE_S
        )

    def patience_left(self) -> float | None:
        """Seconds until the half-written entry the scanner waits at counts as damage."""
        if not (self.scanner.waiting and self.scanner.patient):
            return None
        by_wait = self.stuck_since + _IN_FLIGHT_GRACE_S - time.monotonic()
        by_mtime = (self.mtime_ns + _IN_FLIGHT_GRACE_NS - time.time_ns()) / 1e9
        return max(0.0, min(by_wait, by_mtime))

    def position(self, target: int) -> None:
        """Start reading at the sparse-index point at or before ``target``, checked."""
        best: IndexEntry | None = None
        for point in self.index:
            if point.id > target or point.offset >= self.size:
                break
            best = point
        if best is None or best.offset == 0 or _entry_id_at(self.fd, best.offset) != best.id:
            return  # from the start of the file
        self.scanner = self.new_scanner(best.offset, best.id - 1)

    def is_present(self) -> bool:
        """Whether the file is still at its path; CorruptionError if another file is."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        if (st.st_dev, st.st_ino) != self.identity:
            raise CorruptionError(
                "the segment file this follower was reading was replaced by another file; "
                "the queue was rewritten or restored under it - follow again from id "
                f"{self.scanner.last_id + 1} if that is intended",
                self.path,
            )
        return True

    def close(self) -> None:
        self.file.close()


def _read_index(path: str) -> list[IndexEntry]:
    """The points of a sparse index, or none if it is missing or unreadable (a hint only)."""
    try:
        with open(path, "rb") as f:
            entries, _ = decode_index(f.read())
    except (OSError, DecodeError):
        return []
    return entries


def _entry_id_at(fd: int, offset: int) -> int:
    """Id of the valid entry starting at ``offset``, or -1."""
    head = os.pread(fd, ENTRY_HEADER.size, offset)
    if len(head) < ENTRY_HEADER.size:
        return -1
    (length,) = _LENGTH.unpack_from(head, 0)
    if not MIN_ENTRY_SIZE <= length <= MAX_ENTRY_SIZE:
        return -1
    try:
        entry, _ = decode_entry(os.pread(fd, length, offset), 0)
    except DecodeError:
        return -1
    return entry.id


class Follower:
    """An iterator of the messages of a queue that another process owns.

    Returned by :func:`ledgerq.follow`; see there.  Not thread-safe.  Close it (or
    use it as a context manager) to release its file descriptors; it closes itself
    when the iteration ends or raises.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        from_id: int = 1,
        timeout: float | None = None,
        *,
        watch: WatchMode = "auto",
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        if isinstance(from_id, bool) or not isinstance(from_id, int):
            raise TypeError(f"from_id must be an int, got {type(from_id).__name__}")
        if from_id < 1:
            raise ValueError(f"from_id must be >= 1 (ids start at 1), got {from_id}")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError(f"timeout must be a number or None, got {type(timeout).__name__}")
            if math.isnan(timeout) or timeout < 0:
                raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        if watch not in _WATCH_MODES:
            raise ValueError(f"watch must be one of {_WATCH_MODES}, got {watch!r}")
        self.path = os.path.abspath(os.fspath(path))
        self._segments_dir = os.path.join(self.path, SEGMENTS_DIR)
        _check_queue_directory(self.path, self._segments_dir)
        self._next_id = from_id
        self._timeout = timeout
        self._seg: _OpenSegment | None = None
        self._ready: deque[Entry] = deque()  # the rest of a batch whose end was read
        self._decompressor = ZstdDecompression(Options(max_message_size=_MAX_PAYLOAD))
        # The watcher exists before the first look at the files, so no change between
        # a look and the next wait can be missed (see ledgerq.segment.watch).
        try:
            self._watcher: DirectoryWatcher | None = open_watcher(
                self._segments_dir, watch, suffix=_LOG_SUFFIX
            )
        except FileNotFoundError:
            raise NotAQueueError(
                f"{self.path} has no {SEGMENTS_DIR}/ directory any more; it is not a queue"
            ) from None

    # ------------------------------------------------------------------ public face

    @property
    def next_id(self) -> int:
        """The lowest id not yet passed: ``follow(path, from_id=f.next_id)`` resumes here."""
        return self._next_id

    @property
    def watch(self) -> str:
        """How changes are waited for: ``"inotify"``, ``"poll"``, or ``"closed"``."""
        return self._watcher.kind if self._watcher is not None else "closed"

    @property
    def closed(self) -> bool:
        """Whether the follower has been closed (by :meth:`close`, its end or an error)."""
        return self._watcher is None

    def __iter__(self) -> Follower:
        return self

    def __next__(self) -> Message:
        """Return the next message; wait for it (up to ``timeout``) if it is not there yet.

        Raises ``StopIteration`` after ``timeout`` seconds without a message (and
        once closed); :class:`CorruptionError` when data was lost under the
        follower (the follower is then closed).
        """
        watcher = self._watcher
        if watcher is None:
            raise StopIteration
        timeout = self._timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                message = self._advance()
                if message is not None:
                    return message
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                patience = None if self._seg is None else self._seg.patience_left()
                if patience is not None:
                    left = patience if left is None else min(left, patience)
                watcher.wait(left)
        except BaseException:
            self.close()
            raise
        self.close()
        raise StopIteration

    def close(self) -> None:
        """Release the open segment and the watcher; idempotent.  Iteration then stops."""
        seg, self._seg = self._seg, None
        watcher, self._watcher = self._watcher, None
        self._ready.clear()
        try:
            if seg is not None:
                seg.close()
        finally:
            if watcher is not None:
                watcher.close()

    def __enter__(self) -> Follower:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ledgerq.Follower {self.path!r} next_id={self._next_id} watch={self.watch}>"

    # ------------------------------------------------------------------ reading

    def _advance(self) -> Message | None:
        """The next message that is already on disk, or None (then wait and call again)."""
        while True:
            seg = self._seg
            if seg is None:
                seg = self._seg = self._open_first()
                if seg is None:
                    return None
            entry = self._next_whole(seg)
            if entry is None:
                if self._leave_segment(seg):
                    continue
                return None
            if entry.id < self._next_id:
                continue  # before from_id (scanning from an index point)
            self._next_id = entry.id + 1
            if entry.type != _DATA:
                continue  # reserved record types carry no message
            message = self._message(seg, entry)
            if message is not None:
                return message

    def _next_whole(self, seg: _OpenSegment) -> Entry | None:
        """:meth:`_next_entry`, holding a batch back until its last entry is in the file.

        The owner's recovery cuts a batch whose end never reached the file (a batch
        is all-or-nothing), so no part of one is yielded before its end is there: the
        scan goes back to the batch's start and waits (or, in a sealed segment, where
        nothing will complete it, passes over it as skipped bytes).
        """
        if self._ready:
            return self._ready.popleft()
        entry = self._next_entry(seg)
        if entry is None or not entry.flags & _BATCH_CONTINUES:
            return entry
        start, after_id = seg.scanner.pos - entry.size, entry.id - 1
        rest: list[Entry] = []
        while (more := self._next_entry(seg)) is not None:
            rest.append(more)
            if not more.flags & _BATCH_CONTINUES:
                self._ready.extend(rest)
                return entry
        seg.scanner = seg.new_scanner(start, after_id)
        seg.at_end = True  # look at the file's size again before reading the batch again
        return None

    def _next_entry(self, seg: _OpenSegment) -> Entry | None:
        """The next whole, valid entry of ``seg`` within what the file holds now."""
        if seg.at_end and not self._refresh(seg):
            return None
        scanner = seg.scanner
        entry = scanner.next()
        if scanner.corrupt:
            for region in scanner.corrupt:
                _log_skipped(seg.path, region.start, region.stop)
            scanner.corrupt.clear()
        if entry is None:
            seg.at_end = True
            if scanner.waiting and seg.stuck_pos != scanner.pos:
                seg.stuck_pos = scanner.pos
                seg.stuck_since = time.monotonic()
        return entry

    def _refresh(self, seg: _OpenSegment, *, force: bool = False) -> bool:
        """Look at the file's size again; True if there may be more to read.

        Raises :class:`CorruptionError` if the file shrank below what was read.
        """
        st = os.fstat(seg.fd)
        size = st.st_size
        seg.mtime_ns = st.st_mtime_ns
        scanner = seg.scanner
        if size < scanner.pos:
            raise CorruptionError(
                f"the segment file was truncated to {size} bytes under this follower, "
                f"which had read {scanner.pos} bytes of it (up to message {scanner.last_id}): "
                "messages it yielded are gone. The owner cuts a log only to undo an append "
                "that failed (e.g. disk full); anything else truncating queue files is a bug. "
                "Once the queue is sound, follow again from the last id you trust",
                seg.path,
                size,
            )
        lapsed = scanner.waiting and scanner.patient and not seg.may_be_in_flight(scanner.pos)
        if size == seg.size and not force and not lapsed:
            return False
        # Start a new scanner at the same position: its buffer may hold the bytes of an
        # incomplete tail that a recovering owner has since cut and written again.
        seg.size = size
        seg.scanner = seg.new_scanner(scanner.pos, scanner.last_id)
        return True

    def _leave_segment(self, seg: _OpenSegment) -> bool:
        """At the end of what ``seg`` holds: move on, or say to wait (False)."""
        # Look at our file's path before listing: the owner creates a segment's
        # successor before it can delete it, so a listing taken after our file was
        # found gone shows that successor (or a later one) - unless the file was
        # removed while it was the newest.
        present = seg.is_present()
        later = [first_id for first_id in self._list_segments() if first_id > seg.first_id]
        if not later:
            if not present and os.fstat(seg.fd).st_size > 0:
                raise CorruptionError(
                    "the newest segment file was deleted while this follower was reading it "
                    f"(after message {seg.scanner.last_id}); its owner never deletes the "
                    "segment it appends to, so the queue was removed or tampered with - "
                    "anything written to it since is lost to readers",
                    seg.path,
                )
            return self._refresh(seg)
        if not seg.sealed:
            # A newer segment exists, so this one is sealed and its size is final (the
            # owner creates the next file only after its last write here).  Read to that
            # size, now without waiting at an incomplete entry: nothing will complete it.
            seg.sealed = True
            self._refresh(seg, force=True)
            return True
        if self._refresh(seg):
            return True
        scanner = seg.scanner
        if scanner.pos < seg.size and not seg.tail_reported:
            seg.tail_reported = True
            _log_skipped(seg.path, scanner.pos, seg.size)
        successor = later[0]
        if successor > scanner.last_id + 1 and seg.size > 0 and not seg.is_present():
            # Ids jump, and our (finished) segment has been deleted meanwhile: retention
            # may have deleted whole segments after it before we could open them.
            raise CorruptionError(
                f"messages after id {scanner.last_id} may have been deleted (by the owner's "
                f"retention) before this follower read them: the next segment starts at id "
                f"{successor}; follow with enough retention (retention_max_age) to keep "
                "up, or follow again from a later id",
                seg.path,
            )
        try:
            following = _OpenSegment(self._segments_dir, successor)
        except FileNotFoundError:
            # Deleted between the listing and now: an empty segment dropped by a
            # restarting owner, or retention - look again (the checks above tell which).
            if not seg.is_present():
                raise CorruptionError(
                    f"segment {successor} was deleted (by the owner's retention) before this "
                    f"follower could read it; messages from id {successor} on may be lost to "
                    "it - follow with enough retention (retention_max_age) to keep up",
                    log_path(self._segments_dir, successor),
                ) from None
            return True
        following.position(max(self._next_id, successor))
        self._seg = following
        seg.close()
        return True

    def _open_first(self) -> _OpenSegment | None:
        """Open the segment holding ``next_id`` (or the oldest one); None if none yet."""
        while True:
            ids = self._list_segments()
            if not ids:
                return None
            first_id = ids[max(bisect.bisect_right(ids, self._next_id) - 1, 0)]
            try:
                seg = _OpenSegment(self._segments_dir, first_id)
            except FileNotFoundError:
                continue  # deleted by retention meanwhile: list again
            seg.position(max(self._next_id, first_id))
            return seg

    def _list_segments(self) -> list[int]:
        try:
            return list_segment_ids(self._segments_dir)
        except FileNotFoundError:
            raise CorruptionError(
                "the queue's segments directory was removed while this follower was reading "
                f"it (after message {self._next_id - 1})",
                self._segments_dir,
            ) from None

    def _message(self, seg: _OpenSegment, entry: Entry) -> Message | None:
        payload = entry.payload
        if entry.flags & _COMPRESSED:
            try:
                payload = self._decompressor.restore(entry, payload)
            except CorruptionError as exc:
                logger.warning(
                    "ledgerq: follow skipping message %d in %s: %s", entry.id, seg.path, exc
                )
                return None
        return Message(
            entry.id,
            payload,
            dict(entry.headers) if entry.headers else {},
            _PRIORITIES[entry.priority],
            entry.timestamp,
            entry.expires_at,
            1,
        )


def _log_skipped(path: str, start: int, stop: int) -> None:
    logger.warning(
        "ledgerq: follow skipped %d corrupt bytes in %s at offset %d", stop - start, path, start
    )


def _check_queue_directory(path: str, segments_dir: str) -> None:
    if not os.path.exists(path):
        raise NotAQueueError(
            f"queue directory {path} does not exist (follow reads an existing queue; it "
            "never creates one)"
        )
    if not os.path.isdir(path):
        raise NotAQueueError(f"{path} is not a directory, so not a queue")
    has_meta = os.path.exists(os.path.join(path, META_NAME))
    if has_meta:
        MetaStore(path).load()  # read-only; raises NotAQueueError / IncompatibleFormatError
    if not os.path.isdir(segments_dir):
        raise NotAQueueError(
            f"{path} is not a ledgerq queue (no {SEGMENTS_DIR}/ directory"
            + ("" if has_meta else f" and no {META_NAME}")
            + ")"
        )


def follow(
    path: str | os.PathLike[str],
    from_id: int = 1,
    timeout: float | None = None,
    *,
    watch: WatchMode = "auto",
) -> Follower:
    """Iterate over the messages of a queue another process owns, without its lock.

    Yields every message with id >= ``from_id`` in id order, across segments, then
    follows new appends and new segments as the owner writes them.  ``timeout``:
    seconds without a new message after which the iteration ends normally
    (``None`` waits forever; ``0`` yields what is there and stops).  Nothing in the
    directory is created, written, truncated or locked.  Messages carry their
    stored fields with ``attempts=1``; the follower does not lease, ack or skip
    expired messages (it is a view of the log).  ``watch``: ``"auto"`` (inotify
    where available, else polling), ``"inotify"`` or ``"poll"``.

    Raises :class:`NotAQueueError` if ``path`` is not a queue directory, and (from
    the iteration) :class:`CorruptionError` if the file being read is truncated
    below what was read, replaced, or deleted while it is the newest segment, or a
    segment is deleted before the follower could read it.  Use it as a context
    manager, or call ``close()``, to release its file descriptors early.
    """
    return Follower(path, from_id, timeout, watch=watch)
