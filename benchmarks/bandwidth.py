"""The 4 KiB batch path against the machine's sequential-write bandwidth, and the checksums.

    python benchmarks/bandwidth.py [--seconds 2] [--rounds 3] [--dir /tmp/x] [--checksums]
    python benchmarks/bandwidth.py --encryption [--seconds 1] [--rounds 3]

A small, targeted measurement (not the full suite of ``benchmarks/run.py``): rounds of

* **raw**: 1 MiB ``os.write`` calls appending to a new file (no fsync), the bandwidth the
  page cache takes sequential writes at;
* **batch**: ``enqueue_batch`` of 100 x 4 KiB into a new queue at the default sync level,
  payload bytes per second;

alternately, each after writing and deleting 1 GiB (warm pages: see
``benchmarks.scenarios.warm_pages``), printing the best round of each (noise on a shared
machine only slows a run down) and their ratio.  ``--checksums`` prints the throughput
of the CRC functions instead (zlib's CRC-32, and CRC-32C from ``crc32c`` and
``google_crc32c`` where installed) for 126 B, 4,122 B and 1 MiB.

``--encryption`` measures encryption at rest (issue 18) against the same queue without a
key, in alternating rounds (best of each): ``enqueue_batch`` of 100 x 4 KiB (payload
bytes per second; the target is >= 1 GB/s), and one-at-a-time ``enqueue`` and
``dequeue`` + ``ack`` of 100 B (microseconds per call; the target is the encrypted
enqueue within 3 us of the plain one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import timeit
import zlib
from collections.abc import Callable
from time import perf_counter

import ledgerq

MiB = 1 << 20
PAYLOAD = 4096
BATCH = 100


def warm(path: str, nbytes: int = 1024 * MiB) -> None:
    """Write and delete ``nbytes`` so the timed part gets warm pages."""
    block = os.urandom(MiB)
    scratch = os.path.join(path, "warm.scratch")
    fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(nbytes // MiB):
            os.write(fd, block)
    finally:
        os.close(fd)
        os.unlink(scratch)


def raw_rate(path: str, seconds: float, max_bytes: int) -> float:
    """Bytes per second of 1 MiB appends to a new file."""
    block = os.urandom(MiB)
    fd = os.open(os.path.join(path, "raw.dat"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        written = 0
        start = perf_counter()
        while written < max_bytes and perf_counter() - start < seconds:
            os.write(fd, block)
            written += MiB
        elapsed = perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(os.path.join(path, "raw.dat"))
    return written / elapsed


def batch_rate(path: str, seconds: float, max_bytes: int, key: bytes | None = None) -> float:
    """Payload bytes per second of enqueue_batch(100 x 4 KiB) into a new queue."""
    queue_dir = os.path.join(path, "q")
    payload = os.urandom(PAYLOAD)
    batch = [payload] * BATCH
    q = ledgerq.open(queue_dir, encryption_key=key)
    try:
        written = 0
        start = perf_counter()
        while written < max_bytes and perf_counter() - start < seconds:
            q.enqueue_batch(batch)
            written += PAYLOAD * BATCH
        elapsed = perf_counter() - start
    finally:
        q.close()
        shutil.rmtree(queue_dir)
    return written / elapsed


def checksums() -> None:
    """Print ns per call and GB/s of each CRC function at three sizes."""
    functions: list[tuple[str, Callable[[bytes], int]]] = [("zlib.crc32", zlib.crc32)]
    try:
        import crc32c

        functions.append(("crc32c.crc32c", crc32c.crc32c))
    except ImportError:
        pass
    try:
        import google_crc32c

        functions.append(("google_crc32c.value", google_crc32c.value))
    except ImportError:
        pass
    print(f"{'bytes':>9} {'function':<22} {'ns/call':>10} {'GB/s':>7}")
    for size in (126, 4122, MiB):
        data = os.urandom(size)
        number = max(10, 20_000_000 // size)
        for name, function in functions:
            best = min(timeit.repeat(lambda f=function, d=data: f(d), number=number, repeat=5))
            per_call = best / number
            print(f"{size:>9} {name:<22} {per_call * 1e9:>10.1f} {size / per_call / 1e9:>7.2f}")


def one_at_a_time_us(path: str, count: int, key: bytes | None) -> tuple[float, float]:
    """Microseconds per ``enqueue`` and per ``dequeue`` + ``ack`` of 100 B, one at a time."""
    queue_dir = os.path.join(path, "q1")
    payload = os.urandom(100)
    q = ledgerq.open(queue_dir, encryption_key=key)
    try:
        enqueue = q.enqueue
        start = perf_counter()
        for _ in range(count):
            enqueue(payload)
        enq = perf_counter() - start
        dequeue, ack = q.dequeue, q.ack
        start = perf_counter()
        for _ in range(count):
            message = dequeue()
            assert message is not None
            ack(message.id)
        deq = perf_counter() - start
    finally:
        q.close()
        shutil.rmtree(queue_dir)
    return enq / count * 1e6, deq / count * 1e6


def encryption(base: str, seconds: float, rounds: int, max_bytes: int) -> None:
    """Print the encryption scenarios (see the module docstring)."""
    key = os.urandom(32)
    plain_b, sealed_b, plain_1, sealed_1 = [], [], [], []
    for _ in range(rounds):
        warm(base, 256 * MiB)
        plain_b.append(batch_rate(base, seconds, max_bytes))
        warm(base, 256 * MiB)
        sealed_b.append(batch_rate(base, seconds, max_bytes, key))
        plain_1.append(one_at_a_time_us(base, 50_000, None))
        sealed_1.append(one_at_a_time_us(base, 50_000, key))
    pb, sb = max(plain_b), max(sealed_b)
    print(f"enqueue_batch 100 x 4 KiB, plain:     {pb / 1e9:.2f} GB/s of payload")
    print(f"enqueue_batch 100 x 4 KiB, encrypted: {sb / 1e9:.2f} GB/s of payload (target >= 1)")
    pe, pd = min(e for e, _ in plain_1), min(d for _, d in plain_1)
    se, sd = min(e for e, _ in sealed_1), min(d for _, d in sealed_1)
    print(
        f"enqueue 100 B one at a time: plain {pe:.2f} us, encrypted {se:.2f} us "
        f"(+{se - pe:.2f} us; target <= +3)"
    )
    print(
        f"dequeue + ack 100 B:         plain {pd:.2f} us, encrypted {sd:.2f} us (+{sd - pd:.2f} us)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-mib", type=int, default=1024, help="bytes per timed part")
    parser.add_argument("--dir", default=None)
    parser.add_argument("--checksums", action="store_true")
    parser.add_argument("--encryption", action="store_true")
    args = parser.parse_args()
    if args.checksums:
        checksums()
        return
    base = tempfile.mkdtemp(prefix="lq-bandwidth-", dir=args.dir)
    if args.encryption:
        try:
            encryption(base, args.seconds, args.rounds, args.max_mib * MiB)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        return
    try:
        raws, batches = [], []
        for _ in range(args.rounds):
            warm(base)
            raws.append(raw_rate(base, args.seconds, args.max_mib * MiB))
            warm(base)
            batches.append(batch_rate(base, args.seconds, args.max_mib * MiB))
        raw, batch = max(raws), max(batches)
        print(
            f"raw 1 MiB sequential writes: {raw / MiB:,.0f} MiB/s (rounds: "
            + ", ".join(f"{r / MiB:,.0f}" for r in raws)
            + ")"
        )
        print(
            f"enqueue_batch 100 x 4 KiB:   {batch / MiB:,.0f} MiB/s of payload (rounds: "
            + ", ".join(f"{b / MiB:,.0f}" for b in batches)
            + ")"
        )
        print(f"ratio: {batch / raw:.2f}x")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
