"""``import_kestrel``: move what a Kestrel queue still holds into a ledgerq queue.

Old journals (1.x/2.x) are replayed literally (``oldjournal.Replay``); the pending
items - open transactions first, in ascending xid order, then the queue - become
messages in that order.  Kestrel 3 journals are read file by file in id order; an item
is imported when a reader has not consumed it (id above its head and not in its done
set).  Fan-out children ``q+x`` of an old queue, and Kestrel 3 readers, become ledgerq
readers of the same name, each with exactly its own items pending (or, for children,
separate queues).

Idempotency: see :mod:`ledgerq.kestrel._ledger`.  A torn record at the end of a queue's
newest journal file is cut and reported (Kestrel cuts it on start); any other damage is
reported as damage.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import ledgerq
from ledgerq.kestrel._destination import DEFAULT, ImportJob, open_destination
from ledgerq.kestrel._fanout import Merged, merge_fanout
from ledgerq.kestrel._ledger import item_key
from ledgerq.kestrel._report import ImportReport, Progress, ProgressCallback, Tally
from ledgerq.kestrel._scan import (
    KESTREL2,
    KESTREL3,
    KestrelQueue,
    queue_name_of,
    scan_directory,
)
from ledgerq.kestrel._types import KestrelItem
from ledgerq.kestrel.journal3 import Bookmark, read_bookmark, read_writer_file
from ledgerq.kestrel.oldjournal import Replay, order_journal_files

__all__ = ["KestrelImportError", "import_kestrel"]


class KestrelImportError(ledgerq.LedgerQError):
    """The import cannot start: no such journal, queue or reader, or an ambiguous choice."""


# ---------------------------------------------------------------------- old journals


def _replay(job: ImportJob, entry: KestrelQueue) -> list[KestrelItem]:
    """Replay the files of one queue; what a restarted Kestrel would serve."""
    tally = job.tally
    files = order_journal_files(entry.name, entry.names)
    tally.ignored.extend(files.ignored)
    replay = Replay(entry.name)
    for name in files.order:
        replay.replay_file(job.path(name), on_progress=job.progress.advance)
    tally.files.extend(files.order)
    pending = replay.pending()
    tally.quirks.extend(f"{replay.queue_name}: {line}" for line in replay.quirk_lines())
    # The newest file is the one Kestrel was appending to: a crash leaves a torn record
    # at its end, which Kestrel cuts on start.
    tally.note_damage(replay.damage, files.order[-1] if files.order else None)
    tally.count("open_transactions", sum(1 for item in pending if item.xid is not None))
    return pending


def _child_reader(child: str) -> str:
    """``x`` for the fan-out child ``q+x``."""
    return child.split("+", 1)[1]


def _import_old(job: ImportJob, entry: KestrelQueue, children: list[KestrelQueue]) -> None:
    pending = _replay(job, entry)
    if not entry.names:
        job.tally.quirks.append(
            f"{entry.name}: no journal of its own, only fan-out children (fanoutOnly): its "
            "default reader gets nothing"
        )
    child_lists = {_child_reader(child.name): _replay(job, child) for child in children}
    if child_lists:
        merged = merge_fanout(pending, child_lists)
    else:
        merged = [Merged(item, {DEFAULT}) for item in pending]
    job.tally.count("found", len(merged))
    job.progress.plan(sum(len(m.item.data) for m in merged))
    seen: Counter[str] = Counter()
    with open_destination(job, entry.name) as destination:
        for m in merged:
            key = item_key(f"kestrel:{entry.name}", m.item, seen)
            destination.add(m.item, key, frozenset(m.members))
        destination.place_readers(child_lists)


# ---------------------------------------------------------------------- Kestrel 3


def _targets(entry: KestrelQueue, reader: str | None, tally: Tally) -> tuple[str | None, list[str]]:
    """Which bookmarks to import: ``(chosen, named)``.

    ``chosen`` is the Kestrel reader whose unread items go to ledgerq's default reader
    (``--reader``, or the default bookmark when it is the only one); ``named`` the
    named readers that become ledgerq readers of the same name (without ``--reader``).
    Both empty: there is no bookmark, nothing was read.
    """
    named = sorted(name for name in entry.readers if name)
    if named and "" in entry.readers:
        tally.ignored.append(
            (
                entry.readers[""],
                "default bookmark ignored: named readers exist (libkestrel deletes it)",
            )
        )
    if reader is not None:
        if reader in named or (reader == "" and not named and "" in entry.readers):
            return reader, []
        choices = ", ".join(repr(n) for n in sorted(entry.readers)) or "none"
        raise KestrelImportError(
            f"queue {entry.name!r} has no reader {reader!r} (readers: {choices})"
        )
    if named:
        return None, named
    return ("" if "" in entry.readers else None), []


def _read_bookmarks(job: ImportJob, entry: KestrelQueue, names: list[str]) -> dict[str, Bookmark]:
    tally = job.tally
    marks = {}
    for name in names:
        mark = read_bookmark(job.path(entry.readers[name]))
        tally.note_damage(mark.damage, None)  # rewritten whole by libkestrel: never torn
        tally.files.append(entry.readers[name])
        tally.quirks.extend(f"{mark.name}: {kind}: {n}x" for kind, n in mark.quirks.items())
        marks[name] = mark
    return marks


def _writer_files(job: ImportJob, entry: KestrelQueue) -> list[str]:
    """The writer files holding items, in order of their first item id."""
    # libkestrel names a writer file q.<ms> when it starts writing it.
    newest = max(entry.writers, key=lambda name: int(name.rpartition(".")[2]), default=None)
    ordered: list[tuple[int, str]] = []
    for name in entry.writers:
        info, items = read_writer_file(job.path(name), first_only=True)
        first = next(items, None)
        if first is None:
            if info.damage:
                # Damaged before its first item: read it anyway, to report the damage -
                # last if it is the newest file (its first record may be torn by a crash).
                ordered.append((1 << 64 if name == newest else 0, name))
            else:
                job.tally.ignored.append(
                    (name, "no items (header only): skipped, as libkestrel does")
                )
            continue
        assert first.item_id is not None
        ordered.append((first.item_id, name))
    return [name for _, name in sorted(ordered)]


def _import_v3(job: ImportJob, entry: KestrelQueue, reader: str | None) -> str | None:
    tally = job.tally
    tally.ignored.extend(entry.ignored)
    chosen, named = _targets(entry, reader, tally)
    marks = _read_bookmarks(job, entry, [chosen] if chosen is not None else named)
    # ledgerq reader (DEFAULT: the default one) -> the bookmark saying what it has read
    targets: dict[str, Bookmark | None] = {DEFAULT: None}
    if chosen is not None:
        targets = {DEFAULT: marks[chosen]}
    elif named:
        targets = {name: marks[name] for name in named}
    else:
        tally.quirks.append(
            f"{entry.name}: no reader bookmark: every item is imported (nothing was read)"
        )
    files = _writer_files(job, entry)
    job.progress.plan(sum(os.path.getsize(job.path(name)) for name in files))
    seen: Counter[str] = Counter()
    last_id = 0
    with open_destination(job, entry.name) as destination:
        for name in files:
            info, items = read_writer_file(job.path(name), on_progress=job.progress.advance)
            tally.files.append(name)
            for item in items:
                assert item.item_id is not None
                if item.item_id <= last_id:
                    tally.quirks.append(
                        f"{name}: item {item.item_id} repeats an id of an earlier file: skipped"
                    )
                    continue
                last_id = item.item_id
                tally.count("found")
                members = frozenset(
                    target
                    for target, mark in targets.items()
                    if mark is None or not mark.is_read(item.item_id)
                )
                if not members:
                    tally.count("read_by_reader")
                    continue
                destination.add(item, item_key(f"kestrel3:{entry.name}", item, seen), members)
            # The newest file is the one libkestrel was writing: a torn record at its end
            # is crash residue (libkestrel stops reading there too).
            tally.note_damage(info.damage, files[-1])
            tally.quirks.extend(
                f"{kind}: {count}x (first at {info.quirk_first.get(kind, name)})"
                for kind, count in info.quirks.items()
            )
        destination.place_readers(named)
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
    job = ImportJob(directory, dest_path, keep_expired, options, Progress(on_progress))
    chosen: str | None = None
    child_reports: list[ImportReport] = []
    if entry.format == KESTREL3:
        chosen = _import_v3(job, entry, reader)
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
                        f"{dest_path}+{_child_reader(child.name)}",
                        queue=child.name,
                        keep_expired=keep_expired,
                        on_progress=None,
                        **options,
                    )
                )
            children = []
        _import_old(job, entry, children)
    return job.tally.report(
        source=directory,
        dest=dest_path,
        queue=entry.name,
        format=entry.format,
        reader=chosen,
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
