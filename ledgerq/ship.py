"""``ledgerq ship``: copy a queue's segments to a hub directory, incrementally.

The copy of queue directory ``SRC`` shipped by client ``ID`` lives in
``DEST_ROOT/<ID>.<basename of SRC>/`` (SEJ's hub layout) and is itself a queue
directory: ``meta.json``, ``segments/*.log`` byte for byte as in the source, and a
sparse index per segment - so ``ledgerq.follow``, the Spark reader and (when no
shipper runs) ``ledgerq.open`` read it.  ``ship.json`` there names the source.

How a pass works (the source is read without its lock, beside its owner):

* Source segments are taken in id order.  A segment is *sealed* once a newer one
  exists (its owner creates the next file only after its last write to the
  previous one), or once it is deleted (only sealed segments are deleted).
* Every byte copied is first read and decoded: every entry's CRC is checked, and
  the bytes written are decoded again before they are written.  A segment is
  copied up to the end of its last complete entry; an entry still being appended
  is waited for, never copied in part.  Damage in the middle of a segment (bytes
  that are no entry, followed by valid entries) is reported and copied as it is,
  so the destination stays byte-exact and its readers skip it as the source's do.
* A destination segment appears only whole: it is written to a ``.tmp`` file,
  fsynced and renamed.  After that it grows only by appends of complete, verified
  entries (the way its source grew) and is fsynced before ``meta.json`` moves on.
  A shipper killed in the middle of such an append can leave an incomplete last
  entry, which every ledgerq reader treats as a write in flight and the next run
  cuts off before it continues.  A segment's sealed index is written (atomically)
  before the next segment's file is created, as the queue itself does.
* Resuming needs no state besides the destination itself: the newest destination
  segment says where to go on (its size is the source offset: the copy is
  byte-exact), and its last entry is compared with the source's.

``--delete-shipped`` deletes a source segment only when it is sealed, its copy is
sealed and fsynced, and every id in it is below the durable head of every reader
of the source (``readers/*.state`` replayed read-only).  It cannot see the owner's
memory: see ``docs/ship.md`` for the races with the owner's own retention.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ledgerq._errors import CorruptionError, LedgerQError, NotAQueueError

# Reading the source, which another process owns, with the lock-free reader's rules
# (segment.readonly), and its segments entry by entry (format, scanner, layout);
# writing the destination, a queue directory of its own, under its lock.
from ledgerq.format.entry import decode_entry
from ledgerq.format.errors import DecodeError
from ledgerq.format.index import IndexEntry
from ledgerq.segment.appendlog import AppendLog
from ledgerq.segment.files import atomic_write, fsync_dir, pread_exact, storage_errors
from ledgerq.segment.index_file import read_index, write_index
from ledgerq.segment.layout import content_first_id
from ledgerq.segment.lock import DirLock
from ledgerq.segment.meta import Meta, MetaStore, encode_meta
from ledgerq.segment.naming import (
    LOCK_NAME,
    META_NAME,
    SEGMENTS_DIR,
    TMP_SUFFIX,
    idx_path,
    list_segment_ids,
    log_path,
)
from ledgerq.segment.readonly import (
    DirectoryWatcher,
    EntryFlags,
    SegmentTail,
    WatchMode,
    load_meta,
    queue_dir_problem,
    reader_heads,
    segment_ids,
    watch_segments,
)
from ledgerq.segment.scanner import EntryScanner, sealed_index_holds

__all__ = [
    "STATE_NAME",
    "ShipError",
    "ShipReport",
    "destination_path",
    "durable_reader_heads",
    "ship_queue",
]

logger = logging.getLogger("ledgerq")

STATE_NAME = "ship.json"
STATE_FORMAT = "ledgerq-ship"
STATE_VERSION = 1
_CLIENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}\Z")  # anchored; no '.', which separates the parts
_CHUNK = 8 << 20  # bytes read, verified and written at a time
_DEFAULT_INDEX_INTERVAL = 4096
_BATCH_CONTINUES = int(EntryFlags.BATCH_CONTINUES)
_ENCRYPTED = int(EntryFlags.ENCRYPTED)
_MIN_PASS_INTERVAL_S = 0.05  # in follow mode, at most ~20 passes (and fsyncs) a second

ProgressCallback = Callable[[int, int], None]


class ShipError(LedgerQError):
    """Shipping cannot go on: a bad client id, or a destination that is not this source's."""


@dataclass(frozen=True, slots=True)
class ShipReport:
    """What :func:`ship_queue` did (over all passes when following).

    ``messages``/``bytes`` count entries copied; ``segments`` the destination segment
    files created; ``deleted_*`` the source segments removed by ``delete_shipped``;
    ``corrupt`` the damaged regions copied as they are (``file``, ``offset``,
    ``length``); ``notes`` anything else worth a line (lost data, skipped deletions).
    """

    source: str
    dest: str
    client_id: str
    passes: int
    messages: int
    bytes: int
    segments: int
    last_id: int
    deleted_segments: int
    deleted_bytes: int
    corrupt: tuple[tuple[str, int, int], ...] = ()
    notes: tuple[str, ...] = ()


@dataclass
class _Totals:
    passes: int = 0
    messages: int = 0
    bytes: int = 0
    segments: int = 0
    deleted_segments: int = 0
    deleted_bytes: int = 0
    corrupt: list[tuple[str, int, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def destination_path(
    src: str | os.PathLike[str], dest_root: str | os.PathLike[str], client_id: str
) -> str:
    """``DEST_ROOT/<client_id>.<basename of SRC>``: where ``src`` is shipped to."""
    _check_client_id(client_id)
    name = os.path.basename(os.path.abspath(os.fspath(src)))
    return os.path.join(os.path.abspath(os.fspath(dest_root)), f"{client_id}.{name}")


def _check_client_id(client_id: object) -> str:
    if not isinstance(client_id, str):
        raise TypeError(f"client id must be a str, got {type(client_id).__name__}")
    if not _CLIENT_ID.match(client_id):
        raise ShipError(
            f"invalid client id {client_id!r}: use 1-100 letters, digits, '_' or '-' "
            "(no '.', which separates the client id from the queue name at the hub)"
        )
    return client_id


# ---------------------------------------------------------------------- reader heads


def durable_reader_heads(queue_dir: str | os.PathLike[str]) -> dict[str, int]:
    """Each reader's durable head in the queue at ``queue_dir``, read without its lock.

    The head is the lowest id the reader may still need, as its state journal on
    disk says (its checkpoint head, moved past the ids acknowledged after it; the
    replay is the queue's own, ``ledgerq.segment.readonly.reader_heads``).  The
    owner's memory may be ahead; never behind.  Raises :class:`CorruptionError` for a
    damaged journal.
    """
    return reader_heads(os.fspath(queue_dir))


# ---------------------------------------------------------------------- scanning


@dataclass
class _Scan:
    stop: int  # where the bytes taken end: after the last entry taken
    last_id: int
    entries: list[tuple[int, int, int, int]]  # offset, id, timestamp, size
    corrupt: list[tuple[int, int]]
    exhausted: bool  # the scanner has nothing more now


def _take(scanner: EntryScanner, budget: int) -> _Scan:
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
    return _Scan(stop, entries[-1][1] if entries else after_id, entries, corrupt, exhausted)


# ---------------------------------------------------------------------- destination segments


@dataclass
class _DestSegment:
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

    def open_for_append(self, path: str, fd: int) -> None:
        """Append to ``fd`` (the copy's file at ``path``, ``size`` bytes) from now on."""
        self.out = AppendLog(path, "the shipped copy")
        self.out.adopt(fd, self.size)

    def close(self) -> None:
        out, self.out = self.out, None
        if out is not None:
            out.close()


# ---------------------------------------------------------------------- the shipper


class Shipper:
    """Ships one source queue to its destination; use :func:`ship_queue`.

    Holds the destination's lock from :meth:`open` to :meth:`close`.
    """

    def __init__(
        self,
        src: str | os.PathLike[str],
        dest_root: str | os.PathLike[str],
        client_id: str,
        *,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self.client_id = _check_client_id(client_id)
        self.src = os.path.abspath(os.fspath(src))
        self.dest = destination_path(self.src, dest_root, client_id)
        self.src_segments = os.path.join(self.src, SEGMENTS_DIR)
        self.dest_segments = os.path.join(self.dest, SEGMENTS_DIR)
        self.on_progress = on_progress
        self.totals = _Totals()
        self._lock: DirLock | None = None
        self._current: _DestSegment | None = None  # the newest destination segment
        self._sealed: dict[int, tuple[int, int]] = {}  # first id -> (last id, size)
        self._source: SegmentTail | None = None
        self._source_meta = Meta()
        self._interval = _DEFAULT_INDEX_INTERVAL
        self._entries_before = 0  # entries in destination segments older than the newest
        self._meta_written: tuple[int, int] | None = None
        self._pass_done = 0
        self._pass_total = 0

    # ------------------------------------------------------------------ opening

    def open(self) -> None:
        """Check the source, lock and check (or create) the destination, load its state."""
        problem = queue_dir_problem(self.src)
        if problem is not None:
            raise NotAQueueError(problem)
        self._source_meta = load_meta(self.src)  # its identity (created_ns) and options
        interval = self._source_meta.options.get("index_interval")
        if isinstance(interval, int) and not isinstance(interval, bool) and interval > 0:
            self._interval = interval
        if not os.path.isdir(self.src_segments):
            raise NotAQueueError(f"{self.src} is not a ledgerq queue (no {SEGMENTS_DIR}/)")
        os.makedirs(self.dest, exist_ok=True)
        self._lock = DirLock(self.dest)
        try:
            self._check_destination()
            os.makedirs(self.dest_segments, exist_ok=True)
            self._load_destination()
        except BaseException:
            self.close()
            raise

    def _state(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "client_id": self.client_id,
            "queue": os.path.basename(self.src),
            "source": self.src,
            "source_created_ns": self._source_meta.created_ns,
        }

    def _check_destination(self) -> None:
        state_path = os.path.join(self.dest, STATE_NAME)
        try:
            with open(state_path, "rb") as f:
                state: Any = json.loads(f.read())
        except FileNotFoundError:
            foreign = [n for n in os.listdir(self.dest) if n not in (LOCK_NAME, SEGMENTS_DIR)]
            if foreign or segment_ids(self.dest):
                raise ShipError(
                    f"{self.dest} exists and is not a ship destination (no {STATE_NAME}); "
                    "ship to another root or client id"
                ) from None
            atomic_write(state_path, json.dumps(self._state(), indent=1).encode() + b"\n")
            return
        except (OSError, ValueError) as exc:
            raise ShipError(f"{state_path} is unreadable ({exc})") from None
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ShipError(f"{state_path} is not a ship state file")
        if state.get("source_created_ns") != self._source_meta.created_ns:
            raise ShipError(
                f"{self.dest} holds the copy of another queue (created at "
                f"{state.get('source_created_ns')} ns, from {state.get('source')!r}); "
                f"{self.src} was created at {self._source_meta.created_ns} ns. Ship it "
                "under another client id, or remove the old copy"
            )

    def _load_destination(self) -> None:
        ids = segment_ids(self.dest)
        for name in os.listdir(self.dest_segments):
            if name.endswith(TMP_SUFFIX):
                os.unlink(os.path.join(self.dest_segments, name))  # an unfinished copy
        for first_id in ids[:-1]:
            seg = self._open_dest(first_id)
            if not self._load_sealed(seg):
                self._rescan(seg, cut=False)  # not expected: we seal before going on
                seg.write_index(sealed=True)
            self._sealed[first_id] = (seg.last_id, seg.size)
            if seg.last_id:
                self._entries_before += seg.last_id - seg.first_id + 1
        if ids:
            seg = self._open_dest(ids[-1])
            if not self._load_sealed(seg):
                self._rescan(seg, cut=True)
                seg.write_index(sealed=False)
            else:
                self._sealed[seg.first_id] = (seg.last_id, seg.size)
            seg.open_for_append(seg.log, os.open(seg.log, os.O_WRONLY | os.O_APPEND))
            self._current = seg
            self._check_against_source(seg)

    def _open_dest(self, first_id: int) -> _DestSegment:
        return _DestSegment(
            first_id, log_path(self.dest_segments, first_id), idx_path(self.dest_segments, first_id)
        )

    def _load_sealed(self, seg: _DestSegment) -> bool:
        """Take a sealed segment's range from its index, after checking its last point.

        A copy may end with damaged bytes copied as they are from a sealed source, so
        its last entry need not end the file.
        """
        points, sealed = read_index(seg.idx)
        with open(seg.log, "rb") as f:
            seg.size = os.fstat(f.fileno()).st_size
            if not sealed_index_holds(f.fileno(), seg.size, points, sealed, ends_log=False):
                return False
        last = points[-1]
        seg.points = points
        seg.last_id, seg.last_offset, seg.last_ts = last.id, last.offset, last.timestamp
        seg.sealed = True
        return True

    def _rescan(self, seg: _DestSegment, *, cut: bool) -> None:
        """Find the entries of a destination segment; with ``cut``, cut an incomplete tail.

        Only the newest copy can end in our own interrupted append; an older one keeps
        its bytes (a damaged tail there was copied, as it is, from a sealed source).
        """
        fd = os.open(seg.log, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            found = _take(EntryScanner(fd, 0, size, after_id=seg.first_id - 1), size)
        finally:
            os.close(fd)
        seg.points = []
        for offset, message_id, timestamp, _ in found.entries:
            seg.note(offset, message_id, timestamp, self._interval)
        if not cut:
            seg.size = size
            return
        if found.stop < size:
            # Our own append cut short by a kill or a crash: never a complete entry.
            logger.warning(
                "ledgerq: ship cuts %d bytes of an incomplete copy at the end of %s",
                size - found.stop,
                seg.log,
            )
            with open(seg.log, "r+b") as f:
                f.truncate(found.stop)
                os.fsync(f.fileno())
        seg.size = found.stop

    def _check_against_source(self, seg: _DestSegment) -> None:
        """The newest copy's last entry must be byte for byte the source's."""
        if seg.last_offset < 0:
            return
        try:
            source = SegmentTail(self.src_segments, seg.first_id)
        except FileNotFoundError:
            return  # deleted at the source meanwhile: nothing left to compare or copy
        try:
            size = source.size
            length = seg.size - seg.last_offset
            with open(seg.log, "rb") as f:
                ours = pread_exact(f.fileno(), length, seg.last_offset)
            theirs = pread_exact(source.fd, length, seg.last_offset) if size >= seg.size else b""
        finally:
            source.close()
        if ours != theirs:
            raise ShipError(
                f"{seg.log} does not match {source.path} at offset {seg.last_offset} (message "
                f"{seg.last_id}): the destination was written by something else, or the "
                "source was rewritten; remove the copy to ship again from scratch"
            )

    # ------------------------------------------------------------------ one pass

    def ship_pass(self) -> tuple[int, int]:
        """Copy what is new; return (messages, bytes) copied.  Durable when it returns."""
        self.totals.passes += 1
        messages = nbytes = 0
        try:
            ids = list_segment_ids(self.src_segments)
        except FileNotFoundError:
            raise CorruptionError(
                "the source queue's segments directory is gone (the queue was deleted)",
                self.src_segments,
            ) from None
        current = self._current
        floor = current.first_id if current is not None else 0
        todo = [i for i in ids if i >= floor]
        if current is not None and not current.sealed and current.first_id not in ids:
            todo.insert(0, current.first_id)  # deleted at the source: finish it from our fd
        self._pass_done = 0
        self._pass_total = self._pending_bytes(todo, ids)
        self._progress(0)
        for first_id in todo:
            seg = self._current if self._current and self._current.first_id == first_id else None
            if seg is not None and seg.sealed:
                continue
            source = self._source_for(first_id)
            if source is None:
                if seg is not None:
                    self._lost(seg, "deleted at the source before this shipper could open it")
                continue
            before = self._current
            if seg is None and before is not None and 0 < before.last_id < first_id - 1:
                self._note(
                    f"ids {before.last_id + 1}-{first_id - 1} are not at the source: never "
                    "written (ids skipped after a crash), or deleted by the source's retention "
                    "before they were shipped"
                )
            # Sealed: a newer segment exists (listed before we look at this one's size,
            # so that size is final), or the file is gone (only sealed ones are deleted).
            sealed = not ids or first_id != ids[-1] or not source.is_present()
            got_messages, got_bytes, complete = self._copy(source, seg, sealed=sealed)
            messages += got_messages
            nbytes += got_bytes
            if not complete:
                break
        if nbytes or self._meta_written is None:
            self._write_meta()
        self.totals.messages += messages
        self.totals.bytes += nbytes
        return messages, nbytes

    def _progress(self, nbytes: int) -> None:
        self._pass_done += nbytes
        if self.on_progress is not None:
            self.on_progress(self._pass_done, max(self._pass_total, self._pass_done))

    def _pending_bytes(self, todo: list[int], ids: list[int]) -> int:
        total = 0
        current = self._current
        for first_id in todo:
            try:
                size = os.path.getsize(log_path(self.src_segments, first_id))
            except FileNotFoundError:
                continue
            if current is not None and current.first_id == first_id:
                size -= current.size
            total += max(size, 0)
        return total

    def _source_for(self, first_id: int) -> SegmentTail | None:
        source = self._source
        if source is not None and source.first_id == first_id:
            return source
        if source is not None:
            source.close()
            self._source = None
        try:
            self._source = source = SegmentTail(self.src_segments, first_id)
        except FileNotFoundError:
            return None
        held = content_first_id(source.fd, source.size, first_id) if source.size else first_id
        if held != first_id:
            # The shared naming rule (segment.layout): never copy a file under the ids its
            # name says when its entries say otherwise - the copy would be misnamed too.
            raise CorruptionError(
                f"the source segment file holds ids from {held}, not from {first_id} as its "
                "name says (renamed, swapped or copied by hand): run `ledgerq verify "
                "--repair` on the source queue, then ship again (nothing is lost meanwhile)",
                source.path,
            )
        return source

    def _lost(self, seg: _DestSegment, why: str) -> None:
        self.totals.notes.append(
            f"segment {seg.first_id} was {why}; its messages after {seg.last_id or 'the start'} "
            "are not at the hub (give the source a retention_max_age that outlasts shipping)"
        )
        self._seal(seg)

    def _copy(
        self, source: SegmentTail, seg: _DestSegment | None, *, sealed: bool
    ) -> tuple[int, int, bool]:
        """Copy the new complete entries of ``source``; return (messages, bytes, complete).

        ``complete``: the source segment is sealed and its copy is whole and sealed.
        """
        size = source.refresh()
        start = seg.size if seg is not None else 0
        after_id = seg.last_id if seg is not None and seg.last_id else source.first_id - 1
        if size < start:
            raise CorruptionError(
                f"the source segment shrank to {size} bytes, below the {start} bytes already "
                "shipped; the source was truncated or rewritten under the shipper",
                source.path,
                size,
            )
        if seg is None and sealed and size == 0:
            return 0, 0, True  # an empty sealed segment holds nothing: not copied
        # The live segment's end may be an append or a batch in flight: the scanner stops
        # there (for the grace period) and the copy waits; a sealed segment is copied to
        # its end, byte for byte, whatever it holds.
        source.sealed = sealed
        scanner = source.scanner(start, after_id, whole_batches=not sealed)
        pos = start
        messages = 0
        staged = seg if seg is not None else self._begin(source.first_id)
        while True:
            found = _take(scanner, _CHUNK)
            stop = found.stop
            if found.exhausted and sealed and stop < size:
                # A sealed segment ends in bytes that are no entry: copied as they are
                # (byte-exact), reported; readers skip them as they do at the source.
                found.corrupt.append((stop, size))
                stop = size
            if stop > pos:
                self._write(source, staged, pos, stop, found)
                messages += len(found.entries)
                for start_at, end_at in found.corrupt:
                    self._report_corrupt(source, start_at, end_at)
            pos = stop
            if found.exhausted:
                break
        source.note_stop(pos, waiting=scanner.waiting)
        if not staged.published:
            # A new copy appears whole: all of a sealed segment, or all of the live one's
            # complete entries so far (it grows by appends from now on).
            self._publish(staged, index=not sealed)
        if sealed and staged.size == size:
            self._seal(staged)
            source.close()
            self._source = None
            return messages, pos - start, True
        return messages, pos - start, False

    def patience_left(self) -> float | None:
        """Seconds until bytes the shipper waits at count as damage (None: not waiting)."""
        return self._source.patience_left() if self._source is not None else None

    def _report_corrupt(self, source: SegmentTail, start: int, stop: int) -> None:
        name = os.path.basename(source.path)
        if (name, start, stop - start) in self.totals.corrupt:
            return
        self.totals.corrupt.append((name, start, stop - start))
        logger.warning(
            "ledgerq: ship copied %d damaged bytes of %s at offset %d as they are",
            stop - start,
            source.path,
            start,
        )

    def _report_unsealed(self, source: SegmentTail, ids: list[int]) -> None:
        """Say that entries of an encrypted source are not sealed, and copy them all the
        same: the copy stays byte-exact (what resuming relies on), the shipper has no key
        to judge sealed entries by anyway, and the copy is an encrypted queue whose readers
        skip such entries as corrupt - as the source's do (docs/encryption.md)."""
        which = f"id {ids[0]}" if len(ids) == 1 else f"{len(ids)} of them, ids {ids[0]}-{ids[-1]}"
        note = (
            f"unsealed entries in encrypted {source.path} ({which}): written without the "
            "key, or their seal stripped; copied as found - readers with the key skip them "
            "as corrupt"
        )
        self.totals.notes.append(note)
        logger.warning("ledgerq: ship: %s", note)

    def _write(
        self, source: SegmentTail, seg: _DestSegment, start: int, stop: int, found: _Scan
    ) -> None:
        """Append source bytes [start, stop) to the copy, checked again as written."""
        unsealed: list[int] = []  # entries of an encrypted source that are not sealed
        encrypted = bool(self._source_meta.encryption)
        data = pread_exact(source.fd, stop - start, start)
        if len(data) != stop - start:
            raise CorruptionError(
                "the source segment ended before bytes that were just read",
                source.path,
                start + len(data),
            )
        for offset, message_id, _, length in found.entries:
            # The bytes we write are checked again, not only the ones the scanner read.
            try:
                entry, end = decode_entry(data, offset - start)
            except DecodeError as exc:
                raise CorruptionError(
                    f"bytes changed while being shipped ({exc})", source.path, offset
                ) from None
            if entry.id != message_id or end - (offset - start) != length:
                raise CorruptionError("bytes changed while being shipped", source.path, offset)
            if encrypted and not entry.flags & _ENCRYPTED:
                unsealed.append(message_id)
        if unsealed:
            self._report_unsealed(source, unsealed)
        assert seg.out is not None
        seg.out.append_record(data)  # whole, or StorageError with nothing appended
        seg.size = stop
        self._progress(len(data))
        for offset, message_id, timestamp, _ in found.entries:
            seg.note(offset, message_id, timestamp, self._interval)
        if seg.published:
            seg.out.sync()  # durable before meta.json (and a deletion) count on it
            if seg.index_dirty:
                seg.write_index(sealed=False)

    def _begin(self, first_id: int) -> _DestSegment:
        """Start the copy of a new segment, in a ``.tmp`` file no reader looks at."""
        previous = self._current
        if previous is not None:
            self._seal(previous)  # never two open segments: the older one is final
            previous.close()
            if previous.last_id:
                self._entries_before += previous.last_id - previous.first_id + 1
        seg = self._open_dest(first_id)
        seg.published = False
        tmp = seg.log + TMP_SUFFIX
        with storage_errors("create the shipped copy", tmp):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        seg.open_for_append(tmp, fd)
        self._current = seg
        return seg

    def _publish(self, seg: _DestSegment, *, index: bool) -> None:
        """Make a new copy visible: fsync the temp file, rename it, fsync the directory."""
        assert seg.out is not None
        seg.out.sync()  # the content is on disk before the name points at it
        with storage_errors("publish the shipped copy", seg.log):
            os.replace(seg.log + TMP_SUFFIX, seg.log)
            seg.out.path = seg.log
            fsync_dir(self.dest_segments)  # and the name itself is durable
        seg.published = True
        self.totals.segments += 1
        if index:
            seg.write_index(sealed=False)

    def _seal(self, seg: _DestSegment) -> None:
        if seg.sealed:
            return
        if seg.out is not None:
            seg.out.sync()
        seg.write_index(sealed=True)
        self._sealed[seg.first_id] = (seg.last_id, seg.size)

    def _write_meta(self) -> None:
        current = self._current
        last_id = current.last_id if current is not None and current.last_id else 0
        if not last_id:
            last_id = max((last for last, _ in self._sealed.values()), default=0)
        next_id = max(last_id + 1, current.first_id if current is not None else 1)
        entries = self._entries_before + (
            current.last_id - current.first_id + 1 if current is not None and current.last_id else 0
        )
        if self._meta_written == (next_id, entries):
            return
        meta = Meta(
            # The copy holds the source's entries: delayed ones if its source may have.
            version=self._source_meta.version,
            created_ns=self._source_meta.created_ns,
            clean=False,  # the log may run ahead of next_id while a pass appends
            next_id=next_id,
            reserved_until=next_id,
            counters={"enqueued": entries, "enqueued_through": next_id},
            options=dict(self._source_meta.options),
            # The copy's gaps are its source's (ids skipped after a crash, segments deleted
            # before they were shipped: see the notes); not for the copy to alarm about.
            gaps_from=None,
            # An encrypted source's identity and key check: the copy's entries are its
            # ciphertext as is, opened at the hub with the same key.
            encryption=dict(self._source_meta.encryption),
        )
        atomic_write(os.path.join(self.dest, META_NAME), encode_meta(meta))
        self._meta_written = (next_id, entries)

    @property
    def last_id(self) -> int:
        """The id of the newest message at the destination (0: none)."""
        current = self._current
        if current is not None and current.last_id:
            return current.last_id
        return max((last for last, _ in self._sealed.values()), default=0)

    # ------------------------------------------------------------------ deleting

    def delete_shipped(self) -> tuple[int, int]:
        """Delete source segments that are shipped, durable and consumed by every reader.

        Returns (segments, bytes) deleted.  Never the newest source segment, never one
        whose copy is not sealed (fsynced), never one holding an id at or above the
        durable head of any reader of the source.
        """
        try:
            heads = durable_reader_heads(self.src)
        except CorruptionError as exc:
            self._note(f"nothing deleted: a reader state of the source is damaged ({exc})")
            return 0, 0
        if not heads:
            self._note("nothing deleted: the source has no reader state to say what is consumed")
            return 0, 0
        floor = min(heads.values())
        ids = list_segment_ids(self.src_segments)
        deleted = freed = 0
        for first_id in ids[:-1]:  # the newest segment is the owner's active one
            shipped = self._sealed.get(first_id)
            if shipped is None:
                break  # not shipped (yet): it and everything after it stay
            last_id, size = shipped
            if last_id >= floor:
                break  # a reader still needs it
            path = log_path(self.src_segments, first_id)
            try:
                if os.path.getsize(path) != size:
                    break  # not the file we shipped
                os.unlink(path)
            except FileNotFoundError:
                continue  # the owner's retention was first
            try:
                os.unlink(idx_path(self.src_segments, first_id))
            except FileNotFoundError:
                pass
            deleted += 1
            freed += size
        if deleted:
            fsync_dir(self.src_segments)
        self.totals.deleted_segments += deleted
        self.totals.deleted_bytes += freed
        return deleted, freed

    def _note(self, text: str) -> None:
        if text not in self.totals.notes:
            self.totals.notes.append(text)

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Write the final meta.json, release files and the destination's lock."""
        try:
            if self._lock is not None and self._lock.is_held and self._meta_written is not None:
                self._final_meta()
        finally:
            if self._source is not None:
                self._source.close()
                self._source = None
            if self._current is not None:
                self._current.close()
            if self._lock is not None:
                self._lock.release()

    def _final_meta(self) -> None:
        # Nothing is appended after this: next_id is exact, so the copy is "clean".
        path = os.path.join(self.dest, META_NAME)
        try:
            meta = MetaStore(self.dest).load()
        except LedgerQError:
            return
        meta.clean = True
        atomic_write(path, encode_meta(meta))

    def report(self) -> ShipReport:
        """The totals so far."""
        t = self.totals
        return ShipReport(
            source=self.src,
            dest=self.dest,
            client_id=self.client_id,
            passes=t.passes,
            messages=t.messages,
            bytes=t.bytes,
            segments=t.segments,
            last_id=self.last_id,
            deleted_segments=t.deleted_segments,
            deleted_bytes=t.deleted_bytes,
            corrupt=tuple(t.corrupt),
            notes=tuple(t.notes),
        )


def ship_queue(
    src: str | os.PathLike[str],
    dest_root: str | os.PathLike[str],
    client_id: str,
    *,
    follow: bool = False,
    delete_shipped: bool = False,
    timeout: float | None = None,
    stop: threading.Event | None = None,
    on_progress: ProgressCallback | None = None,
    on_pass: Callable[[ShipReport], None] | None = None,
    watch: WatchMode = "auto",
) -> ShipReport:
    """Copy the queue ``src`` into ``dest_root/<client_id>.<name of src>/``; return a report.

    Reads ``src`` without its lock (it runs beside the owner) and holds the
    destination's lock while it runs.  Copies sealed segments once and the active
    one up to its last complete entry, verifying every entry's CRC; resumable after
    any interruption and idempotent.  Everything copied is fsynced before it
    returns (and before any deletion).  ``delete_shipped`` then deletes source
    segments that are shipped and consumed by every reader of the source (see
    :meth:`Shipper.delete_shipped`).

    ``follow`` keeps shipping as new data arrives until ``stop`` is set, or
    ``timeout`` seconds pass without new data (None: forever); ``on_pass(report)``
    is called after each pass that copied or deleted something.
    ``on_progress(done_bytes, total_bytes)`` reports each pass's copying.

    Raises :class:`ShipError` for an invalid client id or a destination holding
    something else, :class:`NotAQueueError` if ``src`` is not a queue,
    :class:`QueueLockedError` if another shipper (or ``ledgerq.open``) holds the
    destination, :class:`CorruptionError` if the source is truncated or replaced
    under the shipper.
    """
    shipper = Shipper(src, dest_root, client_id, on_progress=on_progress)
    watcher: DirectoryWatcher | None = None
    try:
        if follow:
            # Before the first look at the files, so no change can slip between a look and a wait.
            watcher = watch_segments(os.fspath(src), watch)
        shipper.open()
        idle_since = time.monotonic()
        while True:
            started = time.monotonic()
            messages, nbytes = shipper.ship_pass()
            deleted = shipper.delete_shipped()[0] if delete_shipped else 0
            if messages or nbytes or deleted:
                idle_since = time.monotonic()
                if on_pass is not None:
                    on_pass(shipper.report())
            if not follow or watcher is None:
                break
            if stop is not None and stop.is_set():
                break
            wait = None if timeout is None else timeout - (time.monotonic() - idle_since)
            if wait is not None and wait <= 0:
                break
            patience = shipper.patience_left()
            if patience is not None:
                wait = patience if wait is None else min(wait, patience)
            if stop is not None:
                wait = 0.25 if wait is None else min(wait, 0.25)
            watcher.wait(wait)
            pause = _MIN_PASS_INTERVAL_S - (time.monotonic() - started)
            if pause > 0 and (stop is None or not stop.is_set()):
                time.sleep(pause)  # rate limit: many appends, one pass (and one fsync)
    finally:
        try:
            shipper.close()
        finally:
            if watcher is not None:
                watcher.close()
    return shipper.report()
