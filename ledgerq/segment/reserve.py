"""Disk space held back for acks: the ``reserve`` file of a queue directory.

On a disk that is 100% full even an ack fails: it appends a record to its reader's
journal.  Then nobody can drain the queue - and draining it (acks, after which
retention deletes consumed segments) is what frees space.  So each queue keeps a
small file of incompressible bytes, ``reserve``.  When a write that draining needs -
a journal record, a checkpoint - meets ENOSPC, the queue deletes the reserve and
tries again: the space it held takes those writes, and journals are compacted often
while it is gone, so a drain can go on until segments are deleted.  Enqueues never
use it: while the reserve is gone they refuse (a :class:`StorageError` with ENOSPC,
nothing written) unless it can be written again, which happens as soon as the disk
has that much room - after retention deleted a segment, or someone freed space.

The file is neither synced nor part of the format: a reserve lost in a crash is
written again at the next open, when there is room.  Writing real bytes (not
``fallocate`` or a sparse file) makes the space really taken, also on file systems
that compress or deduplicate.
"""

from __future__ import annotations

import contextlib
import os

from ledgerq.segment.files import write_all

__all__ = ["RESERVE_BYTES", "DiskReserve"]

# 8 pages of 4 KiB: a drain's journal records between two compactions, a checkpoint's
# temp file and meta.json's, with room to spare (see docs/reliability.md).
RESERVE_BYTES = 32 * 1024


class DiskReserve:
    """The reserve file at ``path``: held (written, taking its space) or released."""

    def __init__(self, path: str, size: int = RESERVE_BYTES) -> None:
        self.path = path
        self.size = size
        self.is_held = False

    def ensure(self) -> bool:
        """Hold the reserve, writing the file if it is missing or short; True if held.

        False (nothing left behind) when the disk has not that much room, or refuses.
        """
        if self.is_held:
            return True
        try:
            if os.stat(self.path).st_size == self.size:
                self.is_held = True
                return True
        except FileNotFoundError:
            pass
        except OSError:
            return False
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError:
            return False
        try:
            write_all(fd, os.urandom(self.size))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(self.path)  # a partial reserve would hold space uncounted
            return False
        finally:
            os.close(fd)
        self.is_held = True
        return True

    def release(self) -> bool:
        """Give the reserve's space back to the disk; True if that freed anything.

        False when it was not held, or cannot be deleted (then it is no help, and the
        write that needed room fails with its own error).
        """
        if not self.is_held:
            return False
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass  # deleted behind our back: its space is back already
        except OSError:
            return False
        self.is_held = False
        return True
