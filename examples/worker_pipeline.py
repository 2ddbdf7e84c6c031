"""A worker pipeline: 10,000 jobs, 4 worker processes, retries, a DLQ, and a requeue.

Some jobs are bad (the handler raises): they are retried `max_retries` times, then
dead-lettered with the failure reason. After "fixing the bug", the DLQ is requeued and
the pool finishes them.

Run: python examples/worker_pipeline.py [QUEUE_DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import ledgerq
import ledgerq.workers

JOBS = 10_000


def resize(message: ledgerq.Message) -> None:
    """The buggy first version: chokes on odd-sized images."""
    job = json.loads(message.payload)
    if job["width"] % 97 == 0:
        raise ValueError(f"cannot resize width {job['width']}")


def resize_fixed(message: ledgerq.Message) -> None:
    """The fixed version handles every width."""
    json.loads(message.payload)


def main(path: Path) -> None:
    with ledgerq.open(path) as q:
        q.enqueue_batch(
            [json.dumps({"image": n, "width": 100 + n % 1000}).encode() for n in range(JOBS)]
        )
        print(f"enqueued {len(q)} jobs")

    report = ledgerq.workers.run(path, resize, processes=4, until_empty=True, max_retries=3)
    print(
        f"pass 1: {report.processed} done, {report.failed} failed deliveries, "
        f"{report.dead_lettered} dead-lettered, {report.rate:,.0f} jobs/s"
    )

    with ledgerq.open(path, max_retries=3) as q:
        dead = q.dlq.peek(JOBS)
        reasons = Counter(m.headers["dlq.failure_reason"].split(" width")[0] for m in dead)
        print(f"DLQ holds {len(dead)}: {dict(reasons)}")
        moved = q.requeue_dlq()
        print(f"requeued {moved} after the fix")

    report = ledgerq.workers.run(path, resize_fixed, processes=4, until_empty=True, max_retries=3)
    print(f"pass 2: {report.processed} done, {report.failed} failed")
    with ledgerq.open(path) as q:
        stats = q.stats()
        print(f"total acked {stats.acked}, pending {stats.pending}, DLQ {len(q.dlq)}")
        assert stats.acked == JOBS and stats.pending == 0 and len(q.dlq) == 0


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "images")
