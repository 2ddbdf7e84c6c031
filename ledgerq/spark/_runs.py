"""The vectorised path of the scan: a chunk of a segment cut into entries (:func:`walk`)
and checked column-wise (:func:`check_run`: the checksums of the whole run in one call,
ids rising, plain or not), over the file bytes without a copy.
"""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ledgerq.format.checksum import CHECKSUM, checksum, checksum_v1, count_valid_records
from ledgerq.format.entry import (
    ENTRY_FORMAT,
    ENTRY_FORMAT_SHIFT,
    ENTRY_HEADER,
    MIN_ENTRY_SIZE,
)
from ledgerq.segment.readonly import EntryFlags, RecordType

__all__ = [
    "CRC_SIZE",
    "DATA",
    "HEADER_SIZE",
    "ID_AT",
    "TS_AT",
    "Run",
    "check_run",
    "entry_field",
    "slice_entries",
    "u64_at",
    "unpack_length",
    "walk",
]

_LENGTH = struct.Struct("<I")
unpack_length = _LENGTH.unpack_from
HEADER_SIZE = ENTRY_HEADER.size  # 22: length, type, flags, id, timestamp
ID_AT, TS_AT = 6, 14
CRC_SIZE = CHECKSUM.size
DATA = int(RecordType.DATA)
# The (type, flags) bytes of a plain entry, read as a little-endian u16, by entry format:
# the type byte is format << 4 | DATA, the flags byte 0.  Also which checksum a run has.
_PLAIN_BY_FORMAT = {
    ENTRY_FORMAT: (ENTRY_FORMAT << ENTRY_FORMAT_SHIFT | DATA, checksum),
    0: (DATA, checksum_v1),  # format 1: the nibble is 0
}
# Flags that do not change how a row is decoded: an entry carrying only these is plain.
# BATCH_CONTINUES marks every entry of an enqueue_batch but its last (how edge devices and
# the Spark writer fill queues): without it here every batch-written entry went one by one.
_ROW_NEUTRAL_FLAGS = int(EntryFlags.BATCH_CONTINUES)
_PLAIN_MASK = 0xFFFF & ~(_ROW_NEUTRAL_FLAGS << 8)  # the (type, flags) u16 of a plain entry
_LITTLE_ENDIAN = sys.byteorder == "little"  # the vectorised path views LE bytes as ints


def walk(buf: bytes) -> list[int]:
    """The boundaries of the whole entries at the start of ``buf`` (one more than entries).

    Steps from length field to length field; stops at a length that is impossible or
    runs past the buffer.  A leading run of entries that all have the first entry's
    length is found column-wise (fixed-size messages are common); the rest is walked in
    Python.  Whether the entries are valid is checked afterwards, by :func:`check_run`.
    """
    size = len(buf)
    smallest = MIN_ENTRY_SIZE
    if size < smallest:
        return [0]
    (first,) = unpack_length(buf, 0)
    if first < smallest or first > size:
        return [0]
    pos = 0
    offsets: list[int] = []
    count = size // first
    if count > 8:
        entries = _entries(buf, range(0, count * first + 1, first), count)
        same = pc.equal(entry_field(entries, 0, 4, pa.uint32(), first), first)
        leading = count if pc.all(same).as_py() else pc.index(same, False).as_py()
        offsets = list(range(0, leading * first, first))
        pos = leading * first
    unpack = unpack_length
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


def u64_at(buf: bytes, at: int) -> int:
    return int.from_bytes(buf[at : at + 8], "little")


def _entries(buf: bytes, offsets: list[int] | range, count: int) -> pa.BinaryArray:
    """``count`` entries as one binary value each, over ``buf`` without a copy."""
    bounds = array("i", offsets)  # a C loop; pa.array() would go through Python ints
    return pa.BinaryArray.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(bounds), pa.py_buffer(buf)]
    )


def slice_entries(
    entries: pa.BinaryArray, start: int, stop: int | None, size: int | None
) -> pa.Array:
    """``entry[start:stop]`` of every entry (``stop`` <= 0 counts from the entry's end).

    With ``size``, the length every entry has, the stop is made absolute: Arrow's
    kernel is several times faster with a non-negative stop.
    """
    if stop is not None and stop <= 0 and size is not None:
        stop += size
    if stop == 0:
        stop = None
    return pc.binary_slice(entries, start, stop)


def entry_field(
    entries: pa.BinaryArray, start: int, width: int, kind: pa.DataType, size: int | None
) -> pa.Array:
    """A fixed-width little-endian field at ``start`` of every entry, as an array of ``kind``."""
    sliced = slice_entries(entries, start, start + width, size).cast(pa.binary(width))
    return pa.Array.from_buffers(kind, len(sliced), [None, sliced.buffers()[1]])


@dataclass(frozen=True, slots=True)
class Run:
    """A walked run checked column-wise: of its first ``length`` entries (those of the
    first entry's format), how many at the start are sound (stored CRC matches, id
    above the previous one) and whether those are all plain (a DATA entry with no flag
    that changes the row: the vectorised path; the others go to tier 2)."""

    entries: pa.BinaryArray
    ids: pa.Array
    good: int
    plain: bool
    size: int | None  # the length of every entry, when they all have the same
    length: int  # entries of the run's format: a shorter good is an anomaly

    def head(self, count: int) -> Run:
        """The first ``count`` entries."""
        if count == len(self.ids):
            return self
        return Run(self.entries.slice(0, count), self.ids.slice(0, count), count, self.plain,
                    self.size, count)  # fmt: skip


def check_run(buf: bytes, offsets: list[int], last_id: int) -> Run:
    count = len(offsets) - 1
    entries = _entries(buf, offsets, count)
    if not _LITTLE_ENDIAN:
        return Run(entries, pa.array([], pa.uint64()), 0, False, None, count)  # tier 3
    first_length = offsets[1] - offsets[0]
    size = first_length if offsets[-1] - offsets[0] == first_length * count else None
    if size is not None and count > 1:
        lengths = entry_field(entries, 0, 4, pa.uint32(), size)
        if not pc.all(pc.equal(lengths, size)).as_py():
            size = None
    # One format per run: its checksum is checked in one call.  An entry of another
    # format (a segment a newer ledgerq appended to) ends the run; the next run starts
    # there.  A format this ledgerq does not know is an anomaly: tier 3 says what.
    entry_format = buf[offsets[0] + 4] >> ENTRY_FORMAT_SHIFT
    known = _PLAIN_BY_FORMAT.get(entry_format)
    if known is None:
        return Run(entries, pa.array([], pa.uint64()), 0, False, size, count)
    plain_kind, crc = known
    if count > 1:
        formats = pc.shift_right(entry_field(entries, 4, 1, pa.uint8(), size), ENTRY_FORMAT_SHIFT)
        same = pc.equal(formats, entry_format)
        if not pc.all(same).as_py():
            count = pc.index(same, False).as_py()
            offsets = offsets[: count + 1]
            entries = entries.slice(0, count)
            first_length = offsets[1] - offsets[0]
            if size is None and offsets[-1] - offsets[0] == first_length * count:
                lengths = entry_field(entries, 0, 4, pa.uint32(), None)
                if pc.all(pc.equal(lengths, first_length)).as_py():
                    size = first_length
    good = count_valid_records(buf, offsets, size, crc)
    ids = entry_field(entries, ID_AT, 8, pa.uint64(), size)
    if good and ids[0].as_py() <= last_id:
        good = 0
    if good > 1:
        rising = pc.greater(ids.slice(1, good - 1), ids.slice(0, good - 1))
        if not pc.all(rising).as_py():
            good = pc.index(rising, False).as_py() + 1
    if good == 0:
        return Run(entries, ids, 0, False, size, count)
    kinds = entry_field(entries.slice(0, good), 4, 2, pa.uint16(), size)
    kinds = pc.bit_wise_and(kinds, pa.scalar(_PLAIN_MASK, pa.uint16()))
    plain = bool(pc.all(pc.equal(kinds, plain_kind)).as_py())
    return Run(entries, ids, good, plain, size, count)
