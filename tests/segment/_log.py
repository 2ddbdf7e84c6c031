"""Build segment logs byte by byte, and read them back, for the segment tests.

A :class:`Log` is what the tests wrote: each entry's id, offset and bytes, so that a
test can damage entry *k* precisely and say exactly what reading must give back.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ledgerq.format.entry import Entry, encode_entry, encode_headers
from ledgerq.segment.scanner import EntryScanner

__all__ = ["Log", "Written", "payload_for", "scan"]

BASE_NS = 1_700_000_000 * 10**9


def payload_for(message_id: int, size: int) -> bytes:
    """A payload that names its id (a misplaced entry cannot pass for another)."""
    stem = b"m%d:" % message_id
    return (stem * (size // len(stem) + 1))[:size]


@dataclass(frozen=True)
class Written:
    """One entry as written: where it starts and its exact bytes."""

    id: int
    offset: int
    data: bytes
    timestamp: int

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


@dataclass
class Log:
    """Entries laid end to end from offset 0, ids consecutive from ``first_id``."""

    first_id: int = 1
    entries: list[Written] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.entries[-1].end if self.entries else 0

    @property
    def next_id(self) -> int:
        return self.entries[-1].id + 1 if self.entries else self.first_id

    def add(
        self,
        payload_size: int,
        *,
        timestamp: int | None = None,
        batch_continues: bool = False,
        headers: bool = False,
    ) -> Written:
        """Encode the next entry and note where it goes."""
        message_id = self.next_id
        ts = BASE_NS + message_id if timestamp is None else timestamp
        data = encode_entry(
            message_id,
            ts,
            payload_for(message_id, payload_size),
            headers_blob=encode_headers({"n": str(message_id)}) if headers else None,
            batch_continues=batch_continues,
        )
        written = Written(message_id, self.size, data, ts)
        self.entries.append(written)
        return written

    def data(self) -> bytes:
        return b"".join(w.data for w in self.entries)

    def write(self, path: Path) -> Path:
        path.write_bytes(self.data())
        return path

    def ids(self) -> list[int]:
        return [w.id for w in self.entries]


def scan(
    path: Path,
    *,
    start: int = 0,
    after_id: int = 0,
    boundaries: list[int] | None = None,
    chunk_size: int | None = None,
) -> tuple[list[Entry], EntryScanner]:
    """Every entry an :class:`EntryScanner` returns from ``path``, and the scanner."""
    fd = os.open(path, os.O_RDONLY)
    try:
        extra = {} if chunk_size is None else {"chunk_size": chunk_size}
        scanner = EntryScanner(
            fd, start, os.fstat(fd).st_size, after_id=after_id, boundaries=boundaries, **extra
        )
        got = []
        while (entry := scanner.next()) is not None:
            got.append(entry)
        return got, scanner
    finally:
        os.close(fd)
