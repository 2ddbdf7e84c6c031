"""What running pool tasks reported: ``shared/progress/<reader>.<id:020d>``.

A handler in a worker pool calls ``ledgerq.workers.progress(fraction, note)``; the
pool's owner keeps the report in one small file per in-flight message, replaced whole
(temp file, rename) at each report, deleted when the message is settled.  The console
and ``ledgerq stats --json`` read them without any lock: a rename is atomic, so a
reader sees a whole record, old or new.  No fsync: a report is worth nothing after the
task ends, let alone after a power cut.  None of this touches enqueue or dequeue.

Layout (docs/format.md "Task progress"): :data:`RECORD` then the note's UTF-8.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass

from ledgerq.segment.files import storage_errors
from ledgerq.segment.naming import (
    PROGRESS_DIR,
    SHARED_DIR,
    TMP_SUFFIX,
    parse_progress_name,
    progress_path,
)

__all__ = [
    "MAGIC",
    "MAX_NOTE_CHARS",
    "PPM",
    "RECORD",
    "VERSION",
    "Progress",
    "decode_progress",
    "encode_progress",
    "read_progress",
    "remove_progress",
    "write_progress",
]

MAGIC = b"LQPG"
VERSION = 1
# magic, version, id, attempts, updated (wall ns), fraction (millionths), note length
RECORD = struct.Struct("<4sIQQqII")
assert RECORD.size == 40
PPM = 1_000_000
MAX_NOTE_CHARS = 1000


@dataclass(frozen=True, slots=True)
class Progress:
    """One in-flight message's last report: ``fraction`` done (0 to 1) and a note."""

    reader: str
    id: int
    attempts: int
    fraction: float
    note: str
    updated_ns: int


def encode_progress(
    message_id: int, attempts: int, fraction: float, note: str, at_ns: int
) -> bytes:
    """The bytes of a record (``fraction`` already checked to be in [0, 1])."""
    raw = note.encode("utf-8", "replace")
    ppm = min(PPM, max(0, round(fraction * PPM)))
    return RECORD.pack(MAGIC, VERSION, message_id, attempts, at_ns, ppm, len(raw)) + raw


def decode_progress(reader: str, data: bytes) -> Progress | None:
    """The record in ``data`` (None: not a whole record of this version)."""
    if len(data) < RECORD.size:
        return None
    magic, version, message_id, attempts, at_ns, ppm, length = RECORD.unpack_from(data)
    if magic != MAGIC or version != VERSION or ppm > PPM or len(data) != RECORD.size + length:
        return None
    note = data[RECORD.size :].decode("utf-8", "replace")
    return Progress(reader, message_id, attempts, ppm / PPM, note, at_ns)


def write_progress(
    queue_dir: str,
    reader: str,
    message_id: int,
    attempts: int,
    fraction: float,
    note: str,
    at_ns: int,
) -> None:
    """Replace the record of ``message_id`` (raises :class:`StorageError`)."""
    path = progress_path(queue_dir, reader, message_id)
    tmp = path + TMP_SUFFIX
    data = encode_progress(message_id, attempts, fraction, note, at_ns)
    with storage_errors("write the progress record", path):
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)  # far below a pipe's or a page's size: one write
        finally:
            os.close(fd)
        os.replace(tmp, path)


def remove_progress(queue_dir: str, reader: str, message_id: int) -> None:
    """Delete the record of ``message_id``, if there is one."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(progress_path(queue_dir, reader, message_id))


def read_progress(queue_dir: str, reader: str | None = None) -> list[Progress]:
    """Every record (of ``reader`` only, if given), by reader then id; without a lock."""
    directory = os.path.join(queue_dir, SHARED_DIR, PROGRESS_DIR)
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    for name in names:
        parsed = parse_progress_name(name)
        if parsed is None or (reader is not None and parsed[0] != reader):
            continue
        try:
            with open(os.path.join(directory, name), "rb") as file:
                data = file.read(RECORD.size + 4 * MAX_NOTE_CHARS + 1)
        except OSError:  # deleted meanwhile: the task ended
            continue
        record = decode_progress(parsed[0], data)
        if record is not None and record.id == parsed[1]:
            found.append(record)
    found.sort(key=lambda p: (p.reader, p.id))
    return found
