"""Follow a queue that another process owns: a read-only tail of its log.

A producer process opens the queue (and holds its lock); this process reads every
message as it is written with ``ledgerq.follow``, without the lock, across segment
rotations, then replays part of the log once the producer has gone.

Run: python examples/follow.py [QUEUE_DIR]
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import tempfile
from pathlib import Path

import ledgerq


def producer(path: Path) -> None:
    """The owner: enqueue as many orders as each line of stdin asks for."""
    with ledgerq.open(path, segment_size=4096) as q:
        print("open", flush=True)
        n = 0
        for line in sys.stdin:
            for _ in range(int(line)):
                n += 1
                q.enqueue(f"order {n}".encode(), headers={"shop": f"s{n % 3}"})
        print(f"producer wrote {n} orders and closed the queue", flush=True)


def main(path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, __file__, str(path), "--producer"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert owner.stdin is not None and owner.stdout is not None
    try:
        assert owner.stdout.readline() == "open\n"
        try:
            ledgerq.open(path).close()
        except ledgerq.QueueLockedError:
            print("the producer holds the queue's lock; follow() reads beside it")

        # timeout: end the iteration after 10 s without a message (a safety net here).
        with ledgerq.follow(path, timeout=10) as orders:
            print(f"following {path.name} (waiting with {orders.watch})")
            owner.stdin.write("3\n")
            owner.stdin.flush()
            for msg in itertools.islice(orders, 3):
                print(f"  id {msg.id}: {msg.payload.decode()} {msg.headers}")
            owner.stdin.write("300\n")  # ~20 KB: the 4 KiB segments rotate several times
            owner.stdin.flush()
            more = [msg.id for msg in itertools.islice(orders, 300)]
            segments = len(list((path / "segments").glob("*.log")))
            print(
                f"followed {len(more)} more, up to id {more[-1]}, across {segments} segment files"
            )
            resume_at = orders.next_id
    finally:
        owner.stdin.close()
        print(owner.stdout.read().strip())
        owner.stdout.close()
        owner.wait()

    # The log stays readable after the owner has gone: replay from any id.
    with ledgerq.follow(path, from_id=resume_at - 5, timeout=0) as replay:
        ids = [msg.id for msg in replay]
    print(f"replayed ids {ids[0]}..{ids[-1]} with timeout=0 (what is there, then stop)")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "--producer":
        producer(Path(sys.argv[1]))
    elif len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "orders")
