"""Write the committed format-1 fixture queue (run once with a ledgerq that writes format 1).

Kept to show how ``fixtures/v1_queue`` was made: with the code of main at 9248413, before
format 2 existed, as ``python tests/format/make_v1_fixture.py DEST`` (and ``fixtures/v1_clean`` with
``--clean``: the same, closed cleanly before the second part; ``fixtures/v1_empty`` with
``--empty``: a queue that never held a message, for the behaviour suite's format-1
configuration in tests/core/test_behaviour.py).  Every record type a
format-1 ledgerq writes is in it: entries with and without each optional field
(TTL, priority, headers, compressed payload, batches with BATCH_CONTINUES), two segments,
reader journals holding LEASE/ACK/NACK/RELEASE/DEAD_LETTER/EXPIRE records and a
CHECKPOINT, the retry and dedup feature logs, and a dead-letter queue.
"""

from __future__ import annotations

import os
import sys
import time

import ledgerq


def empty(dest: str) -> None:
    """A format-1 queue with its files (meta, options, an empty segment, the default
    reader's state, the dedup and retry logs) and no message: ids start at 1."""
    q = ledgerq.open(dest, dedup_window=60.0)
    assert q.dequeue() is None  # the default reader's state file
    q.close()


def _lease(q: ledgerq.Queue) -> ledgerq.Message:
    m = q.dequeue()
    assert m is not None
    return m


def _ack_release_nack(q: ledgerq.Queue, acks: int, reason: str) -> None:
    """Lease and ack ``acks`` messages, then lease and release one, then lease one and
    nack it with ``reason``: LEASE, ACK, RELEASE and NACK records in the journal."""
    for _ in range(acks):
        q.ack(_lease(q).id)
    q.release(_lease(q).id)
    q.nack(_lease(q).id, reason)


def main(dest: str, *, clean: bool = False) -> None:
    q = ledgerq.open(
        dest,
        segment_size=1 << 16 if clean else 1024,  # clean: one segment, still active
        priorities=True,
        dedup_window=3600.0,
        compression="zstd",
        compression_min_size=400,
        max_retries=1,
        sync="always",
    )
    q.enqueue(b"plain")
    q.enqueue(b"with ttl", ttl=3600.0 * 24 * 365 * 50)
    q.enqueue(b"high", priority=ledgerq.Priority.HIGH)
    q.enqueue(b"low", priority=ledgerq.Priority.LOW)
    q.enqueue(b"headed", headers={"k": "v", "trace": "abc"})
    q.enqueue(b"z" * 500)  # compressed
    q.enqueue(b"dedup", dedup_id="once")
    q.enqueue_batch([b"batch-%d" % i for i in range(5)])
    q.enqueue(b"expired", ttl=0.001)
    q.enqueue_batch([b"x" * 300 for _ in range(20)])  # crosses segments
    time.sleep(0.01)
    reader = q.reader("other")
    m = reader.dequeue()
    assert m is not None
    reader.ack(m.id)
    _ack_release_nack(q, 4, "first failure")
    q.nack(_lease(q).id, "again")  # max_retries=1: dead-lettered
    q.close()  # the journals are now CHECKPOINTs
    if clean:
        return  # fixtures/v1_clean: closed cleanly, its newest segment still appendable
    # Reopened and left without a close (as a killed process leaves it), so that the
    # journals also hold LEASE, ACK, NACK and RELEASE records after their CHECKPOINT.
    q = ledgerq.open(dest, sync="always")
    _ack_release_nack(q, 3, "later")
    q.enqueue(b"after reopen")
    os._exit(0)


if __name__ == "__main__":
    if "--empty" in sys.argv[2:]:
        empty(sys.argv[1])
    else:
        main(sys.argv[1], clean="--clean" in sys.argv[2:])
