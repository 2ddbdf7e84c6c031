"""Temporary queues: the ones kombu declares ``auto_delete`` or with an expiry.

AMQP deletes an ``auto_delete`` queue when its last consumer goes away, and a queue
declared with ``x-expires`` once it has been unused that long.  Celery declares its
client-side queues so - the ``rpc://`` result backend's reply queue (one per client
process, named by a UUID), ``celery inspect``'s reply queue, an event monitor's queue -
and a directory broker that kept them would keep one directory per client forever.

So the transport records each such queue it declares, with the declaring process and
the expiry, as a small file ``<root>/temporary/<queue>.json`` (written by rename); it
removes the queue when this process stops consuming it (a cancel, the connection's
close, the interpreter's exit), and any process that connects removes the temporary
queues whose declaring process is dead - ``auto_delete`` ones at once, others once
their expiry has passed since they were declared.  A queue another process has open is
never removed (it is someone's again); its record stays for the next look.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import NamedTuple

from ledgerq.celery._names import check_name
from ledgerq.celery._owners import process_is_alive

__all__ = ["TemporaryQueue", "TemporaryQueues"]

DIR = "temporary"


class TemporaryQueue(NamedTuple):
    """One record: the queue, the process it lives for, and how it ends."""

    queue: str
    owner_pid: int
    auto_delete: bool
    expires_s: float | None
    declared_at: float


class TemporaryQueues:
    """The records of one broker directory (``<root>/temporary``)."""

    def __init__(self, root: str) -> None:
        self.directory = os.path.join(root, DIR)

    def _path(self, queue: str) -> str:
        return os.path.join(self.directory, check_name("queue", queue) + ".json")

    def record(self, queue: str, *, auto_delete: bool, expires_s: float | None) -> None:
        """Note that this process declared ``queue`` as temporary."""
        os.makedirs(self.directory, exist_ok=True)
        path = self._path(queue)
        temporary = f"{os.path.join(self.directory, '.')}{queue}.{os.getpid()}.tmp"
        entry = {
            "queue": queue,
            "owner_pid": os.getpid(),
            "auto_delete": auto_delete,
            "expires_s": expires_s,
            "declared_at": time.time(),
        }
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(entry, file)
        os.replace(temporary, path)

    def forget(self, queue: str) -> None:
        """Drop the record of ``queue`` (removed, or declared durable since)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(queue))

    def read(self, queue: str) -> TemporaryQueue | None:
        """The record of ``queue`` (None: none, or unreadable)."""
        try:
            with open(self._path(queue), "rb") as file:
                data = json.load(file)
            expires = data["expires_s"]
            return TemporaryQueue(
                str(data["queue"]),
                int(data["owner_pid"]),
                bool(data["auto_delete"]),
                None if expires is None else float(expires),
                float(data["declared_at"]),
            )
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def stale(self, now: float | None = None) -> list[str]:
        """The temporary queues due for removal: their process is dead, and they are
        ``auto_delete`` or their expiry has passed."""
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []
        now = time.time() if now is None else now
        due = []
        for name in names:
            if name.startswith(".") or not name.endswith(".json"):
                continue
            entry = self.read(name[: -len(".json")])
            if entry is None or process_is_alive(entry.owner_pid):
                continue
            expired = entry.expires_s is not None and now - entry.declared_at >= entry.expires_s
            if entry.auto_delete or expired:
                due.append(entry.queue)
        return due
