"""Dead-letter queue: a retry loop with nack, then inspection and requeue of failures.

Run: python examples/dlq.py [QUEUE_DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import ledgerq


def handle(payload: bytes) -> None:
    job = json.loads(payload)
    if job["amount"] < 0:
        raise ValueError(f"negative amount {job['amount']}")


def main(path: Path) -> None:
    with ledgerq.open(path, max_retries=3) as q:
        for n, amount in enumerate([10, -5, 7, -1, 3]):
            q.enqueue(json.dumps({"invoice": n, "amount": amount}).encode())

        while (msg := q.dequeue()) is not None:
            try:
                handle(msg.payload)
                q.ack(msg.id)
            except ValueError as exc:
                q.nack(msg.id, reason=str(exc))  # retried, then dead-lettered on the 3rd failure
                print(f"#{msg.id} failed (attempt {msg.attempts}): {exc}")

        print(f"dead letters: {len(q.dlq)}")
        for dead in q.dlq.peek(10):
            h = dead.headers
            print(
                f"  dlq #{dead.id} was #{h['dlq.original_id']}, failed {h['dlq.retry_count']}x:"
                f" {h['dlq.failure_reason']}"
            )

        # The bug is fixed: requeue everything and process it again.
        moved = q.requeue_dlq()
        print(f"requeued {moved}")
        while (msg := q.dequeue()) is not None:
            job = json.loads(msg.payload)
            print(f"#{msg.id} invoice {job['invoice']} processed after the fix")
            q.ack(msg.id)
        stats = q.stats()
        print(f"acked={stats.acked} nacked={stats.nacked} dead_lettered={stats.dead_lettered}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "invoices")
