"""``repair``: what can be repaired without losing a valid entry, under the queue's lock.

It takes the queue's lock by opening it with :func:`ledgerq.open` - whose recovery cuts a
torn tail of the newest segment and of reader journals, and rebuilds the index of a
sealed segment that fails its check - then rebuilds, under the lock, any index that is
still wrong, renames a misnamed segment file to its content's name, moves a copy into
``segments/damaged/``, records ids no file holds any more as known lost, and verifies
again.  It never deletes a valid entry: a corrupt entry in the middle of a log stays (and
stays reported); readers skip it.
"""

from __future__ import annotations

import logging
import os

from ledgerq._api import open as open_path
from ledgerq._errors import LedgerQError, QueueLockedError
from ledgerq._options import Options
from ledgerq.core.journal import ReaderJournal
from ledgerq.format.index import IndexEntry
from ledgerq.format.reader_state import Checkpoint
from ledgerq.segment.index_file import write_index
from ledgerq.segment.layout import (
    Layout,
    SegmentFile,
)
from ledgerq.segment.lock import DirLock
from ledgerq.segment.meta import (
    ID_BLOCK,
    DamagedMetaError,
    MetaStore,
    OptionsStore,
    holds_queue_data,
)
from ledgerq.segment.meta_rebuild import rebuild_meta
from ledgerq.segment.naming import (
    SEGMENTS_DIR,
    idx_path,
    log_path,
    reader_state_path,
)
from ledgerq.segment.readonly import (
    list_reader_names,
    queue_dir_problem,
    replay_reader,
    stored_options,
)
from ledgerq.segment.readonly_state import has_valid_header
from ledgerq.segment.scanner import EntryScanner
from ledgerq.segment.setaside import move_to_damaged, rename_segment
from ledgerq.tools._verify import check_queue, queue_dirs, verify
from ledgerq.tools._verify_report import (
    IndexRebuild,
    ProgressCallback,
    RepairReport,
    Tally,
)

logger = logging.getLogger("ledgerq")


class _Collect(logging.Handler):
    """Keeps the ``ledgerq`` logger's warnings during a repair (what recovery did)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.messages.append(message.removeprefix("ledgerq: "))


def repair(
    path: str | os.PathLike[str], *, on_progress: ProgressCallback | None = None
) -> RepairReport:
    """Repair what can be repaired without losing a valid entry; verify before and after.

    Takes the queue's lock (raises :class:`QueueLockedError` when it is open
    elsewhere).  Opening the queue runs its recovery: the torn tail of the newest
    segment and of reader journals is cut, the index of a sealed segment that fails
    its check is rebuilt.  Indexes still wrong after that are rebuilt from their logs
    (atomically, durably).  A misnamed segment file is renamed to the id of its first
    entry, a copy (whose ids another file holds) is moved into ``segments/damaged/``,
    and ids missing between segments are recorded in ``meta.json`` as known lost (no
    longer reported; counted in ``stats().lost``).  Corrupt entries inside a log are
    left in place: readers skip them, and the report after the repair still lists them.
    A step that cannot run (a read-only file system, a full disk) is listed in the
    report's ``not_done``, never passed over: the report is then not of a repaired queue.
    """
    root = os.fspath(path)
    before = verify(root, on_progress=on_progress)
    actions: list[str] = []
    not_done: list[str] = []
    for queue_dir in queue_dirs(root):
        if queue_dir_problem(queue_dir) is None:
            try:
                actions.extend(_repair_metadata(queue_dir))
            except (LedgerQError, OSError) as exc:
                not_done.append(f"could not repair the metadata of {queue_dir}: {exc}")
    collect = _Collect()
    logger.addHandler(collect)
    try:
        queue = open_path(root)  # with its stored options: a repair must not change them
        queue.close()
        actions.append("opened and closed the queue (its recovery ran)")
    except QueueLockedError:
        raise
    except (LedgerQError, OSError) as exc:
        not_done.append(f"could not open the queue, so its recovery did not run: {exc}")
    finally:
        logger.removeHandler(collect)
    actions.extend(f"recovery: {message}" for message in collect.messages)
    tally = Tally()
    for queue_dir in queue_dirs(root):
        check_queue(queue_dir, tally)
    for rebuild in tally.rebuilds:
        where = idx_path(os.path.join(rebuild.queue_dir, SEGMENTS_DIR), rebuild.name_id)
        try:
            lock = DirLock(rebuild.queue_dir)
        except QueueLockedError:
            raise
        except (LedgerQError, OSError) as exc:
            not_done.append(f"could not rebuild {where}: {exc}")
            continue
        try:
            points = _rebuild_index(rebuild)
        except (LedgerQError, OSError) as exc:
            not_done.append(f"could not rebuild {where}: {exc}")
            continue
        finally:
            lock.release()
        actions.append(f"rebuilt {where} from its log ({points} points)")
    for queue_dir, (layout, unexplained) in tally.layouts.items():
        if layout.misnamed or layout.set_aside or unexplained:
            try:
                lock = DirLock(queue_dir)
            except QueueLockedError:
                raise
            except (LedgerQError, OSError) as exc:
                not_done.append(f"could not repair the segment files of {queue_dir}: {exc}")
                continue
            try:
                actions.extend(_repair_layout(queue_dir, layout, unexplained))
            except (LedgerQError, OSError) as exc:
                not_done.append(f"could not repair the segment files of {queue_dir}: {exc}")
            finally:
                lock.release()
    after = verify(root)
    return RepairReport(before, after, tuple(actions), tuple(not_done))


def _repair_metadata(queue_dir: str) -> list[str]:
    """Rebuild what the queue refuses to open without (under its lock): a missing or
    damaged ``meta.json`` of a queue that holds data, and reader journals without a
    valid header (restarted at the oldest retained message)."""
    lock = DirLock(queue_dir)
    actions = []
    try:
        store = MetaStore(queue_dir)
        try:
            problem = None if store.exists() else "was missing"
            if problem is None:
                store.load()
        except DamagedMetaError as exc:
            problem = f"was damaged ({exc.reason})"
        if problem is not None and holds_queue_data(queue_dir):
            copy = OptionsStore(queue_dir).load()
            meta, notes = rebuild_meta(queue_dir, copy, margin=ID_BLOCK)
            store.save(meta)
            actions.append(f"rebuilt {store.path}, which {problem}: " + "; ".join(notes))
        for name in list_reader_names(queue_dir):
            path = reader_state_path(queue_dir, name)
            try:
                with open(path, "rb") as f:
                    data = f.read(64)
            except FileNotFoundError:
                continue
            if has_valid_header(data) is False:
                journal = ReaderJournal(path)
                try:
                    journal.rewrite(Checkpoint(1, [], [], {}))  # atomic, durable
                finally:
                    journal.close()
                actions.append(
                    f"restarted reader {name!r} at the oldest retained message: its state file "
                    f"{path} was {'empty' if not data else 'without a valid header'}, so which "
                    "messages it had finished is unknown - they are delivered to it again "
                    "(at-least-once), and its counters (acked, nacked, ...) restart at 0"
                )
    finally:
        lock.release()
    return actions


# Names a repair gives a misnamed file on its way to its right name (when that name is
# taken by another misnamed file - a swap): above every id (2^64 - 1 < 10^20 - 1), so
# never a new segment's name.  A crash mid-way leaves the file misnamed there, which
# every reader takes by its content; the next repair finishes the move.
_STAGING_NAME = 10**20 - 1


def _repair_layout(queue_dir: str, layout: Layout, unexplained: list[tuple[int, int]]) -> list[str]:
    """Move copies into ``segments/damaged/``, rename misnamed files to their content's
    name, and record ``unexplained`` gaps as known lost (the queue's lock held)."""
    seg_dir = os.path.join(queue_dir, SEGMENTS_DIR)
    actions = []
    held = {f.name_id for _, _, f in layout.held_aside}
    for f, holder in layout.set_aside:
        if f.name_id in held:
            continue  # its later ids are nowhere else: left where it is (reported)
        where = move_to_damaged(seg_dir, f.name_id)
        actions.append(
            f"moved {f.file_name} (ids {f.ids()}, which {holder.file_name} holds) to {where}"
        )
    taken = {f.name_id for f in layout.used} | held
    staged: list[tuple[int, SegmentFile]] = []
    for f in layout.misnamed:
        if f.first_id not in taken:
            rename_segment(seg_dir, f.name_id, f.first_id)
            taken.discard(f.name_id)
            taken.add(f.first_id)
            actions.append(f"renamed {f.file_name} to {f.first_id:020d}.log (ids {f.ids()})")
            continue
        staging = _STAGING_NAME - len(staged)
        while staging in taken or os.path.exists(log_path(seg_dir, staging)):
            staging -= 1
        rename_segment(seg_dir, f.name_id, staging)
        taken.discard(f.name_id)
        taken.add(staging)
        staged.append((staging, f))
    for staging, f in staged:
        rename_segment(seg_dir, staging, f.first_id)
        actions.append(f"renamed {f.file_name} to {f.first_id:020d}.log (ids {f.ids()})")
    if unexplained:
        store = MetaStore(queue_dir)
        meta = store.load()
        for lo, hi in unexplained:
            if [lo, hi] not in meta.lost:
                # Not counted yet (the queue was not opened since): count it now.
                meta.lost.append([lo, hi])
                lost = replay_reader(queue_dir, "default").unfinished_in(lo, hi)
                meta.counters["lost"] = meta.counters.get("lost", 0) + lost
            meta.known_lost.append([lo, hi])
            actions.append(
                f"recorded ids {lo}-{hi} of {queue_dir} as known lost (no segment file holds "
                "them; restore it from a backup to get them back): no longer reported"
            )
        store.save(meta)
    return actions


def _rebuild_index(rebuild: IndexRebuild) -> int:
    """Write the index of one segment from a scan of its log; return its number of points."""
    seg_dir = os.path.join(rebuild.queue_dir, SEGMENTS_DIR)
    stored = stored_options(rebuild.queue_dir).get("index_interval")
    interval = stored if isinstance(stored, int) and stored > 0 else Options().index_interval
    fd = os.open(log_path(seg_dir, rebuild.name_id), os.O_RDONLY)
    try:
        scanner = EntryScanner(fd, 0, os.fstat(fd).st_size, after_id=rebuild.first_id - 1)
        points: list[IndexEntry] = []
        last: IndexEntry | None = None
        while (entry := scanner.next()) is not None:
            last = IndexEntry(entry.id, entry.timestamp, scanner.pos - entry.size)
            if not points or last.offset - points[-1].offset >= interval:
                points.append(last)
    finally:
        os.close(fd)
    if rebuild.sealed and last is not None and points[-1] != last:
        points.append(last)  # a sealed index ends with the segment's last entry
    write_index(idx_path(seg_dir, rebuild.name_id), points, sealed=rebuild.sealed)
    return len(points)
