"""The shipper: one source queue copied to its destination, pass after pass (see the
package's docstring for how a pass works), and the sealed copies' deletion at the
source once every reader is past them.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

from ledgerq._errors import CorruptionError, LedgerQError, NotAQueueError

# Reading the source, which another process owns, with the lock-free reader's rules
# (segment.readonly), and its segments entry by entry (format, scanner, layout);
# writing the destination, a queue directory of its own, under its lock.
from ledgerq.format.entry import decode_entry
from ledgerq.format.errors import DecodeError
from ledgerq.segment.files import atomic_write, fsync_dir, pread_exact, storage_errors
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
    EntryFlags,
    SegmentTail,
    load_meta,
    queue_dir_problem,
    reader_heads,
    segment_ids,
)
from ledgerq.ship._report import ProgressCallback, ShipError, ShipReport, Totals
from ledgerq.ship._segments import DestSegment, Scan, take

__all__ = [
    "STATE_FORMAT",
    "STATE_NAME",
    "STATE_VERSION",
    "Shipper",
    "check_client_id",
    "destination_path",
]

logger = logging.getLogger("ledgerq")

STATE_NAME = "ship.json"

STATE_FORMAT = "ledgerq-ship"

STATE_VERSION = 1

_CLIENT_ID = re.compile(r"^[A-Za-z0-9_-]{1,100}\Z")  # anchored; no '.', which separates the parts

_CHUNK = 8 << 20  # bytes read, verified and written at a time

_DEFAULT_INDEX_INTERVAL = 4096

_ENCRYPTED = int(EntryFlags.ENCRYPTED)


def destination_path(
    src: str | os.PathLike[str], dest_root: str | os.PathLike[str], client_id: str
) -> str:
    """``DEST_ROOT/<client_id>.<basename of SRC>``: where ``src`` is shipped to."""
    check_client_id(client_id)
    name = os.path.basename(os.path.abspath(os.fspath(src)))
    return os.path.join(os.path.abspath(os.fspath(dest_root)), f"{client_id}.{name}")


def check_client_id(client_id: object) -> str:
    if not isinstance(client_id, str):
        raise TypeError(f"client id must be a str, got {type(client_id).__name__}")
    if not _CLIENT_ID.match(client_id):
        raise ShipError(
            f"invalid client id {client_id!r}: use 1-100 letters, digits, '_' or '-' "
            "(no '.', which separates the client id from the queue name at the hub)"
        )
    return client_id


def durable_reader_heads(queue_dir: str | os.PathLike[str]) -> dict[str, int]:
    """Each reader's durable head in the queue at ``queue_dir``, read without its lock.

    The head is the lowest id the reader may still need, as its state journal on
    disk says (its checkpoint head, moved past the ids acknowledged after it; the
    replay is the queue's own, ``ledgerq.segment.readonly.reader_heads``).  The
    owner's memory may be ahead; never behind.  Raises :class:`CorruptionError` for a
    damaged journal.
    """
    return reader_heads(os.fspath(queue_dir))


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
        self.client_id = check_client_id(client_id)
        self.src = os.path.abspath(os.fspath(src))
        self.dest = destination_path(self.src, dest_root, client_id)
        self.src_segments = os.path.join(self.src, SEGMENTS_DIR)
        self.dest_segments = os.path.join(self.dest, SEGMENTS_DIR)
        self.on_progress = on_progress
        self.totals = Totals()
        self._lock: DirLock | None = None
        self._current: DestSegment | None = None  # the newest destination segment
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
            if not seg.load_sealed():
                seg.rescan(self._interval, cut=False)  # not expected: we seal before going on
                seg.write_index(sealed=True)
            self._sealed[first_id] = (seg.last_id, seg.size)
            if seg.last_id:
                self._entries_before += seg.last_id - seg.first_id + 1
        if ids:
            seg = self._open_dest(ids[-1])
            if not seg.load_sealed():
                seg.rescan(self._interval, cut=True)
                seg.write_index(sealed=False)
            else:
                self._sealed[seg.first_id] = (seg.last_id, seg.size)
            seg.open_for_append(seg.log, os.open(seg.log, os.O_WRONLY | os.O_APPEND))
            self._current = seg
            self._check_against_source(seg)

    def _open_dest(self, first_id: int) -> DestSegment:
        return DestSegment(
            first_id, log_path(self.dest_segments, first_id), idx_path(self.dest_segments, first_id)
        )

    def _check_against_source(self, seg: DestSegment) -> None:
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

    def _lost(self, seg: DestSegment, why: str) -> None:
        self.totals.notes.append(
            f"segment {seg.first_id} was {why}; its messages after {seg.last_id or 'the start'} "
            "are not at the hub (give the source a retention_max_age that outlasts shipping)"
        )
        self._seal(seg)

    def _copy(
        self, source: SegmentTail, seg: DestSegment | None, *, sealed: bool
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
            found = take(scanner, _CHUNK)
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
        self, source: SegmentTail, seg: DestSegment, start: int, stop: int, found: Scan
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

    def _begin(self, first_id: int) -> DestSegment:
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

    def _publish(self, seg: DestSegment, *, index: bool) -> None:
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

    def _seal(self, seg: DestSegment) -> None:
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
