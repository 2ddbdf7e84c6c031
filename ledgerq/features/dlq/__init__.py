"""The dead-letter queue feature: the DLQ, the move into it, and its failure log.

One feature in three modules, which import each other and no other feature:

* :mod:`~ledgerq.features.dlq.store` - the DLQ itself, a full queue in ``<queue>/dlq/``;
* :mod:`~ledgerq.features.dlq.feature` - moves a message there after ``max_retries``
  failed deliveries;
* :mod:`~ledgerq.features.dlq.retries` - ``features/retries.log``, the reason and time
  of each failing message's last failure.

See ``docs/dlq.md``.
"""

from __future__ import annotations

from ledgerq.features.dlq.feature import DeadLetterFeature
from ledgerq.features.dlq.store import DLQ_DIR, DLQ_HEADERS, DeadLetterStore, OpenConfigured

__all__ = ["DLQ_DIR", "DLQ_HEADERS", "DeadLetterFeature", "DeadLetterStore", "OpenConfigured"]
