"""Periodic jobs: a heartbeat every 0.2 s, enqueued by the queue itself, once per tick.

Two shared-mode handles (they could be two processes) have the queue open; each tick
gives one message however many look. The consumer blocks in dequeue: its wait ends at
the next tick, which it fires itself.

Run: python examples/periodic_jobs.py [QUEUE_DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import ledgerq


def main(path: Path) -> None:
    with (
        ledgerq.open(path, shared=True) as producer,
        ledgerq.open(path, shared=True) as consumer,
    ):
        producer.add_periodic("heartbeat", b"ping", every=0.2, headers={"source": "example"})
        producer.add_periodic("nightly-report", b"report", cron="0 3 * * *")
        for job in consumer.periodic():
            print(f"job {job.name}: {job.schedule}")
        ticks = []
        while len(ticks) < 3:
            msg = consumer.dequeue(timeout=10)
            assert msg is not None, "a tick should come within 0.2 s"
            ticks.append(int(msg.headers["periodic.tick"]))
            print(f"message #{msg.id}: {msg.payload!r} for tick {msg.headers['periodic.tick']}")
            consumer.ack(msg.id)
        assert len(set(ticks)) == len(ticks), "one message per tick"
        producer.remove_periodic("heartbeat")
        print("jobs left:", [job.name for job in producer.periodic()])


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "periodic")
