"""The state of a queue core, declared once: what every part of it reads and writes.

:class:`~ledgerq.core.queue.QueueCore` is written in parts, one concern each - opening
and recovery (``opening.py``), the named readers (``named_readers.py``), the append
paths (``appending.py``), the checked append path (``admission.py``), the hand-off
(``handoff.py``), retention (``retention.py``), closing (``closing.py``) - each a
mixin whose methods take the queue as ``self``.  They all derive from
:class:`QueueState`, which declares the queue's fields (set by the queue's constructor
and by opening; ``typing.get_type_hints`` resolves them, so their types are imported
here) and, for the type checker only, the queue's methods the parts call across.  It
holds no code: a newcomer reads here what a queue core is made of.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ledgerq._options import Options
from ledgerq.core.backlog import Backlog
from ledgerq.core.clock import Clock, QueueClock
from ledgerq.core.feature import Draft, Feature, HandoffTaker, KeyAdmitter, Timer
from ledgerq.core.lifecycle import Holdings, MetaKeeper, Tally
from ledgerq.core.reader import ReaderCore, ReaderHooks
from ledgerq.core.reader_handle import Reader
from ledgerq.core.shared_appends import SharedAppends
from ledgerq.core.waits import Waits
from ledgerq.format.entry import Entry
from ledgerq.format.sealing import EntrySealer
from ledgerq.segment.lock import DirLock
from ledgerq.segment.manager import SegmentManager
from ledgerq.segment.meta import Meta, MetaStore, OptionsStore
from ledgerq.segment.reserve import DiskReserve
from ledgerq.segment.steplock import Budget
from ledgerq.segment.sync import GroupCommit

__all__ = ["QueueState"]


class QueueState:
    """The fields of a queue core (declarations only; see the module)."""

    # What the queue's constructor sets before opening (core/queue.py) ...
    path: str
    options: Options
    shared: bool
    _budget: Budget  # how long a wait for another handle's lock may take
    _clock_source: Clock
    _remember_options: bool
    _features: list[Feature]
    _dirlock: DirLock  # LOCK, held while the queue is open (the constructor takes it)
    _readers: dict[str, Reader]
    _cores: dict[str, ReaderCore]
    # ... the queue's state, set once by opening ...
    _waits: Waits  # how callers wait and are woken; _lock is its lock
    _lock: threading.Lock
    _closed: bool
    _meta_store: MetaStore
    _options_store: OptionsStore
    _meta: Meta
    _keeper: MetaKeeper  # saves meta.json and options.json
    _sealer: EntrySealer | None  # an encrypted queue's
    _digest_key: bytes | None  # an encrypted queue's key of dedup ids' and unique keys' digests
    _disk_reserve: DiskReserve
    _make_room: Callable[[], bool]  # the journals' and features' way to the reserve
    _tally: Tally  # the counters stats() shows
    _manager: SegmentManager
    _log_commit: GroupCommit
    _sync_always: bool
    _stop_flusher: threading.Event
    _flusher: threading.Thread | None  # sync="interval"'s thread
    _holdings: Holdings  # what close (and the finalizer) releases
    _default: Reader
    _timer: Timer | None  # the feature that enqueues by time (periodic jobs)
    # ... the ids and the clock ...
    _next_id: int
    _ids_reserved_until: int  # the durable id reservation in meta.json
    _append_gate: int  # an append of an id at or past it takes _reserve_ids first
    _enqueued: int
    _clock: QueueClock
    _clock_offset_ns: int  # now = _clock_offset_ns + _clock_mono(), inline on hot paths
    _clock_mono: Callable[[], int]
    # ... and the features' hooks, sorted into the lists the append paths walk.
    _transformers: list[Feature]
    _admitters: list[Feature]
    _preparers: list[Feature]
    _recorders: list[Feature]
    _restorers: list[Feature]
    _flushers: list[Feature]
    _reader_hooks: ReaderHooks
    _backlog: Backlog | None  # a bounded queue's room check
    _plain_path: bool  # no hook looks at a plain enqueue: skip building Drafts
    _max_size: int
    _encode_plain: Callable[[int, int, bytes], bytes]
    _encode_delayed: Callable[[int, int, bytes, int], bytes]
    _encode_batch: Callable[[int, int, list[bytes], bool], tuple[list[bytes], list[int]]]
    _unique: KeyAdmitter | None  # unique jobs, on the path of bytes with only a key
    _handoff_taker: HandoffTaker | None  # the path of forwarded bytes payloads

    # The append session of shared mode (core/shared_appends), once the handle has joined
    # the session's page; None in exclusive mode: its appends are the uncontended case.
    _appends: SharedAppends | None

    if TYPE_CHECKING:  # the queue's own methods, which its parts call

        def _ensure_open(self) -> None: ...
        def _open_reader(self, name: str, *, start_latest: bool) -> Reader: ...
        def _save_meta(self, *, clean: bool) -> None: ...
        def _prepare_wait(self) -> bool: ...
        def _fire_timer(self) -> None: ...
        def _restore_disk_reserve(self) -> bool: ...
        def _retire_consumed(self) -> None: ...
        def _restore(self, entry: Entry) -> bytes: ...
        # The append pipeline's steps (appending.py; the checked path: admission.py).
        def _reserve_ids(self, end: int) -> None: ...
        def _append(
            self, drafts: list[Draft], sizes: list[int] | None = None, timeout: float | None = 0
        ) -> list[int]: ...
        def _encode_drafts(
            self, drafts: list[Draft], first: int, now: int, continues: bool = False
        ) -> list[bytes]: ...
        def _appended(self, first: int, count: int, rotated: bool) -> int: ...
        def _count_written(self, first: int) -> None: ...
        def _after_append(self) -> None: ...
