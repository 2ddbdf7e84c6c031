"""``meta.json``: the queue's format version, id reservation and queue-wide counters;
``options.json``: a second copy of the stored options.

The files are JSON (``docs/format.md`` lists their fields; a test keeps the two in
step).  ``meta.json`` is read by the queue when it opens and by every reader that works
without the queue's lock (``ledgerq.segment.readonly``), and replaced atomically (temp
file, fsync, rename, fsync of the directory) - so a reader sees the old file or the new
one.

Ids are never reused, even when a power cut loses entries whose ids were already
returned.  So ids are *reserved* in blocks of :data:`ID_BLOCK`: before handing out an id
at or past ``reserved_until``, the queue durably records a new ``reserved_until`` a
block further on (``QueueCore._reserve_ids``).  After an unclean shutdown the next id is
at least ``reserved_until``; after a clean close it is exactly ``next_id``.

``meta.json`` is rewritten often (every id block, every open and close); a file
rewritten often is the one a full disk, a careless script or a bad restore damages.
Losing it must not lose the options the application set (``max_retries``, dedup, ...):
``options.json`` holds them too, written only when they change, and is what a lost or
damaged ``meta.json`` is rebuilt with (``segment.meta_rebuild``).
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
from ledgerq.segment.naming import (
    META_NAME,
    OPTIONS_NAME,
    READERS_DIR,
    SEGMENTS_DIR,
    STATE_SUFFIX,
    parse_log_name,
)

__all__ = [
    "DELIVER_AT_VERSION",
    "ID_BLOCK",
    "ENCRYPTED_VERSION",
    "FORMAT_VERSION",
    "NEWEST_VERSION",
    "OPTIONS_FORMAT",
    "OPTIONS_VERSION",
    "DamagedMetaError",
    "Meta",
    "MetaStore",
    "OptionsCopy",
    "OptionsStore",
    "encode_meta",
    "holds_queue_data",
    "stored_options",
]

# Version 2: entries, reader journals and feature logs checksummed with CRC-32C.  A
# queue's meta.json says 2 from the first open by a ledgerq that writes format 2 (before
# it appends anything), so an older ledgerq - and its follow, ship and Spark, which read
# meta.json first - refuses the queue ("upgrade ledgerq") instead of taking every new
# record for damage.  Version 1 queues are read, and appended to, as they are.
FORMAT_VERSION = 2
OPTIONS_FORMAT = "ledgerq-options"
OPTIONS_VERSION = 1  # options.json did not change with format 2: older ledgerqs use it
OPTIONS_ENCRYPTED_VERSION = 2  # options.json of an encrypted queue (with ``encryption``)
# Delayed and grouped entries (issue 17) are format 2 only: a queue holding one says
# version 2, written at the first open, like every queue this ledgerq opened
# (``ledgerq verify`` reports one under version 1).
DELIVER_AT_VERSION = 2
# Version 3: an encrypted queue (issue 18): meta.json holds an ``encryption`` object (the
# queue's identity and key check) and the segments ENCRYPTED entries.  Only encrypted
# queues say 3 - a plain queue stays version 2, open to a format 2 ledgerq - so an older
# ledgerq (and its follow, ship, Spark) refuses an encrypted queue rather than taking
# its sealed entries for damage, or rewriting meta.json without the key check.
ENCRYPTED_VERSION = 3
NEWEST_VERSION = ENCRYPTED_VERSION  # the newest version this ledgerq reads

ID_BLOCK = 1 << 20  # ids reserved ahead at a time (see the module's docstring)


class DamagedMetaError(NotAQueueError):
    """``meta.json`` exists but its content is not a ledgerq meta file (cut, garbage);
    ``reason`` says what is wrong with it."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path} is damaged ({reason}); this is not a usable ledgerq queue")
        self.reason = reason


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
    # An encrypted queue's cipher, identity and key check (segment.encryption); {} when
    # the queue is plain.  Never the key.
    encryption: dict[str, str] = field(default_factory=dict)


@dataclass
class OptionsCopy:
    """The content of ``options.json``: the stored options, and when the queue was made.

    An encrypted queue's ``encryption`` object is copied here too (a queue whose
    meta.json is lost must not lose its identity: its entries could never be opened
    again); the file is then version 2, which an older ledgerq takes for a missing copy.
    """

    format: str = OPTIONS_FORMAT
    version: int = OPTIONS_VERSION
    created_ns: int = 0
    options: dict[str, object] = field(default_factory=dict)
    encryption: dict[str, str] = field(default_factory=dict)


def stored_options(directory: str) -> dict[str, object]:
    """The options a queue was last opened with ({} for a new or unreadable queue).

    From ``meta.json``, or from ``options.json`` when ``meta.json`` is missing or
    damaged (the queue then rebuilds ``meta.json`` with them, or refuses to open).
    """
    store = MetaStore(directory)
    try:
        if store.exists():
            return store.load().options
    except IncompatibleFormatError:
        return {}  # open() itself reports it
    except DamagedMetaError:
        pass
    except NotAQueueError:
        return {}
    copy = OptionsStore(directory).load()
    return copy.options if copy is not None else {}


def holds_queue_data(directory: str) -> bool:
    """Whether ``directory`` holds messages or reader state: a segment log that is not
    empty, or a reader state file (what a first open killed early never leaves)."""
    segments = os.path.join(directory, SEGMENTS_DIR)
    try:
        with os.scandir(segments) as entries:
            for entry in entries:
                if parse_log_name(entry.name) is not None and entry.stat().st_size > 0:
                    return True
    except FileNotFoundError:
        pass
    try:
        names = os.listdir(os.path.join(directory, READERS_DIR))
    except FileNotFoundError:
        return False
    return any(name.endswith(STATE_SUFFIX) for name in names)


class OptionsStore:
    """Reads and durably replaces ``options.json`` (rarely: when the options change)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, OPTIONS_NAME)

    def load(self) -> OptionsCopy | None:
        """The copy, or None when it is missing or not a valid options file."""
        try:
            with open(self.path, "rb") as f:
                raw: Any = json.loads(f.read())
        except (OSError, ValueError, RecursionError):
            return None
        if not isinstance(raw, dict) or raw.get("format") != OPTIONS_FORMAT:
            return None
        version, created, options = raw.get("version"), raw.get("created_ns"), raw.get("options")
        if (
            type(version) is not int
            or version > OPTIONS_ENCRYPTED_VERSION
            or not isinstance(options, dict)
        ):
            return None
        return OptionsCopy(
            version=version,
            created_ns=created if type(created) is int else 0,
            options={str(k): v for k, v in options.items()},
            encryption=_encryption_block(raw.get("encryption")),
        )

    def save(self, copy: OptionsCopy) -> None:
        """Durably replace the file (temp file, fsync, rename, fsync dir)."""
        raw = asdict(copy)
        if copy.encryption:
            raw["version"] = OPTIONS_ENCRYPTED_VERSION
        else:
            del raw["encryption"]  # a plain queue's file stays as older ledgerqs wrote it
        atomic_write(self.path, json.dumps(raw, sort_keys=True, indent=1).encode())


_ENCRYPTION_KEYS = ("cipher", "key_check", "queue_id")


def _encryption_block(value: object) -> dict[str, str]:
    """The ``encryption`` object of a file: {} when absent; kept as read when it has the
    expected keys as strings (segment.encryption checks their content), else {"damaged":
    ...} so that the queue is refused rather than taken for a plain one."""
    if value is None or value == {}:
        return {}
    if isinstance(value, dict) and all(type(value.get(k)) is str for k in _ENCRYPTION_KEYS):
        block = {k: value[k] for k in _ENCRYPTION_KEYS}
        for optional in ("rekey_to", "digest_key"):  # (ledgerq rekey: in progress, done)
            if optional in value:
                block[optional] = str(value[optional])
        return block
    return {"damaged": "true"}


def _pairs(value: object) -> list[list[int]]:
    """The ``[int, int]`` pairs of a JSON array (anything else in it is dropped)."""
    if not isinstance(value, list):
        return []
    return [
        [int(r[0]), int(r[1])]
        for r in value
        if isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r)
    ]


def encode_meta(meta: Meta) -> bytes:
    """The bytes of ``meta.json`` for ``meta``.

    The version says what the file holds: 3 with an ``encryption`` object, else the
    version ``meta`` says (a plain queue's file stays as format 2 wrote it).
    """
    raw = asdict(meta)
    if meta.encryption:
        raw["version"] = ENCRYPTED_VERSION
    else:
        raw["version"] = min(meta.version, FORMAT_VERSION)
        del raw["encryption"]
    return json.dumps(raw, sort_keys=True, indent=1).encode()


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
        except OSError as exc:
            raise NotAQueueError(
                f"{self.path} is unreadable ({exc}); this is not a usable ledgerq queue"
            ) from exc
        except (ValueError, RecursionError) as exc:
            # RecursionError: json nests arrays and objects on the C stack, so a damaged
            # or hostile file of a thousand "[" is bad JSON like any other.
            empty = os.path.getsize(self.path) == 0
            raise DamagedMetaError(self.path, "empty" if empty else f"not JSON: {exc}") from exc
        if not isinstance(raw, dict) or raw.get("format") != "ledgerq":
            raise DamagedMetaError(self.path, "not a ledgerq meta file")
        version = raw.get("version")
        if not isinstance(version, int) or version > NEWEST_VERSION:
            raise IncompatibleFormatError(
                f"queue at {os.path.dirname(self.path)} has format version {version!r}; this "
                f"ledgerq reads version {NEWEST_VERSION} and older - upgrade ledgerq to open it"
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
        meta.encryption = _encryption_block(raw.get("encryption"))
        if version >= ENCRYPTED_VERSION and not meta.encryption:
            meta.encryption = {"damaged": "true"}  # version 3 is an encrypted queue
        meta.version = ENCRYPTED_VERSION if meta.encryption else FORMAT_VERSION
        return meta

    def save(self, meta: Meta) -> None:
        """Durably replace the meta file (temp file, fsync, rename, fsync dir)."""
        data = encode_meta(meta)
        with self._lock:
            atomic_write(self.path, data, durable=True)
