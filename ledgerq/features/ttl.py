"""TTL: messages whose ``expires_at`` has passed are not delivered.

Expiry is lazy (the LedgerQ seed's choice): it is checked when a message is
about to be leased, costs one comparison per delivery, and needs no thread.  An
expired message is settled for the reader (an EXPIRE record in its journal), so
it never comes back, and counted in ``stats().expired``.  Its bytes stay on disk
until retention deletes the segment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledgerq.core.feature import Feature
from ledgerq.format.entry import Entry, EntryFlags

if TYPE_CHECKING:
    from ledgerq.core.reader import ReaderCore

__all__ = ["TTLFeature"]


class TTLFeature(Feature):
    """Skip (and settle) messages whose time to live has passed."""

    name = "ttl"
    deliverable_flags = int(EntryFlags.HAS_TTL)

    def deliverable(self, reader: ReaderCore, entry: Entry, now_ns: int) -> bool:
        expires_at = entry.expires_at
        return expires_at is None or expires_at > now_ns
