"""Quickstart: enqueue, dequeue, ack, nack, crash-safe reopen.

Run: python examples/quickstart.py [QUEUE_DIR]   (default: a temporary directory)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import ledgerq


def main(path: Path) -> None:
    with ledgerq.open(path) as q:
        ids = q.enqueue_batch([f"job {i}".encode() for i in range(5)])
        q.enqueue(b'{"task": "resize", "image": 42}', headers={"content-type": "application/json"})
        print(f"enqueued ids {ids[0]}..{ids[-1]} and one JSON job; {len(q)} pending")

        msg = q.dequeue()
        assert msg is not None
        print(f"got #{msg.id} {msg.payload!r} (attempt {msg.attempts}) -> ack")
        q.ack(msg.id)

        msg = q.dequeue()
        assert msg is not None
        print(f"got #{msg.id} {msg.payload!r} -> nack, it will come back")
        q.nack(msg.id, reason="worker busy")
        again = q.dequeue()
        assert again is not None
        assert again.id == msg.id
        print(f"got #{again.id} again, attempt {again.attempts} -> leave it leased and close")

    # Reopen: the leased-but-unacked message is delivered again (at-least-once).
    with ledgerq.open(path) as q:
        msg = q.dequeue()
        assert msg is not None
        print(f"after reopen: #{msg.id} {msg.payload!r}, attempt {msg.attempts}")
        q.ack(msg.id)
        while (msg := q.dequeue()) is not None:
            q.ack(msg.id)
            print(f"processed #{msg.id} {msg.payload!r} headers={msg.headers}")
        stats = q.stats()
        print(f"done: enqueued={stats.enqueued} acked={stats.acked} pending={stats.pending}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "jobs")
