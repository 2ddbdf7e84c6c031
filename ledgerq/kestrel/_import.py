"""``import_kestrel``: move what a Kestrel queue still holds into a ledgerq queue.

Old journals (1.x/2.x) are replayed literally (``oldjournal.Replay``); the pending
items - open transactions first, in ascending xid order, then the queue - become
messages in that order.  Kestrel 3 journals are read file by file in id order and
only items the chosen reader has not consumed (id above its head and not in its
done set) are imported.  Fan-out children ``q+x`` of an old queue become ledgerq
readers ``x`` of the destination (the Kestrel 3 converter's mapping), or separate
queues.

Idempotency: every imported message carries a stable ``kestrel.import_key``
header, and the destination directory keeps ``kestrel-import.keys`` - one line
``<id> <key>`` per message, appended and fsynced after the messages themselves are
durable.  A later run skips every key found there, or found in the destination's
log after the last id the file records (a run killed between the two).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ledgerq
from ledgerq._errors import LedgerQError
from ledgerq._follow import follow
from ledgerq._queue import Queue
from ledgerq._types import Item
from ledgerq.format.reader_state import (
    Checkpoint,
    encode_checkpoint,
    encode_state_file_header,
)
from ledgerq.kestrel._scan import (
    KESTREL2,
    KESTREL3,
    KestrelQueue,
    queue_name_of,
    scan_directory,
)
from ledgerq.kestrel._types import JournalDamage, KestrelItem
from ledgerq.kestrel.journal3 import Bookmark, read_bookmark, read_writer_file
from ledgerq.kestrel.oldjournal import Replay, order_journal_files
from ledgerq.segment.files import atomic_write, fsync_dir
from ledgerq.segment.lock import DirLock
from ledgerq.segment.readonly import READERS_DIR, reader_state_path

__all__ = ["LEDGER_NAME", "ImportReport", "KestrelImportError", "import_kestrel"]

LEDGER_NAME = "kestrel-import.keys"
KEY_HEADER = "kestrel.import_key"
_BATCH = 1000
_READER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\Z")  # ledgerq's reader names

ProgressCallback = Callable[[int, int], None]


class KestrelImportError(LedgerQError):
    """The import cannot start: no such journal, queue or reader, or an ambiguous choice."""


@dataclass(frozen=True, slots=True)
class ImportReport:
    """What :func:`import_kestrel` found, imported and skipped, and why.

    ``ok`` is False when a journal was damaged (truncated or corrupt): everything
    readable before the damage was imported and ``damage`` says where the rest is.
    """

    source: str
    dest: str
    queue: str
    format: str
    reader: str | None
    found: int  # items the journal still held (pending, open transactions included)
    imported: int
    already_imported: int
    expired_dropped: int
    expired_kept: int
    read_by_reader: int  # Kestrel 3: consumed by the chosen reader
    open_transactions: int  # old journals: open reads restored as pending items
    files: tuple[str, ...]
    ignored: tuple[tuple[str, str], ...]
    quirks: tuple[str, ...]
    damage: tuple[JournalDamage, ...]
    readers: tuple[tuple[str, str], ...] = ()  # fan-out child -> what was done with it
    children: tuple[ImportReport, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether every journal (children included) was read to its end."""
        return not self.damage and all(child.ok for child in self.children)


@dataclass
class _Tally:
    found: int = 0
    imported: int = 0
    already: int = 0
    expired_dropped: int = 0
    expired_kept: int = 0
    read: int = 0
    open_transactions: int = 0
    files: list[str] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)
    quirks: list[str] = field(default_factory=list)
    damage: list[JournalDamage] = field(default_factory=list)
    readers: list[tuple[str, str]] = field(default_factory=list)


class _Progress:
    def __init__(self, callback: ProgressCallback | None) -> None:
        self.callback = callback
        self.done = 0
        self.total = 0

    def plan(self, nbytes: int) -> None:
        self.total += nbytes
        self.report()

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        self.report()

    def report(self) -> None:
        if self.callback is not None:
            self.callback(self.done, max(self.total, self.done))


# ---------------------------------------------------------------------- the ledger


class _Ledger:
    """``kestrel-import.keys`` in the destination: which keys were imported, as which id."""

    def __init__(self, dest: str) -> None:
        self.path = os.path.join(dest, LEDGER_NAME)
        self.keys: dict[str, int] = {}
        self.max_id = 0

    def load(self) -> None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            # A torn last line (a run killed mid-append): cut it so appends stay whole.
            with open(self.path, "r+b") as f:
                f.truncate(complete)
                os.fsync(f.fileno())
        for line in data[:complete].splitlines():
            number, _, key = line.decode("utf-8", "replace").partition(" ")
            if number.isdigit() and key:
                self.add(key, int(number))

    def add(self, key: str, message_id: int) -> None:
        self.keys[key] = message_id
        self.max_id = max(self.max_id, message_id)

    def append(self, pairs: list[tuple[str, int]]) -> None:
        """Record ``pairs`` durably (the messages must already be durable)."""
        if not pairs:
            return
        created = not os.path.exists(self.path)
        blob = "".join(f"{mid} {key}\n" for key, mid in pairs).encode("utf-8")
        with open(self.path, "ab") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        if created:
            fsync_dir(os.path.dirname(self.path))
        for key, mid in pairs:
            self.add(key, mid)

    def catch_up(self, dest: str) -> None:
        """Find keys in the log after the last recorded id (a run killed before recording)."""
        found = []
        with follow(dest, from_id=self.max_id + 1, timeout=0) as messages:
            for message in messages:
                key = message.headers.get(KEY_HEADER)
                if key and key not in self.keys:
                    found.append((key, message.id))
        self.append(found)


# ---------------------------------------------------------------------- items to messages


def _item_key(prefix: str, item: KestrelItem, seen: Counter[str]) -> str:
    if item.item_id is not None:
        return f"{prefix}:{item.item_id}"
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{item.add_time_ms}|{item.expire_time_ms}|".encode())
    digest.update(item.data)
    base = digest.hexdigest()
    seen[base] += 1
    return f"{prefix}:{base}:{seen[base] - 1}"


def _headers(queue: str, item: KestrelItem, key: str) -> dict[str, str]:
    headers = {"kestrel.queue": queue, KEY_HEADER: key}
    if item.add_time_ms is not None:
        headers["kestrel.add_time"] = str(item.add_time_ms)
    if item.expire_time_ms is not None:
        headers["kestrel.expire_time"] = str(item.expire_time_ms)
    if item.error_count is not None:
        headers["kestrel.error_count"] = str(item.error_count)
    if item.item_id is not None:
        headers["kestrel.id"] = str(item.item_id)
    if item.xid is not None:
        headers["kestrel.xid"] = str(item.xid)
    return headers


class _Writer:
    """Enqueues items in batches and records them in the ledger."""

    def __init__(
        self,
        queue: Queue,
        ledger: _Ledger,
        tally: _Tally,
        progress: _Progress,
        *,
        source_queue: str,
        keep_expired: bool,
        now_ms: int,
    ) -> None:
        self.queue = queue
        self.ledger = ledger
        self.tally = tally
        self.progress = progress
        self.source_queue = source_queue
        self.keep_expired = keep_expired
        self.now_ms = now_ms
        self._batch: list[tuple[KestrelItem, str]] = []

    def is_expired(self, item: KestrelItem) -> bool:
        return item.expire_time_ms is not None and item.expire_time_ms <= self.now_ms

    def add(self, item: KestrelItem, key: str) -> None:
        """Import ``item`` under ``key`` unless it was imported before or has expired."""
        if key in self.ledger.keys:
            self.tally.already += 1
            return
        if self.is_expired(item):
            if not self.keep_expired:
                self.tally.expired_dropped += 1
                return
            self.tally.expired_kept += 1
        self._batch.append((item, key))
        if len(self._batch) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        batch, self._batch = self._batch, []
        if not batch:
            return
        now_ms = time.time_ns() // 1_000_000
        items = []
        for item, key in batch:
            ttl = None
            if item.expire_time_ms is not None and item.expire_time_ms > now_ms:
                ttl = (item.expire_time_ms - now_ms) / 1000.0
            items.append(Item(item.data, headers=_headers(self.source_queue, item, key), ttl=ttl))
        ids = self.queue.enqueue_batch(items)
        self.queue.sync()  # the messages are durable before the ledger says they exist
        self.ledger.append([(key, mid) for (_, key), mid in zip(batch, ids, strict=True)])
        self.tally.imported += len(batch)
        self.progress.advance(sum(len(item.data) for item, _ in batch))


# ---------------------------------------------------------------------- old journals


def _replay(directory: str, entry: KestrelQueue, tally: _Tally, progress: _Progress) -> Replay:
    files = order_journal_files(entry.name, entry.names)
    tally.ignored.extend(files.ignored)
    replay = Replay(entry.name)
    for name in files.order:
        replay.replay_file(os.path.join(directory, name), on_progress=progress.advance)
    tally.files.extend(files.order)
    return replay


def _finish_replay(replay: Replay, tally: _Tally) -> list[KestrelItem]:
    pending = replay.pending()
    tally.quirks.extend(f"{replay.queue_name}: {line}" for line in replay.quirk_lines())
    tally.damage.extend(replay.damage)
    return pending


@dataclass
class _Merged:
    item: KestrelItem
    members: set[str]


def _merge(parent: list[KestrelItem], children: dict[str, list[KestrelItem]]) -> list[_Merged]:
    """One list holding every item of the parent and its fan-out children, once.

    A child's copy of an item is found by its payload (the Kestrel 3 converter's rule),
    matching from the end - both queues hold a suffix of the same stream - while
    keeping every queue's own order; items only a child holds are placed just before
    the next item it shares (or at the end).
    """
    merged = [_Merged(item, {""}) for item in parent]
    for child, items in sorted(children.items()):
        by_payload: dict[bytes, list[int]] = {}
        for position, entry in enumerate(merged):
            by_payload.setdefault(hashlib.blake2b(entry.item.data).digest(), []).append(position)
        matched: list[int | None] = [None] * len(items)
        upper = len(merged)
        for j in range(len(items) - 1, -1, -1):
            candidates = by_payload.get(hashlib.blake2b(items[j].data).digest(), [])
            best = None
            for k in range(len(candidates) - 1, -1, -1):
                if candidates[k] < upper:
                    best = k
                    break
            if best is not None:
                position = candidates.pop(best)
                matched[j] = position
                upper = position
        inserts: dict[int, list[_Merged]] = {}
        target = len(merged)
        for j in range(len(items) - 1, -1, -1):
            at = matched[j]
            if at is not None:
                merged[at].members.add(child)
                target = at
            else:
                inserts.setdefault(target, []).insert(0, _Merged(items[j], {child}))
        rebuilt: list[_Merged] = []
        for position, entry in enumerate(merged):
            rebuilt.extend(inserts.get(position, []))
            rebuilt.append(entry)
        rebuilt.extend(inserts.get(len(merged), []))
        merged = rebuilt
    return merged


def _reader_name(child: str) -> str:
    return child.split("+", 1)[1]


def _import_old(
    directory: str,
    entry: KestrelQueue,
    children: list[KestrelQueue],
    dest: str,
    tally: _Tally,
    progress: _Progress,
    *,
    keep_expired: bool,
    options: dict[str, Any],
) -> None:
    replay = _replay(directory, entry, tally, progress)
    pending = _finish_replay(replay, tally)
    if not entry.names:
        tally.quirks.append(
            f"{entry.name}: no journal of its own, only fan-out children (fanoutOnly): its "
            "default reader gets nothing"
        )
    tally.open_transactions += sum(1 for item in pending if item.xid is not None)
    child_lists: dict[str, list[KestrelItem]] = {}
    for child in children:
        child_replay = _replay(directory, child, tally, progress)
        child_items = _finish_replay(child_replay, tally)
        tally.open_transactions += sum(1 for item in child_items if item.xid is not None)
        child_lists[_reader_name(child.name)] = child_items
    merged = _merge(pending, child_lists) if child_lists else [_Merged(i, {""}) for i in pending]
    tally.found += len(merged)
    progress.plan(sum(len(m.item.data) for m in merged))
    keys = []
    seen: Counter[str] = Counter()
    for m in merged:
        keys.append(_item_key(f"kestrel:{entry.name}", m.item, seen))
    with ledgerq.open(dest, **options) as queue:
        ledger = _Ledger(queue.path)
        ledger.load()
        ledger.catch_up(queue.path)
        writer = _Writer(
            queue,
            ledger,
            tally,
            progress,
            source_queue=entry.name,
            keep_expired=keep_expired,
            now_ms=time.time_ns() // 1_000_000,
        )
        for m, key in zip(merged, keys, strict=True):
            writer.add(m.item, key)
        writer.flush()
        if not child_lists:
            return
        ids = [ledger.keys.get(key) for key in keys]
        not_parent = [
            mid for m, mid in zip(merged, ids, strict=True) if mid and "" not in m.members
        ]
        if not_parent:
            queue.purge(not_parent)
        next_id = queue.stats().next_id
        plans = _reader_plans(queue.path, merged, ids, child_lists, next_id, tally)
    _write_reader_states(dest, plans)


def _ids_from(dest: str, first: int) -> list[int]:
    """Ids of the messages in the log of ``dest`` from ``first`` on."""
    with follow(dest, from_id=first, timeout=0) as found:
        return [message.id for message in found]


def _reader_plans(
    dest: str,
    merged: list[_Merged],
    ids: list[int | None],
    children: dict[str, list[KestrelItem]],
    next_id: int,
    tally: _Tally,
) -> dict[str, Checkpoint]:
    """The starting state of each fan-out child's reader that does not exist yet."""
    plans = {}
    for child in sorted(children):
        path = reader_state_path(dest, child)
        if child == "default" or not _READER_NAME.match(child):
            tally.readers.append((child, "not a valid ledgerq reader name: not created"))
            continue
        if os.path.exists(path):
            tally.readers.append((child, "reader exists already: left as it is"))
            continue
        wanted = {mid for m, mid in zip(merged, ids, strict=True) if mid and child in m.members}
        head = min(wanted) if wanted else next_id
        # Everything else from the head on - other children's items, and messages that
        # were in the queue before - is done for this reader: it sees exactly q+x's items.
        done = [mid for mid in _ids_from(dest, head) if mid > head and mid not in wanted]
        plans[child] = Checkpoint(head, done, [], {})
        tally.readers.append((child, f"reader created with {len(wanted)} pending messages"))
    return plans


def _write_reader_states(dest: str, plans: dict[str, Checkpoint]) -> None:
    """Create reader state files (the documented format) under the queue's lock."""
    if not plans:
        return
    lock = DirLock(os.path.abspath(dest))
    try:
        readers = os.path.join(dest, READERS_DIR)
        os.makedirs(readers, exist_ok=True)
        for name, checkpoint in plans.items():
            path = reader_state_path(dest, name)
            if os.path.exists(path):
                continue
            atomic_write(path, encode_state_file_header() + encode_checkpoint(checkpoint))
    finally:
        lock.release()


# ---------------------------------------------------------------------- Kestrel 3


def _choose_reader(entry: KestrelQueue, reader: str | None, tally: _Tally) -> str | None:
    named = {name: path for name, path in entry.readers.items() if name}
    if named and "" in entry.readers:
        tally.ignored.append(
            (
                entry.readers[""],
                "default bookmark ignored: named readers exist (libkestrel deletes it)",
            )
        )
    if reader is not None:
        if reader == "" and not named and "" in entry.readers:
            return ""
        if reader in named:
            return reader
        choices = ", ".join(repr(n) for n in sorted(entry.readers)) or "none"
        raise KestrelImportError(
            f"queue {entry.name!r} has no reader {reader!r} (readers: {choices})"
        )
    if len(named) == 1:
        return next(iter(named))
    if len(named) > 1:
        raise KestrelImportError(
            f"queue {entry.name!r} has several readers ({', '.join(sorted(named))}); "
            "choose the one whose unread items to import with --reader"
        )
    return "" if "" in entry.readers else None


def _import_v3(
    directory: str,
    entry: KestrelQueue,
    reader: str | None,
    dest: str,
    tally: _Tally,
    progress: _Progress,
    *,
    keep_expired: bool,
    options: dict[str, Any],
) -> str | None:
    tally.ignored.extend(entry.ignored)
    chosen = _choose_reader(entry, reader, tally)
    mark: Bookmark | None = None
    if chosen is not None:
        mark = read_bookmark(os.path.join(directory, entry.readers[chosen]))
        tally.damage.extend(mark.damage)
        tally.files.append(entry.readers[chosen])
        if mark.quirks:
            tally.quirks.extend(f"{mark.name}: {k}: {n}x" for k, n in mark.quirks.items())
    else:
        tally.quirks.append(
            f"{entry.name}: no reader bookmark: every item is imported (nothing was read)"
        )
    ordered: list[tuple[int, str]] = []
    for name in entry.writers:
        info, items = read_writer_file(os.path.join(directory, name), first_only=True)
        first = next(items, None)
        if first is None:
            if info.damage:
                ordered.append((0, name))  # damaged before its first item: report it below
            else:
                tally.ignored.append((name, "no items (header only): skipped, as libkestrel does"))
            continue
        assert first.item_id is not None
        ordered.append((first.item_id, name))
    ordered.sort()
    progress.plan(sum(os.path.getsize(os.path.join(directory, n)) for _, n in ordered))
    with ledgerq.open(dest, **options) as queue:
        ledger = _Ledger(queue.path)
        ledger.load()
        ledger.catch_up(queue.path)
        writer = _Writer(
            queue,
            ledger,
            tally,
            progress,
            source_queue=entry.name,
            keep_expired=keep_expired,
            now_ms=time.time_ns() // 1_000_000,
        )
        seen: Counter[str] = Counter()
        last_id = 0
        for _, name in ordered:
            info, items = read_writer_file(
                os.path.join(directory, name), on_progress=progress.advance
            )
            tally.files.append(name)
            for item in items:
                assert item.item_id is not None
                if item.item_id <= last_id:
                    tally.quirks.append(
                        f"{name}: item {item.item_id} repeats an id of an earlier file: skipped"
                    )
                    continue
                last_id = item.item_id
                tally.found += 1
                if mark is not None and mark.is_read(item.item_id):
                    tally.read += 1
                    continue
                writer.add(item, _item_key(f"kestrel3:{entry.name}", item, seen))
            tally.damage.extend(info.damage)
            tally.quirks.extend(
                f"{kind}: {count}x (first at {info.quirk_first.get(kind, name)})"
                for kind, count in info.quirks.items()
            )
        writer.flush()
    return chosen


# ---------------------------------------------------------------------- entry point


def _locate(src: str, queue: str | None) -> tuple[str, str | None]:
    """The journal directory and the queue asked for (a file path names its queue)."""
    if not os.path.exists(src):
        raise KestrelImportError(f"no Kestrel journal at {src!r}: it does not exist")
    if os.path.isfile(src):
        name = queue_name_of(os.path.basename(src))
        if queue is not None and queue != name:
            raise KestrelImportError(f"{src!r} is a journal of queue {name!r}, not {queue!r}")
        return os.path.dirname(os.path.abspath(src)), name
    return os.path.abspath(src), queue


def import_kestrel(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    queue: str | None = None,
    reader: str | None = None,
    keep_expired: bool = False,
    children_as_queues: bool = False,
    on_progress: ProgressCallback | None = None,
    **options: Any,
) -> ImportReport:
    """Import the items a Kestrel queue still holds into the ledgerq queue ``dest``.

    ``src`` is Kestrel's journal directory (or one journal file, naming its queue);
    ``queue`` picks the queue when the directory holds several.  Old (1.x/2.x)
    journals are replayed op by op in Kestrel's file order; open transactions come
    first, in ascending xid order.  Kestrel 3 journals: only items the reader
    ``reader`` (``""`` the default one; by default the only one there is) has not
    read.  Items already expired are dropped and counted unless ``keep_expired``.
    Fan-out children ``q+x`` of an old queue become readers ``x`` of ``dest``, or
    with ``children_as_queues`` the queues ``<dest>+x``.  ``**options`` go to
    :func:`ledgerq.open` for ``dest``.  ``on_progress(done_bytes, total_bytes)``.

    Running it again imports nothing twice.  Messages are durable (fsynced) when it
    returns.  Raises :class:`KestrelImportError` when there is nothing to import
    from (no such directory, queue or reader, or an ambiguous choice) and the
    errors of :func:`ledgerq.open` for ``dest``; damaged journals do not raise - the
    report says what was imported before the damage (``report.ok`` is False).
    """
    directory, wanted = _locate(os.fspath(src), queue)
    dest_path = os.path.abspath(os.fspath(dest))
    try:
        found = scan_directory(directory)
    except OSError as exc:
        raise KestrelImportError(f"cannot read the journal directory {directory}: {exc}") from exc
    entry = _pick_queue(found, wanted, directory)
    progress = _Progress(on_progress)
    tally = _Tally()
    chosen: str | None = None
    child_reports: list[ImportReport] = []
    if entry.format == KESTREL3:
        chosen = _import_v3(
            directory,
            entry,
            reader,
            dest_path,
            tally,
            progress,
            keep_expired=keep_expired,
            options=options,
        )
    else:
        if reader is not None:
            raise KestrelImportError(
                "Kestrel 1/2 journals have no readers; a fan-out child q+x is imported as "
                "reader x of the destination (or pick it with --queue q+x)"
            )
        children = [] if entry.parent else _children(found, entry.name)
        if children and children_as_queues:
            for child in children:
                child_reports.append(
                    import_kestrel(
                        directory,
                        f"{dest_path}+{_reader_name(child.name)}",
                        queue=child.name,
                        keep_expired=keep_expired,
                        on_progress=None,
                        **options,
                    )
                )
            children = []
        _import_old(
            directory,
            entry,
            children,
            dest_path,
            tally,
            progress,
            keep_expired=keep_expired,
            options=options,
        )
    return ImportReport(
        source=directory,
        dest=dest_path,
        queue=entry.name,
        format=entry.format,
        reader=chosen,
        found=tally.found,
        imported=tally.imported,
        already_imported=tally.already,
        expired_dropped=tally.expired_dropped,
        expired_kept=tally.expired_kept,
        read_by_reader=tally.read,
        open_transactions=tally.open_transactions,
        files=tuple(tally.files),
        ignored=tuple(tally.ignored),
        quirks=tuple(tally.quirks),
        damage=tuple(tally.damage),
        readers=tuple(tally.readers),
        children=tuple(child_reports),
    )


def _children(found: dict[str, KestrelQueue], name: str) -> list[KestrelQueue]:
    return [q for q in sorted(found.values(), key=lambda q: q.name) if q.parent == name]


def _pick_queue(found: dict[str, KestrelQueue], wanted: str | None, directory: str) -> KestrelQueue:
    if wanted is None:
        tops = sorted({q.parent or name for name, q in found.items()})
        if not tops:
            raise KestrelImportError(f"no Kestrel journal files in {directory}")
        if len(tops) > 1:
            raise KestrelImportError(
                f"{directory} holds journals of several queues ({', '.join(tops)}); choose one "
                "with --queue"
            )
        wanted = tops[0]
    entry = found.get(wanted)
    if entry is not None:
        return entry
    if any(q.parent == wanted for q in found.values()):
        # A parent with fan-out children but no journal of its own (Kestrel's fanoutOnly):
        # it holds nothing; its children become readers.
        return KestrelQueue(wanted, KESTREL2)
    names = ", ".join(sorted(found)) or "none"
    raise KestrelImportError(
        f"no journal of queue {wanted!r} in {directory} (queues there: {names})"
    )
