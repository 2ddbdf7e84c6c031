"""Feature state logs: framed msgpack records (dedup table, retry tracker).

Each file starts with an 8-byte header (a 4-byte magic naming the feature and a
u32 version) followed by records::

    length  u32  whole record, this field and the CRC included
    body    msgpack value (length - 8 bytes)
    crc     u32  CRC-32C (version 2) or CRC-32 (version 1) of every byte before it

Files are written in version 2; a version-1 file is read, and its feature rewrites it
(as version 2) when the queue opens, before appending to it.

A torn last record is ignored (and cut) by the reader of the file.  A damaged record
with valid records after it is damage in the middle: it is skipped - the decoder looks
for the next offset where a whole, checksummed record starts - and counted, so that one
bad record never hides the ones written after it.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import msgpack

from ledgerq.format.checksum import Checksum, checksum, checksum_v1, recovery_crc_allowance
from ledgerq.format.errors import CorruptRecord, IncompleteRecord

__all__ = [
    "FEATURE_FILE_HEADER",
    "FEATURE_VERSION",
    "FeatureFile",
    "decode_feature_file",
    "decode_feature_records",
    "encode_feature_file_header",
    "encode_feature_record",
]

FEATURE_FILE_HEADER = struct.Struct("<4sI")
assert FEATURE_FILE_HEADER.size == 8
_LENGTH = struct.Struct("<I")
_MIN = 8
_MAX = 1 << 26
FEATURE_VERSION = 2  # written; 1 (CRC-32) is read too
_CHECKSUMS: dict[int, Checksum] = {1: checksum_v1, 2: checksum}


def encode_feature_file_header(magic: bytes, version: int = FEATURE_VERSION) -> bytes:
    """Return the 8-byte header of a feature state file (its records: CRC-32C)."""
    if len(magic) != 4:
        raise ValueError("a feature file magic is 4 bytes")
    return FEATURE_FILE_HEADER.pack(magic, version)


def encode_feature_record(value: Any) -> bytes:
    """Return one framed record holding ``value`` (msgpack-encodable), for version 2."""
    body: bytes = msgpack.packb(value, use_bin_type=True)
    head = _LENGTH.pack(_MIN + len(body))
    framed = head + body
    return framed + _LENGTH.pack(checksum(framed))


class FeatureFile(NamedTuple):
    """The records of a feature file, where the last whole one ends, and damage skipped."""

    values: list[Any]
    end: int
    damaged: int
    version: int = FEATURE_VERSION  # a caller appends only to a file of FEATURE_VERSION


def decode_feature_file(buf: bytes, magic: bytes) -> FeatureFile:
    """Decode a whole feature file of version 1 or 2.

    Returns its record values, ``end`` - where the last whole, valid record ends (bytes
    after it are a torn append, for the caller to cut) - ``damaged``, how many damaged
    regions with valid records after them were skipped, and the file's version.  Raises
    :class:`CorruptRecord` for a bad header, :class:`IncompleteRecord` for a short one.
    """
    if len(buf) < FEATURE_FILE_HEADER.size:
        raise IncompleteRecord("feature file header cut short", 0, FEATURE_FILE_HEADER.size)
    got_magic, got_version = FEATURE_FILE_HEADER.unpack_from(buf, 0)
    crc = _CHECKSUMS.get(got_version)
    if got_magic != magic or crc is None:
        raise CorruptRecord(f"bad feature file header {got_magic!r} v{got_version}", 0)
    return decode_feature_records(buf, FEATURE_FILE_HEADER.size, got_version)


def decode_feature_records(buf: bytes, pos: int, version: int = FEATURE_VERSION) -> FeatureFile:
    """Decode the records of ``buf`` from ``pos`` (after the header, or where an earlier
    read stopped) in a file of ``version``; see :func:`decode_feature_file` for what is
    returned."""
    crc = _CHECKSUMS[version]
    values: list[Any] = []
    end = pos
    damaged = 0
    # Checksumming candidates after bad bytes is capped (see recovery_crc_allowance), so a
    # crafted file of plausible lengths cannot make decoding quadratic.
    budget = recovery_crc_allowance(len(buf))
    while pos < len(buf):
        found = _record_at(buf, pos, crc)
        if found is not None:
            value, pos = found
            values.append(value)
            end = pos
            continue
        resume, budget = _next_record(buf, pos + 1, budget, crc)
        if resume is None:
            break  # nothing valid follows: a torn tail
        damaged += 1
        pos = resume
    return FeatureFile(values, end, damaged, version)


def _record_at(buf: bytes, pos: int, crc: Checksum) -> tuple[Any, int] | None:
    """The value of the whole, valid record at ``pos`` and where it ends; None if none."""
    if len(buf) - pos < _MIN:
        return None
    (length,) = _LENGTH.unpack_from(buf, pos)
    if length < _MIN or length > _MAX or pos + length > len(buf):
        return None
    crc_at = pos + length - 4
    if crc(memoryview(buf)[pos:crc_at]) != _LENGTH.unpack_from(buf, crc_at)[0]:
        return None
    try:
        value = msgpack.unpackb(buf[pos + 4 : crc_at], raw=False, strict_map_key=False)
    except Exception:  # msgpack raises several types for bad bodies
        return None
    return value, pos + length


def _next_record(buf: bytes, start: int, budget: int, crc: Checksum) -> tuple[int | None, int]:
    """The first offset from ``start`` where a valid record begins (None), and budget left."""
    for at in range(start, len(buf) - _MIN + 1):
        (length,) = _LENGTH.unpack_from(buf, at)
        if length < _MIN or length > _MAX or at + length > len(buf):
            continue
        if length > budget:
            return None, budget  # cannot afford to check it: treat the rest as torn
        if _record_at(buf, at, crc) is not None:
            return at, budget
        budget -= length
    return None, budget
