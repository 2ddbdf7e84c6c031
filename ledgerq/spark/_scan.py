"""Reading one segment file into Arrow record batches (or tuples) for a Spark task.

The hot path is written for the common case - a run of valid entries without optional
fields - and hands everything else to the code the rest of ledgerq reads with:

1. **Plain runs, vectorised.**  A chunk of the file (4 MiB, one ``pread``) is cut into
   entries by stepping from length field to length field (a Python loop, or none at all
   for a run of same-size entries, found column-wise); the entries become a
   ``BinaryArray`` over the file bytes (offsets only, no copy), from which ids,
   timestamps and payloads are sliced by Arrow kernels.  The checksums of the whole run
   are checked with one call (``format.checksum.count_valid_records``, which knows the
   checksum's algebra).  A run is of one entry format (the high nibble of the type
   byte: CRC-32C in format 2, CRC-32 in format 1), checked with that format's CRC: an
   entry of the other format ends the run and starts the next one, so segments of
   either format, and one a newer ledgerq appended to, stay on this path.  The first
   entry whose checksum does not match, or whose id does not increase, ends the run.
2. **Entries with optional fields** (TTL, priority, headers, compression) in a run
   whose CRCs check out are decoded one by one with :func:`decode_entry`.
3. **Anything else** - a bad CRC, a bad length, ids out of order, a torn or damaged
   tail - switches the rest of the segment to ledgerq's own resynchronising scanner
   (``TailScanner``: an ``EntryScanner`` that, on the live tail, stops at an append in
   flight instead of searching inside it): corrupt regions are skipped, logged through the
   ``ledgerq`` logger and counted, or raise :class:`CorruptionError` in FAILFAST mode.
   What a task returns is exactly what that scanner alone would (a test flips every
   bit of a segment and compares).

Segments are read with ``pread`` and never locked, so a live queue can be read beside
its owner: sealed segments are final, and the newest one is read up to its last
complete entry (an append in flight is not an error).
"""

from __future__ import annotations

import logging
import os
import struct
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import zstandard

from ledgerq._errors import CorruptionError
from ledgerq.format.checksum import CHECKSUM, checksum, checksum_v1, count_valid_records
from ledgerq.format.compression import restore_zstd
from ledgerq.format.entry import (
    ENTRY_FORMAT,
    ENTRY_FORMAT_SHIFT,
    ENTRY_HEADER,
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
from ledgerq.segment.naming import SEGMENTS_DIR, idx_path, log_path
from ledgerq.segment.readonly import MAX_VIEW_PAYLOAD, Entry, EntryFlags, RecordType
from ledgerq.segment.scanner import TailScanner, checked_start
from ledgerq.spark._layout import ReaderSnapshot

__all__ = [
    "ARROW_SCHEMA",
    "ARROW_SCHEMA_WITH_STATE",
    "COLUMNS",
    "ScanStats",
    "SegmentTask",
    "scan_segment",
]

logger = logging.getLogger("ledgerq")

_TS = pa.timestamp("us", tz="UTC")
_TS_NS = pa.timestamp("ns", tz="UTC")
_HEADERS = pa.map_(pa.string(), pa.string())
# What pyspark's to_arrow_schema(schema, timezone="UTC") gives for the read schema; the
# first batch a task yields is compared with it exactly (a test checks the two agree).
ARROW_SCHEMA = pa.schema(
    [
        pa.field("queue", pa.string()),
        pa.field("id", pa.int64()),
        pa.field("timestamp", _TS),
        pa.field("expires_at", _TS),
        pa.field("priority", pa.int32()),
        pa.field("headers", _HEADERS),
        pa.field("payload", pa.binary()),
        pa.field("deliver_at", _TS),  # enqueue(..., delay=): null when none
    ]
)
ARROW_SCHEMA_WITH_STATE = ARROW_SCHEMA.append(pa.field("state", pa.string()))
# Every column a read can give, in the schema's order (``state`` only with a reader).
COLUMNS = tuple(ARROW_SCHEMA_WITH_STATE.names)

PENDING, LEASED, ACKED = "pending", "leased", "acked"

_CHUNK_BYTES = 4 << 20  # one pread, and at most one record batch, per 4 MiB of log
_SLOW_BATCH_ROWS = 8192  # rows per batch on the entry-by-entry paths
_LENGTH = struct.Struct("<I")
_unpack_length = _LENGTH.unpack_from
_ID_TS = struct.Struct("<Qq")
_unpack_id_ts = _ID_TS.unpack_from
_HEADER_SIZE = ENTRY_HEADER.size  # 22: length, type, flags, id, timestamp
_ID_AT, _TS_AT = 6, 14
_CRC_SIZE = CHECKSUM.size
_DATA = int(RecordType.DATA)
# The (type, flags) bytes of a plain entry, read as a little-endian u16, by entry format:
# the type byte is format << 4 | DATA, the flags byte 0.  Also which checksum a run has.
_PLAIN_BY_FORMAT = {
    ENTRY_FORMAT: (ENTRY_FORMAT << ENTRY_FORMAT_SHIFT | _DATA, checksum),
    0: (_DATA, checksum_v1),  # format 1: the nibble is 0
}
# Flags that do not change how a row is decoded: an entry carrying only these is plain.
# BATCH_CONTINUES marks every entry of an enqueue_batch but its last (how edge devices and
# the Spark writer fill queues): without it here every batch-written entry went one by one.
_ROW_NEUTRAL_FLAGS = int(EntryFlags.BATCH_CONTINUES)
_PLAIN_MASK = 0xFFFF & ~(_ROW_NEUTRAL_FLAGS << 8)  # the (type, flags) u16 of a plain entry
_COMPRESSED = int(EntryFlags.COMPRESSED)
_ENCRYPTED = int(EntryFlags.ENCRYPTED)
_LITTLE_ENDIAN = sys.byteorder == "little"  # the vectorised path views LE bytes as ints
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EMPTY_STRINGS = pa.array([], pa.string())


@dataclass(frozen=True, slots=True)
class SegmentTask:
    """One Spark input partition: a segment file and the rows wanted from it.

    Bounds are inclusive; timestamps are microseconds since the epoch (what Spark
    compares).  ``size_limit`` bounds the bytes read (the newest segment's size when it
    was planned, so all tasks of a query read one snapshot); ``live_tail`` says the
    segment was the newest one then, so an incomplete entry at its end is an append in
    flight rather than damage.
    """

    queue: str
    path: str
    first_id: int
    next_first_id: int | None
    size_limit: int | None = None
    live_tail: bool = False
    id_lo: int = 1
    id_hi: int | None = None
    ids: frozenset[int] | None = None
    ts_lo: int | None = None
    ts_hi: int | None = None
    seek_by_time: bool = False
    state: ReaderSnapshot | None = None
    failfast: bool = False
    name_id: int | None = None  # the id in the file's name, when it is not first_id
    # The columns a row has, in order (option ``columns``); None: the whole schema.
    columns: tuple[str, ...] | None = None
    # An encrypted queue's key (checked against the queue when the task was planned);
    # never in repr().  Its entries leave the vectorised path to be opened one by one.
    encryption_key: bytes | None = field(default=None, repr=False)

    @property
    def log_path(self) -> str:
        """Path of the segment's log file."""
        return log_path(os.path.join(self.path, SEGMENTS_DIR), self.name_id or self.first_id)

    @property
    def index_path(self) -> str:
        """Path of the segment's sparse index file."""
        return idx_path(os.path.join(self.path, SEGMENTS_DIR), self.name_id or self.first_id)


class ScanStats:
    """What one task's scan met, for its summary log line and for tests."""

    __slots__ = ("corrupt_bytes", "corrupt_regions", "decoded_one_by_one", "lost_messages", "rows")

    def __init__(self) -> None:
        self.rows = 0
        self.corrupt_regions = 0
        self.corrupt_bytes = 0
        self.lost_messages = 0
        # Entries that left the vectorised path (tiers 2 and 3): what a test checks to
        # know that a kind of segment is read the fast way.
        self.decoded_one_by_one = 0


# ---------------------------------------------------------------------- entry point


def scan_segment(
    task: SegmentTask, *, arrow: bool = True, stats: ScanStats | None = None
) -> Iterator[pa.RecordBatch] | Iterator[tuple[Any, ...]]:
    """Yield the rows of ``task`` as Arrow record batches (``arrow``) or as tuples."""
    if arrow:
        return _ArrowSink(task, stats or ScanStats()).run()
    return _TupleSink(task, stats or ScanStats()).run()


# ---------------------------------------------------------------------- the scan


class _Plain:
    """A run of valid entries without optional fields: ``offsets`` are its entry
    boundaries in ``buf`` (one more than there are entries); ``run`` holds the columns
    already sliced from it while checking it."""

    __slots__ = ("buf", "offsets", "run")

    def __init__(self, buf: bytes, offsets: list[int], run: _Run) -> None:
        self.buf = buf
        self.offsets = offsets
        self.run = run

    def __len__(self) -> int:
        return len(self.offsets) - 1


class _Decoded:
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


_Piece = _Plain | _Decoded


class _SegmentScan:
    """Walks one segment and yields :class:`_Plain` and :class:`_Decoded` pieces."""

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

    def pieces(self) -> Iterator[_Piece]:
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

    def _scan(self, fd: int, pos: int, end: int, last_id: int) -> Iterator[_Piece]:
        id_hi = self.id_hi
        while pos < end and not self.done:
            buf = pread_exact(fd, min(_CHUNK_BYTES, end - pos), pos)
            offsets = _walk(buf)
            if len(offsets) == 1 and len(buf) < end - pos and len(buf) >= 4:
                # one entry larger than the chunk: read it whole (if its length is sane)
                length = _unpack_length(buf, 0)[0]
                if MIN_ENTRY_SIZE <= length <= min(MAX_ENTRY_SIZE, end - pos):
                    buf = pread_exact(fd, length, pos)
                    offsets = _walk(buf)
            walked = len(offsets) - 1
            if not walked:
                break  # a bad length, or an incomplete tail: tier 3 decides which
            run = _check_run(buf, offsets, last_id)
            good = run.good
            if good:
                piece: _Piece
                if run.plain and not self.sealed:
                    piece = _Plain(buf, offsets[: good + 1], run.head(good))
                    last_id = _u64_at(buf, offsets[good - 1] + _ID_AT)
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

    def _decode_run(
        self, buf: bytes, offsets: list[int], last_id: int
    ) -> tuple[_Decoded, int, int]:
        """Tier 2: decode entries whose CRCs checked out; stop at the first invalid one."""
        out = _Decoded()
        taken = 0
        for taken in range(len(offsets) - 1):
            try:
                entry, _ = decode_entry(buf, offsets[taken])
            except DecodeError:
                return out, taken, last_id
            self.stats.decoded_one_by_one += 1
            last_id = entry.id
            if entry.type == _DATA:
                self._add(out, entry)
        return out, len(offsets) - 1, last_id

    def _slow(self, fd: int, pos: int, end: int, last_id: int) -> Iterator[_Decoded]:
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
        out = _Decoded()
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
            if entry.type == _DATA:
                self._add(out, entry)
                if len(out) >= _SLOW_BATCH_ROWS:
                    yield out
                    out = _Decoded()
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

    def _add(self, out: _Decoded, entry: Entry) -> None:
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


def _walk(buf: bytes) -> list[int]:
    """The boundaries of the whole entries at the start of ``buf`` (one more than entries).

    Steps from length field to length field; stops at a length that is impossible or
    runs past the buffer.  A leading run of entries that all have the first entry's
    length is found column-wise (fixed-size messages are common); the rest is walked in
    Python.  Whether the entries are valid is checked afterwards, by :func:`_check_run`.
    """
    size = len(buf)
    smallest = MIN_ENTRY_SIZE
    if size < smallest:
        return [0]
    (first,) = _unpack_length(buf, 0)
    if first < smallest or first > size:
        return [0]
    pos = 0
    offsets: list[int] = []
    count = size // first
    if count > 8:
        entries = _entries(buf, range(0, count * first + 1, first), count)
        same = pc.equal(_field(entries, 0, 4, pa.uint32(), first), first)
        leading = count if pc.all(same).as_py() else pc.index(same, False).as_py()
        offsets = list(range(0, leading * first, first))
        pos = leading * first
    unpack = _unpack_length
    add_offset = offsets.append
    limit = size - smallest
    while pos <= limit:
        (length,) = unpack(buf, pos)
        stop = pos + length
        if length < smallest or stop > size:
            break
        add_offset(pos)
        pos = stop
    add_offset(pos)
    return offsets


def _u64_at(buf: bytes, at: int) -> int:
    return int.from_bytes(buf[at : at + 8], "little")


def _entries(buf: bytes, offsets: list[int] | range, count: int) -> pa.BinaryArray:
    """``count`` entries as one binary value each, over ``buf`` without a copy."""
    bounds = array("i", offsets)  # a C loop; pa.array() would go through Python ints
    return pa.BinaryArray.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(bounds), pa.py_buffer(buf)]
    )


def _slice(entries: pa.BinaryArray, start: int, stop: int | None, size: int | None) -> pa.Array:
    """``entry[start:stop]`` of every entry (``stop`` <= 0 counts from the entry's end).

    With ``size``, the length every entry has, the stop is made absolute: Arrow's
    kernel is several times faster with a non-negative stop.
    """
    if stop is not None and stop <= 0 and size is not None:
        stop += size
    if stop == 0:
        stop = None
    return pc.binary_slice(entries, start, stop)


def _field(
    entries: pa.BinaryArray, start: int, width: int, kind: pa.DataType, size: int | None
) -> pa.Array:
    """A fixed-width little-endian field at ``start`` of every entry, as an array of ``kind``."""
    sliced = _slice(entries, start, start + width, size).cast(pa.binary(width))
    return pa.Array.from_buffers(kind, len(sliced), [None, sliced.buffers()[1]])


class _Run:
    """A walked run checked column-wise: of its first ``length`` entries (those of the
    first entry's format), how many at the start are sound (stored CRC matches, id
    above the previous one) and whether those are all plain (a DATA entry with no flag
    that changes the row: the vectorised path; the others go to tier 2)."""

    __slots__ = ("entries", "good", "ids", "length", "plain", "size")

    def __init__(
        self,
        entries: pa.BinaryArray,
        ids: pa.Array,
        good: int,
        plain: bool,
        size: int | None,
        length: int,
    ) -> None:
        self.entries = entries
        self.ids = ids
        self.good = good
        self.plain = plain
        self.size = size  # the length of every entry, when they all have the same
        self.length = length  # entries of the run's format: a shorter good is an anomaly

    def head(self, count: int) -> _Run:
        """The first ``count`` entries."""
        if count == len(self.ids):
            return self
        return _Run(self.entries.slice(0, count), self.ids.slice(0, count), count, self.plain,
                    self.size, count)  # fmt: skip


def _check_run(buf: bytes, offsets: list[int], last_id: int) -> _Run:
    count = len(offsets) - 1
    entries = _entries(buf, offsets, count)
    if not _LITTLE_ENDIAN:
        return _Run(entries, pa.array([], pa.uint64()), 0, False, None, count)  # tier 3
    first_length = offsets[1] - offsets[0]
    size = first_length if offsets[-1] - offsets[0] == first_length * count else None
    if size is not None and count > 1:
        lengths = _field(entries, 0, 4, pa.uint32(), size)
        if not pc.all(pc.equal(lengths, size)).as_py():
            size = None
    # One format per run: its checksum is checked in one call.  An entry of another
    # format (a segment a newer ledgerq appended to) ends the run; the next run starts
    # there.  A format this ledgerq does not know is an anomaly: tier 3 says what.
    entry_format = buf[offsets[0] + 4] >> ENTRY_FORMAT_SHIFT
    known = _PLAIN_BY_FORMAT.get(entry_format)
    if known is None:
        return _Run(entries, pa.array([], pa.uint64()), 0, False, size, count)
    plain_kind, crc = known
    if count > 1:
        formats = pc.shift_right(_field(entries, 4, 1, pa.uint8(), size), ENTRY_FORMAT_SHIFT)
        same = pc.equal(formats, entry_format)
        if not pc.all(same).as_py():
            count = pc.index(same, False).as_py()
            offsets = offsets[: count + 1]
            entries = entries.slice(0, count)
            first_length = offsets[1] - offsets[0]
            if size is None and offsets[-1] - offsets[0] == first_length * count:
                lengths = _field(entries, 0, 4, pa.uint32(), None)
                if pc.all(pc.equal(lengths, first_length)).as_py():
                    size = first_length
    good = count_valid_records(buf, offsets, size, crc)
    ids = _field(entries, _ID_AT, 8, pa.uint64(), size)
    if good and ids[0].as_py() <= last_id:
        good = 0
    if good > 1:
        rising = pc.greater(ids.slice(1, good - 1), ids.slice(0, good - 1))
        if not pc.all(rising).as_py():
            good = pc.index(rising, False).as_py() + 1
    if good == 0:
        return _Run(entries, ids, 0, False, size, count)
    kinds = _field(entries.slice(0, good), 4, 2, pa.uint16(), size)
    kinds = pc.bit_wise_and(kinds, pa.scalar(_PLAIN_MASK, pa.uint16()))
    plain = bool(pc.all(pc.equal(kinds, plain_kind)).as_py())
    return _Run(entries, ids, good, plain, size, count)


# ---------------------------------------------------------------------- row filters


class _Filter:
    """The exact row filter a task applies (what was pushed down), id and time."""

    def __init__(self, task: SegmentTask) -> None:
        self.id_lo = task.id_lo if task.id_lo > 1 else None
        self.id_hi = task.id_hi
        self.ids = task.ids
        self.ts_lo = task.ts_lo
        self.ts_hi = task.ts_hi
        self.active = any(
            v is not None for v in (self.id_lo, self.id_hi, self.ids, self.ts_lo, self.ts_hi)
        )

    def mask(self, ids: pa.Array, ts_us: pa.Array) -> pa.Array | None:
        """A boolean mask of the rows to keep, or None when every row is kept."""
        if not self.active:
            return None
        conditions = []
        if self.id_lo is not None:
            conditions.append(pc.greater_equal(ids, self.id_lo))
        if self.id_hi is not None:
            conditions.append(pc.less_equal(ids, self.id_hi))
        if self.ids is not None:
            conditions.append(pc.is_in(ids, value_set=pa.array(sorted(self.ids), pa.int64())))
        ts_int = ts_us.cast(pa.int64())
        if self.ts_lo is not None:
            conditions.append(pc.greater_equal(ts_int, self.ts_lo))
        if self.ts_hi is not None:
            conditions.append(pc.less_equal(ts_int, self.ts_hi))
        mask = conditions[0]
        for condition in conditions[1:]:
            mask = pc.and_(mask, condition)
        return None if pc.all(mask).as_py() else mask

    def keep(self, message_id: int, ts_us: int) -> bool:
        """The same test for one row."""
        return (
            (self.id_lo is None or message_id >= self.id_lo)
            and (self.id_hi is None or message_id <= self.id_hi)
            and (self.ids is None or message_id in self.ids)
            and (self.ts_lo is None or ts_us >= self.ts_lo)
            and (self.ts_hi is None or ts_us <= self.ts_hi)
        )


def _ns_to_us(ns: pa.Array) -> pa.Array:
    return ns.view(_TS_NS).cast(_TS, safe=False)


def _state_of(state: ReaderSnapshot, message_id: int) -> str:
    if message_id < state.head or message_id in state.done:
        return ACKED
    return LEASED if message_id in state.leased else PENDING


# ---------------------------------------------------------------------- Arrow output


class _ArrowSink:
    def __init__(self, task: SegmentTask, stats: ScanStats) -> None:
        self.task = task
        self.stats = stats
        self.filter = _Filter(task)
        full = ARROW_SCHEMA if task.state is None else ARROW_SCHEMA_WITH_STATE
        self.names = full.names if task.columns is None else list(task.columns)
        self.schema = pa.schema([full.field(name) for name in self.names])
        # Only the columns asked for are built (and sent to Spark): less to make, to
        # serialise and for the JVM to convert, row by row.
        self.wanted = frozenset(self.names)

    def run(self) -> Iterator[pa.RecordBatch]:
        scan = _SegmentScan(self.task, self.stats)
        for piece in scan.pieces():
            batch = self._plain(piece) if isinstance(piece, _Plain) else self._decoded(piece)
            if batch is not None and batch.num_rows:
                self.stats.rows += batch.num_rows
                yield batch
        _summary(self.task, self.stats)

    def _plain(self, piece: _Plain) -> pa.RecordBatch | None:
        run = piece.run
        entries, size = run.entries, run.size
        ids = run.ids.cast(pa.int64())
        ts = _ns_to_us(_field(entries, _TS_AT, 8, pa.int64(), size))
        mask = self.filter.mask(ids, ts)
        if mask is not None:
            entries, ids, ts = entries.filter(mask), ids.filter(mask), ts.filter(mask)
        rows = len(ids)
        if not rows:
            return None
        wanted = self.wanted
        columns: dict[str, pa.Array] = {"id": ids, "timestamp": ts}
        if "queue" in wanted:
            columns["queue"] = pa.repeat(pa.scalar(self.task.queue, pa.string()), rows)
        for name in ("expires_at", "deliver_at"):
            if name in wanted:
                columns[name] = pa.nulls(rows, _TS)
        if "priority" in wanted:
            columns["priority"] = pa.repeat(pa.scalar(1, pa.int32()), rows)
        if "headers" in wanted:
            columns["headers"] = _empty_maps(rows)
        if "payload" in wanted:
            columns["payload"] = _slice(entries, _HEADER_SIZE, -_CRC_SIZE, size)
        return self._batch(columns, ids)

    def _decoded(self, piece: _Decoded) -> pa.RecordBatch | None:
        ids = pa.array(piece.ids, pa.int64())
        ts = _ns_to_us(pa.array(piece.timestamps, pa.int64()))
        wanted = self.wanted
        columns: dict[str, pa.Array] = {"id": ids, "timestamp": ts}
        if "queue" in wanted:
            columns["queue"] = pa.repeat(pa.scalar(self.task.queue, pa.string()), len(ids))
        if "expires_at" in wanted:
            columns["expires_at"] = _ns_to_us(pa.array(piece.expires, pa.int64()))
        if "priority" in wanted:
            columns["priority"] = pa.array(piece.priorities, pa.int32())
        if "headers" in wanted:
            columns["headers"] = pa.array([list(h.items()) for h in piece.headers], _HEADERS)
        if "payload" in wanted:
            columns["payload"] = pa.array(piece.payloads, pa.binary())
        if "deliver_at" in wanted:
            columns["deliver_at"] = _ns_to_us(pa.array(piece.deliver, pa.int64()))
        mask = self.filter.mask(ids, ts)
        if mask is not None:
            columns = {name: c.filter(mask) for name, c in columns.items()}
            ids = columns["id"]
        if not len(ids):
            return None
        return self._batch(columns, ids)

    def _batch(self, columns: dict[str, pa.Array], ids: pa.Array) -> pa.RecordBatch:
        state = self.task.state
        if state is not None and "state" in self.wanted:
            acked = pc.less(ids, state.head)
            if state.done:
                acked = pc.or_(acked, pc.is_in(ids, value_set=pa.array(sorted(state.done))))
            other = pa.repeat(pa.scalar(PENDING), len(ids))
            if state.leased:
                leased = pc.is_in(ids, value_set=pa.array(sorted(state.leased)))
                other = pc.if_else(leased, LEASED, other)
            columns["state"] = pc.if_else(acked, ACKED, other)
        return pa.RecordBatch.from_arrays(
            [columns[name] for name in self.names], schema=self.schema
        )


def _empty_maps(rows: int) -> pa.MapArray:
    return pa.MapArray.from_arrays(
        pa.repeat(pa.scalar(0, pa.int32()), rows + 1), _EMPTY_STRINGS, _EMPTY_STRINGS
    )


# ---------------------------------------------------------------------- tuple output


def _datetime(ns: int) -> datetime:
    # aware UTC datetimes: a naive one would be taken as the worker's local time
    return _EPOCH + timedelta(microseconds=int(ns / 1000) if ns < 0 else ns // 1000)


class _TupleSink:
    def __init__(self, task: SegmentTask, stats: ScanStats) -> None:
        self.task = task
        self.stats = stats
        self.filter = _Filter(task)
        full = COLUMNS if task.state is not None else COLUMNS[:-1]
        # the positions of the asked-for columns in a whole row (None: the whole row)
        self.pick = None if task.columns is None else [full.index(c) for c in task.columns]

    def run(self) -> Iterator[tuple[Any, ...]]:
        scan = _SegmentScan(self.task, self.stats)
        for piece in scan.pieces():
            rows = self._plain(piece) if isinstance(piece, _Plain) else self._decoded(piece)
            for row in rows:
                self.stats.rows += 1
                yield row
        _summary(self.task, self.stats)

    def _row(
        self,
        message_id: int,
        ts_ns: int,
        expires: int | None,
        priority: int,
        headers: dict[str, str],
        payload: bytes,
        deliver: int | None = None,
    ) -> tuple[Any, ...] | None:
        ts_us = int(ts_ns / 1000) if ts_ns < 0 else ts_ns // 1000
        if self.filter.active and not self.filter.keep(message_id, ts_us):
            return None
        row: tuple[Any, ...] = (
            self.task.queue,
            message_id,
            _datetime(ts_ns),
            None if expires is None else _datetime(expires),
            priority,
            headers,
            payload,
            None if deliver is None else _datetime(deliver),
        )
        state = self.task.state
        if state is not None:
            row = (*row, _state_of(state, message_id))
        return row if self.pick is None else tuple(row[i] for i in self.pick)

    def _plain(self, piece: _Plain) -> Iterator[tuple[Any, ...]]:
        buf, offsets = piece.buf, piece.offsets
        for i in range(len(offsets) - 1):
            start, stop = offsets[i], offsets[i + 1]
            message_id, ts_ns = _unpack_id_ts(buf, start + _ID_AT)
            row = self._row(
                message_id, ts_ns, None, 1, {}, buf[start + _HEADER_SIZE : stop - _CRC_SIZE]
            )
            if row is not None:
                yield row

    def _decoded(self, piece: _Decoded) -> Iterator[tuple[Any, ...]]:
        for i in range(len(piece)):
            row = self._row(
                piece.ids[i],
                piece.timestamps[i],
                piece.expires[i],
                piece.priorities[i],
                piece.headers[i],
                piece.payloads[i],
                piece.deliver[i],
            )
            if row is not None:
                yield row


def _summary(task: SegmentTask, stats: ScanStats) -> None:
    if stats.corrupt_regions:
        logger.warning(
            "ledgerq: read %d rows of queue %s from %s; %d corrupt regions skipped "
            "(%d bytes, %d messages lost)",
            stats.rows,
            task.queue,
            task.log_path,
            stats.corrupt_regions,
            stats.corrupt_bytes,
            stats.lost_messages,
        )
