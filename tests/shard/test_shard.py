"""``ledgerq.open_sharded``: SEJ naming, routing, fairness, ids, stats, reopening."""

from __future__ import annotations

import collections
import dataclasses
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import xxhash
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import ledgerq
from ledgerq.shard import (
    ShardedQueue,
    parse_shard_dir_name,
    read_shard_count,
    shard_dir_name,
    shard_file_path,
    shard_index,
    split_id,
    write_shard_count,
)
from tests.blocked import close_during_a_blocked_dequeue


def keys_for(index: int, shards: int, count: int = 1) -> list[str]:
    """``count`` keys that route to shard ``index``."""
    found = []
    i = 0
    while len(found) < count:
        key = f"key-{i}"
        if shard_index(key, shards) == index:
            found.append(key)
        i += 1
    return found


# ---------------------------------------------------------------------- naming


@pytest.mark.parametrize(
    ("prefix", "shards", "index", "name"),
    [
        ("p", 2, 1, "p.1.001"),
        ("p", 1024, 0x1FF, "p.a.1ff"),
        ("p", 1024, 0x3FF, "p.a.3ff"),
        ("", 2, 0, "1.000"),
        ("", 2, 1, "1.001"),
        ("", 16, 10, "4.00a"),
        ("orders_v2-eu", 512, 300, "orders_v2-eu.9.12c"),
    ],
)
def test_shard_directories_are_named_as_sej_does(
    prefix: str, shards: int, index: int, name: str
) -> None:
    assert shard_dir_name(prefix, shards, index) == name
    assert parse_shard_dir_name(name) == (prefix, shards, index)


@pytest.mark.parametrize("prefix", ["a.b", "a b", "é", "x/y", ".", "a\n"])
def test_the_prefix_rule_is_anchored(prefix: str) -> None:
    with pytest.raises(ledgerq.ConfigError, match="prefix"):
        shard_dir_name(prefix, 2, 0)


@pytest.mark.parametrize("shards", [0, 1, 3, 6, 2048, -2])
def test_shard_counts_are_powers_of_two_from_2_to_1024(shards: int) -> None:
    with pytest.raises(ledgerq.ConfigError, match="power of two"):
        shard_dir_name("", shards, 0)


@pytest.mark.parametrize("name", ["0.000", "b.000", "1.002", "1.00", "p..1.000", "p.1.000.x", "P"])
def test_other_names_are_not_shard_directories(name: str) -> None:
    assert parse_shard_dir_name(name) is None


def test_the_queue_creates_its_shards_with_sej_names(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "root", shards=4, prefix="jobs") as q:
        assert [Path(p).name for p in q.paths] == [
            "jobs.2.000",
            "jobs.2.001",
            "jobs.2.002",
            "jobs.2.003",
        ]
    names = sorted(p.name for p in (tmp_path / "root").iterdir())
    assert names == [
        "jobs.2.000",
        "jobs.2.001",
        "jobs.2.002",
        "jobs.2.003",
        "jobs.ledgerq-shards.json",
    ]
    recorded = json.loads((tmp_path / "root" / "jobs.ledgerq-shards.json").read_text())
    assert recorded == {"format": "ledgerq-shards", "version": 1, "prefix": "jobs", "shards": 4}


# ---------------------------------------------------------------------- routing


def test_routing_is_xxh3_64_of_the_utf8_key_modulo_the_shard_count() -> None:
    # Pinned values: the routing must never change (other processes, the Spark writer).
    assert xxhash.xxh3_64_intdigest(b"") == 3244421341483603138
    assert shard_index("", 1024) == 3244421341483603138 % 1024
    assert shard_index("user-42", 8) == 5836184775705692621 % 8
    assert shard_index("héllo", 16) == 7657728615535385375 % 16
    assert shard_index(b"order:1", 2) == 5991892729224494106 % 2
    assert shard_index("héllo", 16) == shard_index("héllo".encode(), 16)
    with pytest.raises(TypeError):
        shard_index(42, 2)  # type: ignore[arg-type]


def test_routing_is_stable_across_reopens_and_processes(tmp_path: Path) -> None:
    keys = [f"customer-{i}" for i in range(40)]
    here = [shard_index(k, 32) for k in keys]
    code = (
        "import json, sys; from ledgerq.shard import shard_index; "
        "print(json.dumps([shard_index(k, 32) for k in json.loads(sys.argv[1])]))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code, json.dumps(keys)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert json.loads(other.stdout) == here
    placed: dict[str, int] = {}
    with ledgerq.open_sharded(tmp_path / "r", 32) as q:
        for key in keys:
            placed[key] = q.shard_of(q.enqueue(key.encode(), key=key))
    assert placed == dict(zip(keys, here, strict=True))
    with ledgerq.open_sharded(tmp_path / "r", 32) as q:
        for key in keys:
            assert q.shard_of(q.enqueue(b"again", key=key)) == placed[key]


def test_messages_without_a_key_go_round_robin(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "r", 4) as q:
        ids = [q.enqueue(b"m") for _ in range(12)]
        assert collections.Counter(q.shard_of(i) for i in ids) == {0: 3, 1: 3, 2: 3, 3: 3}
        assert [len(s) for s in q.queues] == [3, 3, 3, 3]


def test_a_dedup_id_without_a_key_routes_to_one_shard_so_dedup_works(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "r", 8, dedup_window=60) as q:
        first = q.enqueue(b"once", dedup_id="order-7")
        assert all(q.enqueue(b"once", dedup_id="order-7") == first for _ in range(5))
        assert len(q) == 1
        assert q.stats().duplicates == 5


# ---------------------------------------------------------------------- ids, ack, nack


def test_ids_are_unique_across_shards_and_ack_nack_take_them(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "r", 4, max_retries=5) as q:
        ids = [q.enqueue(f"m{i}".encode(), key=f"k{i}") for i in range(40)]
        assert len(set(ids)) == 40 and min(ids) >= 4
        for message_id in ids:
            index, local = split_id(message_id, 4)
            assert q.shard_of(message_id) == index
            assert message_id == local * 4 + index
        got = q.dequeue_batch(40)
        assert sorted(m.id for m in got) == sorted(ids)
        by_id = {m.id: m for m in got}
        assert all(by_id[i].payload == f"m{n}".encode() for n, i in enumerate(ids))
        q.nack(got[0].id, "try again")
        for message in got[1:]:
            q.ack(message.id)
        again = q.dequeue()
        assert again is not None
        assert (again.id, again.attempts) == (got[0].id, 2)
        q.ack(again.id)
        with pytest.raises(ledgerq.UnknownMessageError):
            q.ack(again.id)
        with pytest.raises(ledgerq.UnknownMessageError):
            q.nack(3)  # below every id a shard can hand out
        stats = q.stats()
        assert (stats.enqueued, stats.acked, stats.nacked, stats.pending) == (40, 40, 1, 0)


def test_enqueue_batch_routes_each_item_and_keeps_the_order(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "r", 2) as q:
        keys = [f"k{i}" for i in range(10)]
        ids = q.enqueue_batch([b"a", ledgerq.Item(b"b", headers={"h": "1"})] * 5, keys=keys)
        assert [q.shard_of(i) for i in ids] == [shard_index(k, 2) for k in keys]
        got = {m.id: m for m in q.dequeue_batch(10)}
        assert [got[i].payload for i in ids] == [b"a", b"b"] * 5
        assert got[ids[1]].headers == {"h": "1"}
        with pytest.raises(ValueError, match="keys"):
            q.enqueue_batch([b"x"], keys=["a", "b"])


# ---------------------------------------------------------------------- fairness


def test_dequeue_serves_the_shards_in_turn(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "r", 4) as q:
        for index in range(4):
            for key in keys_for(index, 4, 10):
                q.enqueue(b"m", key=key)
        served = [q.shard_of(q.dequeue().id) for _ in range(12)]  # type: ignore[union-attr]
        assert collections.Counter(served) == {0: 3, 1: 3, 2: 3, 3: 3}
        batch = q.dequeue_batch(8)
        assert collections.Counter(q.shard_of(m.id) for m in batch) == {0: 2, 1: 2, 2: 2, 3: 2}


def test_a_busy_shard_does_not_starve_the_others(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "r", 4) as q:
        for key in keys_for(0, 4, 100):
            q.enqueue(b"busy", key=key)
        for index in (1, 2, 3):
            q.enqueue(b"quiet", key=keys_for(index, 4)[0])
        batch = q.dequeue_batch(8)
        counts = collections.Counter(q.shard_of(m.id) for m in batch)
        assert counts == {0: 5, 1: 1, 2: 1, 3: 1}
        assert len(q.dequeue_batch(200)) == 95


def test_a_blocked_dequeue_wakes_when_any_shard_gets_a_message(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "r", 8) as q:
        got: list[ledgerq.Message | None] = []
        waiter = threading.Thread(target=lambda: got.append(q.dequeue(timeout=None)))
        waiter.start()
        q.enqueue(b"wake up", key=keys_for(5, 8)[0])
        waiter.join(timeout=60)
        assert not waiter.is_alive()
        assert got[0] is not None and got[0].payload == b"wake up"


def test_a_blocked_dequeue_wakes_when_a_lease_times_out(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "r", 2, visibility_timeout=0.05) as q:
        q.enqueue(b"slow work", key="k")
        first = q.dequeue()
        assert first is not None
        again = q.dequeue(timeout=60)  # no enqueue wakes it: the lease deadline must
        assert again is not None
        assert (again.id, again.attempts) == (first.id, 2)


def test_close_wakes_a_blocked_dequeue(tmp_path: Path) -> None:
    q = ledgerq.open_sharded(tmp_path / "r", 2)
    errors = close_during_a_blocked_dequeue(q)
    assert len(errors) == 1 and q.closed
    with pytest.raises(ledgerq.QueueClosedError):
        q.enqueue(b"x")
    q.close()  # idempotent


# ---------------------------------------------------------------------- stats, options


def test_stats_are_summed_and_kept_per_shard(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "r", 4, segment_size=4096) as q:
        for i in range(20):
            q.enqueue(b"x" * 100, key=f"k{i}")
        for message in q.dequeue_batch(5):
            q.ack(message.id)
        q.dequeue_batch(3)
        per_shard = q.shard_stats()
        total = q.stats()
        assert isinstance(total, ledgerq.Stats)
        not_summed = {"oldest_pending_age", "next_id", "readers"}
        for field in dataclasses.fields(ledgerq.Stats):
            if field.name not in not_summed:
                name = field.name
                assert getattr(total, name) == sum(getattr(s, name) for s in per_shard), name
        default = total.readers["default"]
        for name in ("pending", "in_flight", "acked", "nacked", "expired", "dead_lettered"):
            assert getattr(default, name) == sum(
                getattr(s.readers["default"], name) for s in per_shard
            ), name
        assert (default.name, default.head) == ("default", 0)  # heads are per shard
        assert (total.pending, total.in_flight, total.enqueued, total.acked) == (12, 3, 20, 5)
        assert len(q) == 12
        assert total.readers["default"].pending == 12
        assert total.oldest_pending_age >= max(s.oldest_pending_age for s in per_shard)


def test_options_pass_through_to_every_shard(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "r", 2, segment_size=12345, max_retries=7) as q:
        assert all(s.options.segment_size == 12345 for s in q.queues)
        assert all(s.options.max_retries == 7 for s in q.queues)
    with pytest.raises(TypeError, match="unknown option"):
        ledgerq.open_sharded(tmp_path / "other", 2, no_such_option=1)


# ---------------------------------------------------------------------- reopening


def test_reopening_with_another_shard_count_raises(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "r", 4, prefix="a") as q:
        q.enqueue(b"x")
    for wrong in (2, 8):
        with pytest.raises(ledgerq.ConfigError, match="4 shards"):
            ledgerq.open_sharded(tmp_path / "r", wrong, prefix="a")
    # Another prefix is another sharded queue in the same root.
    with ledgerq.open_sharded(tmp_path / "r", 8, prefix="b") as other:
        assert len(other) == 0
    with ledgerq.open_sharded(tmp_path / "r", 4, prefix="a") as q:
        assert len(q) == 1


def test_the_count_is_inferred_from_directories_without_the_count_file(tmp_path: Path) -> None:
    with ledgerq.open_sharded(tmp_path / "r", 4):
        pass
    Path(shard_file_path(tmp_path / "r", "")).unlink()
    with pytest.raises(ledgerq.ConfigError, match="4 shards"):
        ledgerq.open_sharded(tmp_path / "r", 2)


def test_the_count_file_helpers(tmp_path: Path) -> None:
    assert read_shard_count(tmp_path / "new", "p") is None
    write_shard_count(tmp_path / "new", "p", 16)
    write_shard_count(tmp_path / "new", "p", 16)  # the same count: nothing to do
    assert read_shard_count(tmp_path / "new", "p") == 16
    with pytest.raises(ledgerq.ConfigError):
        write_shard_count(tmp_path / "new", "p", 32)
    Path(shard_file_path(tmp_path / "new", "p")).write_text("{not json")
    with pytest.raises(ledgerq.ConfigError, match="unreadable"):
        read_shard_count(tmp_path / "new", "p")


def test_shard_directories_written_by_another_writer_are_opened(tmp_path: Path) -> None:
    # What the Spark writer does: route rows with the helpers, write ordinary queues.
    root = tmp_path / "r"
    write_shard_count(root, "events", 4)
    for i in range(20):
        key = f"user-{i}"
        path = root / shard_dir_name("events", 4, shard_index(key, 4))
        with ledgerq.open(path) as shard:
            shard.enqueue(key.encode())
    with ledgerq.open_sharded(root, 4, prefix="events") as q:
        got = q.dequeue_batch(100)
        assert sorted(m.payload for m in got) == sorted(f"user-{i}".encode() for i in range(20))
        assert all(q.shard_of(m.id) == shard_index(m.payload, 4) for m in got)


def test_a_shard_open_elsewhere_fails_the_open_and_closes_the_others(tmp_path: Path) -> None:
    root = tmp_path / "r"
    with ledgerq.open_sharded(root, 2):
        pass
    with ledgerq.open(root / "1.001"), pytest.raises(ledgerq.QueueLockedError):
        ledgerq.open_sharded(root, 2)
    with ledgerq.open_sharded(root, 2) as q:  # shard 0 was released
        assert q.shards == 2


# ---------------------------------------------------------------------- against a model


class ShardedModel(RuleBasedStateMachine):
    """Random operations against a model: per-shard FIFO, leases, acks, reopens."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self._dir = tempfile.TemporaryDirectory()
        self.root = Path(self._dir.name) / "r"
        self.q: ShardedQueue = ledgerq.open_sharded(self.root, 4, max_retries=0)
        self.pending: dict[int, collections.deque[tuple[int, bytes]]] = {
            i: collections.deque() for i in range(4)
        }
        self.leased: dict[int, bytes] = {}
        self.counter = 0

    @rule(key=st.one_of(st.none(), st.text(max_size=5)))
    def enqueue(self, key: str | None) -> None:
        self.counter += 1
        payload = b"m%d" % self.counter
        message_id = self.q.enqueue(payload, key=key)
        index = self.q.shard_of(message_id)
        if key is not None:
            assert index == shard_index(key, 4)
        self.pending[index].append((message_id, payload))

    @rule(n=st.integers(1, 6))
    def dequeue(self, n: int) -> None:
        got = self.q.dequeue_batch(n)
        assert len(got) == min(n, sum(len(d) for d in self.pending.values()))
        for message in got:
            queue = self.pending[self.q.shard_of(message.id)]
            assert queue[0] == (message.id, message.payload)  # FIFO inside a shard
            queue.popleft()
            self.leased[message.id] = message.payload

    @precondition(lambda self: self.leased)
    @rule(data=st.data(), ack=st.booleans())
    def settle(self, data: st.DataObject, ack: bool) -> None:
        message_id = data.draw(st.sampled_from(sorted(self.leased)))
        payload = self.leased.pop(message_id)
        if ack:
            self.q.ack(message_id)
        else:
            self.q.nack(message_id)
            queue = self.pending[self.q.shard_of(message_id)]
            queue.append((message_id, payload))
            ordered = sorted(queue)
            queue.clear()
            queue.extend(ordered)  # a nacked message comes back in id order

    @rule()
    def reopen(self) -> None:
        self.q.close()
        self.q = ledgerq.open_sharded(self.root, 4, max_retries=0)
        for message_id, payload in self.leased.items():  # leases do not survive a reopen
            self.pending[self.q.shard_of(message_id)].append((message_id, payload))
        for index, queue in self.pending.items():
            self.pending[index] = collections.deque(sorted(queue))
        self.leased.clear()

    @invariant()
    def lengths_agree(self) -> None:
        assert len(self.q) == sum(len(d) for d in self.pending.values())
        self.q._check()

    def teardown(self) -> None:
        self.q.close()
        self._dir.cleanup()


TestShardedModel = ShardedModel.TestCase
TestShardedModel.settings = settings(max_examples=15, stateful_step_count=25, deadline=None)
