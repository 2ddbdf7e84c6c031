"""``ledgerq.open_sharded``: one queue-like object over N ordinary queues.

Sharding is a layer over whole queues (python-diskcache's ``FanoutCache``, SEJ's
``shard`` package): each shard is an ordinary queue directory, opened with
:func:`ledgerq.open`, named as SEJ names its shard directories::

    root/[prefix.]<bits>.<index>        bits = log2(shards) as one hex digit (1..a)
                                        index = the shard number as 3 hex digits (000..3ff)
    root/[prefix.]ledgerq-shards.json   {"format": "ledgerq-shards", "version": 1,
                                         "prefix": ..., "shards": N}

Routing: a message with a key goes to shard ``xxh3_64(key as UTF-8) % shards``
(:func:`shard_index`), so the same key always lands in the same shard - in this
process, in another one, and in the Spark writer that fills shard directories with
the helpers of this module.  A message without a key goes round-robin (or, when it
has a ``dedup_id``, to the shard of its dedup id, so a duplicate meets the original).

Ids: shard ``i`` hands out its own ids; the sharded queue gives the caller
``local_id * shards + i``, unique across shards and positive.  :func:`split_id`
undoes it.  Ids increase inside a shard, not across shards.

Concurrency: every shard is thread-safe on its own.  Blocked ``dequeue`` calls wait
on a condition of the sharded queue that each shard's listener notifies; the listener
runs under the shard's lock and only takes the condition's lock, and no code here
calls into a shard while holding that condition - so the lock order is always
shard -> sharded queue and there is no deadlock.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar, Unpack

import xxhash

from ledgerq import _api
from ledgerq._errors import ConfigError, QueueClosedError, QueueFullError, UnknownMessageError
from ledgerq._options import OpenOptions
from ledgerq._queue import Queue
from ledgerq._types import Item, Message, Priority, ReaderStats, Stats
from ledgerq.core.args import check_count, check_id, check_queue_path, check_timeout
from ledgerq.core.clock import Clock
from ledgerq.core.closing import Closing
from ledgerq.core.processes import forked_error, track, unpicklable, untrack
from ledgerq.segment.files import atomic_write

__all__ = [
    "MAX_SHARDS",
    "MIN_SHARDS",
    "SHARD_FILE_FORMAT",
    "ShardedQueue",
    "existing_shard_counts",
    "global_id",
    "open_sharded",
    "parse_shard_dir_name",
    "read_shard_count",
    "shard_dir_name",
    "shard_file_path",
    "shard_index",
    "split_id",
    "write_shard_count",
]

MIN_SHARDS = 2
MAX_SHARDS = 1024  # SEJ: shard-bit 1..a, shard-index 000..3ff
SHARD_FILE_FORMAT = "ledgerq-shards"
SHARD_FILE_VERSION = 1
_SHARD_FILE_SUFFIX = "ledgerq-shards.json"
# SEJ's prefix rule [a-zA-Z0-9_-]*, anchored (SEJ's own regex is not, so it validates nothing).
_PREFIX = re.compile(r"^[A-Za-z0-9_-]*\Z")
_SHARD_NAME = re.compile(
    r"^(?:(?P<prefix>[A-Za-z0-9_-]+)\.)?(?P<bits>[1-9a])\.(?P<index>[0-9a-f]{3})\Z"
)


# ---------------------------------------------------------------------- naming


def _check_prefix(prefix: object) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if not _PREFIX.match(prefix):
        raise ConfigError(
            f"invalid shard prefix {prefix!r}: use only letters, digits, '_' and '-' "
            "(SEJ's [a-zA-Z0-9_-]*), or '' for none"
        )
    return prefix


def _check_shards(shards: object) -> int:
    if isinstance(shards, bool) or not isinstance(shards, int):
        raise TypeError(f"shards must be an int, got {type(shards).__name__}")
    if not MIN_SHARDS <= shards <= MAX_SHARDS or shards & (shards - 1):
        raise ConfigError(
            f"shards must be a power of two from {MIN_SHARDS} to {MAX_SHARDS}, got {shards}"
        )
    return shards


def shard_dir_name(prefix: str, shards: int, index: int) -> str:
    """The directory name of shard ``index`` of ``shards``: ``[prefix.]<bits>.<index:03x>``.

    ``bits`` is log2(shards) as one hex digit (SEJ's shard-bit, 1..a); the prefix and
    its dot are omitted when ``prefix`` is empty.  Raises :class:`ConfigError` for an
    invalid prefix, shard count or index.
    """
    _check_prefix(prefix)
    _check_shards(shards)
    if isinstance(index, bool) or not isinstance(index, int):
        raise TypeError(f"shard index must be an int, got {type(index).__name__}")
    if not 0 <= index < shards:
        raise ConfigError(f"shard index must be in 0..{shards - 1}, got {index}")
    name = f"{shards.bit_length() - 1:x}.{index:03x}"
    return f"{prefix}.{name}" if prefix else name


def parse_shard_dir_name(name: str) -> tuple[str, int, int] | None:
    """``(prefix, shards, index)`` of a shard directory name, or None if it is not one."""
    match = _SHARD_NAME.match(name)
    if match is None:
        return None
    shards = 1 << int(match.group("bits"), 16)
    index = int(match.group("index"), 16)
    if index >= shards:
        return None
    return match.group("prefix") or "", shards, index


def shard_index(key: bytes | str, shards: int) -> int:
    """The shard a key routes to: xxh3_64 of its UTF-8 bytes, modulo ``shards``.

    Stable across processes, machines and versions (xxh3_64 with seed 0).
    """
    if isinstance(key, str):
        data = key.encode("utf-8")
    elif isinstance(key, (bytes, bytearray, memoryview)):
        data = bytes(key)
    else:
        raise TypeError(f"shard key must be str or bytes, got {type(key).__name__}")
    return int(xxhash.xxh3_64_intdigest(data) % shards)


def global_id(local_id: int, index: int, shards: int) -> int:
    """The id a sharded queue hands out for ``local_id`` of shard ``index``."""
    return local_id * shards + index


def split_id(message_id: int, shards: int) -> tuple[int, int]:
    """``(shard index, local id)`` of an id handed out by a sharded queue of ``shards``."""
    return message_id % shards, message_id // shards


# ---------------------------------------------------------------------- the count file


def shard_file_path(root: str | os.PathLike[str], prefix: str) -> str:
    """Where the shard count of ``prefix`` under ``root`` is recorded."""
    _check_prefix(prefix)
    name = f"{prefix}.{_SHARD_FILE_SUFFIX}" if prefix else _SHARD_FILE_SUFFIX
    return os.path.join(os.fspath(root), name)


def read_shard_count(root: str | os.PathLike[str], prefix: str) -> int | None:
    """The shard count recorded for ``prefix`` under ``root``, or None if none is.

    Raises :class:`ConfigError` if the file exists but is not a valid shard file.
    """
    path = shard_file_path(root, prefix)
    try:
        with open(path, "rb") as f:
            raw: Any = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"shard count file {path} is unreadable ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != SHARD_FILE_FORMAT:
        raise ConfigError(f"{path} is not a ledgerq shard count file")
    version = raw.get("version")
    if not isinstance(version, int) or version > SHARD_FILE_VERSION:
        raise ConfigError(f"{path} has version {version!r}; this ledgerq reads version 1")
    shards = raw.get("shards")
    if isinstance(shards, bool) or not isinstance(shards, int):
        raise ConfigError(f"{path} holds no valid shard count")
    try:
        return _check_shards(shards)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def write_shard_count(root: str | os.PathLike[str], prefix: str, shards: int) -> None:
    """Record that ``prefix`` under ``root`` has ``shards`` shards (durably, atomically).

    Creates ``root`` if missing.  A no-op when the same count is recorded; raises
    :class:`ConfigError` when another count is (resharding means moving messages).
    """
    _check_shards(shards)
    recorded = read_shard_count(root, prefix)
    if recorded == shards:
        return
    if recorded is not None:
        raise ConfigError(
            f"{os.fspath(root)!r} (prefix {prefix!r}) has {recorded} shards, not {shards}; "
            "a sharded queue cannot be reopened with another shard count"
        )
    os.makedirs(os.fspath(root), exist_ok=True)
    body = {
        "format": SHARD_FILE_FORMAT,
        "version": SHARD_FILE_VERSION,
        "prefix": prefix,
        "shards": shards,
    }
    atomic_write(shard_file_path(root, prefix), json.dumps(body, indent=1).encode() + b"\n")


def existing_shard_counts(root: str, prefix: str) -> set[int]:
    """Shard counts implied by the shard directories of ``prefix`` already under ``root``."""
    counts: set[int] = set()
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return counts
    for name in names:
        parsed = parse_shard_dir_name(name)
        if parsed is not None and parsed[0] == prefix and os.path.isdir(os.path.join(root, name)):
            counts.add(parsed[1])
    return counts


# ---------------------------------------------------------------------- the queue

_Figures = TypeVar("_Figures", Stats, ReaderStats)


def _sum_stats(parts: list[Stats], shards: int) -> Stats:
    """The figures of every shard (``parts[i]`` is shard ``i``'s) as one queue's."""
    per_reader: dict[str, list[ReaderStats]] = {}
    for part in parts:
        for name, reader_stats in part.readers.items():
            per_reader.setdefault(name, []).append(reader_stats)
    readers = {
        name: _summed(
            ReaderStats,
            rows,
            name=name,
            head=0,  # heads are ids of one shard each: no sum or maximum means anything
            oldest_pending_age=max(r.oldest_pending_age for r in rows),
        )
        for name, rows in per_reader.items()
    }
    return _summed(
        Stats,
        parts,
        oldest_pending_age=max((p.oldest_pending_age for p in parts), default=0.0),
        next_id=max(global_id(p.next_id, i, shards) for i, p in enumerate(parts)),
        readers=readers,
        lost=sum(p.lost for p in parts),
    )


def _summed(kind: type[_Figures], parts: Sequence[_Figures], **others: Any) -> _Figures:
    """A ``kind`` whose fields are the sums of ``parts``' fields, but for ``others``."""
    sums = {
        f.name: sum(getattr(part, f.name) for part in parts)
        for f in dataclasses.fields(kind)
        if f.name not in others
    }
    return kind(**sums, **others)


class ShardedQueue(Closing):
    """A queue over ``shards`` ordinary queues; use :func:`ledgerq.open_sharded` to get one.

    ``queues`` holds the shard queues (``queues[i]`` is shard ``i``).  Thread-safe.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        shards: int,
        prefix: str = "",
        *,
        clock: Clock | None = None,
        **options: Unpack[OpenOptions],
    ) -> None:
        check_queue_path(root, "root")
        self.shards = _check_shards(shards)
        self.prefix = _check_prefix(prefix)
        self.root = os.path.abspath(os.fspath(root))
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise ConfigError(f"{self.root} exists and is not a directory")
        recorded = read_shard_count(self.root, prefix)
        if recorded is not None and recorded != shards:
            raise ConfigError(
                f"{self.root} (prefix {prefix!r}) was created with {recorded} shards; "
                f"cannot open it with {shards} (resharding would move messages between "
                "shards - drain it and create a new one)"
            )
        others = existing_shard_counts(self.root, prefix) - {shards}
        if others:
            raise ConfigError(
                f"{self.root} already holds shard directories of prefix {prefix!r} for "
                f"{', '.join(str(n) for n in sorted(others))} shards; cannot open it with "
                f"{shards}"
            )
        write_shard_count(self.root, prefix, shards)
        self.paths = [
            os.path.join(self.root, shard_dir_name(prefix, shards, i)) for i in range(shards)
        ]
        self.queues: list[Queue] = []
        self._cond = threading.Condition(threading.Lock())
        self._generation = 0
        self._removers: list[Callable[[], None]] = []
        self._rr_lock = threading.Lock()
        self._round_robin = itertools.count()
        self._next_reader = 0
        self._closed = False
        try:
            for path in self.paths:
                queue = _api.open(path, clock=clock, **options)
                self.queues.append(queue)
                self._removers.append(queue.add_listener(self._on_change))
        except BaseException:
            self._close_all()
            raise
        self._owner_pid = os.getpid()
        self._forked = False
        track(self)  # unusable in a forked child, as its shards are (core/processes)

    # ------------------------------------------------------------------ routing

    def _on_change(self) -> None:
        # Runs in a shard's thread with that shard's lock held: only touch our condition.
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def shard_for(self, key: bytes | str | None = None) -> int:
        """The shard a message with ``key`` goes to (the next round-robin one without a key)."""
        if key is not None:
            return shard_index(key, self.shards)
        with self._rr_lock:
            return next(self._round_robin) % self.shards

    def shard_of(self, message_id: int) -> int:
        """The shard holding the message ``message_id`` handed out by this queue."""
        return split_id(self._check_id(message_id), self.shards)[0]

    def _check_id(self, message_id: object) -> int:
        message_id = check_id(message_id)
        if message_id < self.shards:
            raise UnknownMessageError(f"message {message_id} was not handed out by {self.root}")
        return message_id

    def _ensure_open(self) -> None:
        if self._closed:
            if self._forked:
                raise forked_error("sharded queue", self.root, self._owner_pid)
            raise QueueClosedError(f"sharded queue {self.root} is closed")

    def _after_fork_in_child(self) -> None:
        """In a forked child: closed, its shards the parent's (see ``Queue``'s)."""
        self._forked = True
        self._closed = True
        self._cond = threading.Condition(threading.Lock())
        self._rr_lock = threading.Lock()

    def _globalize(self, index: int, message: Message) -> Message:
        return dataclasses.replace(message, id=global_id(message.id, index, self.shards))

    # ------------------------------------------------------------------ producing

    def enqueue(
        self,
        payload: bytes | bytearray | memoryview,
        key: bytes | str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        priority: Priority | int = Priority.MEDIUM,
        ttl: float | None = None,
        dedup_id: str | bytes | None = None,
        delay: float | None = None,
        group: str | None = None,
        timeout: float | None = 0,
        unique_key: str | None = None,
    ) -> int:
        """Append one message to the shard of ``key``; return its (global) id.

        Without a key the shard is the next round-robin one - or the shard of
        ``group`` when one is given (a group's order holds inside one shard), else of
        ``unique_key``, else of ``dedup_id`` (so that unique jobs and dedup work
        across the whole queue; with a key or a group, within the shard chosen).
        Durability is the shard's (see :meth:`ledgerq.Queue.enqueue`).  The bounds
        ``max_pending`` and ``max_pending_bytes`` hold per shard: a full shard waits up
        to ``timeout`` for room, then raises :class:`ledgerq.QueueFullError`.
        """
        self._ensure_open()
        index = self._route(key, group, unique_key if unique_key is not None else dedup_id)
        local = self.queues[index].enqueue(
            payload,
            headers=headers,
            priority=priority,
            ttl=ttl,
            dedup_id=dedup_id,
            delay=delay,
            group=group,
            timeout=timeout,
            unique_key=unique_key,
        )
        return global_id(local, index, self.shards)

    def enqueue_batch(
        self,
        items: Iterable[bytes | bytearray | memoryview | Item],
        *,
        keys: Iterable[bytes | str | None] | None = None,
        timeout: float | None = 0,
    ) -> list[int]:
        """Append several messages; return their global ids in the order given.

        ``keys`` (one per item, None for round-robin) route them.  Each shard's part
        of the batch is written all-or-nothing with one write; the batch as a whole
        is not atomic across shards (a crash can keep some shards' parts).  A full
        bounded shard waits for room within ``timeout`` (all the parts together);
        if it has none, :class:`ledgerq.QueueFullError` names the ids of the parts
        already written to other shards.
        """
        wait = check_timeout(timeout)
        deadline = None if wait is None else time.monotonic() + wait
        self._ensure_open()
        batch = list(items)
        key_list = [None] * len(batch) if keys is None else list(keys)
        if len(key_list) != len(batch):
            raise ValueError(f"got {len(key_list)} keys for {len(batch)} items")
        parts: dict[int, list[int]] = {}
        for position, (item, key) in enumerate(zip(batch, key_list, strict=True)):
            if isinstance(item, Item):
                unique = item.unique_key
                index = self._route(key, item.group, item.dedup_id if unique is None else unique)
            else:
                index = self.shard_for(key)
            parts.setdefault(index, []).append(position)
        ids = [0] * len(batch)
        for index, positions in sorted(parts.items()):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                local = self.queues[index].enqueue_batch([batch[p] for p in positions], left)
            except QueueFullError as exc:
                written = [i for i in ids if i]
                if not written:
                    raise
                raise QueueFullError(
                    f"{exc} (shard {index}); the batch's parts for other shards were "
                    f"enqueued: ids {written}"
                ) from exc
            for position, local_id in zip(positions, local, strict=True):
                ids[position] = global_id(local_id, index, self.shards)
        return ids

    def _route(self, key: bytes | str | None, group: object, dedup_id: object) -> int:
        """The shard of a message: by key; without one by its group, then its unique key
        or dedup id (the caller passes the one that applies as ``dedup_id``)."""
        if key is None:
            if isinstance(group, str):
                return shard_index(group, self.shards)
            if isinstance(dedup_id, str | bytes):
                return shard_index(dedup_id, self.shards)
        return self.shard_for(key)

    # ------------------------------------------------------------------ consuming

    def _start(self) -> int:
        """The shard to look at first: moves on by one at every call (fairness)."""
        with self._rr_lock:
            start = self._next_reader
            self._next_reader = (start + 1) % self.shards
        return start

    def _take(self, n: int) -> list[Message]:
        """Lease up to ``n`` messages now, spread over the shards that have some."""
        taken: list[Message] = []
        start = self._start()
        order = [(start + i) % self.shards for i in range(self.shards)]
        while len(taken) < n and order:
            still: list[int] = []
            for position, index in enumerate(order):
                left = n - len(taken)
                if left <= 0:
                    break
                # An equal share of what is left for each shard still in this pass.
                share = math.ceil(left / (len(order) - position))
                got = self.queues[index].dequeue_batch(share, 0)
                taken.extend(self._globalize(index, m) for m in got)
                if len(got) == share:
                    still.append(index)  # it may have more
            order = still
        return taken

    def _seconds_to_next_expiry(self) -> float | None:
        """Seconds until some shard's lease times out (a message may come back then)."""
        found: float | None = None
        for queue in self.queues:
            left = queue.reader("default").seconds_to_next_expiry()
            if left is not None and (found is None or left < found):
                found = left
        return found

    def dequeue_batch(self, n: int, timeout: float | None = 0) -> list[Message]:
        """Lease up to ``n`` messages from the shards, fairly; wait only while there are none.

        Shards are visited round-robin from a starting shard that moves on at every
        call, each asked for an equal share, so no shard starves another.  ``timeout``
        as for :meth:`ledgerq.Queue.dequeue`.  Message ids are global ids.
        """
        n = check_count("n", n)
        wait = check_timeout(timeout)
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            self._ensure_open()
            with self._cond:
                seen = self._generation
            taken = self._take(n)
            if taken:
                return taken
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return []
            expiry = self._seconds_to_next_expiry()  # a lease that times out frees a message
            remaining = min((t for t in (remaining, expiry) if t is not None), default=None)
            with self._cond:
                if self._generation == seen and not self._closed:
                    self._cond.wait(remaining)

    def dequeue(self, timeout: float | None = 0) -> Message | None:
        """Lease the next message of any shard (see :meth:`dequeue_batch`), or None."""
        messages = self.dequeue_batch(1, timeout)
        return messages[0] if messages else None

    def ack(self, message_id: int) -> None:
        """Mark a leased message (a global id) done; durability as the shard's ``ack``.

        Raises :class:`UnknownMessageError` if the id is not leased.
        """
        self._ensure_open()
        index, local = split_id(self._check_id(message_id), self.shards)
        try:
            self.queues[index].ack(local)
        except UnknownMessageError:
            raise UnknownMessageError(
                f"message {message_id} is not leased (shard {index}, local id {local})"
            ) from None

    def nack(self, message_id: int, reason: str = "", *, delay: float | None = None) -> None:
        """Give a leased message (a global id) back as failed (see ``Queue.nack``)."""
        self._ensure_open()
        index, local = split_id(self._check_id(message_id), self.shards)
        try:
            self.queues[index].nack(local, reason, delay=delay)
        except UnknownMessageError:
            raise UnknownMessageError(
                f"message {message_id} is not leased (shard {index}, local id {local})"
            ) from None

    def release(self, message_id: int, *, delay: float | None = None) -> None:
        """Give a leased message (a global id) back unused (see ``Queue.release``)."""
        self._ensure_open()
        index, local = split_id(self._check_id(message_id), self.shards)
        try:
            self.queues[index].release(local, delay=delay)
        except UnknownMessageError:
            raise UnknownMessageError(
                f"message {message_id} is not leased (shard {index}, local id {local})"
            ) from None

    def touch(self, message_id: int, seconds: float | None = None) -> None:
        """Extend the lease of a message (a global id) (see ``Queue.touch``)."""
        self._ensure_open()
        index, local = split_id(self._check_id(message_id), self.shards)
        try:
            self.queues[index].touch(local, seconds)
        except UnknownMessageError:
            raise UnknownMessageError(
                f"message {message_id} is not leased (shard {index}, local id {local})"
            ) from None

    def peek(self, n: int = 1) -> list[Message]:
        """Up to ``n`` pending messages (round-robin over the shards), without leasing them."""
        n = check_count("n", n)
        self._ensure_open()
        per_shard = [[self._globalize(i, m) for m in q.peek(n)] for i, q in enumerate(self.queues)]
        found: list[Message] = []
        for row in itertools.zip_longest(*per_shard):
            found.extend(m for m in row if m is not None)
        return found[:n]

    # ------------------------------------------------------------------ observing

    def stats(self) -> Stats:
        """Every shard's figures summed into one :class:`ledgerq.Stats`.

        ``oldest_pending_age`` is the oldest of the shards'; ``next_id`` is above every
        id handed out; ``readers`` sums each reader's figures over the shards (with
        ``head`` 0: heads are per shard - see :meth:`shard_stats`).
        """
        return _sum_stats(self.shard_stats(), self.shards)

    def shard_stats(self) -> list[Stats]:
        """Each shard's own :class:`ledgerq.Stats` (local ids), by shard index."""
        self._ensure_open()
        return [queue.stats() for queue in self.queues]

    def __len__(self) -> int:
        self._ensure_open()
        return sum(len(queue) for queue in self.queues)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called."""
        return self._closed

    # ------------------------------------------------------------------ maintenance

    def sync(self) -> None:
        """fsync every shard (see :meth:`ledgerq.Queue.sync`)."""
        self._ensure_open()
        for queue in self.queues:
            queue.sync()

    def compact(self) -> None:
        """Apply retention in every shard now."""
        self._ensure_open()
        for queue in self.queues:
            queue.compact()

    def close(self) -> None:
        """Close every shard (sync, persist state, unlock); idempotent.

        Blocked ``dequeue`` calls raise :class:`QueueClosedError`.
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        untrack(self)
        self._close_all()

    def _close_all(self) -> None:
        removers, self._removers = self._removers, []
        for remove in removers:
            try:
                remove()
            except QueueClosedError:  # pragma: no cover - the shard is closing anyway
                pass
        first: BaseException | None = None
        for queue in self.queues:
            try:
                queue.close()
            except BaseException as exc:  # close every shard, then report the first failure
                if first is None:
                    first = exc
        if first is not None:
            raise first

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.shards} shards"
        prefix = f" prefix={self.prefix!r}" if self.prefix else ""
        return f"<ledgerq.ShardedQueue {self.root!r}{prefix} {state}>"

    def __reduce__(self) -> NoReturn:
        raise unpicklable("a ledgerq.ShardedQueue", self.root)

    def _check(self) -> None:
        """Assert every shard's invariants (tests call this after every step)."""
        for queue in self.queues:
            queue._check()


def open_sharded(
    root: str | os.PathLike[str],
    shards: int,
    prefix: str = "",
    *,
    clock: Clock | None = None,
    **options: Unpack[OpenOptions],
) -> ShardedQueue:
    """Open (creating if missing) a queue of ``shards`` ordinary queues under ``root``.

    ``shards`` is a power of two from 2 to 1024; shard ``i`` lives in
    ``root/[prefix.]<log2(shards) in hex>.<i:03x>`` (SEJ naming) and the count is
    recorded in ``root/[prefix.]ledgerq-shards.json``.  ``**options`` are passed to
    :func:`ledgerq.open` for every shard, and so is ``clock``.

    Raises :class:`ConfigError` for an invalid prefix or shard count, or when the
    directory was created with another shard count; ``TypeError``/``ConfigError``
    for bad options and :class:`QueueLockedError` if a shard is open elsewhere
    (like ``ledgerq.open``).
    """
    return ShardedQueue(root, shards, prefix, clock=clock, **options)
