"""The disk reserve of a queue open in shared mode: one ``reserve`` file for every handle.

In exclusive mode the one handle knows whether it released the reserve
(:class:`~ledgerq.segment.reserve.DiskReserve`).  In shared mode any handle may meet a
full disk in an ack and release it, and then *every* handle's enqueues must refuse
until it is back - else the others would fill the space it freed, which is the acks'.
So whether the reserve is spent is published in the state page's ``reserve_spent``
word, which each handle's append path reads (one byte of the mapped page) and each
handle's :attr:`is_held` looks at:

* release (a drain write met ENOSPC): under the append lock, set the word, delete the
  file;
* restore (an enqueue through the closed gate, or retention deleted a segment): under
  the append lock, write the file if there is room (or find it written by another
  handle), then clear the word.

Both under the append lock, so once it is released the word and the file agree.  A
handle killed between the two steps leaves the word set with the file present (the
next restore finds the file and clears it) or the word set and the file gone (the
spent state, as intended); never a clear word without the file.  The first handle of a
session writes the page from the file (``reserve_spent`` = 0 if it holds it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from ledgerq.format.shared_state import SLOT_RESERVE_SPENT
from ledgerq.segment.reserve import RESERVE_BYTES, DiskReserve
from ledgerq.segment.shared_page import SharedPage

__all__ = ["SharedDiskReserve"]


class SharedDiskReserve(DiskReserve):
    """The reserve at ``path`` shared by the handles of one queue (see the module).

    Until :meth:`attach` (the first handle, recovering alone) it is a plain reserve.
    """

    def __init__(self, path: str, size: int = RESERVE_BYTES) -> None:
        self._held = False
        self._page: SharedPage | None = None
        self._locked: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext
        super().__init__(path, size)

    def attach(
        self, page: SharedPage, locked: Callable[[], contextlib.AbstractContextManager[None]]
    ) -> None:
        """Publish through ``page`` from now on; ``locked`` takes the append lock."""
        self._page = page
        self._locked = locked

    @property
    def is_held(self) -> bool:
        """Whether the reserve is held: by this handle's knowledge, and no other handle
        has released it since (the page's word)."""
        page = self._page
        return self._held and (page is None or not page.get(SLOT_RESERVE_SPENT))

    @is_held.setter
    def is_held(self, held: bool) -> None:
        self._held = held

    def ensure(self) -> bool:
        page = self._page
        if page is None:
            return super().ensure()
        with self._locked():
            if page.get(SLOT_RESERVE_SPENT):
                self._held = False  # released by some handle: the file tells the rest
            if not super().ensure():
                return False
            page.set(SLOT_RESERVE_SPENT, 0)
            return True

    def release(self) -> bool:
        """Release the reserve for every handle; True if that may have freed space.

        True also when another handle had released it and this one did not know yet
        (as a reserve deleted behind an exclusive queue's back): its write is tried
        once more and its journals compact early from now on.
        """
        page = self._page
        if page is None:
            return super().release()
        with self._locked():
            knew_spent = not self._held
            was_set = page.get(SLOT_RESERVE_SPENT)
            page.set(SLOT_RESERVE_SPENT, 1)  # first: a death after it leaves it spent
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                self._held = False
                return not knew_spent
            except OSError:
                page.set(SLOT_RESERVE_SPENT, was_set)  # still there: no help, not spent
                return False
            self._held = False
            return True
