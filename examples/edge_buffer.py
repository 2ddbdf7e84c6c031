"""Edge buffering: a bounded queue between a sensor and an uploader that goes offline.

A device reads a sensor faster than its uplink can always take, and the uplink drops
out now and then.  The queue buffers the readings on disk, and its bound
(``max_pending``) keeps the buffer from filling the device's disk during a long
outage: the sensor's ``enqueue(..., timeout=)`` waits for room (backpressure) instead
of growing the backlog without end.  The uploader gives a reading back with
``release`` while the link is down (not a failure: it does not move toward the
dead-letter queue) and backs off, doubling its pause up to a ceiling.

Run: python examples/edge_buffer.py [QUEUE_DIR]
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import ledgerq

BUFFER = 20  # readings the device may hold unsent
READINGS = 120


class FlakyUplink:
    """A link that is down for ``outage`` sends, then up, then down again once more."""

    def __init__(self, outage: int) -> None:
        self.outage = outage
        self.attempts = 0
        self.sent: list[bytes] = []

    def send(self, payload: bytes) -> bool:
        self.attempts += 1
        down = self.attempts <= self.outage or 60 < self.attempts <= 60 + self.outage
        if down:
            return False
        self.sent.append(payload)
        return True


def sensor(q: ledgerq.Queue, held_back: list[int]) -> None:
    """Read the sensor; when the buffer is full, wait for room (at most 30 s a reading)."""
    for n in range(READINGS):
        reading = f"reading {n}: {20 + n % 7}.{n % 10} C".encode()
        try:
            q.enqueue(reading)  # timeout=0: raises at once if the buffer is full
        except ledgerq.QueueFullError:
            held_back[0] += 1
            q.enqueue(reading, timeout=30)  # backpressure: wait for the uploader


def uploader(q: ledgerq.Queue, link: FlakyUplink, largest: list[int]) -> None:
    """Send every reading; while the link is down, give it back and back off."""
    pause, uploaded = 0.005, 0
    while uploaded < READINGS:
        msg = q.dequeue(timeout=30)
        if msg is None:
            raise RuntimeError("the sensor stopped sending")
        stats = q.stats()
        largest[0] = max(largest[0], stats.pending + stats.in_flight)
        if link.send(msg.payload):
            q.ack(msg.id)
            uploaded += 1
            pause = 0.005
        else:
            q.release(msg.id)  # offline: not the reading's fault, no step toward the DLQ
            time.sleep(pause)
            pause = min(pause * 2, 0.08)


def main(path: Path) -> None:
    link = FlakyUplink(outage=12)
    held_back, largest = [0], [0]
    with ledgerq.open(path, max_pending=BUFFER) as q:
        producer = threading.Thread(target=sensor, args=(q, held_back))
        producer.start()
        uploader(q, link, largest)
        producer.join()
        print(f"{READINGS} readings sent in order over a link that was down twice")
        print(f"the sensor was held back {held_back[0]} times by the bound of {BUFFER}")
        print(f"the buffer never held more than {largest[0]} readings")
        assert [int(p.split()[1].rstrip(b":")) for p in link.sent] == list(range(READINGS))
        assert largest[0] <= BUFFER
        assert q.stats().pending == 0


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "edge")
