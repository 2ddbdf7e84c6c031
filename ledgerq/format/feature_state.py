"""Feature state logs: framed msgpack records (dedup table, retry tracker).

Each file starts with an 8-byte header (a 4-byte magic naming the feature and a
u32 version) followed by records::

    length  u32  whole record, this field and the CRC included
    body    msgpack value (length - 8 bytes)
    crc32   u32  CRC-32 of every byte of the record before it

A torn last record is ignored (and cut) by the reader of the file.  A damaged record
with valid records after it is damage in the middle: it is skipped - the decoder looks
for the next offset where a whole, checksummed record starts - and counted, so that one
bad record never hides the ones written after it.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import msgpack

from ledgerq.format.checksum import checksum, recovery_crc_allowance
from ledgerq.format.errors import CorruptRecord, IncompleteRecord

__all__ = [
    "FEATURE_FILE_HEADER",
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


def encode_feature_file_header(magic: bytes, version: int = 1) -> bytes:
    """Return the 8-byte header of a feature state file."""
    if len(magic) != 4:
        raise ValueError("a feature file magic is 4 bytes")
    return FEATURE_FILE_HEADER.pack(magic, version)


def encode_feature_record(value: Any) -> bytes:
    """Return one framed record holding ``value`` (msgpack-encodable)."""
    body: bytes = msgpack.packb(value, use_bin_type=True)
    head = _LENGTH.pack(_MIN + len(body))
    framed = head + body
    return framed + _LENGTH.pack(checksum(framed))


class FeatureFile(NamedTuple):
    """The records of a feature file, where the last whole one ends, and damage skipped."""

    values: list[Any]
    end: int
    damaged: int


def decode_feature_file(buf: bytes, magic: bytes, version: int = 1) -> FeatureFile:
    """Decode a whole feature file.

    Returns its record values, ``end`` - where the last whole, valid record ends (bytes
    after it are a torn append, for the caller to cut) - and ``damaged``, how many
    damaged regions with valid records after them were skipped.  Raises
    :class:`CorruptRecord` for a bad header, :class:`IncompleteRecord` for a short one.
    """
    if len(buf) < FEATURE_FILE_HEADER.size:
        raise IncompleteRecord("feature file header cut short", 0, FEATURE_FILE_HEADER.size)
    got_magic, got_version = FEATURE_FILE_HEADER.unpack_from(buf, 0)
    if got_magic != magic or got_version != version:
        raise CorruptRecord(f"bad feature file header {got_magic!r} v{got_version}", 0)
    return decode_feature_records(buf, FEATURE_FILE_HEADER.size)


def decode_feature_records(buf: bytes, pos: int) -> FeatureFile:
    """Decode the records of ``buf`` from ``pos`` (after the header, or where an earlier
    read stopped); see :func:`decode_feature_file` for what is returned."""
    values: list[Any] = []
    end = pos
    damaged = 0
    # Checksumming candidates after bad bytes is capped (see recovery_crc_allowance), so a
    # crafted file of plausible lengths cannot make decoding quadratic.
    budget = recovery_crc_allowance(len(buf))
    while pos < len(buf):
        found = _record_at(buf, pos)
        if found is not None:
            value, pos = found
            values.append(value)
            end = pos
            continue
        resume, budget = _next_record(buf, pos + 1, budget)
        if resume is None:
            break  # nothing valid follows: a torn tail
        damaged += 1
        pos = resume
    return FeatureFile(values, end, damaged)


def _record_at(buf: bytes, pos: int) -> tuple[Any, int] | None:
    """The value of the whole, valid record at ``pos`` and where it ends; None if none."""
    if len(buf) - pos < _MIN:
        return None
    (length,) = _LENGTH.unpack_from(buf, pos)
    if length < _MIN or length > _MAX or pos + length > len(buf):
        return None
    crc_at = pos + length - 4
    if checksum(memoryview(buf)[pos:crc_at]) != _LENGTH.unpack_from(buf, crc_at)[0]:
        return None
    try:
        value = msgpack.unpackb(buf[pos + 4 : crc_at], raw=False, strict_map_key=False)
    except Exception:  # msgpack raises several types for bad bodies
        return None
    return value, pos + length


def _next_record(buf: bytes, start: int, budget: int) -> tuple[int | None, int]:
    """The first offset from ``start`` where a valid record begins (None), and budget left."""
    for at in range(start, len(buf) - _MIN + 1):
        (length,) = _LENGTH.unpack_from(buf, at)
        if length < _MIN or length > _MAX or at + length > len(buf):
            continue
        if length > budget:
            return None, budget  # cannot afford to check it: treat the rest as torn
        if _record_at(buf, at) is not None:
            return at, budget
        budget -= length
    return None, budget
