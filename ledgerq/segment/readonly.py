"""Reading a queue directory without its lock: the API of a reader that does not own it.

``ledgerq.follow``, ``ledgerq ship``, the Spark source, ``ledgerq verify``/``dump``, the
console and the read-only ``stats``/``peek`` read queues that another process may have
open, and take no lock to do so; the queue's own recovery shares the reader-journal
replay.  This module is what such a reader uses, and nothing more (``__all__`` is pinned
by ``tests/test_layers.py``, which also refuses any other name imported from here):

* a queue view: what a queue directory is (:func:`queue_dir_problem`), where the queues
  under a directory are (:func:`find_queues`), its ``meta.json`` and stored options
  read without the lock, its segments (ids, watched, and in the order of their contents
  as the owner orders them: ``SegmentDirectory``, from ``segment.layout``);
* entries from an id: ``SegmentTail`` (one segment, with the patience rule), ``LogTail``
  (the whole log, as it grows, across rotations) and ``last_complete_id``, built on the
  one live-tail scanner (``segment.scanner.TailScanner``: it stops at an append or a
  batch still in flight instead of searching past it), and the ``Entry`` values they
  yield with the meaning of their type and flags;
* reader heads: reader state journals replayed whole or incrementally (``JournalTail``,
  ``ReaderState``, ``replay_reader``, ``reader_heads``, ``list_reader_names``);
* message views: the :class:`~ledgerq.Message` a view that does not lease builds from an
  entry (:func:`view_message`, with :func:`view_sealer` for an encrypted queue).

Bytes, file names, index points and scanners are not here: the few outer modules that
genuinely work at that level (the Spark scan decodes entry bytes itself, ``ship`` copies
segments byte for byte) import them from the module that defines them, each named in
their allow-list in ``tests/test_layers.py`` with the reason.

What a reader without the lock may rely on, from the owner's side (``docs/format.md``):

* the owner only appends to a log, one ``write()`` per enqueue or batch, so bytes of a
  log below a size once seen never change - except when the owner's recovery cuts a
  torn tail: an incomplete entry, or the whole entries of a batch whose last entry is
  missing (a reader holds a batch back until its last entry is there);
* a ``write()`` is not atomic for readers: the end of the newest segment may hold the
  first bytes of an entry still being written, which look like damage - a reader waits
  at them for a grace period (``readonly_tail.IN_FLIGHT_GRACE_S``) before searching
  past them;
* ids inside a segment are consecutive, and between segments they only increase; a
  segment file is named after its first entry's id - unless someone renamed, swapped
  or copied files by hand, which ``segment.layout`` detects (by content, never by name);
* a segment is sealed (its last write done) before the next segment's file is created,
  so once a newer ``.log`` exists, the older file's size is final;
* only sealed segments are ever deleted, oldest first, and the active (newest) one only
  when it is empty (a restart replacing it); a segment file name is never reused;
* a sparse index point is written after the entry it names, and the index is a hint:
  a point is trusted only once the entry at its offset checks out;
* reader journals only grow, except that recovery cuts a torn last record and a
  compaction replaces the file whole with one that starts with a CHECKPOINT;
* ``meta.json`` is only ever replaced whole (temp file and rename).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import zstandard

from ledgerq._errors import CorruptionError, IncompatibleFormatError, NotAQueueError
from ledgerq._types import Message
from ledgerq.format.compression import restore_zstd
from ledgerq.format.entry import Entry, EntryFlags, RecordType
from ledgerq.format.errors import CorruptRecord
from ledgerq.format.sealing import EntrySealer
from ledgerq.segment.encryption import sealer_for
from ledgerq.segment.layout import SegmentDirectory
from ledgerq.segment.messages import entry_to_message
from ledgerq.segment.meta import Meta, MetaStore, stored_options
from ledgerq.segment.naming import (
    DLQ_DIR,
    LOG_SUFFIX,
    META_NAME,
    QUEUE_NAMES,
    SEGMENTS_DIR,
    list_reader_names,
    list_segment_ids,
)
from ledgerq.segment.progress import Progress, read_progress
from ledgerq.segment.ratelimit import RateState, read_rate_state
from ledgerq.segment.readonly_state import JournalTail, ReaderState, reader_heads, replay_reader
from ledgerq.segment.readonly_tail import LogTail, SegmentTail, last_complete_id
from ledgerq.segment.watch import DirectoryWatcher, WatchMode, open_watcher

# What a reader of a queue it does not own needs, and nothing more (pinned by
# tests/test_layers.py: a name added here is added there, with a reader that needs it).
__all__ = [
    # a queue view
    "QueueDir",
    "check_queue_dir",
    "find_queues",
    "is_cleanly_closed",
    "is_queue_dir",
    "load_meta",
    "queue_dir_problem",
    "stored_options",
    # its segments
    "DirectoryWatcher",
    "SegmentDirectory",
    "WatchMode",
    "segment_ids",
    "watch_segments",
    # entries from an id
    "Entry",
    "EntryFlags",
    "LogTail",
    "RecordType",
    "SegmentTail",
    "last_complete_id",
    # reader heads
    "JournalTail",
    "ReaderState",
    "list_reader_names",
    "reader_heads",
    "replay_reader",
    # message views
    "MAX_VIEW_PAYLOAD",
    "VIEW_ATTEMPTS",
    "view_message",
    "view_sealer",
    # what the worker pools share (the console and `ledgerq stats` show it)
    "Progress",
    "RateState",
    "read_progress",
    "read_rate_state",
]

logger = logging.getLogger("ledgerq")


# ---------------------------------------------------------------------- queue directories


def queue_dir_problem(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` is not a queue directory, or None when it is one.  Looks only.

    The rule: an existing directory that holds ``meta.json``, or holds ``segments/``
    and nothing a queue does not hold (a first open killed before it wrote its
    ``meta.json`` leaves that; ``ledgerq.open`` takes it up).  It does not read
    ``meta.json``: :func:`check_queue_dir` does, for readers about to read the queue.
    """
    root = os.fspath(path)
    if not os.path.exists(root):
        return f"no queue at {root!r}: the directory does not exist"
    if not os.path.isdir(root):
        return f"{root!r} is not a directory, so not a queue"
    try:
        names = os.listdir(root)
    except OSError as exc:
        return f"{root!r} cannot be listed ({exc.strerror or exc}), so not a usable queue"
    if META_NAME in names:
        return None
    if SEGMENTS_DIR not in names or not os.path.isdir(os.path.join(root, SEGMENTS_DIR)):
        return f"{root!r} is not a ledgerq queue (it has neither {META_NAME} nor {SEGMENTS_DIR}/)"
    foreign = sorted(set(names) - QUEUE_NAMES)
    if foreign:
        return f"{root!r} is not a ledgerq queue (it holds {foreign[:3]} but no {META_NAME})"
    return None


def is_queue_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a queue directory (see :func:`queue_dir_problem`)."""
    return queue_dir_problem(path) is None


def check_queue_dir(path: str | os.PathLike[str]) -> None:
    """Raise unless ``path`` is a queue directory whose ``meta.json`` (if any) is usable.

    Raises :class:`NotAQueueError` (with :func:`queue_dir_problem`'s text, or for an
    unreadable ``meta.json``) and :class:`IncompatibleFormatError` (a newer format).
    """
    problem = queue_dir_problem(path)
    if problem is not None:
        raise NotAQueueError(problem)
    store = MetaStore(os.fspath(path))
    if store.exists():
        store.load()


def load_meta(queue_dir: str) -> Meta:
    """The queue's ``meta.json``, read-only.

    Raises :class:`NotAQueueError` when it is missing or unreadable and
    :class:`IncompatibleFormatError` when it is of a newer format.
    """
    store = MetaStore(queue_dir)
    if not store.exists():
        raise NotAQueueError(f"{queue_dir} is not a usable ledgerq queue (it has no {META_NAME})")
    return store.load()


def is_cleanly_closed(queue_dir: str) -> bool:
    """Whether ``meta.json`` says the queue was closed cleanly (no process has it open)."""
    try:
        return load_meta(queue_dir).clean
    except (NotAQueueError, IncompatibleFormatError):
        return False


@dataclass(frozen=True, slots=True)
class QueueDir:
    """One queue directory found by :func:`find_queues`; ``name`` names it in results."""

    name: str
    path: str


def find_queues(path: str | os.PathLike[str], *, include_dlq: bool) -> list[QueueDir]:
    """The queue directories at or under ``path``, sorted by name.

    ``path`` itself may be a queue (its own name is then the queue name) or a tree of
    queues (names are paths relative to ``path``, with ``/``).  The walk does not go
    into a queue directory (except its ``dlq/`` when ``include_dlq``), skips names
    starting with ``.`` or ``_`` (hidden, and the Spark writer's staging area) and
    follows each directory once.  Raises :class:`NotAQueueError` if ``path`` does not
    exist or is not a directory; an existing directory with no queue yields ``[]``.
    """
    root = os.path.abspath(os.fspath(path))
    if not os.path.exists(root):
        raise NotAQueueError(f"no ledgerq queue at {os.fspath(path)!r}: the path does not exist")
    if not os.path.isdir(root):
        raise NotAQueueError(f"{os.fspath(path)!r} is not a directory, so not a ledgerq queue")
    found: list[QueueDir] = []
    if is_queue_dir(root):
        _add_queue(found, os.path.basename(root.rstrip(os.sep)) or root, root, include_dlq)
    else:
        _walk(root, "", found, set(), include_dlq)
    found.sort(key=lambda q: q.name)
    return found


def _add_queue(found: list[QueueDir], name: str, path: str, include_dlq: bool) -> None:
    found.append(QueueDir(name, path))
    if include_dlq:
        dlq = os.path.join(path, DLQ_DIR)
        if is_queue_dir(dlq):
            _add_queue(found, f"{name}/{DLQ_DIR}", dlq, include_dlq)


def _walk(directory: str, prefix: str, found: list[QueueDir], seen: set[str], dlq: bool) -> None:
    real = os.path.realpath(directory)
    if real in seen:
        return  # a symlink loop, or the same tree reached twice
    seen.add(real)
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return
    for entry in entries:
        if entry.name.startswith((".", "_")):
            continue
        try:
            if not entry.is_dir():
                continue
        except OSError:
            continue
        name = f"{prefix}{entry.name}"
        if is_queue_dir(entry.path):
            _add_queue(found, name, entry.path, dlq)
        else:
            _walk(entry.path, f"{name}/", found, seen, dlq)


# ---------------------------------------------------------------------- segments


def segment_ids(queue_dir: str) -> list[int]:
    """First ids of the queue's segments, in order ([] when it has no ``segments/``)."""
    try:
        return list_segment_ids(os.path.join(queue_dir, SEGMENTS_DIR))
    except FileNotFoundError:
        return []


def watch_segments(queue_dir: str, mode: WatchMode = "auto") -> DirectoryWatcher:
    """A watcher of the queue's segment logs (create it before the first look at them).

    Raises :class:`NotAQueueError` when the queue has no ``segments/`` directory.
    """
    try:
        return open_watcher(os.path.join(queue_dir, SEGMENTS_DIR), mode, suffix=LOG_SUFFIX)
    except FileNotFoundError:
        raise NotAQueueError(
            f"{queue_dir} has no {SEGMENTS_DIR}/ directory (any more); it is not a queue"
        ) from None


# ---------------------------------------------------------------------- views

# What a view that does not lease (``ledgerq.follow``, ``ledgerq dump``) says for
# ``Message.attempts``: 0, no delivery.  A view delivers nothing, and knows nothing of
# any reader's deliveries; 1 would claim a first delivery that no reader counted.
VIEW_ATTEMPTS = 0
# A view has no max_message_size of its own; this bounds what a (damaged) zstd frame may
# decompress to, like the queue does with its option.
MAX_VIEW_PAYLOAD = 1 << 30
_COMPRESSED = int(EntryFlags.COMPRESSED)
_ENCRYPTED = int(EntryFlags.ENCRYPTED)
_RESTORED = _COMPRESSED | _ENCRYPTED  # the stored payload is not the message as is
_DATA = int(RecordType.DATA)
_local = threading.local()  # one zstd decompressor per thread (they are not thread-safe)


def _decompressor() -> zstandard.ZstdDecompressor:
    dctx: zstandard.ZstdDecompressor | None = getattr(_local, "dctx", None)
    if dctx is None:
        dctx = _local.dctx = zstandard.ZstdDecompressor()
    return dctx


def view_sealer(queue_dir: str, key: bytes | None) -> EntrySealer | None:
    """The sealer a view of the queue at ``queue_dir`` opens its entries with (None for a
    plain queue).  Raises :class:`ConfigError` for an encrypted queue without its key, or
    with another, and for a plain queue given a key; :class:`NotAQueueError` without a
    usable ``meta.json``."""
    return sealer_for(load_meta(queue_dir).encryption, key, queue_dir)


def _restore(entry: Entry, path: str, sealer: EntrySealer | None) -> tuple[Entry, bytes] | None:
    """``entry`` opened (sealed) and its payload decompressed, or None (logged) when
    that cannot be done: see :func:`view_message`."""
    if sealer is not None:  # an encrypted queue: every entry must open (unsealed: corrupt)
        try:
            entry = sealer.open(entry)
        except CorruptRecord as exc:
            problem = str(exc).removesuffix(" at offset 0")
            logger.warning("ledgerq: skipping message %d in %s: %s", entry.id, path, problem)
            return None
    elif entry.flags & _ENCRYPTED:
        logger.warning(
            "ledgerq: skipping message %d in %s: it is encrypted and no key was given",
            entry.id,
            path,
        )
        return None
    payload = entry.payload
    if entry.flags & _COMPRESSED:
        try:
            payload = restore_zstd(
                payload, MAX_VIEW_PAYLOAD, message_id=entry.id, decompressor=_decompressor()
            )
        except CorruptionError as exc:
            logger.warning("ledgerq: skipping message %d in %s: %s", entry.id, path, exc)
            return None
    return entry, payload


def view_message(entry: Entry, path: str, sealer: EntrySealer | None = None) -> Message | None:
    """The :class:`Message` a view yields for ``entry`` read from the log ``path``.

    Its stored fields, the payload opened (``sealer``, for an encrypted queue: see
    :func:`view_sealer`) and decompressed, and ``attempts`` = :data:`VIEW_ATTEMPTS`.
    None for an entry of a reserved record type (no message), and - with a warning on
    the ``ledgerq`` logger - when the payload cannot be opened (no key, or it fails
    authentication), when an encrypted queue's entry is not sealed (``sealer`` given:
    a forgery, or a stripped seal) or when it fails to decompress: the view skips that
    message as the queue would.
    """
    if entry.type != _DATA:
        return None
    if entry.flags & _RESTORED or sealer is not None:
        opened = _restore(entry, path, sealer)
        if opened is None:
            return None
        entry, payload = opened
    else:  # the common entry: its payload is the message's
        payload = entry.payload
    return entry_to_message(entry, VIEW_ATTEMPTS, payload)
