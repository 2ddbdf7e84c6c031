"""Id reservation through ``meta.json`` (the file itself: ``ledgerq.segment.meta``).

Ids are never reused, even when a power cut loses entries whose ids were already
returned.  So ids are *reserved* in blocks: before handing out an id at or past
``reserved_until``, the queue durably records a new ``reserved_until`` a block
further on.  After an unclean shutdown the next id is at least ``reserved_until``;
after a clean close it is exactly ``next_id``.
"""

from __future__ import annotations

__all__ = ["ID_BLOCK"]

ID_BLOCK = 1 << 20
