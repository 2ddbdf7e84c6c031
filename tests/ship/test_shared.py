"""``ledgerq ship --delete-shipped`` beside shared-mode producers and a consumer.

The shipper deletes segments under processes that keep the queue open; they go on
without reopening, and the hub's copy holds every message once.
"""

from __future__ import annotations

from pathlib import Path

import ledgerq
from ledgerq.ship import ship_queue
from tests._child import Children

PRODUCERS, EACH = 2, 200
TOTAL = PRODUCERS * EACH

_PRODUCER = """
import sys, ledgerq
path, name, each = sys.argv[1], sys.argv[2], int(sys.argv[3])
with ledgerq.open(path, shared=True, segment_size=1024) as q:
    for n in range(each):
        q.enqueue(b"%s %d" % (name.encode(), n))
print("done", flush=True)
"""

# Acks every message; reports each id, then the end once it has all of them.
_CONSUMER = """
import sys, ledgerq
path, total = sys.argv[1], int(sys.argv[2])
with ledgerq.open(path, shared=True, segment_size=1024) as q:
    got = 0
    while got < total:
        m = q.dequeue(timeout=1.0)
        if m is not None:
            q.ack(m.id)
            got += 1
            print("acked", m.id, flush=True)
print("consumed", flush=True)
"""


def test_ship_and_delete_shipped_beside_shared_processes(
    tmp_path: Path, children: Children
) -> None:
    src, hub = tmp_path / "telemetry", tmp_path / "hub"
    # The queue keeps consumed segments for an hour (stored): only the shipper frees them.
    with ledgerq.open(src, segment_size=1024, retention_max_age=3600):
        pass
    consumer = children.start(["-c", _CONSUMER, str(src), str(TOTAL)])
    producers = [
        children.start(["-c", _PRODUCER, str(src), f"p{i}", str(EACH)]) for i in range(PRODUCERS)
    ]
    acked: list[int] = []
    deleted = 0
    # A pass after every 25 acks, while the others append, rotate and ack.
    while (line := consumer.line()) != "consumed":
        acked.append(int(line.split()[1]))
        if len(acked) % 25 == 0:
            deleted += ship_queue(src, hub, "dev", delete_shipped=True).deleted_segments
    consumer.expect_exit(0)
    for producer in producers:
        assert producer.line() == "done"
        producer.expect_exit(0)
    deleted += ship_queue(src, hub, "dev", delete_shipped=True).deleted_segments

    assert sorted(acked) == list(range(1, TOTAL + 1))  # each once, though files went away
    assert deleted > 0
    with ledgerq.follow(hub / "dev.telemetry", timeout=0) as copy:
        shipped = list(copy)
    assert [m.id for m in shipped] == list(range(1, TOTAL + 1))
    payloads = sorted(m.payload for m in shipped)
    assert payloads == sorted(b"p%d %d" % (i, n) for i in range(PRODUCERS) for n in range(EACH))
    with ledgerq.open(src, shared=True) as q:  # the source goes on after the deletions
        assert q.enqueue(b"after") == TOTAL + 1
        m = q.dequeue()
        assert m is not None and m.payload == b"after"
        q.ack(m.id)
