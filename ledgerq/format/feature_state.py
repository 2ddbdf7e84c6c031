"""Feature state logs: framed msgpack records (dedup table, retry tracker).

Each file starts with an 8-byte header (a 4-byte magic naming the feature and a
u32 version) followed by records::

    length  u32  whole record, this field and the CRC included
    body    msgpack value (length - 8 bytes)
    crc32   u32  CRC-32 of every byte of the record before it

A torn last record is ignored (and cut) by the reader of the file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import msgpack

from ledgerq.format.checksum import checksum
from ledgerq.format.errors import CorruptRecord, IncompleteRecord

__all__ = [
    "FEATURE_FILE_HEADER",
    "decode_feature_file",
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


def decode_feature_file(buf: bytes, magic: bytes, version: int = 1) -> tuple[list[Any], int]:
    """Decode a whole feature file; return its record values and the end of the last whole one.

    Raises :class:`CorruptRecord` for a bad header.  Reading stops at the first
    record that is incomplete or damaged (a torn append); what follows it is ignored.
    """
    if len(buf) < FEATURE_FILE_HEADER.size:
        raise IncompleteRecord("feature file header cut short", 0, FEATURE_FILE_HEADER.size)
    got_magic, got_version = FEATURE_FILE_HEADER.unpack_from(buf, 0)
    if got_magic != magic or got_version != version:
        raise CorruptRecord(f"bad feature file header {got_magic!r} v{got_version}", 0)
    values = []
    pos = FEATURE_FILE_HEADER.size
    for value, stop in _records(buf, pos):
        values.append(value)
        pos = stop
    return values, pos


def _records(buf: bytes, pos: int) -> Iterator[tuple[Any, int]]:
    end = len(buf)
    while end - pos >= 4:
        (length,) = _LENGTH.unpack_from(buf, pos)
        if length < _MIN or length > _MAX or pos + length > end:
            return
        crc_at = pos + length - 4
        if checksum(memoryview(buf)[pos:crc_at]) != _LENGTH.unpack_from(buf, crc_at)[0]:
            return
        try:
            value = msgpack.unpackb(buf[pos + 4 : crc_at], raw=False, strict_map_key=False)
        except Exception:
            return
        yield value, pos + length
        pos += length
