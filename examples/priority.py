"""Priorities: urgent jobs jump the line; old low-priority jobs are promoted, not starved.

Run: python examples/priority.py [QUEUE_DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import ledgerq
from ledgerq import Item, Priority


def main(path: Path) -> None:
    with ledgerq.open(path, priorities=True, starvation_after=30.0) as q:
        q.enqueue(b"nightly report", priority=Priority.LOW)
        q.enqueue_batch(
            [
                Item(b"resize avatar", priority=Priority.MEDIUM),
                Item(b"payment webhook", priority=Priority.HIGH),
                Item(b"send newsletter", priority=Priority.LOW),
                Item(b"password reset mail", priority=Priority.HIGH),
            ]
        )
        order = []
        while (msg := q.dequeue()) is not None:
            order.append(msg.payload.decode())
            print(f"{msg.priority.name:<6} #{msg.id} {msg.payload.decode()}")
            q.ack(msg.id)
        assert order[:2] == ["payment webhook", "password reset mail"]
        assert order[-2:] == ["nightly report", "send newsletter"]


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "jobs")
