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
    for _ in range(4):
        m = q.dequeue()
        assert m is not None
        q.ack(m.id)
    m = q.dequeue()
    assert m is not None
    q.release(m.id)
    m = q.dequeue()
    assert m is not None
    q.nack(m.id, "first failure")
    m = q.dequeue()
    assert m is not None
    q.nack(m.id, "again")  # max_retries=1: dead-lettered
    q.close()  # the journals are now CHECKPOINTs
    if clean:
        return  # fixtures/v1_clean: closed cleanly, its newest segment still appendable
    # Reopened and left without a close (as a killed process leaves it), so that the
    # journals also hold LEASE, ACK, NACK and RELEASE records after their CHECKPOINT.
    q = ledgerq.open(dest, sync="always")
    for _ in range(3):
        m = q.dequeue()
        assert m is not None
        q.ack(m.id)
    m = q.dequeue()
    assert m is not None
    q.release(m.id)
    m = q.dequeue()
    assert m is not None
    q.nack(m.id, "later")
    q.enqueue(b"after reopen")
    os._exit(0)


if __name__ == "__main__":
    if "--empty" in sys.argv[2:]:
        empty(sys.argv[1])
    else:
        main(sys.argv[1], clean="--clean" in sys.argv[2:])
