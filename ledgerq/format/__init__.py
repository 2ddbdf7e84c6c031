"""Bytes <-> records.  Pure functions over buffers: no files, no clocks, no locks."""

from __future__ import annotations

from ledgerq.format.checksum import CHECKSUM_NAME, CHECKSUM_NAME_V1, checksum, checksum_v1
from ledgerq.format.entry import (
    MAX_ENTRY_SIZE,
    MIN_ENTRY_SIZE,
    Entry,
    EntryFlags,
    RecordType,
    decode_entry,
    decode_headers,
    encode_entry,
    encode_headers,
    peek_length,
)
from ledgerq.format.errors import CorruptRecord, DecodeError, IncompleteRecord
from ledgerq.format.index import (
    INDEX_ENTRY,
    INDEX_HEADER,
    OPEN_COUNT,
    IndexEntry,
    decode_index,
    encode_index_entry,
    encode_index_header,
)
from ledgerq.format.reader_state import (
    Checkpoint,
    StateRecordType,
    decode_checkpoint,
    decode_state_file_header,
    decode_state_record,
    encode_checkpoint,
    encode_ids_record,
    encode_state_file_header,
    state_file_version,
)

__all__ = [
    "CHECKSUM_NAME",
    "CHECKSUM_NAME_V1",
    "INDEX_ENTRY",
    "INDEX_HEADER",
    "MAX_ENTRY_SIZE",
    "MIN_ENTRY_SIZE",
    "OPEN_COUNT",
    "Checkpoint",
    "CorruptRecord",
    "DecodeError",
    "Entry",
    "EntryFlags",
    "IncompleteRecord",
    "IndexEntry",
    "RecordType",
    "StateRecordType",
    "checksum",
    "checksum_v1",
    "decode_checkpoint",
    "decode_entry",
    "decode_headers",
    "decode_index",
    "decode_state_file_header",
    "decode_state_record",
    "encode_checkpoint",
    "encode_entry",
    "encode_headers",
    "encode_ids_record",
    "encode_index_entry",
    "encode_index_header",
    "encode_state_file_header",
    "peek_length",
    "state_file_version",
]
