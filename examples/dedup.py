"""Dedup window: a webhook delivered three times is enqueued once.

Run: python examples/dedup.py [QUEUE_DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import ledgerq


def main(path: Path) -> None:
    with ledgerq.open(path, dedup_window=300) as q:
        deliveries = ["evt_1", "evt_2", "evt_1", "evt_3", "evt_1", "evt_2"]
        for event_id in deliveries:
            message_id = q.enqueue(f"payload of {event_id}".encode(), dedup_id=event_id)
            print(f"webhook {event_id} -> message #{message_id}")
        stats = q.stats()
        print(f"{len(deliveries)} deliveries, {len(q)} messages, {stats.duplicates} duplicates")
        assert len(q) == 3


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "webhooks")
