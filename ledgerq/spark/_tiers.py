"""The three tiers of a segment's scan (see ``_scan.py``): :class:`SegmentScan` walks one
segment and yields :class:`Plain` runs (vectorised) and :class:`Decoded` entries (decoded
one by one, or through ledgerq's resynchronising scanner past an anomaly).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import zstandard

from ledgerq._errors import CorruptionError
from ledgerq.format.compression import restore_zstd
from ledgerq.format.entry import (
    MAX_ENTRY_SIZE,
    MIN_ENTRY_SIZE,
    decode_entry,
)
from ledgerq.format.errors import CorruptRecord, DecodeError
from ledgerq.format.index import IndexEntry
from ledgerq.format.sealing import EntrySealer
from ledgerq.segment.encryption import sealer_for, stored_block
from ledgerq.segment.files import pread_exact
from ledgerq.segment.index_file import read_index
from ledgerq.segment.readonly import MAX_VIEW_PAYLOAD, Entry, EntryFlags
from ledgerq.segment.scanner import TailScanner, checked_start
from ledgerq.spark._runs import DATA, ID_AT, Run, check_run, u64_at, unpack_length, walk
from ledgerq.spark._task import ScanStats, SegmentTask

__all__ = ["Decoded", "Piece", "Plain", "SegmentScan"]

logger = logging.getLogger("ledgerq")

_CHUNK_BYTES = 4 << 20  # one pread, and at most one record batch, per 4 MiB of log
_SLOW_BATCH_ROWS = 8192  # rows per batch on the entry-by-entry paths
_COMPRESSED = int(EntryFlags.COMPRESSED)
_ENCRYPTED = int(EntryFlags.ENCRYPTED)


class Plain:
    """A run of valid entries without optional fields: ``offsets`` are its entry
    boundaries in ``buf`` (one more than there are entries); ``run`` holds the columns
    already sliced from it while checking it."""

    __slots__ = ("buf", "offsets", "run")

    def __init__(self, buf: bytes, offsets: list[int], run: Run) -> None:
        self.buf = buf
        self.offsets = offsets
        self.run = run

    def __len__(self) -> int:
        return len(self.offsets) - 1


class Decoded:
    """Entries decoded one by one, as columns (payloads already decompressed)."""

    __slots__ = ("deliver", "expires", "headers", "ids", "payloads", "priorities", "timestamps")

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.timestamps: list[int] = []
        self.expires: list[int | None] = []
        self.deliver: list[int | None] = []
        self.priorities: list[int] = []
        self.headers: list[dict[str, str]] = []
        self.payloads: list[bytes] = []

    def __len__(self) -> int:
        return len(self.ids)


Piece = Plain | Decoded


class SegmentScan:
    """Walks one segment and yields :class:`Plain` and :class:`Decoded` pieces."""

    def __init__(self, task: SegmentTask, stats: ScanStats) -> None:
        self.task = task
        self.stats = stats
        self.path = task.log_path
        self._dctx: zstandard.ZstdDecompressor | None = None  # made when first needed
        self._sealer: EntrySealer | None = None  # made when first needed
        # An encrypted queue (planned with its key): every entry must open, so a run of
        # plain entries - forged, or stripped of their seal - is decoded one by one and
        # skipped as corrupt, never taken as rows by the vectorised path.
        self.sealed = task.encryption_key is not None
        self.done = False  # past the highest wanted id: nothing more is wanted
        id_hi = task.id_hi
        if task.ids:
            id_hi = max(task.ids) if id_hi is None else min(id_hi, max(task.ids))
        self.id_hi = id_hi
        self._index: list[IndexEntry] | None = None

    def pieces(self) -> Iterator[Piece]:
        task = self.task
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            self._missing()
            return
        try:
            size = os.fstat(fd).st_size
            end = size if task.size_limit is None else min(size, task.size_limit)
            pos, last_id = self._start(fd, end)
            yield from self._scan(fd, pos, end, last_id)
        finally:
            os.close(fd)

    def _points(self) -> list[IndexEntry]:
        """The segment's sparse index, read when first needed (to seek, or to resync)."""
        if self._index is None:
            self._index, _ = read_index(self.task.index_path)
        return self._index

    def _missing(self) -> None:
        message = (
            f"segment {self.path} was deleted before it could be read (retention, or the "
            "queue was removed); its messages are not in the result"
        )
        if self.task.failfast:
            raise CorruptionError(message)
        logger.warning("ledgerq: %s", message)

    def _start(self, fd: int, end: int) -> tuple[int, int]:
        """Where to start: the latest checked index point that no wanted row precedes."""
        task = self.task
        accept = task.id_lo
        if task.ids:
            accept = max(accept, min(task.ids))
        if task.seek_by_time and task.ts_lo is not None:
            # The last point of the leading run of points older than ts_lo (docs/format.md,
            # "Lookups"): entries before it are older still, if the clock did not step back.
            lo_ns = task.ts_lo * 1000
            run_end = 0
            for point in self._points():
                if point.timestamp >= lo_ns:
                    break
                run_end = point.id
            accept = max(accept, run_end)
        if accept <= task.first_id:
            return 0, task.first_id - 1
        return checked_start(fd, self._points(), end, accept, task.first_id)

    # -- the three tiers -------------------------------------------------------------

    def _scan(self, fd: int, pos: int, end: int, last_id: int) -> Iterator[Piece]:
        id_hi = self.id_hi
        while pos < end and not self.done:
            buf = pread_exact(fd, min(_CHUNK_BYTES, end - pos), pos)
            offsets = walk(buf)
            if len(offsets) == 1 and len(buf) < end - pos and len(buf) >= 4:
                # one entry larger than the chunk: read it whole (if its length is sane)
                length = unpack_length(buf, 0)[0]
                if MIN_ENTRY_SIZE <= length <= min(MAX_ENTRY_SIZE, end - pos):
                    buf = pread_exact(fd, length, pos)
                    offsets = walk(buf)
            walked = len(offsets) - 1
            if not walked:
                break  # a bad length, or an incomplete tail: tier 3 decides which
            run = check_run(buf, offsets, last_id)
            good = run.good
            if good:
                piece: Piece
                if run.plain and not self.sealed:
                    piece = Plain(buf, offsets[: good + 1], run.head(good))
                    last_id = u64_at(buf, offsets[good - 1] + ID_AT)
                else:
                    piece, good, last_id = self._decode_run(buf, offsets[: good + 1], last_id)
                if len(piece):
                    yield piece
                pos += offsets[good]
                if id_hi is not None and last_id >= id_hi:
                    self.done = True
            if good < run.length:
                break  # an anomaly inside the run: tier 3 from its first entry
        if pos < end and not self.done:
            yield from self._slow(fd, pos, end, last_id)

    def _decode_run(self, buf: bytes, offsets: list[int], last_id: int) -> tuple[Decoded, int, int]:
        """Tier 2: decode entries whose CRCs checked out; stop at the first invalid one."""
        out = Decoded()
        taken = 0
        for taken in range(len(offsets) - 1):
            try:
                entry, _ = decode_entry(buf, offsets[taken])
            except DecodeError:
                return out, taken, last_id
            self.stats.decoded_one_by_one += 1
            last_id = entry.id
            if entry.type == DATA:
                self._add(out, entry)
        return out, len(offsets) - 1, last_id

    def _slow(self, fd: int, pos: int, end: int, last_id: int) -> Iterator[Decoded]:
        """Tier 3: ledgerq's resynchronising scanner for the rest of the segment."""
        task = self.task
        boundaries = [p.offset for p in self._points()]
        # The live tail may end in an append in flight: stop there, never search inside it.
        scanner = TailScanner(
            fd=fd,
            pos=pos,
            end=end,
            after_id=last_id,
            boundaries=boundaries,
            patient=task.live_tail,
            whole_batches=False,  # as the fast paths: a task reads the snapshot it was given
        )
        out = Decoded()
        reported = 0
        previous = last_id
        while (entry := scanner.next()) is not None:
            self.stats.decoded_one_by_one += 1
            if len(scanner.corrupt) > reported:
                for region in scanner.corrupt[reported:]:
                    self._corrupt(region.start, region.stop, entry.id - previous - 1)
                reported = len(scanner.corrupt)
            previous = entry.id
            if self.id_hi is not None and entry.id > self.id_hi:
                self.done = True
                break
            if entry.type == DATA:
                self._add(out, entry)
                if len(out) >= _SLOW_BATCH_ROWS:
                    yield out
                    out = Decoded()
        else:
            if scanner.pos < end and not task.live_tail:
                # a sealed segment ends in bytes that hold no valid entry
                self._corrupt(scanner.pos, end, -1)
        if len(out):
            yield out

    def _skip(self, entry: Entry, problem: str) -> None:
        """Skip the message of ``entry`` as corrupt (or raise, with FAILFAST)."""
        if self.task.failfast:
            raise CorruptionError(f"message {entry.id}: {problem}", self.path)
        logger.warning("ledgerq: skipping message %d in %s: %s", entry.id, self.path, problem)
        self.stats.corrupt_regions += 1
        self.stats.lost_messages += 1

    def _open(self, entry: Entry) -> Entry | None:
        """``entry`` with its sealed headers and payload opened; None when it cannot be."""
        if self._sealer is None:
            key = self.task.encryption_key
            if key is None:
                self._skip(entry, "it is encrypted: read with option encryption_key_hex")
                return None
            self._sealer = sealer_for(stored_block(self.task.path) or {}, key, self.task.path)
            assert self._sealer is not None
        try:
            return self._sealer.open(entry)
        except CorruptRecord as exc:
            self._skip(entry, str(exc).removesuffix(" at offset 0"))
            return None

    def _add(self, out: Decoded, entry: Entry) -> None:
        if entry.flags & _ENCRYPTED or self.sealed:
            opened = self._open(entry)
            if opened is None:
                return
            entry = opened
        payload = entry.payload
        if entry.flags & _COMPRESSED:
            if self._dctx is None:
                self._dctx = zstandard.ZstdDecompressor()
            try:
                payload = restore_zstd(
                    payload, MAX_VIEW_PAYLOAD, message_id=entry.id, decompressor=self._dctx
                )
            except CorruptionError as exc:
                if self.task.failfast:
                    raise CorruptionError(str(exc), self.path) from exc
                logger.warning("ledgerq: skipping message %d in %s: %s", entry.id, self.path, exc)
                self.stats.corrupt_regions += 1
                self.stats.lost_messages += 1
                return
        out.ids.append(entry.id)
        out.timestamps.append(entry.timestamp)
        out.expires.append(entry.expires_at)
        out.deliver.append(entry.deliver_at)
        out.priorities.append(entry.priority)
        out.headers.append(entry.headers or {})
        out.payloads.append(payload)

    def _corrupt(self, start: int, stop: int, lost: int) -> None:
        what = f"{lost} message{'s' if lost != 1 else ''} lost" if lost >= 0 else "at the end"
        if self.task.failfast:
            raise CorruptionError(
                f"{stop - start} corrupt bytes ({what}); mode=FAILFAST stops the read",
                self.path,
                start,
            )
        logger.warning(
            "ledgerq: skipped %d corrupt bytes in %s at offset %d (%s)",
            stop - start,
            self.path,
            start,
            what,
        )
        self.stats.corrupt_regions += 1
        self.stats.corrupt_bytes += stop - start
        self.stats.lost_messages += max(lost, 0)
