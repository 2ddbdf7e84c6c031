"""``ledgerq.follow`` beside several shared-mode processes appending and rotating."""

from __future__ import annotations

from pathlib import Path

import ledgerq
from tests._child import Children

PRODUCERS, EACH = 3, 150

# Enqueues EACH messages (singles and batches of 3), consuming every other one, then
# says so; segments of 1 KiB make the producers rotate under each other all the time.
_PRODUCER = """
import sys, ledgerq
path, name, each = sys.argv[1], sys.argv[2], int(sys.argv[3])
with ledgerq.open(path, shared=True, segment_size=1024) as q:
    n = 0
    while n < each:
        if n % 4 == 0 and n + 3 <= each:
            q.enqueue_batch([b"%s %d" % (name.encode(), n + k) for k in range(3)])
            n += 3
        else:
            q.enqueue(b"%s %d" % (name.encode(), n))
            n += 1
        m = q.dequeue()
        if m is not None and n % 2:
            q.ack(m.id)
    print("done", flush=True)
"""


def test_a_follower_reads_every_process_append_once_in_id_order(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, segment_size=1024):
        pass
    with ledgerq.follow(path, from_id=1, timeout=60) as follower:
        producers = [
            children.start(["-c", _PRODUCER, str(path), f"p{i}", str(EACH)])
            for i in range(PRODUCERS)
        ]
        seen: list[ledgerq.Message] = []
        for message in follower:  # meanwhile: the producers append and rotate
            seen.append(message)
            if len(seen) == PRODUCERS * EACH:
                break
    for producer in producers:
        assert producer.line() == "done"
        producer.expect_exit(0)
    assert [m.id for m in seen] == list(range(1, PRODUCERS * EACH + 1))
    by_producer: dict[str, list[int]] = {}
    for message in seen:
        name, n = message.payload.decode().split()
        by_producer.setdefault(name, []).append(int(n))
    assert by_producer == {f"p{i}": list(range(EACH)) for i in range(PRODUCERS)}
    assert len(list((path / "segments").glob("*.log"))) > PRODUCERS  # they did rotate
