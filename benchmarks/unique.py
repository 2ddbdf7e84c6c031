"""Unique jobs: the cost of ``enqueue(..., unique_key=)`` beside a plain enqueue, and
the memory per held key.

    python benchmarks/unique.py [--messages 100000] [--rounds 3]

A targeted measurement (not the suite of ``benchmarks/run.py``) of issue 28's promise
``enqueue(unique_key=) >= 0.8x a plain enqueue``:

* **enqueue**: ``--messages`` single enqueues of a 100-byte payload into a new queue,
  plain vs each with its own ``unique_key`` (every key new: each writes its record and
  its message; the table grows to all of them), exclusive and shared mode;
* **consumer keeps up**: the same enqueues, plain vs each with a new key, timed in
  runs of 1,000, each run dequeued and acked (not timed) before the next: the keys
  held stay few, and the sweeps that forget the finished ones run on the enqueues'
  path (they are timed) - the steady state of a unique-job queue;
* **held**: the same count of enqueues of one key whose message is pending (each
  answers the held id and writes nothing);
* **memory**: bytes the table holds per key (``tracemalloc``, a separate pass): in the
  session that enqueued them, and after a reopen (read back from
  ``features/unique.log``, each key then also waiting to be verified).

* **floor**: a plain enqueue followed by one ``os.write`` of a record-sized buffer to
  another file - what a design that writes each key's record with a system call pays
  at least (the record must reach the OS before its message: a second ``write()``;
  the design before ``features/unique.table``).
* **in-entry floor**: what a design keeping the key's digest *inside* the message's
  entry (one ``write()``; a new entry format, since the flags byte is full) pays at
  least: the key's digest, one lookup and one insert in a dict, and an entry 17 bytes
  longer (a kind byte and the 16-byte digest).
* **mapped floor**: what the design of ``features/unique.table`` pays at least: the
  digest, one lookup and one insert in a dict, and a 40-byte record stored into a
  shared mapping of a file (``struct.pack_into``, no system call; a CRC of the digest
  stands for the rest of the record's work).

The keys are made before the clock starts (the caller's, as the plain row's payload
is): every row measures the enqueue.

Rounds alternate; the best round of each is reported.  Times are the process's CPU time
(``time.process_time``: user + system), not wall time: on a shared, loaded machine the
wall clock mostly measures the wait for a core.  Default options otherwise.
"""

from __future__ import annotations

import argparse
import gc
import mmap
import os
import shutil
import struct
import tempfile
import time
import tracemalloc
import zlib

import ledgerq
from ledgerq.features.unique import unique_digest

PAYLOAD = b"x" * 100


def _rate(path: str, n: int, *, shared: bool, keys: str | None) -> float:
    shutil.rmtree(path, ignore_errors=True)
    # The keys exist before the clock starts: the caller makes them (often they are
    # ids it has already), and the row measures the enqueue, as the plain row does.
    job_keys = [f"job-{i}" for i in range(n)]
    with ledgerq.open(path, shared=shared) as q:
        enqueue = q.enqueue
        gc.collect()
        started = time.process_time()
        if keys is None:
            for _ in range(n):
                enqueue(PAYLOAD)
        elif keys == "floor":
            fd = os.open(path + ".floor", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            record = bytes(58)
            try:
                for _ in range(n):
                    enqueue(PAYLOAD)
                    os.write(fd, record)
            finally:
                os.close(fd)
        elif keys == "in-entry":
            held: dict[bytes, int] = {}
            longer = PAYLOAD + bytes(17)
            for key in job_keys:
                digest = unique_digest(key)
                if held.get(digest) is None:
                    held[digest] = enqueue(longer)
        elif keys == "mapped":
            fd = os.open(path + ".mapped", os.O_RDWR | os.O_CREAT, 0o644)
            os.ftruncate(fd, 64 * (n + 1))
            area = mmap.mmap(fd, 64 * (n + 1))
            held = {}
            pack_into = struct.Struct("<16sQqI").pack_into
            offset = 0
            try:
                for key in job_keys:
                    digest = unique_digest(key)
                    if held.get(digest) is None:
                        message_id = enqueue(PAYLOAD)
                        pack_into(area, offset, digest, message_id, 0, zlib.crc32(digest))
                        offset += 36
                        held[digest] = message_id
            finally:
                area.close()
                os.close(fd)
        elif keys == "distinct":
            for key in job_keys:
                enqueue(PAYLOAD, unique_key=key)
        else:
            for _ in range(n):
                enqueue(PAYLOAD, unique_key="the-one")
        return n / (time.process_time() - started)


_RUN = 1000  # enqueues between two drains in the "consumer keeps up" rows


def _kept_up_rate(path: str, n: int, *, shared: bool, unique: bool) -> float:
    """Enqueues per CPU second when a consumer drains every run of ``_RUN`` (untimed)."""
    shutil.rmtree(path, ignore_errors=True)
    spent = 0.0
    with ledgerq.open(path, shared=shared) as q:
        enqueue = q.enqueue
        for run in range(n // _RUN):
            keys = [f"job-{run}-{i}" for i in range(_RUN)]
            started = time.process_time()
            if unique:
                for key in keys:
                    enqueue(PAYLOAD, unique_key=key)
            else:
                for _ in keys:
                    enqueue(PAYLOAD)
            spent += time.process_time() - started
            q.ack_batch([m.id for m in q.dequeue_batch(_RUN)])
    return (n // _RUN * _RUN) / spent


def _memory(path: str, n: int) -> tuple[float, float]:
    shutil.rmtree(path, ignore_errors=True)
    with ledgerq.open(path, sync="never") as q:
        q.enqueue(PAYLOAD, unique_key="warm-up")  # the file and its first record
        gc.collect()
        tracemalloc.start()
        before, _ = tracemalloc.get_traced_memory()
        for i in range(n):
            q.enqueue(PAYLOAD, unique_key=f"job-{i}")
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        in_session = (after - before) / n
    with ledgerq.open(path, sync="never") as q:
        gc.collect()
        tracemalloc.start()
        before, _ = tracemalloc.get_traced_memory()
        q.enqueue(PAYLOAD, unique_key="warm-up")  # reads the file back: every key
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        reopened = (after - before) / n
    return in_session, reopened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    n = args.messages
    tmp = tempfile.mkdtemp(prefix="ledgerq-unique-bench-")
    try:
        path = tmp + "/q"
        for shared in (False, True):
            kinds = ("distinct", "held", "floor", "in-entry", "mapped")
            best = dict.fromkeys(("plain", *kinds, "kept-up plain", "kept-up unique"), 0.0)
            for _ in range(args.rounds):
                best["plain"] = max(best["plain"], _rate(path, n, shared=shared, keys=None))
                for kind in kinds:
                    best[kind] = max(best[kind], _rate(path, n, shared=shared, keys=kind))
                for unique in (False, True):
                    name = "kept-up unique" if unique else "kept-up plain"
                    rate = _kept_up_rate(path, n, shared=shared, unique=unique)
                    best[name] = max(best[name], rate)
            mode = "shared" if shared else "exclusive"
            plain = best["plain"]
            print(
                f"{mode:9}  plain {plain:9,.0f}/s   unique_key (new keys) "
                f"{best['distinct']:9,.0f}/s = {best['distinct'] / plain:.2f}x   "
                f"held key {best['held']:9,.0f}/s = {best['held'] / plain:.2f}x   "
                f"floor {best['floor']:9,.0f}/s = {best['floor'] / plain:.2f}x   "
                f"in-entry floor {best['in-entry']:9,.0f}/s = {best['in-entry'] / plain:.2f}x   "
                f"mapped floor {best['mapped']:9,.0f}/s = {best['mapped'] / plain:.2f}x"
            )
            kept_plain, kept_unique = best["kept-up plain"], best["kept-up unique"]
            print(
                f"{mode:9}  consumer keeps up: plain {kept_plain:9,.0f}/s   unique_key "
                f"{kept_unique:9,.0f}/s = {kept_unique / kept_plain:.2f}x"
            )
        in_session, reopened = _memory(path, n)
        print(
            f"memory per held key: {in_session:.0f} B in the enqueuing session, "
            f"{reopened:.0f} B after a reopen ({n:,} keys)"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
