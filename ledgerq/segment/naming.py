"""Every name inside a queue directory, defined once.

::

    QUEUE/
      LOCK                      LOCK_NAME: flock'ed while the queue is open
      meta.json                 META_NAME: format version, next id, stored options
      options.json              OPTIONS_NAME: a second copy of the stored options
      segments/                 SEGMENTS_DIR
        <first-id:020d>.log     log_path(): entries
        <first-id:020d>.idx     idx_path(): the sparse index
      readers/                  READERS_DIR
        <name>.state            reader_state_path(): one reader's journal
      features/                 FEATURES_DIR: the feature logs (segment/feature_log.py)
        dedup.log               DEDUP_NAME: the dedup window's table
        retries.log             RETRIES_NAME: the last failure of each failing message
        unique.table            UNIQUE_TABLE_NAME: the unique keys held (segment/key_table.py)
        unique.log              UNIQUE_NAME: where an older ledgerq kept them (read, removed)
        periodic.log            PERIODIC_NAME: the periodic jobs and their last ticks
        forwards.table          FORWARDS_TABLE_NAME: the hand-off keys forwards brought here
        forwards.log            FORWARDS_NAME: where an older ledgerq kept them (read, removed)
      dlq/                      DLQ_DIR: the dead-letter queue, a queue directory itself
      shared/                   SHARED_DIR: coordination of shared-mode handles
        OPENING                 OPENING_NAME: flock'ed while a shared handle opens
        APPEND                  APPEND_NAME: flock'ed across one append
        state                   SHARED_STATE_NAME: the state page (format.shared_state)
        <name>.reader           reader_lock_path(): flock'ed across a reader's step
        <handle:016x>.live      handle_live_path(): flock'ed while that handle lives
        ratelimit               RATE_LIMIT_NAME: the worker pools' start times (rate_limit=)
        progress/               PROGRESS_DIR: what running pool tasks reported
          <reader>.<id:020d>    progress_path(): one in-flight message's progress
      reserve                   RESERVE_NAME: disk space held back for acks on a full disk

A file being replaced is written first as ``<name>.tmp`` (TMP_SUFFIX) and renamed.
``docs/format.md`` lists the same names; a test keeps the two in step.
"""

from __future__ import annotations

import os
import re

__all__ = [
    "APPEND_NAME",
    "DEDUP_NAME",
    "DLQ_DIR",
    "FEATURES_DIR",
    "FORWARDS_NAME",
    "FORWARDS_TABLE_NAME",
    "INDEX_SUFFIX",
    "LIVE_SUFFIX",
    "LOCK_NAME",
    "LOG_SUFFIX",
    "META_NAME",
    "OPENING_NAME",
    "OPTIONS_NAME",
    "PERIODIC_NAME",
    "PROGRESS_DIR",
    "QUEUE_NAMES",
    "RATE_LIMIT_NAME",
    "READERS_DIR",
    "RESERVE_NAME",
    "RETRIES_NAME",
    "SEGMENTS_DIR",
    "SHARED_DIR",
    "SHARED_STATE_NAME",
    "STATE_SUFFIX",
    "TMP_SUFFIX",
    "UNIQUE_NAME",
    "UNIQUE_TABLE_NAME",
    "feature_log_path",
    "handle_live_path",
    "idx_path",
    "list_live_handles",
    "list_reader_names",
    "list_segment_ids",
    "log_path",
    "parse_log_name",
    "parse_progress_name",
    "progress_path",
    "rate_limit_path",
    "reader_lock_path",
    "reader_state_path",
]

SEGMENTS_DIR = "segments"
READERS_DIR = "readers"
FEATURES_DIR = "features"
DLQ_DIR = "dlq"
META_NAME = "meta.json"
OPTIONS_NAME = "options.json"
LOCK_NAME = "LOCK"
RESERVE_NAME = "reserve"
LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".idx"
STATE_SUFFIX = ".state"
TMP_SUFFIX = ".tmp"
SHARED_DIR = "shared"
OPENING_NAME = "OPENING"
APPEND_NAME = "APPEND"
SHARED_STATE_NAME = "state"
READER_LOCK_SUFFIX = ".reader"
LIVE_SUFFIX = ".live"
# The feature logs, in FEATURES_DIR (feature_log_path).
DEDUP_NAME = "dedup.log"
RETRIES_NAME = "retries.log"
UNIQUE_NAME = "unique.log"
UNIQUE_TABLE_NAME = "unique.table"
PERIODIC_NAME = "periodic.log"
FORWARDS_NAME = "forwards.log"
FORWARDS_TABLE_NAME = "forwards.table"
RATE_LIMIT_NAME = "ratelimit"  # in SHARED_DIR
PROGRESS_DIR = "progress"  # in SHARED_DIR

# Everything a queue directory may hold: a directory holding anything else and no
# meta.json is not a queue (``meta.json.tmp``: a first open killed before its rename).
QUEUE_NAMES = frozenset(
    (
        LOCK_NAME,
        META_NAME,
        META_NAME + TMP_SUFFIX,
        OPTIONS_NAME,
        OPTIONS_NAME + TMP_SUFFIX,
        SEGMENTS_DIR,
        READERS_DIR,
        FEATURES_DIR,
        DLQ_DIR,
        SHARED_DIR,
        RESERVE_NAME,
    )
)

_LOG_NAME = re.compile(r"^(\d{20})" + re.escape(LOG_SUFFIX) + r"$")


def log_path(segments_dir: str, first_id: int) -> str:
    """Path of the log file of the segment whose first id is ``first_id``."""
    return os.path.join(segments_dir, f"{first_id:020d}{LOG_SUFFIX}")


def idx_path(segments_dir: str, first_id: int) -> str:
    """Path of the sparse index of the segment whose first id is ``first_id``."""
    return os.path.join(segments_dir, f"{first_id:020d}{INDEX_SUFFIX}")


def parse_log_name(name: str) -> int | None:
    """The id a segment log's file name says (``None`` for any other name)."""
    match = _LOG_NAME.match(name)
    return int(match.group(1)) if match else None


def list_segment_ids(segments_dir: str) -> list[int]:
    """First ids of the segments present, in increasing order (temp files ignored).

    Raises ``FileNotFoundError`` when ``segments_dir`` does not exist.
    """
    ids = []
    for name in os.listdir(segments_dir):
        match = _LOG_NAME.match(name)
        if match:
            ids.append(int(match.group(1)))
    ids.sort()
    return ids


def feature_log_path(queue_dir: str, name: str) -> str:
    """Path of the feature log ``name`` (``DEDUP_NAME``, ...) of the queue at ``queue_dir``."""
    return os.path.join(queue_dir, FEATURES_DIR, name)


def reader_state_path(queue_dir: str, name: str) -> str:
    """Path of the state journal of the reader ``name`` of the queue at ``queue_dir``."""
    return os.path.join(queue_dir, READERS_DIR, name + STATE_SUFFIX)


def list_reader_names(queue_dir: str) -> list[str]:
    """Names of the readers with a state journal, sorted ([] when there is none).

    Only the names of ``*.state`` files; a leftover ``.tmp`` is an unfinished
    replacement, which the queue ignores too.
    """
    try:
        names = os.listdir(os.path.join(queue_dir, READERS_DIR))
    except FileNotFoundError:
        return []
    return sorted(
        name[: -len(STATE_SUFFIX)]
        for name in names
        if name.endswith(STATE_SUFFIX) and len(name) > len(STATE_SUFFIX)
    )


def reader_lock_path(queue_dir: str, name: str) -> str:
    """Path of the file shared-mode handles lock across a step of the reader ``name``."""
    return os.path.join(queue_dir, SHARED_DIR, name + READER_LOCK_SUFFIX)


_LIVE_NAME = re.compile(r"^([0-9a-f]{16})" + re.escape(LIVE_SUFFIX) + r"$")


def handle_live_path(queue_dir: str, handle_id: int) -> str:
    """Path of the file the shared-mode handle ``handle_id`` keeps locked while it lives."""
    return os.path.join(queue_dir, SHARED_DIR, f"{handle_id:016x}{LIVE_SUFFIX}")


def list_live_handles(queue_dir: str) -> list[int]:
    """Ids of the shared-mode handles with a liveness file (live, or dead uncleaned)."""
    try:
        names = os.listdir(os.path.join(queue_dir, SHARED_DIR))
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1), 16) for m in map(_LIVE_NAME.match, names) if m)


def rate_limit_path(queue_dir: str) -> str:
    """Path of the file the worker pools of the queue at ``queue_dir`` share a rate limit in."""
    return os.path.join(queue_dir, SHARED_DIR, RATE_LIMIT_NAME)


def progress_path(queue_dir: str, reader: str, message_id: int) -> str:
    """Path of the progress record of the message ``message_id`` leased by ``reader``."""
    return os.path.join(queue_dir, SHARED_DIR, PROGRESS_DIR, f"{reader}.{message_id:020d}")


_PROGRESS_NAME = re.compile(r"^(.+)\.(\d{20})$")


def parse_progress_name(name: str) -> tuple[str, int] | None:
    """The reader and message id a progress record's file name says (None: not one)."""
    match = _PROGRESS_NAME.match(name)
    return (match.group(1), int(match.group(2))) if match else None
