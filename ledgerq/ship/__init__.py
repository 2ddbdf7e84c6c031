"""``ledgerq ship``: copy a queue's segments to a hub directory, incrementally.

The copy of queue directory ``SRC`` shipped by client ``ID`` lives in
``DEST_ROOT/<ID>.<basename of SRC>/`` (SEJ's hub layout) and is itself a queue
directory: ``meta.json``, ``segments/*.log`` byte for byte as in the source, and a
sparse index per segment - so ``ledgerq.follow``, the Spark reader and (when no
shipper runs) ``ledgerq.open`` read it.  ``ship.json`` there names the source.

How a pass works (the source is read without its lock, beside its owner):

* Source segments are taken in id order.  A segment is *sealed* once a newer one
  exists (its owner creates the next file only after its last write to the
  previous one), or once it is deleted (only sealed segments are deleted).
* Every byte copied is first read and decoded: every entry's CRC is checked, and
  the bytes written are decoded again before they are written.  A segment is
  copied up to the end of its last complete entry; an entry still being appended
  is waited for, never copied in part.  Damage in the middle of a segment (bytes
  that are no entry, followed by valid entries) is reported and copied as it is,
  so the destination stays byte-exact and its readers skip it as the source's do.
* A destination segment appears only whole: it is written to a ``.tmp`` file,
  fsynced and renamed.  After that it grows only by appends of complete, verified
  entries (the way its source grew) and is fsynced before ``meta.json`` moves on.
  A shipper killed in the middle of such an append can leave an incomplete last
  entry, which every ledgerq reader treats as a write in flight and the next run
  cuts off before it continues.  A segment's sealed index is written (atomically)
  before the next segment's file is created, as the queue itself does.
* Resuming needs no state besides the destination itself: the newest destination
  segment says where to go on (its size is the source offset: the copy is
  byte-exact), and its last entry is compared with the source's.

``--delete-shipped`` deletes a source segment only when it is sealed, its copy is
sealed and fsynced, and every id in it is below the durable head of every reader
of the source (``readers/*.state`` replayed read-only).  It cannot see the owner's
memory: see ``docs/ship.md`` for the races with the owner's own retention.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from ledgerq._public import publish
from ledgerq.segment.readonly import DirectoryWatcher, WatchMode, watch_segments
from ledgerq.ship._report import ProgressCallback, ShipError, ShipReport
from ledgerq.ship._shipper import STATE_NAME, Shipper, destination_path, durable_reader_heads

__all__ = [
    "STATE_NAME",
    "ShipError",
    "ShipReport",
    "destination_path",
    "durable_reader_heads",
    "ship_queue",
]

_MIN_PASS_INTERVAL_S = 0.05  # in follow mode, at most ~20 passes (and fsyncs) a second


def ship_queue(
    src: str | os.PathLike[str],
    dest_root: str | os.PathLike[str],
    client_id: str,
    *,
    follow: bool = False,
    delete_shipped: bool = False,
    timeout: float | None = None,
    stop: threading.Event | None = None,
    on_progress: ProgressCallback | None = None,
    on_pass: Callable[[ShipReport], None] | None = None,
    watch: WatchMode = "auto",
) -> ShipReport:
    """Copy the queue ``src`` into ``dest_root/<client_id>.<name of src>/``; return a report.

    Reads ``src`` without its lock (it runs beside the owner) and holds the
    destination's lock while it runs.  Copies sealed segments once and the active
    one up to its last complete entry, verifying every entry's CRC; resumable after
    any interruption and idempotent.  Everything copied is fsynced before it
    returns (and before any deletion).  ``delete_shipped`` then deletes source
    segments that are shipped and consumed by every reader of the source (see
    :meth:`Shipper.delete_shipped`).

    ``follow`` keeps shipping as new data arrives until ``stop`` is set, or
    ``timeout`` seconds pass without new data (None: forever); ``on_pass(report)``
    is called after each pass that copied or deleted something.
    ``on_progress(done_bytes, total_bytes)`` reports each pass's copying.

    Raises :class:`ShipError` for an invalid client id or a destination holding
    something else, :class:`NotAQueueError` if ``src`` is not a queue,
    :class:`QueueLockedError` if another shipper (or ``ledgerq.open``) holds the
    destination, :class:`CorruptionError` if the source is truncated or replaced
    under the shipper.
    """
    shipper = Shipper(src, dest_root, client_id, on_progress=on_progress)
    watcher: DirectoryWatcher | None = None
    try:
        if follow:
            # Before the first look at the files, so no change can slip between a look and a wait.
            watcher = watch_segments(os.fspath(src), watch)
        shipper.open()
        idle_since = time.monotonic()
        while True:
            started = time.monotonic()
            messages, nbytes = shipper.ship_pass()
            deleted = shipper.delete_shipped()[0] if delete_shipped else 0
            if messages or nbytes or deleted:
                idle_since = time.monotonic()
                if on_pass is not None:
                    on_pass(shipper.report())
            if not follow or watcher is None:
                break
            if stop is not None and stop.is_set():
                break
            wait = None if timeout is None else timeout - (time.monotonic() - idle_since)
            if wait is not None and wait <= 0:
                break
            patience = shipper.patience_left()
            if patience is not None:
                wait = patience if wait is None else min(wait, patience)
            if stop is not None:
                wait = 0.25 if wait is None else min(wait, 0.25)
            watcher.wait(wait)
            pause = _MIN_PASS_INTERVAL_S - (time.monotonic() - started)
            if pause > 0 and (stop is None or not stop.is_set()):
                time.sleep(pause)  # rate limit: many appends, one pass (and one fsync)
    finally:
        try:
            shipper.close()
        finally:
            if watcher is not None:
                watcher.close()
    return shipper.report()


publish(__name__, globals(), __all__)  # (the names defined in private modules)
