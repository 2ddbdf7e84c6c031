"""Drain a queue or a reader: the end of many crash tests, written once."""

from __future__ import annotations

from typing import Any

import ledgerq


def drain(reader: Any) -> list[ledgerq.Message]:
    """Dequeue (in batches of 64) and ack everything ``reader`` - a queue or a named
    reader, exclusive or shared - delivers; return it in delivery order."""
    delivered: list[ledgerq.Message] = []
    while batch := reader.dequeue_batch(64):
        for msg in batch:
            reader.ack(msg.id)
        delivered.extend(batch)
    return delivered
