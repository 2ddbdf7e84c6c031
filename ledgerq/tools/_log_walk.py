"""The log walk (``ledgerq dump``): every retained message of a queue, read without its
lock, and the sealed ones that fail authentication under a key.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from ledgerq._types import Message
from ledgerq.format.entry import Entry, EntryFlags
from ledgerq.format.errors import CorruptRecord
from ledgerq.segment.naming import SEGMENTS_DIR
from ledgerq.segment.readonly import (
    SegmentDirectory,
    SegmentTail,
    view_message,
    view_sealer,
)
from ledgerq.segment.readonly_tail import log_skipped
from ledgerq.segment.scanner import EntryScanner

_ENCRYPTED = int(EntryFlags.ENCRYPTED)


def iter_messages(
    path: str | os.PathLike[str], from_id: int = 1, *, encryption_key: bytes | None = None
) -> Iterator[Message]:
    """Yield every message retained in the segments of ``path`` with id >= ``from_id``.

    A log view, read without the lock: acked and expired messages that are still in a
    segment are included, and each message is what every view yields
    (``ledgerq.segment.readonly.view_message``: ``attempts`` is 0, as with
    ``ledgerq.follow``).  Corrupt entries are skipped and logged; the walk ends at the
    end of the newest segment (an append in flight is not read).  An encrypted queue
    needs its ``encryption_key``: :class:`ConfigError` without it or with another.
    """
    sealer = view_sealer(os.fspath(path), encryption_key)
    for entry, segment_path in _iter_entries(path, from_id):
        message = view_message(entry, segment_path, sealer)
        if message is not None:
            yield message


def unauthentic_ids(path: str | os.PathLike[str], encryption_key: bytes) -> list[int]:
    """The ids of the sealed messages of ``path`` that fail authentication under the key.

    Read without the lock, as :func:`iter_messages`.  Raises :class:`ConfigError` when
    the key is not the queue's (or the queue is not encrypted).  Entries that are not
    sealed at all need no key to be found: :func:`verify` reports them (``unsealed``).
    """
    sealer = view_sealer(os.fspath(path), encryption_key)
    assert sealer is not None
    failed = []
    for entry, _ in _iter_entries(path, 1):
        if entry.flags & _ENCRYPTED:
            try:
                sealer.open(entry)
            except CorruptRecord:
                failed.append(entry.id)
    return failed


def _iter_entries(path: str | os.PathLike[str], from_id: int) -> Iterator[tuple[Entry, str]]:
    """The valid entries of ``path`` with id >= ``from_id``, with their segment's path."""
    seg_dir = os.path.join(os.fspath(path), SEGMENTS_DIR)
    files = SegmentDirectory(seg_dir).layout().used  # by content: as every reader orders them
    for position, f in enumerate(files):
        if position + 1 < len(files) and files[position + 1].first_id <= from_id:
            continue  # every id of this segment is below from_id
        try:
            seg = SegmentTail(seg_dir, f.first_id, f.name_id)
        except FileNotFoundError:
            continue  # deleted by retention while we walked
        try:
            start, after = seg.start_for(from_id)
            scanner = EntryScanner(
                seg.fd, start, seg.size, after_id=after, boundaries=seg.boundaries
            )
            while (entry := scanner.next()) is not None:
                if entry.id >= from_id:
                    yield entry, seg.path
            for region in scanner.corrupt:
                log_skipped(seg.path, region.start, region.stop)
        finally:
            seg.close()
