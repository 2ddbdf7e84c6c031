"""Moving misplaced segment files: renamed to their content's name, or set aside.

A repair (and, when a rotation needs the name, the queue itself) fixes a misnamed or
duplicate segment file (see ``segment.layout``) by moving it, never by deleting it: a
misnamed file is renamed to the id of its first entry, a copy or an overlapping file
is moved into ``segments/damaged/``, where no reader looks and an operator can
inspect it.  Each move renames the ``.log`` first - its name is what says which ids
it holds - then its ``.idx`` (an index left behind without its log is deleted on
open and rebuilt from the log), and fsyncs the directories, so that a crash leaves
either name, both valid.
"""

from __future__ import annotations

import contextlib
import os

from ledgerq.segment.files import fsync_dir, make_durable_dir
from ledgerq.segment.layout import DAMAGED_DIR
from ledgerq.segment.naming import idx_path, log_path

__all__ = ["move_to_damaged", "rename_segment"]


def rename_segment(segments_dir: str, name_id: int, new_id: int) -> None:
    """Rename segment ``name_id``'s log and index to ``new_id``'s names (durably).

    Raises ``FileExistsError`` when a log of that name exists already.
    """
    target = log_path(segments_dir, new_id)
    if os.path.exists(target):
        raise FileExistsError(17, "a segment file of that name exists", target)
    os.rename(log_path(segments_dir, name_id), target)
    with contextlib.suppress(FileNotFoundError):
        os.rename(idx_path(segments_dir, name_id), idx_path(segments_dir, new_id))
    fsync_dir(segments_dir)


def move_to_damaged(segments_dir: str, name_id: int) -> str:
    """Move segment ``name_id``'s log and index into ``segments/damaged/``; return the
    log's new path.  A name already taken there gets a ``.N`` suffix (nothing there is
    ever overwritten)."""
    damaged = os.path.join(segments_dir, DAMAGED_DIR)
    make_durable_dir(damaged)
    source = log_path(segments_dir, name_id)
    base = os.path.basename(source)
    target = os.path.join(damaged, base)
    n = 0
    while os.path.exists(target) or os.path.exists(target + ".idx"):
        n += 1
        target = os.path.join(damaged, f"{base}.{n}")
    os.rename(source, target)
    with contextlib.suppress(FileNotFoundError):
        os.rename(idx_path(segments_dir, name_id), target + ".idx")
    fsync_dir(damaged)
    fsync_dir(segments_dir)
    return target
