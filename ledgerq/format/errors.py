"""Decoding outcomes other than a valid record.

Every decoder in :mod:`ledgerq.format` tells three cases apart:

* a complete, valid record is returned;
* :class:`IncompleteRecord` - the bytes end before the record does (a torn write at
  the tail of a file, or simply data not written yet);
* :class:`CorruptRecord` - the bytes are all there but cannot be a valid record
  (bad checksum, impossible length, unknown type).

They are plain exceptions of the pure format layer; the storage layer turns them
into skips, truncations or :class:`ledgerq.CorruptionError` as the situation needs.
"""

from __future__ import annotations

__all__ = ["CorruptRecord", "DecodeError", "IncompleteRecord"]


class DecodeError(Exception):
    """Base of the decoding outcomes; ``pos`` is the offset of the record's first byte."""

    def __init__(self, message: str, pos: int) -> None:
        super().__init__(f"{message} at offset {pos}")
        self.pos = pos


class IncompleteRecord(DecodeError):
    """The buffer ends before the record does; ``needed`` bytes would complete it (if known)."""

    def __init__(self, message: str, pos: int, needed: int | None = None) -> None:
        super().__init__(message, pos)
        self.needed = needed


class CorruptRecord(DecodeError):
    """The record's bytes are present but invalid."""
