"""Rebuilding a lost or damaged ``meta.json`` from what the other files imply.

``meta.json`` holds what no other file does - the id reservation, the queue-wide
counters, the record of the gaps the queue made - and the stored options, of which
``options.json`` keeps a second copy.  When it is missing or damaged in a queue that
holds data, the queue opens only once it is rebuilt (by ``open`` itself when the
options copy is there, else by ``ledgerq verify --repair``), and the rebuild says what
it could not know instead of guessing silently:

* **next id**: above every id in any segment file and in any reader journal, plus a
  whole reservation block - ids up to a block past the log may have been handed out
  before the file was lost, and ids are never reused;
* **options**: from ``options.json``; without it they are unknown, and the queue takes
  what the application passes (defaults for the rest) - said, not guessed;
* **counters**: ``enqueued`` is derived at the next open (what the default reader
  finished plus what is retained unfinished); ``duplicates``, ``dropped``,
  ``corrupt_skipped`` and ``lost`` lived only in ``meta.json`` and restart at 0;
* **gaps**: the record of the gaps the queue made is gone, so the gaps between the
  segments now on disk can no longer be told from deleted files: they raise no alarm
  (``gaps_from`` starts again at the next id).
"""

from __future__ import annotations

import os
import time

from ledgerq._errors import CorruptionError
from ledgerq.segment.layout import SegmentDirectory
from ledgerq.segment.meta import FORMAT_VERSION, Meta, OptionsCopy
from ledgerq.segment.naming import SEGMENTS_DIR, list_reader_names
from ledgerq.segment.readonly_state import replay_reader
from ledgerq.segment.readonly_tail import last_id_in_file

__all__ = ["highest_id", "rebuild_meta"]

_ANY_ID = (1 << 64) - 1


def highest_id(queue_dir: str) -> tuple[int, list[str]]:
    """The highest id any segment file or reader journal of the queue mentions, and
    notes on what could not be read (a damaged journal).

    Each segment is read from its last index point that checks out to its end (every
    file, the set-aside ones too: an id they hold was handed out).
    """
    seg_dir = os.path.join(queue_dir, SEGMENTS_DIR)
    notes: list[str] = []
    highest = 0
    try:
        layout = SegmentDirectory(seg_dir).layout()
    except FileNotFoundError:
        layout = None
    files = [] if layout is None else [*layout.used, *(f for f, _ in layout.set_aside)]
    for f in files:
        highest = max(highest, last_id_in_file(seg_dir, f, live=False))
    for name in list_reader_names(queue_dir):
        try:
            state = replay_reader(queue_dir, name)
        except CorruptionError as exc:
            notes.append(
                f"reader {name}'s journal could not be read ({exc}); its ids were not "
                "looked at (the reservation block skipped covers them)"
            )
            continue
        highest = max(highest, state.head - 1, *state.done, *state.deliveries)
    return highest, notes


def rebuild_meta(
    queue_dir: str, copy: OptionsCopy | None, *, margin: int
) -> tuple[Meta, list[str]]:
    """A new ``meta.json`` content for the queue at ``queue_dir``, and what it could not know.

    ``copy`` is the options copy (None when it is lost too); ``margin`` the ids skipped
    past the highest id found (the queue's reservation block).  The caller writes it.
    """
    highest, notes = highest_id(queue_dir)
    next_id = highest + 1 + margin
    meta = Meta(
        # Whether an entry is delayed is not looked for: the newest version, which an
        # older ledgerq refuses rather than misread (segment.meta).
        version=FORMAT_VERSION,
        created_ns=copy.created_ns if copy is not None and copy.created_ns else time.time_ns(),
        clean=False,
        next_id=next_id,
        reserved_until=next_id,
        counters={},  # no "enqueued": derived by the next open
        options=dict(copy.options) if copy is not None else {},
        gaps_from=None,
        # An encrypted queue's identity and key check: without them its entries are lost.
        encryption=dict(copy.encryption)
        if copy is not None
        else {},  # set by the next open: the gaps on disk now raise no alarm
    )
    notes.insert(
        0,
        f"next id {next_id}: past the highest id in the segments and reader journals "
        f"({highest}) and a whole reservation block ({margin}), since ids up to there may "
        "have been handed out",
    )
    if copy is not None:
        notes.append("stored options taken from options.json")
    else:
        notes.append(
            "the stored options were lost with meta.json (options.json is missing or damaged "
            "too): the queue now takes the options the application opens it with, defaults "
            "for the rest - pass them again (e.g. max_retries, dedup_window, priorities)"
        )
    if copy is None or not copy.created_ns:
        notes.append("the queue's creation time is unknown: set to now")
    notes.append(
        "counters duplicates, dropped, corrupt_skipped and lost lived only in meta.json and "
        "restart at 0; enqueued is derived at the next open from the default reader and the "
        "retained messages"
    )
    notes.append(
        "the record of the gaps the queue made was in meta.json: gaps between the segments "
        "now on disk are no longer reported"
    )
    return meta, notes
