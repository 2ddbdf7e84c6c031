"""zstd compression: JSON events take a fraction of the disk.

Run: python examples/compression.py [QUEUE_DIR]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import ledgerq


def main(path: Path) -> None:
    events = [
        json.dumps(
            {"sensor": f"s{i % 8}", "reading": i * 0.5, "unit": "celsius", "ok": True}
        ).encode()
        * 20
        for i in range(200)
    ]
    raw = sum(len(e) for e in events)
    with (
        ledgerq.open(path / "plain") as plain,
        ledgerq.open(path / "zstd", compression="zstd") as z,
    ):
        plain.enqueue_batch(events)
        z.enqueue_batch(events)
        print(f"payload bytes: {raw}")
        print(f"on disk without compression: {plain.stats().disk_bytes}")
        print(f"on disk with zstd:           {z.stats().disk_bytes}")
        got = z.dequeue_batch(len(events))
        assert [m.payload for m in got] == events  # decompressed transparently
        print(f"read back {len(got)} events intact")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
