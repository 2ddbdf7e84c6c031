"""The real-ENOSPC sweep's child: a workload whose n-th write finds the disk full, then
a crash.  ``python -m tests.faults._realchild CONFIG_JSON``.

The workload is the torture's (``tests.torture._child.Workload``: enqueues with dedup
ids, batches, dequeues, acks, nacks into the DLQ, requeues, compaction, syncs, reopens)
on a queue in a real tmpfs.  Just before the ``nth`` call that can need space on the
queue's files - a write, a creating open, a mkdir - the child fills the disk to its
last byte with ballast (``tests.realfs.Ballast``); the call meets the kernel's own
ENOSPC, or fits in a page the file already has.  The disk stays full for ``hold``
steps; then either the child crashes at once (``crash_full``) or it frees the disk,
runs ``after`` more steps, and crashes.  A crash is ``os._exit``: nothing closed.

Besides the workload's report lines (see ``tests.torture._child``) it writes::

    F <type> <errno> <message>   the step that started with the last B line raised
    C <sites>                    the space-needing calls counted before the fill
    K <filled>                   about to crash (filled: 1 if the fill happened)
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledgerq.core import journal
from tests.faults._shim import Interposer
from tests.realfs import Ballast
from tests.torture._child import Workload, emit


class FillAt(Interposer):
    """Fill the disk just before the ``nth`` space-needing call on the queue's files."""

    def __init__(self, root: str, nth: int, disk: Ballast) -> None:
        super().__init__(root)
        self.nth = nth
        self.disk = disk
        self.count = 0
        self.filled = False

    def around(self, name: str, path: str, call: Callable[[], Any], args: tuple[Any, ...]) -> Any:
        needs_space = name in ("write", "writev", "pwrite", "mkdir") or (
            name == "open" and bool(args[1] & os.O_CREAT)
        )
        if needs_space and not self.filled:
            self.count += 1
            if self.count == self.nth:
                self.disk.fill()
                self.filled = True
        return call()


def _step(work: Workload) -> None:
    try:
        if work.q.closed:  # a reopen whose close or open failed on the full disk
            work.leased.clear()  # the closed queue's leases went with it
            work.q = work._open()
        work.step()
    except Exception as exc:
        code = getattr(exc, "errno", None) or 0
        text = str(exc).replace("\n", " ")[:200]
        emit(f"F {type(exc).__name__} {code} {text}\n")


def main(argv: list[str]) -> None:
    config = json.loads(argv[1])
    # Journal compaction after a few KiB, not 1 MiB: the workload is small.
    journal._COMPACT_MIN_BYTES = config.get("compact_bytes", 4096)
    disk = Ballast(Path(config["disk"]))
    # The queue and its DLQ exist before the sweep's sites are counted: creating a queue
    # on a full disk fails, and says so - no promise is at stake there.
    work = Workload(config)
    filler = FillAt(config["path"], config["nth"], disk)
    filler.install()
    held = 0
    if work is not None:
        for _ in range(config["steps"]):
            if filler.filled:
                break
            _step(work)
        while filler.filled and held < config["hold"]:
            _step(work)
            held += 1
        emit(f"C {filler.count}\n")
        if filler.filled and not config["crash_full"]:
            disk.free()
            for _ in range(config["after"]):
                _step(work)
    emit(f"K {int(filler.filled)}\n")
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
