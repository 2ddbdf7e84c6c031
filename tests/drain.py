"""Drain a queue or a reader: the end of many crash tests, written once."""

from __future__ import annotations

from typing import Any

import ledgerq
from ledgerq.features.periodic import TICK_HEADER


def drain(reader: Any) -> list[ledgerq.Message]:
    """Dequeue (in batches of 64) and ack everything ``reader`` - a queue or a named
    reader, exclusive or shared - delivers; return it in delivery order."""
    delivered: list[ledgerq.Message] = []
    while batch := reader.dequeue_batch(64):
        for msg in batch:
            reader.ack(msg.id)
        delivered.extend(batch)
    return delivered


def drain_singly(reader: Any) -> list[ledgerq.Message]:
    """Lease and ack, one dequeue at a time, every message ``reader`` - a queue or a
    named reader - delivers; return them in delivery order."""
    delivered = []
    while (msg := reader.dequeue()) is not None:
        reader.ack(msg.id)
        delivered.append(msg)
    return delivered


def drain_ticks(q: Any) -> list[int]:
    """Lease and ack, one dequeue at a time (each may fire a due periodic job), every
    message ``q`` delivers; return the periodic tick of each, in delivery order."""
    return [int(msg.headers[TICK_HEADER]) for msg in drain_singly(q)]
