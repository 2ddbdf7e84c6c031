"""Encryption at rest: an edge buffer whose disk may be lost holds no message in clear.

Run: python examples/encryption.py [QUEUE_DIR]
"""

from __future__ import annotations

import secrets
import sys
import tempfile
from pathlib import Path

import ledgerq


def main(path: Path) -> None:
    # In production the key comes from a secret store (or a file `chmod 600` that is
    # not on the same disk), never from beside the queue.
    key = secrets.token_bytes(32)
    reading = b'{"patient": "ada", "heart_rate": 71}'
    with ledgerq.open(path, encryption_key=key) as q:
        q.enqueue(reading, headers={"device": "ward-7"})
    on_disk = b"".join(p.read_bytes() for p in path.rglob("*") if p.is_file())
    assert reading not in on_disk and b"ward-7" not in on_disk
    print(f"{len(on_disk)} bytes on disk, none of them the reading or its headers")
    try:
        ledgerq.open(path, encryption_key=secrets.token_bytes(32))
    except ledgerq.ConfigError as exc:
        print(f"another key is refused before anything is read or written: {exc}")
    with ledgerq.open(path, encryption_key=key) as q:
        message = q.dequeue()
        assert message is not None and message.payload == reading
        q.ack(message.id)
        print(f"with the key: {message.payload.decode()} from {message.headers['device']}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "vitals")
