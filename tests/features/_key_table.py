"""The records of a feature's key table (``features/*.table``), read as docs/format.md
says - independently of ledgerq/segment/key_table.py - and one stored by hand."""

from __future__ import annotations

import struct
from pathlib import Path

RECORD = struct.Struct("<16sQqq")
HEADER_SIZE = 64


def key_table_records(path: Path, magic: bytes) -> list[tuple[bytes, int, int, int]]:
    """A 64-byte header (magic, u32 version 1, ...), then 40-byte records up to the
    first whose id is 0."""
    data = path.read_bytes()
    assert data[:8] == magic + (1).to_bytes(4, "little"), data[:8]
    records, pos = [], HEADER_SIZE
    while pos + RECORD.size <= len(data):
        record = RECORD.unpack_from(data, pos)
        if not record[1]:
            break
        records.append(record)
        pos += RECORD.size
    return records


def store_key_record(path: Path, magic: bytes, record: tuple[bytes, int, int, int]) -> None:
    """Put ``record`` after the table's last one, as a handle's store would."""
    at = HEADER_SIZE + RECORD.size * len(key_table_records(path, magic))
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(RECORD.pack(*record))
