"""Ship a live queue to a hub directory: ``ledgerq.ship.ship_queue`` / ``ledgerq ship``.

An edge device keeps writing to its queue while the shipper copies the segments into
``HUB/<client-id>.<queue>/`` - without taking the queue's lock, incrementally, and
verifying every message's CRC.  The copy is itself a queue directory.  With
``delete_shipped`` the edge reclaims disk once the hub copy is durable and every
reader of the edge queue is past the data.

Run: python examples/ship.py [DIR]
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

import ledgerq
from ledgerq.ship import ShipReport, ship_queue


def size_of(queue_dir: Path) -> int:
    return sum(p.stat().st_size for p in (queue_dir / "segments").glob("*.log"))


def main(base: Path) -> None:
    edge = base / "edge" / "telemetry"
    hub = base / "hub"
    # The owner keeps consumed segments for an hour, so only the shipper deletes them.
    with ledgerq.open(edge, segment_size=16 * 1024, retention_max_age=3600) as q:
        for n in range(500):
            q.enqueue(f"reading {n}: {n * 0.25:.2f} C".encode(), headers={"sensor": f"s{n % 4}"})

        first = ship_queue(edge, hub, "device-7")  # the queue stays open: no lock needed
        print(f"shipped {first.messages} messages in {first.segments} segments to {first.dest}")
        again = ship_queue(edge, hub, "device-7")
        print(f"a second run ships {again.messages} messages (idempotent)")

        # Follow mode: keep shipping while the owner writes, stop when told to.
        stop = threading.Event()
        passes: list[int] = []

        def on_pass(report: ShipReport) -> None:
            passes.append(report.last_id)
            if report.last_id >= 800:
                stop.set()

        follower = threading.Thread(
            target=ship_queue,
            args=(edge, hub, "device-7"),
            kwargs={"follow": True, "stop": stop, "on_pass": on_pass, "timeout": 30},
        )
        follower.start()
        for n in range(500, 800):
            q.enqueue(f"reading {n}".encode())
        follower.join()
        print(f"following: {len(passes)} passes shipped up to id {passes[-1]}")

        # The local consumer processes everything; then the shipped segments can go.
        for message in q.dequeue_batch(1000):
            q.ack(message.id)
        q.sync()
        before = size_of(edge)
        report = ship_queue(edge, hub, "device-7", delete_shipped=True)
        print(
            f"delete_shipped removed {report.deleted_segments} segments: "
            f"{before} -> {size_of(edge)} bytes on the edge (the active segment stays)"
        )

    copy = hub / "device-7.telemetry"
    with ledgerq.follow(copy, timeout=0) as messages:
        ids = [m.id for m in messages]
    print(f"the hub copy is a queue: ids {ids[0]}..{ids[-1]}, {len(ids)} messages")
    with ledgerq.open(copy) as hub_queue:  # no shipper running: it opens like any queue
        print(f"opened at the hub: {len(hub_queue)} pending")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
