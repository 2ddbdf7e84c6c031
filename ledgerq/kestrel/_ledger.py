"""``kestrel-import.keys``: which Kestrel items a destination queue holds already.

Every imported message carries a stable key in its ``kestrel.import_key`` header, and
the destination directory keeps one line ``<id> <key>`` per imported message,
appended and fsynced after the messages themselves are durable.  A run skips every key
found there, or found in the destination's log after the last id the file records (a
run killed between the two steps).
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter

import ledgerq
from ledgerq.kestrel._types import KestrelItem

__all__ = ["KEY_HEADER", "LEDGER_NAME", "ImportLedger", "item_key"]

LEDGER_NAME = "kestrel-import.keys"
KEY_HEADER = "kestrel.import_key"


def item_key(prefix: str, item: KestrelItem, seen: Counter[str]) -> str:
    """The stable key of ``item``: ``<prefix>:<id>`` (Kestrel 3) or a hash and a count.

    Old journals have no ids: the key hashes the add time, the expiry and the payload,
    and ``seen`` counts identical items in replay order to tell them apart.
    """
    if item.item_id is not None:
        return f"{prefix}:{item.item_id}"
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{item.add_time_ms}|{item.expire_time_ms}|".encode())
    digest.update(item.data)
    base = digest.hexdigest()
    seen[base] += 1
    return f"{prefix}:{base}:{seen[base] - 1}"


def _fsync_dir(path: str) -> None:
    # The ledger's directory entry must survive a power cut as the file's content does.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ImportLedger:
    """The keys imported into the queue in directory ``dest``, and the id each became."""

    def __init__(self, dest: str) -> None:
        self.dest = dest
        self.path = os.path.join(dest, LEDGER_NAME)
        self.keys: dict[str, int] = {}
        self.max_id = 0

    def load(self) -> None:
        """Read the file, cutting a torn last line, then find keys logged after it."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            # A torn last line (a run killed mid-append): cut it so appends stay whole.
            with open(self.path, "r+b") as f:
                f.truncate(complete)
                os.fsync(f.fileno())
        for line in data[:complete].splitlines():
            number, _, key = line.decode("utf-8", "replace").partition(" ")
            if number.isdigit() and key:
                self._add(key, int(number))
        self._catch_up()

    def _add(self, key: str, message_id: int) -> None:
        self.keys[key] = message_id
        self.max_id = max(self.max_id, message_id)

    def append(self, pairs: list[tuple[str, int]]) -> None:
        """Record ``pairs`` of (key, id) durably (the messages must already be durable)."""
        if not pairs:
            return
        created = not os.path.exists(self.path)
        blob = "".join(f"{mid} {key}\n" for key, mid in pairs).encode("utf-8")
        with open(self.path, "ab") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        if created:
            _fsync_dir(self.dest)
        for key, mid in pairs:
            self._add(key, mid)

    def _catch_up(self) -> None:
        """Record keys in the log after the last recorded id (a run killed before recording)."""
        found = []
        with ledgerq.follow(self.dest, from_id=self.max_id + 1, timeout=0) as messages:
            for message in messages:
                key = message.headers.get(KEY_HEADER)
                if key and key not in self.keys:
                    found.append((key, message.id))
        self.append(found)
