"""The storage engine: segment files, sparse indexes, rotation, recovery, deletion."""

from __future__ import annotations

from ledgerq.segment.cursor import LogCursor
from ledgerq.segment.files import StorageError, atomic_write, datasync, fsync_dir, write_all
from ledgerq.segment.lock import DirLock
from ledgerq.segment.manager import SegmentManager
from ledgerq.segment.scanner import CorruptRegion, EntryScanner
from ledgerq.segment.segment import Segment
from ledgerq.segment.sync import GroupCommit

__all__ = [
    "CorruptRegion",
    "DirLock",
    "EntryScanner",
    "GroupCommit",
    "LogCursor",
    "Segment",
    "SegmentManager",
    "StorageError",
    "atomic_write",
    "datasync",
    "fsync_dir",
    "write_all",
]
