"""Spread one queue over several directories: ``ledgerq.open_sharded``.

Messages with a key always land in the same shard (xxhash of the key), so the
orders of one customer stay in order; messages without a key go round-robin.
Consumers see one queue: ``dequeue`` serves the shards in turn, ids are unique
across shards, ``stats()`` sums them.

Run: python examples/sharding.py [DIR]
"""

from __future__ import annotations

import collections
import sys
import tempfile
from pathlib import Path

import ledgerq
from ledgerq.shard import shard_dir_name, shard_index


def main(root: Path) -> None:
    with ledgerq.open_sharded(root, shards=4, prefix="orders", segment_size=1 << 20) as q:
        print(f"shard directories: {', '.join(Path(p).name for p in q.paths)}")
        for n in range(12):
            customer = f"customer-{n % 3}"
            q.enqueue(f"order {n} of {customer}".encode(), key=customer)
        for _ in range(4):
            q.enqueue(b"newsletter")  # no key: round-robin
        for customer in ("customer-0", "customer-1", "customer-2"):
            index = shard_index(customer, 4)
            print(f"{customer} -> shard {index} ({shard_dir_name('orders', 4, index)})")

        batch = q.dequeue_batch(8)
        served = collections.Counter(q.shard_of(m.id) for m in batch)
        print(f"dequeue_batch(8) took {dict(sorted(served.items()))} messages from each shard")
        for message in batch:
            q.ack(message.id)
        message = q.dequeue()
        assert message is not None
        q.nack(message.id, "retry later")  # ids are global: ack/nack route them back
        stats = q.stats()
        print(
            f"pending {stats.pending}, acked {stats.acked}, nacked {stats.nacked} "
            f"(summed over {len(q.shard_stats())} shards); len(q) = {len(q)}"
        )

    try:
        ledgerq.open_sharded(root, shards=8, prefix="orders")
    except ledgerq.ConfigError as exc:
        print(f"reopening with another shard count fails: {exc}")
    with ledgerq.open_sharded(root, shards=4, prefix="orders") as q:
        print(f"reopened with 4 shards: {len(q)} messages waiting")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "sharded")
