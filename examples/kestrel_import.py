"""Move what Kestrel queues still hold into ledgerq (``ledgerq import-kestrel``).

This example writes two small Kestrel journal directories byte by byte - a Kestrel 2.x
opcode journal (a rotated file, the current file, an open transaction and a fan-out
child) and a Kestrel 3 writer file with a reader bookmark - then imports them,
twice, to show that a second run imports nothing.

Run: python examples/kestrel_import.py [DIR]
"""

from __future__ import annotations

import struct
import sys
import tempfile
import time
from pathlib import Path

import ledgerq
from ledgerq.kestrel import ImportReport, import_kestrel

NOW_MS = int(time.time() * 1000)


def addx(data: bytes, add_ms: int, expiry_ms: int = 0) -> bytes:
    """Kestrel 1/2 opcode 2 (ADDX): i32 size, i64 add time, i64 expiry, data."""
    return struct.pack("<Biqq", 2, 16 + len(data), add_ms, expiry_ms) + data


REMOVE = b"\x01"


def remove_tentative_xid(xid: int) -> bytes:
    """Kestrel 2.x opcode 9: an open read (``get q/open``) with its transaction id."""
    return struct.pack("<Bi", 9, xid)


def put(item_id: int, data: bytes, add_ms: int, errors: int = 0) -> bytes:
    """Kestrel 3 PUT (0x86): data length, error count, id, add time, data."""
    return b"\x86" + struct.pack("<IiQq", len(data), errors, item_id, add_ms) + data


def show(report: ImportReport) -> None:
    print(
        f"  {report.format} queue {report.queue!r}: imported {report.imported} of "
        f"{report.found} items, {report.already_imported} already imported, "
        f"{report.expired_dropped} expired, {report.read_by_reader} already read, "
        f"{report.open_transactions} open transactions restored"
    )
    for child, what in report.readers:
        print(f"    fan-out child {report.queue}+{child}: {what}")


def main(base: Path) -> None:
    old = base / "kestrel2"
    old.mkdir(parents=True)
    # A rotated journal, then the current one: "jobs.<ms>" first, "jobs" last.
    (old / "jobs.1700000000000").write_bytes(
        addx(b"resize 1.jpg", NOW_MS) + addx(b"resize 2.jpg", NOW_MS) + REMOVE
    )
    (old / "jobs").write_bytes(
        addx(b"resize 3.jpg", NOW_MS)
        + addx(b"expired job", NOW_MS, NOW_MS - 1000)
        + remove_tentative_xid(1)  # "resize 2.jpg" was being worked on
    )
    (old / "jobs+audit").write_bytes(addx(b"resize 3.jpg", NOW_MS))  # a fan-out child
    (old / "jobs~~1700000000500").write_bytes(b"\xff")  # a temp file Kestrel ignores

    new = base / "kestrel3"
    new.mkdir()
    (new / "events.1700000000000").write_bytes(
        b"\x27\x64\x26\x03"
        + put(1, b"signup", NOW_MS)
        + put(2, b"login", NOW_MS, errors=2)
        + put(3, b"logout", NOW_MS)
        + b"\x00" * 64  # libkestrel's zero padding
    )
    # The reader has read everything up to id 1, and id 3 out of order.
    (new / "events.read.").write_bytes(
        b"\x26\x3c\x26\x03" + b"\x02" + struct.pack("<q", 1) + b"\x91" + struct.pack("<Iq", 8, 3)
    )

    dest = base / "ledgerq"
    for attempt in ("first run", "second run"):
        print(f"{attempt}:")
        show(import_kestrel(old, dest / "jobs"))
        show(import_kestrel(new, dest / "events"))

    with ledgerq.open(dest / "jobs") as jobs:
        for message in jobs.dequeue_batch(10):
            print(f"  jobs {message.id}: {message.payload.decode()!r} {message.headers}")
            jobs.ack(message.id)
        audit = [m.payload.decode() for m in jobs.reader("audit").dequeue_batch(10)]
        print(f"  reader 'audit' (was jobs+audit): {audit}")
    with ledgerq.open(dest / "events") as events:
        got = [
            (m.payload.decode(), m.headers["kestrel.error_count"]) for m in events.dequeue_batch(10)
        ]
        print(f"  events (payload, kestrel.error_count): {got}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
