"""Dedup window: an enqueue whose ``dedup_id`` was seen within ``dedup_window``
seconds adds nothing and returns the original message's id.

The table maps the xxh3-128 hash of the dedup id (16 bytes: collisions are not
a practical concern) to the original id and the window's end.  The window is the
same for every entry, so insertion order is expiry order: an ``OrderedDict``
gives oldest-expiry eviction (when ``dedup_max_entries`` is reached) and lazy
cleanup of expired entries from its front, on the enqueue path, with no thread.

The table is persisted in ``features/dedup.log`` (framed msgpack records
``[hash, id, expires_ns]``), appended after the message itself is written - a
crash between the two can let one retry through (at-least-once), never lose a
message - and rewritten when it holds twice the live entries.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import xxhash

from ledgerq._options import Options
from ledgerq.core.feature import Draft, Feature
from ledgerq.format.errors import DecodeError
from ledgerq.format.feature_state import (
    decode_feature_file,
    encode_feature_file_header,
    encode_feature_record,
)
from ledgerq.segment.files import (
    StorageError,
    make_durable_dir,
    replace_and_open,
    storage_errors,
    write_all,
)
from ledgerq.segment.naming import FEATURES_DIR

if TYPE_CHECKING:
    from ledgerq.core.queue import QueueCore

__all__ = ["DedupFeature", "dedup_key"]

_MAGIC = b"LQDD"
_NS = 1_000_000_000
_KEY_SIZE = 16  # an xxh3-128 digest (dedup_key)


def dedup_key(dedup_id: str | bytes) -> bytes:
    """The 16-byte table key of a dedup id (str and bytes ids never collide)."""
    raw = b"s" + dedup_id.encode("utf-8") if isinstance(dedup_id, str) else b"b" + dedup_id
    return xxhash.xxh3_128_digest(raw)


def _table_record(value: Any) -> tuple[bytes, int, int] | None:
    """``(key, id, expires_ns)`` of a decoded ``dedup.log`` record; None if it is not one.

    Exact types only, checked before anything is converted: the file may be damaged
    or hostile, and coercing its values is how a stray int became ``bytes(n)`` (n
    zero bytes) and a float infinity an ``OverflowError``.
    """
    if type(value) is not list or len(value) != 3:
        return None
    key, message_id, expires_ns = value
    if type(key) is not bytes or len(key) != _KEY_SIZE:
        return None
    if type(message_id) is not int or type(expires_ns) is not int:
        return None
    return key, message_id, expires_ns


class DedupFeature(Feature):
    """Remember dedup ids for a window; answer repeats with the original id."""

    name = "dedup"

    def __init__(self, options: Options) -> None:
        assert options.dedup_window is not None
        self._window_ns = int(options.dedup_window * _NS)
        self._max_entries = options.dedup_max_entries
        self._table: OrderedDict[bytes, tuple[int, int]] = OrderedDict()
        self._provisional: list[bytes] = []
        self._path = ""
        self._fd: int | None = None
        self._records = 0

    def attach(self, queue: QueueCore) -> None:
        directory = os.path.join(queue.path, FEATURES_DIR)
        make_durable_dir(directory)
        self._path = os.path.join(directory, "dedup.log")
        values: list[Any] = []
        if os.path.exists(self._path):
            with open(self._path, "rb") as f:
                try:
                    values, _ = decode_feature_file(f.read(), _MAGIC)
                except DecodeError:
                    values = []  # unreadable: start an empty window (at-least-once holds)
        for value in values:
            record = _table_record(value)
            if record is None:
                continue  # not a record this library writes: corrupt, skip it
            key, message_id, expires_ns = record
            self._table[key] = (message_id, expires_ns)
            self._table.move_to_end(key)
        self._rewrite()

    def _rewrite(self) -> None:
        blob = encode_feature_file_header(_MAGIC) + b"".join(
            encode_feature_record([key, mid, exp]) for key, (mid, exp) in self._table.items()
        )
        replace_and_open(self._path, blob, self._adopt)
        self._records = len(self._table)

    def _adopt(self, fd: int) -> None:
        """Append to ``fd``, the rewritten file, from now on."""
        old, self._fd = self._fd, fd
        if old is not None:
            os.close(old)

    def _expire(self, now_ns: int) -> None:
        table = self._table
        while table:
            key = next(iter(table))
            if table[key][1] > now_ns and len(table) <= self._max_entries:
                break
            del table[key]

    def admit(self, draft: Draft, now_ns: int, candidate_id: int) -> int | None:
        if draft.dedup_id is None:
            return None
        self._expire(now_ns)
        key = dedup_key(draft.dedup_id)
        hit = self._table.get(key)
        if hit is not None and hit[1] > now_ns:
            return hit[0]
        self._table[key] = (candidate_id, now_ns + self._window_ns)
        self._table.move_to_end(key)
        self._provisional.append(key)
        return None

    def rollback(self) -> None:
        for key in self._provisional:
            self._table.pop(key, None)
        self._provisional.clear()

    def appended(self, drafts: list[Draft], first_id: int, now_ns: int) -> None:
        if not self._provisional:
            return
        blob = b"".join(
            encode_feature_record([key, *self._table[key]])
            for key in self._provisional
            if key in self._table
        )
        self._provisional.clear()
        assert self._fd is not None
        try:
            write_all(self._fd, blob)
        except OSError as exc:
            raise StorageError("write dedup state", self._path, exc) from exc
        self._records += 1
        if len(self._table) > self._max_entries:
            self._expire(now_ns)
        if self._records > 2 * len(self._table) + 1024:
            self._rewrite()

    def flush(self) -> None:
        if self._fd is not None:
            with storage_errors("sync dedup state", self._path):
                os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def stats(self, counters: dict[str, Any]) -> None:
        counters["dedup_entries"] = len(self._table)
