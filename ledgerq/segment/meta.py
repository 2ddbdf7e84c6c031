"""``meta.json``: the queue's format version, id reservation and queue-wide counters.

The file is JSON (``docs/format.md`` lists its fields; a test keeps the two in step).
It is read by the queue when it opens and by every reader that works without the
queue's lock (``ledgerq.segment.readonly``), and replaced atomically (temp file, fsync,
rename, fsync of the directory) - so a reader sees the old file or the new one.
Why ids are *reserved* through it is explained in ``ledgerq.core.meta``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ledgerq._errors import IncompatibleFormatError, NotAQueueError
from ledgerq.segment.files import atomic_write
from ledgerq.segment.naming import META_NAME

__all__ = ["FORMAT_VERSION", "Meta", "MetaStore", "stored_options"]

FORMAT_VERSION = 1


@dataclass
class Meta:
    """The content of ``meta.json``."""

    format: str = "ledgerq"
    version: int = FORMAT_VERSION
    created_ns: int = field(default_factory=time.time_ns)
    clean: bool = True
    next_id: int = 1
    reserved_until: int = 1
    counters: dict[str, int] = field(default_factory=dict)
    corrupt_regions: list[list[int]] = field(default_factory=list)
    options: dict[str, object] = field(default_factory=dict)
    # Ids between segments (see segment.layout): ``gaps`` the queue left out on purpose
    # (recorded before the segment that makes the gap exists), from ``gaps_from`` on
    # (None: a queue of an older ledgerq, whose gaps below the id it first opened at
    # were never recorded); ``lost`` the ranges found missing and counted (once) in
    # counters["lost"]; ``known_lost`` those a repair accepted as lost (no more alarms).
    gaps: list[list[int]] = field(default_factory=list)
    gaps_from: int | None = 1
    lost: list[list[int]] = field(default_factory=list)
    known_lost: list[list[int]] = field(default_factory=list)


def stored_options(directory: str) -> dict[str, object]:
    """The options a queue was last opened with ({} for a new or unreadable queue)."""
    store = MetaStore(directory)
    if not store.exists():
        return {}
    try:
        return store.load().options
    except (NotAQueueError, IncompatibleFormatError):
        return {}  # open() itself reports these


def _pairs(value: object) -> list[list[int]]:
    """The ``[int, int]`` pairs of a JSON array (anything else in it is dropped)."""
    if not isinstance(value, list):
        return []
    return [
        [int(r[0]), int(r[1])]
        for r in value
        if isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r)
    ]


class MetaStore:
    """Reads and durably replaces ``meta.json``; safe to call from several threads."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, META_NAME)
        self._lock = threading.Lock()

    def exists(self) -> bool:
        """Whether the directory has a meta file."""
        return os.path.exists(self.path)

    def load(self) -> Meta:
        """Read and validate the meta file."""
        try:
            with open(self.path, "rb") as f:
                raw: Any = json.loads(f.read())
        except (OSError, ValueError, RecursionError) as exc:
            # RecursionError: json nests arrays and objects on the C stack, so a damaged
            # or hostile file of a thousand "[" is bad JSON like any other.
            raise NotAQueueError(
                f"{self.path} is unreadable ({exc}); this is not a usable ledgerq queue"
            ) from exc
        if not isinstance(raw, dict) or raw.get("format") != "ledgerq":
            raise NotAQueueError(f"{self.path} is not a ledgerq meta file")
        version = raw.get("version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise IncompatibleFormatError(
                f"queue at {os.path.dirname(self.path)} has format version {version!r}; this "
                f"ledgerq reads version {FORMAT_VERSION} and older - upgrade ledgerq to open it"
            )
        meta = Meta()
        for key in ("created_ns", "next_id", "reserved_until"):
            if isinstance(raw.get(key), int):
                setattr(meta, key, raw[key])
        meta.clean = bool(raw.get("clean", False))
        counters = raw.get("counters", {})
        if isinstance(counters, dict):
            meta.counters = {str(k): int(v) for k, v in counters.items() if isinstance(v, int)}
        stored = raw.get("options", {})
        if isinstance(stored, dict):
            meta.options = {str(k): v for k, v in stored.items()}
        meta.corrupt_regions = _pairs(raw.get("corrupt_regions"))
        gaps_from = raw.get("gaps_from")
        meta.gaps_from = gaps_from if type(gaps_from) is int else None
        meta.gaps = _pairs(raw.get("gaps"))
        meta.lost = _pairs(raw.get("lost"))
        meta.known_lost = _pairs(raw.get("known_lost"))
        return meta

    def save(self, meta: Meta) -> None:
        """Durably replace the meta file (temp file, fsync, rename, fsync dir)."""
        data = json.dumps(asdict(meta), sort_keys=True, indent=1).encode()
        with self._lock:
            atomic_write(self.path, data, durable=True)
