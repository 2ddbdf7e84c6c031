"""The crash tests' child program and a look at queue files on disk.

Synchronisation is by pipes only: the parent reads a child's report lines and kills it
after a chosen number of them (``tests._child.Child``, whose watchdog kills a child
that outlives ``WATCHDOG_SECONDS`` so that a hang fails the test instead of stalling
the run).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable
from pathlib import Path

from tests._child import Child

CHILD_SCRIPT = Path(__file__).with_name("_child.py")
WATCHDOG_SECONDS = 120.0
SYNC_MODES = ("always", "interval", "never")


Spawn = Callable[..., Child]  # the ``spawn`` fixture (see conftest.py)


# ---------------------------------------------------------------------- files on disk
#
# Only the documented on-disk format is relied on here: a segment log is a sequence of
# entries each starting with its whole length (u32, little-endian) with the id (u64) at
# byte 6; a reader state file is an 8-byte header then records that start with their
# whole length (u32); an index file is a 12-byte header (magic, version, count) then
# 24-byte (id, timestamp, offset) entries.

_LOG_NAME = re.compile(r"^(\d{20})\.log$")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
ENTRY_ID_OFFSET = 6
ENTRY_MIN_SIZE = 26
ENTRY_FIXED_SIZE = 22  # length, type, flags, id, timestamp
STATE_HEADER_SIZE = 8
INDEX_HEADER = struct.Struct("<4sII")
INDEX_ENTRY = struct.Struct("<QqQ")
INDEX_OPEN_COUNT = 0xFFFFFFFF


def segment_logs(queue_dir: Path) -> list[Path]:
    """The queue's segment log files, oldest first."""
    seg_dir = queue_dir / "segments"
    return sorted(p for p in seg_dir.iterdir() if _LOG_NAME.match(p.name))


def first_id_of(log: Path) -> int:
    """The first id of a segment, from its file name."""
    match = _LOG_NAME.match(log.name)
    assert match is not None
    return int(match.group(1))


def entry_spans(data: bytes) -> list[tuple[int, int, int]]:
    """``(start, stop, id)`` of every entry of a whole segment log."""
    spans = []
    pos = 0
    while pos < len(data):
        (length,) = _U32.unpack_from(data, pos)
        assert length >= ENTRY_MIN_SIZE, f"bad entry length {length} at {pos}"
        assert pos + length <= len(data), f"entry at {pos} runs past the end"
        (entry_id,) = _U64.unpack_from(data, pos + ENTRY_ID_OFFSET)
        spans.append((pos, pos + length, entry_id))
        pos += length
    return spans


def state_record_spans(data: bytes) -> list[tuple[int, int]]:
    """``(start, stop)`` of every record of a whole reader state file."""
    spans = []
    pos = STATE_HEADER_SIZE
    while pos < len(data):
        (length,) = _U32.unpack_from(data, pos)
        assert pos + length <= len(data), f"state record at {pos} runs past the end"
        spans.append((pos, pos + length))
        pos += length
    return spans


def read_index(path: Path) -> tuple[int, list[tuple[int, int, int]]]:
    """The count field and the ``(id, timestamp, offset)`` entries of an index file."""
    data = path.read_bytes()
    magic, version, count = INDEX_HEADER.unpack_from(data, 0)
    assert magic == b"LQIX", f"{path} has magic {magic!r}"
    assert version == 1
    n = (len(data) - INDEX_HEADER.size) // INDEX_ENTRY.size
    entries = [
        INDEX_ENTRY.unpack_from(data, INDEX_HEADER.size + i * INDEX_ENTRY.size) for i in range(n)
    ]
    return count, entries


def truncate(path: Path, size: int) -> None:
    """Cut ``path`` to ``size`` bytes."""
    os.truncate(path, size)
