"""File names inside a queue directory."""

from __future__ import annotations

import os
import re

__all__ = [
    "SEGMENTS_DIR",
    "idx_path",
    "list_segment_ids",
    "log_path",
]

SEGMENTS_DIR = "segments"
_LOG_NAME = re.compile(r"^(\d{20})\.log$")


def log_path(segments_dir: str, first_id: int) -> str:
    """Path of the log file of the segment whose first id is ``first_id``."""
    return os.path.join(segments_dir, f"{first_id:020d}.log")


def idx_path(segments_dir: str, first_id: int) -> str:
    """Path of the sparse index of the segment whose first id is ``first_id``."""
    return os.path.join(segments_dir, f"{first_id:020d}.idx")


def list_segment_ids(segments_dir: str) -> list[int]:
    """First ids of the segments present, in increasing order (temp files ignored)."""
    ids = []
    for name in os.listdir(segments_dir):
        match = _LOG_NAME.match(name)
        if match:
            ids.append(int(match.group(1)))
    ids.sort()
    return ids
