"""Child processes of the ship tests; they report through stdout, one line per event.

``produce PATH COUNT SEGMENT_SIZE``: enqueue COUNT messages, printing ``enq N`` every
50 and ``done`` at the end, then wait for a line on stdin before closing the queue.

``ship SRC ROOT CLIENT CHUNK``: ship with a chunk size of CHUNK bytes (so that a big
copy reports progress many times), printing ``progress DONE TOTAL`` at each step and
``finished`` at the end.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import ledgerq
import ledgerq.ship
import ledgerq.ship._shipper


def payload(i: int) -> bytes:
    """Message number ``i``: deterministic, of varying size."""
    return (b"<%d>" % i) * (1 + i % 37)


def produce(path: str, count: str, segment_size: str) -> None:
    with ledgerq.open(path, segment_size=int(segment_size), sync="never") as q:
        print("ready", flush=True)
        for i in range(1, int(count) + 1):
            q.enqueue(payload(i), headers={"n": str(i)})
            if i % 50 == 0:
                print(f"enq {i}", flush=True)
        print("done", flush=True)
        sys.stdin.readline()


def ship(src: str, root: str, client: str, chunk: str) -> None:
    ledgerq.ship._shipper._CHUNK = int(chunk)

    def progress(done: int, total: int) -> None:
        print(f"progress {done} {total}", flush=True)

    ledgerq.ship.ship_queue(src, root, client, on_progress=progress)
    print("finished", flush=True)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"produce": produce, "ship": ship}[command](*args)
