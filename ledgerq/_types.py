"""Public value types: Priority, Message, Item, Stats, PeriodicJob, and the option value
literals."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum
from typing import Literal, TypeAlias

__all__ = [
    "Compression",
    "Item",
    "Message",
    "PeriodicJob",
    "Priority",
    "ReaderStart",
    "ReaderStats",
    "Stats",
    "SyncMode",
]

SyncMode: TypeAlias = Literal["always", "interval", "never"]
"""The values of the ``sync`` option: when an enqueue or ack reaches the disk."""

Compression: TypeAlias = Literal["none", "zstd"]
"""The values of the ``compression`` option."""

ReaderStart: TypeAlias = Literal["earliest", "latest"]
"""Where a new reader starts: the oldest retained message, or the tail."""


class Priority(IntEnum):
    """Delivery priority when ``priorities=True``: HIGH before MEDIUM before LOW."""

    LOW = 0
    MEDIUM = 1
    HIGH = 2


@dataclass(frozen=True, slots=True)
class Message:
    """A delivered message.  ``attempts`` is 1 on the first delivery; ``group`` is its
    message group (``enqueue(..., group=)``), if any."""

    id: int
    payload: bytes
    headers: dict[str, str]
    priority: Priority
    timestamp: int
    expires_at: int | None
    attempts: int
    group: str | None = None


@dataclass(frozen=True, slots=True)
class Item:
    """One message of an ``enqueue_batch`` call, with the options of ``enqueue``."""

    payload: bytes | bytearray | memoryview
    headers: Mapping[str, str] | None = None
    priority: Priority | int = Priority.MEDIUM
    ttl: float | None = None
    dedup_id: str | bytes | None = None
    delay: float | None = None
    group: str | None = None
    unique_key: str | None = None


@dataclass(frozen=True, slots=True)
class ReaderStats:
    """One reader's view of a queue."""

    name: str
    pending: int
    in_flight: int
    acked: int
    nacked: int
    expired: int
    dead_lettered: int
    head: int
    oldest_pending_age: float
    delayed: int = 0


@dataclass(frozen=True, slots=True)
class Stats:
    """A snapshot of a queue's state; counters count since the queue was created.

    ``pending``, ``in_flight``, ``acked``, ``nacked``, ``expired``,
    ``dead_lettered`` and ``oldest_pending_age`` are the default reader's;
    ``readers`` holds every open reader's own figures.  ``delayed`` counts the
    pending messages waiting for their delay (``enqueue(..., delay=)``).  ``lost``
    counts messages the default reader had not consumed whose segment file was found
    missing (deleted or moved by hand; ``dropped`` counts those retention removed,
    ``corrupt_skipped`` damaged regions skipped).
    """

    pending: int
    in_flight: int
    enqueued: int
    acked: int
    nacked: int
    dead_lettered: int
    expired: int
    duplicates: int
    dropped: int
    corrupt_skipped: int
    segments: int
    disk_bytes: int
    oldest_pending_age: float
    next_id: int = 0
    readers: dict[str, ReaderStats] = field(default_factory=dict)
    lost: int = 0
    delayed: int = 0


@dataclass(frozen=True, slots=True)
class PeriodicJob:
    """A periodic job of a queue, as :meth:`ledgerq.Queue.periodic` lists it.

    Exactly one of ``every`` (seconds) and ``cron`` (a 5-field expression, UTC) is set.
    ``next_run_ns`` is the tick the next message is enqueued for (ns since the epoch, in
    the queue's time); ``last_run_ns`` the last tick one was enqueued for (None: none
    yet).  ``payload``, ``headers`` and ``priority`` are each message's.
    """

    name: str
    every: float | None
    cron: str | None
    next_run_ns: int
    last_run_ns: int | None
    payload: bytes
    headers: dict[str, str]
    priority: Priority

    @property
    def next_run(self) -> datetime:
        """:attr:`next_run_ns` as an aware UTC datetime (microseconds)."""
        return datetime.fromtimestamp(self.next_run_ns / 1e9, tz=UTC)

    @property
    def last_run(self) -> datetime | None:
        """:attr:`last_run_ns` as an aware UTC datetime, or None before the first tick."""
        if self.last_run_ns is None:
            return None
        return datetime.fromtimestamp(self.last_run_ns / 1e9, tz=UTC)

    @property
    def schedule(self) -> str:
        """The schedule as text: ``"every 60s"`` or ``"cron */5 * * * *"``."""
        if self.cron is not None:
            return f"cron {self.cron}"
        return f"every {self.every:g}s"
