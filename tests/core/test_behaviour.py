"""The queue's core behaviour, written once and run against several configurations.

queuelib's habit: a behaviour suite re-run against every configuration a user can
choose, including segments so small that every message rotates, so that a path only
one configuration takes (rotation at each append, the fsync of every call, compressed
payloads, the priority index, no DLQ) is held to the same promises as the default.

Two parts: the tests below (FIFO order, ack/nack/redelivery, reopen, batches,
readers, stats counters, peek, retention of consumed segments), and the stateful
model of ``test_queue_model.py`` re-run against each configuration with a smaller
budget.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

import ledgerq
from ledgerq import Item, Priority
from tests.core.test_queue_model import QueueMachine
from tests.locking import locking

CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    # Every message past 38 bytes of payload fills a segment: a rotation per append.
    "tiny-segments": {"segment_size": 64, "index_interval": 1},
    "sync-always": {"sync": "always"},
    "zstd": {"compression": "zstd", "compression_min_size": 0},
    "priorities": {"priorities": True},
    "no-retries": {"max_retries": 0},
    # Every entry sealed with AES-256-GCM (format 2's encryption at rest).
    "encrypted": {"encryption_key": bytes(range(32))},
    # A queue a format-1 ledgerq created (tests/format/fixtures/v1_empty), upgraded by
    # the first open of each test: its options are the ones stored in it.
    "format-1": {"dedup_window": 60.0},
}

# Configurations that start from a queue directory written by another ledgerq.
SEEDS: dict[str, Path] = {
    "format-1": Path(__file__).parents[1] / "format" / "fixtures" / "v1_empty",
}


@dataclass(frozen=True)
class Config:
    """One configuration under test: how to open a queue with it, and what it implies.

    ``shared``: every open is a shared-mode handle (``ledgerq.open(path, shared=True)``),
    which must keep every promise an exclusive queue keeps - with the lock words, or
    with the flock files (``locking``: ``tests/locking.py``).
    """

    name: str
    options: dict[str, Any]
    shared: bool = False
    locking: str | None = None
    seed: Path | None = None

    def open(self, path: Path) -> ledgerq.Queue:
        if self.seed is not None and not path.exists():
            shutil.copytree(self.seed, path)
        with locking(self.locking):
            return ledgerq.open(path, shared=self.shared, **self.options)

    @property
    def max_retries(self) -> int:
        return int(self.options.get("max_retries", ledgerq.Options().max_retries))

    @property
    def by_priority(self) -> bool:
        return bool(self.options.get("priorities", False))


# mode -> (shared, locking)
MODES: dict[str, tuple[bool, str | None]] = {
    "exclusive": (False, None),
    "shared": (True, "words"),
    "shared-flock": (True, "flock"),
}


@pytest.fixture(
    params=[(name, mode) for mode in MODES for name in CONFIGS],
    ids=[f"{name}-{mode}" for mode in MODES for name in CONFIGS],
)
def config(request: pytest.FixtureRequest) -> Config:
    name, mode = request.param
    shared, how = MODES[mode]
    return Config(name, CONFIGS[name], shared, how, SEEDS.get(name))


@pytest.fixture
def qpath(tmp_path: Path) -> Path:
    return tmp_path / "q"


def payload(n: int) -> bytes:
    """Payloads of different sizes, some compressible, one empty: ``n`` is readable in it."""
    return b"" if n == 0 else (b"message %d " % n) * (1 + n % 7)


def drain(source: ledgerq.Queue | ledgerq.Reader) -> list[ledgerq.Message]:
    """Dequeue and ack everything, one at a time."""
    got = []
    while (msg := source.dequeue()) is not None:
        source.ack(msg.id)
        got.append(msg)
    return got


# ---------------------------------------------------------------------- order


def test_fifo_order_ids_payloads_and_headers(config: Config, qpath: Path) -> None:
    with config.open(qpath) as q:
        ids = [q.enqueue(payload(n), headers={"n": str(n)}) for n in range(12)]
        ids += q.enqueue_batch([Item(payload(n), headers={"n": str(n)}) for n in range(12, 20)])
        ids.append(q.enqueue(payload(20)))
        assert ids == list(range(1, 22))
        got = drain(q)
    assert [m.id for m in got] == ids
    assert [m.payload for m in got] == [payload(n) for n in range(21)]
    assert [m.headers for m in got] == [{"n": str(n)} for n in range(20)] + [{}]
    assert {m.attempts for m in got} == {1}


def test_order_with_priorities_given(config: Config, qpath: Path) -> None:
    """Priority order when the queue has priorities on (FIFO inside one level);
    arrival order when it does not."""
    levels = [Priority.LOW, Priority.HIGH, Priority.MEDIUM, Priority.HIGH, Priority.LOW] * 3
    with config.open(qpath) as q:
        ids = [q.enqueue(payload(n), priority=p) for n, p in enumerate(levels)]
        got = [m.id for m in drain(q)]
    if config.by_priority:
        assert got == sorted(ids, key=lambda i: (-levels[i - 1], i))
    else:
        assert got == ids


# ---------------------------------------------------------------------- ack, nack, redelivery


def test_ack_settles_and_nack_redelivers_with_one_more_attempt(config: Config, qpath: Path) -> None:
    with config.open(qpath) as q:
        q.enqueue_batch([payload(n) for n in range(1, 4)])
        first = q.dequeue()
        assert first is not None and (first.id, first.attempts) == (1, 1)
        q.nack(first.id, "not now")
        again = q.dequeue()
        assert again is not None and (again.id, again.attempts) == (1, 2)
        q.ack(again.id)
        with pytest.raises(ledgerq.UnknownMessageError):
            q.ack(again.id)
        rest = drain(q)
        assert [(m.id, m.attempts) for m in rest] == [(2, 1), (3, 1)]
        stats = q.stats()
        assert (stats.acked, stats.nacked, stats.pending, stats.in_flight) == (3, 1, 0, 0)


def test_failed_deliveries_go_to_the_dlq_after_max_retries(config: Config, qpath: Path) -> None:
    failures = config.max_retries or 5  # 0: never dead-lettered, however often it fails
    with config.open(qpath) as q:
        message_id = q.enqueue(payload(7), headers={"k": "v"})
        for attempt in range(1, failures + 1):
            msg = q.dequeue()
            assert msg is not None and (msg.id, msg.attempts) == (message_id, attempt)
            q.nack(msg.id, f"failure {attempt}")
        stats = q.stats()
        if config.max_retries:
            assert q.dequeue() is None
            (dead,) = q.dlq.peek(5)
            assert dead.payload == payload(7)
            assert dead.headers["k"] == "v"
            assert dead.headers["dlq.original_id"] == str(message_id)
            assert dead.headers["dlq.retry_count"] == str(failures)
            assert dead.headers["dlq.failure_reason"] == f"failure {failures}"
            assert (stats.dead_lettered, stats.pending) == (1, 0)
        else:
            msg = q.dequeue()
            assert msg is not None and msg.attempts == failures + 1
            assert (stats.dead_lettered, len(q.dlq)) == (0, 0)


# ---------------------------------------------------------------------- reopen


def test_reopen_keeps_pending_and_brings_leases_back(config: Config, qpath: Path) -> None:
    with config.open(qpath) as q:
        q.enqueue_batch([payload(n) for n in range(1, 9)])
        leased = q.dequeue_batch(3)
        q.ack(leased[1].id)
        stats = q.stats()
        assert (stats.pending, stats.in_flight) == (5, 2)
    with config.open(qpath) as q:
        stats = q.stats()
        assert (stats.pending, stats.in_flight, stats.acked, stats.enqueued) == (7, 0, 1, 8)
        got = drain(q)
    # The two leases lost to the reopen come back first (they are the oldest), once more.
    expected = [(1, 2), (3, 2), *((i, 1) for i in range(4, 9))]
    assert [(m.id, m.attempts) for m in got] == expected
    assert [m.payload for m in got] == [payload(n) for n in (1, 3, 4, 5, 6, 7, 8)]


def test_ids_keep_increasing_across_reopen(config: Config, qpath: Path) -> None:
    with config.open(qpath) as q:
        first = q.enqueue_batch([payload(1), payload(2)])
        drain(q)
    with config.open(qpath) as q:
        assert q.enqueue(payload(3)) > first[-1]


# ---------------------------------------------------------------------- batches


def test_batches_in_and_out(config: Config, qpath: Path) -> None:
    with config.open(qpath) as q:
        ids = q.enqueue_batch([payload(n) for n in range(10)])
        assert ids == list(range(ids[0], ids[0] + 10))
        first = q.dequeue_batch(4)
        second = q.dequeue_batch(100)
        assert [m.id for m in first + second] == ids
        assert q.dequeue_batch(3) == []
        q.ack_batch([m.id for m in first])
        q.nack(second[0].id, "again")
        third = q.dequeue_batch(10)
        assert [(m.id, m.attempts) for m in third] == [(second[0].id, 2)]
        stats = q.stats()
        assert (stats.acked, stats.in_flight, stats.pending) == (4, 6, 0)


# ---------------------------------------------------------------------- readers


def test_readers_each_get_every_message_and_keep_their_place(config: Config, qpath: Path) -> None:
    with config.open(qpath) as q:
        q.enqueue_batch([payload(n) for n in range(1, 7)])
        audit, billing = q.reader("audit"), q.reader("billing")
        assert [m.id for m in drain(audit)] == [1, 2, 3, 4, 5, 6]
        taken = billing.dequeue_batch(2)
        billing.ack(taken[0].id)
        assert [m.id for m in drain(q)] == [1, 2, 3, 4, 5, 6], "the default reader is apart"
        q.enqueue(payload(7))
    with config.open(qpath) as q:
        assert [m.id for m in drain(q.reader("audit"))] == [7]
        again = drain(q.reader("billing"))
        expected = [(2, 2), *((i, 1) for i in range(3, 8))]  # its lost lease, then on
        assert [(m.id, m.attempts) for m in again] == expected
        readers = q.stats().readers
        assert readers["billing"].acked == 7 and readers["audit"].acked == 7


# ---------------------------------------------------------------------- stats and peek


def test_stats_counters_add_up_and_persist(config: Config, qpath: Path) -> None:
    with config.open(qpath) as q:
        q.enqueue_batch([payload(n) for n in range(1, 11)])
        q.enqueue(payload(11))
        for msg in q.dequeue_batch(4):
            q.ack(msg.id)
        leased = q.dequeue_batch(2)
        q.nack(leased[0].id, "no")
        before = q.stats()
        assert (before.enqueued, before.acked, before.nacked) == (11, 4, 1)
        assert (before.pending, before.in_flight) == (6, 1)
        assert before.segments >= 1 and before.disk_bytes > 0
        assert before.oldest_pending_age > 0.0
        assert len(q) == before.pending
    with config.open(qpath) as q:
        after = q.stats()
        assert (after.enqueued, after.acked, after.nacked) == (11, 4, 1)
        assert (after.pending, after.in_flight) == (7, 0)  # the lease came back


def test_peek_shows_what_comes_next_without_leasing(config: Config, qpath: Path) -> None:
    with config.open(qpath) as q:
        assert q.peek(3) == []
        q.enqueue_batch([payload(n) for n in range(1, 6)])
        assert [m.id for m in q.peek(3)] == [1, 2, 3]
        assert [m.payload for m in q.peek(1)] == [payload(1)]
        assert q.stats().in_flight == 0 and len(q) == 5
        first = q.dequeue()
        assert first is not None and first.id == 1
        assert [m.id for m in q.peek(10)] == [2, 3, 4, 5]
        q.nack(first.id, "back")
        assert [m.id for m in q.peek(2)] == [1, 2]


# ---------------------------------------------------------------------- retention


def test_consumed_segments_are_deleted_and_unconsumed_ones_kept(
    config: Config, qpath: Path
) -> None:
    with config.open(qpath) as q:
        q.reader("slow")  # holds every segment until it consumes them
        q.enqueue_batch([payload(n) for n in range(1, 30)])
        for n in range(30, 40):
            q.enqueue(payload(n) + b"." * 64)  # over 64 bytes: each fills a tiny segment
        drain(q)
        q.compact()
        held = q.stats().segments
        logs = list((qpath / "segments").glob("*.log"))
        assert len(logs) == held
        assert [m.id for m in q.reader("slow").peek(100)] == list(range(1, 40))
        drain(q.reader("slow"))
        q.compact()
        assert q.stats().segments == 1
        assert len(list((qpath / "segments").glob("*.log"))) == 1
        if config.name == "tiny-segments":
            assert held >= 11, "tiny segments should have rotated at every single enqueue"


# ---------------------------------------------------------------------- the model, re-run

_MODEL_SETTINGS = settings(max_examples=12, stateful_step_count=30, deadline=None)


def _model_test(name: str, options: dict[str, Any], shared: bool, how: str | None) -> Any:
    """The model's TestCase for ``options`` (starvation off: it depends on the clock)."""
    extra = {"starvation_after": None} if options.get("priorities") else {}
    machine = type(
        f"Model_{name}",
        (QueueMachine,),
        {
            "options": {**options, **extra},
            "shared": shared,
            "locking": how,
            "seed": SEEDS.get(name),
        },
    )
    test = machine.TestCase
    test.settings = _MODEL_SETTINGS
    return test


for _name, _options in CONFIGS.items():
    for _mode, (_shared, _how) in MODES.items():
        _suffix = "" if _mode == "exclusive" else "_" + _mode.replace("-", "_")
        globals()[f"TestModel_{_name.replace('-', '_')}{_suffix}"] = _model_test(
            _name, _options, _shared, _how
        )


# ---------------------------------------------------------------------- the configurations


def test_each_configuration_is_what_it_says(config: Config, qpath: Path) -> None:
    """A configuration that silently fell back to the default would test nothing new."""
    secret = b"a payload nobody reads on disk"
    with config.open(qpath) as q:
        q.enqueue(secret)
        q.enqueue_batch([secret, secret])
        on_disk = b"".join(p.read_bytes() for p in (qpath / "segments").glob("*.log"))
        meta = json.loads((qpath / "meta.json").read_text())
    if config.name == "encrypted":
        assert secret not in on_disk
    elif config.name != "zstd":  # (zstd may keep a short payload's bytes as literals)
        assert on_disk.count(secret) == 3
    if config.seed is not None:
        assert json.loads((config.seed / "meta.json").read_text())["version"] == 1
        assert (
            meta["created_ns"] == json.loads((config.seed / "meta.json").read_text())["created_ns"]
        )
