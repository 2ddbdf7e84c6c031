"""The queues the console serves: found under its root, named by relative path.

A request names a queue by the name the console gave it (its path relative to the
root, or the root's own name when the root is a queue), and :meth:`Catalog.get`
answers only names that the last walk of the root found.  No part of a request ever
becomes part of a file path: nothing outside the root can be reached, whatever the
name says (``..``, absolute paths, symlinks out are all just unknown names).
"""

from __future__ import annotations

import os
import threading
import time

import ledgerq
from ledgerq.segment.readonly import find_queues
from ledgerq.ui._figures import QueueFigures, QueueFiles
from ledgerq.ui._history import KEEP_S, History

__all__ = ["Catalog"]

REDISCOVER_S = 5.0  # how old a walk of the root may be before a listing walks again
FRESH_S = 1.0  # figures younger than this are served as they are


class Catalog:
    """The queues under ``root``, their followed files and their history.

    ``encryption_key``: the console's key, which each encrypted queue is read with
    (a plain queue never gets it: ``QueueFiles``).
    """

    def __init__(
        self, root: str, *, history_s: float = KEEP_S, encryption_key: bytes | None = None
    ) -> None:
        self.root = os.path.abspath(root)
        self._key = encryption_key
        self.history = History(history_s)
        self._files: dict[str, QueueFiles] = {}
        self._figures: dict[str, QueueFigures] = {}
        self._changed_at: dict[str, float] = {}  # when the console last changed a queue
        self._walked_at = -REDISCOVER_S
        self._lock = threading.Lock()

    def names(self, *, rediscover: bool = False) -> list[str]:
        """The queue names, sorted; walks the root again when the last walk is old."""
        with self._lock:
            stale = time.monotonic() - self._walked_at >= REDISCOVER_S
            if rediscover or stale:
                self._walk()
            return sorted(self._files)

    def get(self, name: str) -> QueueFiles | None:
        """The files of the queue called ``name``; None when no walk found it (one more
        walk is made first, for a queue created since: a walk costs what the overview
        costs, one directory listing per directory of the tree)."""
        with self._lock:
            files = self._files.get(name)
            if files is None:
                self._walk()
                files = self._files.get(name)
            return files

    def figures(self, name: str, *, max_age_s: float = FRESH_S) -> QueueFigures | None:
        """The figures of ``name``: reused when younger than ``max_age_s``, else read
        now (and sampled into the history)."""
        files = self.get(name)
        if files is None:
            return None
        known = self._figures.get(name)
        if (
            known is not None
            and time.time() - known.taken_at < max_age_s
            and known.taken_at > self._changed_at.get(name, 0.0)
        ):
            return known
        fresh = files.figures()
        self._figures[name] = fresh
        self.history.add(name, fresh)
        return fresh

    def changed(self, name: str) -> None:
        """The console changed the queue ``name`` (an action): figures read before now
        are not reused, even within their second - also those of a reading under way,
        which started before the change."""
        self._changed_at[name] = time.time()

    def sample_all(self) -> None:
        """Read the figures of every queue whose last reading is older than a second."""
        for name in self.names():
            self.figures(name)

    def _walk(self) -> None:
        try:
            found = {q.name: q.path for q in find_queues(self.root, include_dlq=False)}
        except ledgerq.NotAQueueError:
            found = {}  # the root itself went away: nothing to serve until it is back
        for name in set(self._files) - set(found):
            del self._files[name]
            self._figures.pop(name, None)
        for name, path in found.items():
            known = self._files.get(name)
            if known is None or known.path != path:
                self._files[name] = QueueFiles(path, encryption_key=self._key)
        self.history.forget(set(found))
        self._walked_at = time.monotonic()
