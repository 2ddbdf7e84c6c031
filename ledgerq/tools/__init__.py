"""Operator tools over the files of a queue: ``verify``, ``repair`` and a log walk.

:func:`verify` reads every byte a queue keeps - the CRC of every entry in every
segment, every sparse index against its log, every reader's state journal and
``meta.json`` - and reports each problem with its file and byte offset, and checks the
segment files against each other by their contents (``segment.layout``): a misnamed
file, a copy or overlap, and ids missing between segments that the queue did not leave
out on purpose.  It takes no
lock and writes nothing, so it can run beside the process that owns the queue (then a
torn tail at the very end of the newest segment or of a journal may be a write still in
flight; verify a closed queue for an exact answer).  The dead-letter queue in ``dlq/``
is a queue of the same format and is checked the same way.

:func:`repair` is the only function here that writes.  It takes the queue's lock by
opening it with :func:`ledgerq.open` - whose recovery cuts a torn tail of the newest
segment and of reader journals, and rebuilds the index of a sealed segment that fails
its check - then rebuilds, under the lock, any index that is still wrong, renames a
misnamed segment file to its content's name, moves a copy into ``segments/damaged/``,
records ids no file holds any more as known lost, and verifies again.  It never deletes
a valid entry: a corrupt entry in the middle of a log stays (and stays reported);
readers skip it.

:func:`iter_messages` walks the retained log read-only (``ledgerq dump``).

:func:`read_key_file` and :func:`key_from_bytes` read an encryption key the way every
way in takes one from a file (``--key-file``, ``serve --encryption-key-file``, the
Celery transport's ``encryption_key_file``).

This module is their one public face; each tool lives in a private module of its own
(``_verify.py`` with ``_verify_log.py`` and ``_verify_report.py``, ``_repair.py``,
``_log_walk.py``, ``_dead_letters.py``, ``_key_file.py``, ``_rekey.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from ledgerq._public import publish
from ledgerq._queue import Queue
from ledgerq._rekey import rekey
from ledgerq._types import PeriodicJob
from ledgerq.core.reader_handle import Reader
from ledgerq.features.periodic import read_jobs
from ledgerq.segment.naming import DLQ_DIR
from ledgerq.segment.readonly import queue_dir_problem
from ledgerq.tools._dead_letters import (
    DEAD_LETTER_HEADERS,
    DeadLetterFilter,
    paced,
    parse_header_condition,
    requeue_dead_letters,
)
from ledgerq.tools._key_file import KEY_SIZE, KeyFileError, key_from_bytes, read_key_file
from ledgerq.tools._log_walk import iter_messages
from ledgerq.tools._log_walk import (
    unauthentic_ids as unauthentic_ids,  # for `ledgerq verify --key-file`
)
from ledgerq.tools._repair import repair
from ledgerq.tools._verify import verify
from ledgerq.tools._verify_report import (
    CORRUPT_ENTRY,
    CORRUPT_TAIL,
    GAP,
    ID_ORDER,
    INDEX,
    META,
    MISNAMED,
    OVERLAP,
    READER_STATE,
    READER_STATE_TAIL,
    TORN_TAIL,
    UNSEALED,
    Problem,
    RepairReport,
    VerifyReport,
)

__all__ = [
    "CORRUPT_ENTRY",
    "CORRUPT_TAIL",
    "DEAD_LETTER_HEADERS",
    "GAP",
    "ID_ORDER",
    "INDEX",
    "KEY_SIZE",
    "META",
    "MISNAMED",
    "OVERLAP",
    "READER_STATE",
    "READER_STATE_TAIL",
    "TORN_TAIL",
    "UNSEALED",
    "DeadLetterFilter",
    "KeyFileError",
    "Problem",
    "RepairReport",
    "VerifyReport",
    "create_reader",
    "has_dlq",
    "iter_messages",
    "key_from_bytes",
    "not_a_queue",
    "paced",
    "parse_header_condition",
    "periodic_jobs",
    "read_key_file",
    "rekey",
    "repair",
    "requeue_dead_letters",
    "verify",
]


def periodic_jobs(path: str | os.PathLike[str]) -> list[PeriodicJob]:
    """The periodic jobs of the queue at ``path`` (name, schedule, next and last run),
    read without its lock: it works beside the processes that have the queue open.

    A snapshot of ``features/periodic.log``; a tick being fired right now may show as
    fired.  On an encrypted queue the payload and headers of each job are not read
    (``b""``, ``{}``): they are sealed with the queue's key.  ``[]`` for a queue
    without periodic jobs.
    """
    return read_jobs(os.fspath(path))


# ---------------------------------------------------------------------- looking


def not_a_queue(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` is not an existing queue directory, or None when it is one.

    Looks only; creates nothing (``ledgerq.open`` would create a missing queue).  The
    rule is ``ledgerq.segment.readonly.queue_dir_problem``'s, shared by every reader.
    """
    return queue_dir_problem(path)


def has_dlq(path: str | os.PathLike[str]) -> bool:
    """Whether the queue at ``path`` has a dead-letter queue (``q.dlq`` would create one)."""
    return os.path.isdir(os.path.join(os.fspath(path), DLQ_DIR))


# ---------------------------------------------------------------------- creating a reader


def create_reader(queue: Queue, name: str, *, head: int, done: Iterable[int] = ()) -> Reader:
    """Create the reader ``name`` of the open ``queue`` at a given position and return it.

    Every message below ``head`` counts as done for it, and so does every id in
    ``done``; it delivers the others from ``head`` on.  This is how an importer or a
    migration gives a reader the state it had elsewhere (``ledgerq import-kestrel``
    creates a Kestrel reader's twin with it).  ``head`` runs from 1 to the queue's
    next id (``queue.stats().next_id``: a reader at the tail); each ``done`` id lies
    above ``head`` and below the next id.  A ``head`` below the oldest retained
    message starts there.

    Durable when it returns: the reader's state file is written, fsynced and renamed
    into place, and its directory fsynced.  Raises ``ValueError`` when the reader
    exists already (its state is never replaced), for an invalid name and for an id
    out of bounds; ``TypeError`` for an id that is not an int; ``QueueClosedError``
    on a closed queue.
    """
    return queue._create_reader(name, head, done)


publish(__name__, globals(), __all__)  # (the names defined in private modules)
