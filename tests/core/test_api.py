"""The public API as CONTRACT.md states it: arguments, errors, waits, lifecycle."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
import logging
import math
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import typing
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

import ledgerq
import ledgerq.aio
import ledgerq.workers
from ledgerq import Item, Priority
from tests.blocked import close_during_a_blocked_dequeue


@pytest.fixture
def qpath(tmp_path: Path) -> Path:
    return tmp_path / "q"


def test_open_creates_directory_and_context_manager_closes(qpath: Path) -> None:
    with ledgerq.open(qpath) as q:
        assert q.enqueue(b"a") == 1
    assert (qpath / "meta.json").exists()
    assert q.closed
    with pytest.raises(ledgerq.QueueClosedError):
        q.enqueue(b"b")
    with pytest.raises(ledgerq.QueueClosedError):
        q.dequeue()


def test_options_object_and_kwargs(qpath: Path) -> None:
    opts = ledgerq.Options(segment_size=1024, sync="never")
    with ledgerq.open(qpath, options=opts, max_retries=5) as q:
        assert q.options.segment_size == 1024
        assert q.options.max_retries == 5
    with pytest.raises(TypeError, match="unknown option"):
        ledgerq.open(qpath, segmnet_size=10)
    with pytest.raises(ledgerq.ConfigError):
        ledgerq.open(qpath, sync="sometimes")
    with pytest.raises(ValueError, match="segment_size"):
        ledgerq.Options(segment_size=0)
    with pytest.raises(ledgerq.ConfigError):
        ledgerq.Options(compression="gzip")


def test_ids_positive_increasing_and_fifo(qpath: Path) -> None:
    with ledgerq.open(qpath) as q:
        ids = [q.enqueue(str(i).encode()) for i in range(10)]
        ids += q.enqueue_batch([b"x", Item(b"y", headers={"k": "v"})])
        assert ids == sorted(set(ids)) and ids[0] >= 1
        got = [q.dequeue() for _ in ids]
        assert [m.id for m in got if m] == ids
        assert got[-1] is not None and got[-1].headers == {"k": "v"}
        assert q.dequeue() is None


def test_message_fields(qpath: Path) -> None:
    with ledgerq.open(qpath) as q:
        q.enqueue(bytearray(b"payload"), headers={"a": "1"}, priority=Priority.HIGH, ttl=60)
        msg = q.dequeue()
        assert msg is not None
        assert msg.payload == b"payload" and isinstance(msg.payload, bytes)
        assert msg.headers == {"a": "1"}
        assert msg.priority is Priority.HIGH
        assert msg.attempts == 1
        assert msg.expires_at is not None and msg.expires_at > msg.timestamp
        assert msg.expires_at - msg.timestamp == 60 * 1_000_000_000
        with pytest.raises(AttributeError):
            msg.id = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"payload": "text"}, TypeError),
        ({"payload": 5}, TypeError),
        ({"payload": None}, TypeError),
        ({"payload": b"x", "headers": {"a": 1}}, TypeError),
        ({"payload": b"x", "headers": {1: "a"}}, TypeError),
        ({"payload": b"x", "headers": ["a"]}, TypeError),
        ({"payload": b"x", "priority": 7}, ValueError),
        ({"payload": b"x", "priority": "HIGH"}, TypeError),
        ({"payload": b"x", "ttl": -1}, ValueError),
        ({"payload": b"x", "ttl": 0}, ValueError),
        ({"payload": b"x", "ttl": "10"}, TypeError),
    ],
)
def test_bad_enqueue_arguments_write_nothing(
    qpath: Path, kwargs: dict[str, object], error: type[Exception]
) -> None:
    with ledgerq.open(qpath) as q:
        payload = kwargs.pop("payload")
        with pytest.raises(error):
            q.enqueue(payload, **kwargs)  # type: ignore[arg-type]
        assert len(q) == 0
        assert q.stats().enqueued == 0
        assert q.enqueue(b"ok") == 1, "a rejected call must not consume an id"


def test_batch_is_all_or_nothing_on_bad_item(qpath: Path) -> None:
    with ledgerq.open(qpath) as q:
        with pytest.raises(TypeError):
            q.enqueue_batch([b"a", b"b", "c"])  # type: ignore[list-item]
        assert len(q) == 0
        assert q.enqueue_batch([]) == []


def test_max_message_size_boundary(qpath: Path) -> None:
    with ledgerq.open(qpath, max_message_size=100) as q:
        assert q.enqueue(b"x" * 100) == 1
        with pytest.raises(ledgerq.MessageTooLargeError, match="max_message_size"):
            q.enqueue(b"x" * 101)
        assert isinstance(ledgerq.MessageTooLargeError("m"), ValueError)
        assert len(q) == 1


def test_ack_and_nack_unknown_ids(qpath: Path) -> None:
    with ledgerq.open(qpath) as q:
        q.enqueue(b"a")
        with pytest.raises(ledgerq.UnknownMessageError):
            q.ack(1)  # not leased yet
        with pytest.raises(KeyError):
            q.nack(99)
        msg = q.dequeue()
        assert msg is not None
        q.ack(msg.id)
        with pytest.raises(ledgerq.UnknownMessageError, match="not leased"):
            q.ack(msg.id)  # twice
        with pytest.raises(TypeError):
            q.ack("1")  # type: ignore[arg-type]


@pytest.mark.parametrize("sync", ["interval", "always"])
def test_ack_batch_acks_all_or_nothing_and_survives_reopen(qpath: Path, sync: str) -> None:
    with ledgerq.open(qpath, sync=sync) as q:
        q.enqueue_batch([b"a", b"b", b"c", b"d"])
        a, _b, c = q.dequeue_batch(3)
        with pytest.raises(ledgerq.UnknownMessageError, match="4"):
            q.ack_batch([a.id, 4])  # 4 is not leased: a is not acked either
        with pytest.raises(ValueError, match=f"message id {c.id} twice"):
            q.ack_batch([a.id, c.id, c.id])  # the error names the repeated id
        with pytest.raises(TypeError):
            q.ack_batch([a.id, "2"])  # type: ignore[list-item]
        assert q.stats().in_flight == 3
        q.ack_batch(m.id for m in (a, c))
        q.ack_batch([])
        stats = q.stats()
        assert (stats.acked, stats.in_flight, stats.pending) == (2, 1, 1)  # d waits, b leased
        with pytest.raises(ledgerq.UnknownMessageError):
            q.ack(a.id)
    with ledgerq.open(qpath) as q:  # b's lease comes back; a and c stay acked
        again = q.dequeue_batch(10)
        assert [(m.payload, m.attempts) for m in again] == [(b"b", 2), (b"d", 1)]


def test_nack_redelivers_with_more_attempts(qpath: Path) -> None:
    with ledgerq.open(qpath, max_retries=0) as q:
        q.enqueue(b"a")
        q.enqueue(b"b")
        first = q.dequeue()
        assert first is not None
        q.nack(first.id, "boom")
        again = q.dequeue()
        assert again is not None and again.id == first.id and again.attempts == 2
        assert q.stats().nacked == 1


def test_leases_come_back_after_reopen(qpath: Path) -> None:
    with ledgerq.open(qpath) as q:
        q.enqueue_batch([b"a", b"b", b"c"])
        a, b = q.dequeue_batch(2)
        q.ack(b.id)
    with ledgerq.open(qpath) as q:
        assert len(q) == 2
        again = q.dequeue()
        assert again is not None and again.id == a.id and again.attempts == 2
        rest = q.dequeue()
        assert rest is not None and rest.payload == b"c"
        assert q.dequeue() is None


def test_dequeue_timeout_waits_for_an_enqueue(qpath: Path) -> None:
    with ledgerq.open(qpath) as q:
        got: list[ledgerq.Message | None] = []
        consumer = threading.Thread(target=lambda: got.append(q.dequeue(timeout=30)))
        consumer.start()
        q.enqueue(b"wake up")
        consumer.join()
        assert got and got[0] is not None and got[0].payload == b"wake up"
        assert q.dequeue(timeout=0.01) is None
        with pytest.raises(ValueError, match="timeout"):
            q.dequeue(timeout=-1)


def test_close_wakes_blocked_dequeue(qpath: Path) -> None:
    errors = close_during_a_blocked_dequeue(ledgerq.open(qpath))
    assert len(errors) == 1


def test_locked_directory(qpath: Path) -> None:
    with ledgerq.open(qpath):
        with pytest.raises(ledgerq.QueueLockedError) as info:
            ledgerq.open(qpath)
        assert str(qpath) in str(info.value)
    with ledgerq.open(qpath) as q:  # released on close
        assert not q.closed


def test_directory_that_is_not_a_queue(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ledgerq.NotAQueueError, match="not a ledgerq queue"):
        ledgerq.open(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"], "nothing may be written there"
    file_path = tmp_path / "notes.txt"
    with pytest.raises(ledgerq.LedgerQError):
        ledgerq.open(file_path)


def test_newer_format_version_is_refused(qpath: Path) -> None:
    with ledgerq.open(qpath) as q:
        q.enqueue(b"a")
    meta = json.loads((qpath / "meta.json").read_text())
    meta["version"] = 99
    (qpath / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ledgerq.IncompatibleFormatError, match="upgrade ledgerq"):
        ledgerq.open(qpath)


def test_pathlike_and_bad_path_type(qpath: Path) -> None:
    with ledgerq.open(qpath) as q:
        assert q.path == str(qpath)
    with pytest.raises(TypeError):
        ledgerq.open(42)  # type: ignore[arg-type]


def test_stats_fields_and_persistence(qpath: Path) -> None:
    with ledgerq.open(qpath) as q:
        q.enqueue_batch([b"a", b"b", b"c"])
        msg = q.dequeue()
        assert msg is not None
        q.ack(msg.id)
        stats = q.stats()
        assert (stats.pending, stats.in_flight, stats.enqueued, stats.acked) == (2, 0, 3, 1)
        assert stats.segments == 1 and stats.disk_bytes > 0
        assert stats.oldest_pending_age >= 0.0
    with ledgerq.open(qpath) as q:
        stats = q.stats()
        assert (stats.pending, stats.enqueued, stats.acked) == (2, 3, 1)
        q.dequeue_batch(2)
        assert q.stats().oldest_pending_age == 0.0


def test_peek_does_not_lease(qpath: Path) -> None:
    with ledgerq.open(qpath) as q:
        q.enqueue_batch([b"a", b"b"])
        assert [m.payload for m in q.peek(5)] == [b"a", b"b"]
        msg = q.dequeue()
        assert msg is not None and msg.payload == b"a"


@pytest.mark.parametrize("mode", ["always", "interval", "never"])
def test_concurrent_producers_and_consumers(qpath: Path, mode: str) -> None:
    per_thread, producers = 200, 4
    with ledgerq.open(qpath, sync=mode, segment_size=4096) as q:
        produced: list[int] = []
        consumed: list[int] = []
        lock = threading.Lock()

        def produce(t: int) -> None:
            for i in range(per_thread):
                message_id = q.enqueue(f"{t}:{i}".encode())
                with lock:
                    produced.append(message_id)

        def consume() -> None:
            while True:
                msg = q.dequeue(timeout=5)
                if msg is None:
                    return
                if msg.payload == b"stop":
                    q.ack(msg.id)
                    return
                q.ack(msg.id)
                with lock:
                    consumed.append(msg.id)

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(producers)]
        consumers = [threading.Thread(target=consume) for _ in range(2)]
        for t in threads + consumers:
            t.start()
        for t in threads:
            t.join()
        q.enqueue_batch([b"stop", b"stop"])
        for t in consumers:
            t.join()
        assert sorted(produced) == sorted(set(produced))
        assert len(produced) == per_thread * producers
        assert sorted(consumed) == sorted(produced)
        q._check()


def test_sync_and_compact_are_callable(qpath: Path) -> None:
    with ledgerq.open(qpath, sync="never", segment_size=256) as q:
        q.enqueue_batch([b"x" * 100] * 10)
        q.sync()
        assert q.stats().segments > 1
        while (msg := q.dequeue()) is not None:
            q.ack(msg.id)
        q.compact()
        assert q.stats().segments == 1


def test_exception_tree() -> None:
    # Every exception class ledgerq exports, with the stdlib types users may catch.
    tree = {
        ledgerq.ConfigError: (ValueError,),
        ledgerq.NotAQueueError: (ledgerq.ConfigError, ValueError),
        ledgerq.IncompatibleFormatError: (ledgerq.ConfigError, ValueError),
        ledgerq.QueueLockedError: (),
        ledgerq.QueueBusyError: (),
        ledgerq.QueueClosedError: (),
        ledgerq.QueueFullError: (),
        ledgerq.ForkedQueueError: (),
        ledgerq.MessageTooLargeError: (ValueError,),
        ledgerq.CorruptionError: (),
        ledgerq.UnknownMessageError: (KeyError,),
        ledgerq.StorageError: (OSError,),
    }
    exported = {
        obj
        for obj in (getattr(ledgerq, name) for name in ledgerq.__all__)
        if isinstance(obj, type) and issubclass(obj, BaseException)
    }
    assert exported == {ledgerq.LedgerQError, *tree}
    for cls, bases in tree.items():
        assert issubclass(cls, ledgerq.LedgerQError), cls
        for base in bases:
            assert issubclass(cls, base), (cls, base)


def test_public_exports_are_pinned() -> None:
    # Equality, not a subset (httpx's habit): a name added or dropped is a decision.
    assert ledgerq.__all__ == [
        "Clock",
        "Compression",
        "ConfigError",
        "CorruptionError",
        "ForkedQueueError",
        "IncompatibleFormatError",
        "Item",
        "LedgerQError",
        "Message",
        "MessageTooLargeError",
        "NotAQueueError",
        "OpenOptions",
        "Options",
        "PeriodicJob",
        "Priority",
        "Queue",
        "QueueBusyError",
        "QueueClosedError",
        "QueueFullError",
        "QueueLockedError",
        "Reader",
        "ReaderStart",
        "ReaderStats",
        "ShardedQueue",
        "Stats",
        "StorageError",
        "SyncMode",
        "UnknownMessageError",
        "__version__",
        "follow",
        "open",
        "open_sharded",
    ]
    assert ledgerq.__all__ == sorted(ledgerq.__all__)
    for name in ledgerq.__all__:
        assert hasattr(ledgerq, name), name


_PUBLIC_OBJECTS = [
    name
    for name in ledgerq.__all__
    if isinstance(getattr(ledgerq, name), type) or inspect.isfunction(getattr(ledgerq, name))
]


@pytest.mark.parametrize("name", _PUBLIC_OBJECTS)
def test_public_names_live_at_their_public_path(name: str) -> None:
    obj = getattr(ledgerq, name)
    assert obj.__module__ == "ledgerq"
    assert obj.__qualname__ == name
    if isinstance(obj, type):
        typing.get_type_hints(obj)  # the annotations still resolve from the public path


@pytest.mark.parametrize("face", ["ledgerq.tools", "ledgerq.workers", "ledgerq.ship"])
def test_the_faces_public_names_live_at_the_faces_path(face: str, tmp_path: Path) -> None:
    # Their modules are packages of private modules: what a user imports from the face
    # is named by the face in reprs and pickles (a private module may move).
    module = importlib.import_module(face)
    for name in module.__all__:
        obj = getattr(module, name)
        if isinstance(obj, type) or inspect.isfunction(obj):
            assert (obj.__module__, obj.__qualname__) == (face, name)
            if isinstance(obj, type):
                typing.get_type_hints(obj)
    if face == "ledgerq.tools":
        ledgerq.open(tmp_path / "q").close()
        report = module.verify(tmp_path / "q")
        data = pickle.dumps(report, protocol=0)
        assert b"ledgerq.tools\n" in data and b"_verify" not in data
        assert pickle.loads(data) == report


def test_values_pickle_by_their_public_path(qpath: Path) -> None:
    with ledgerq.open(qpath) as q:
        q.enqueue(b"payload", headers={"k": "v"}, priority=Priority.HIGH, ttl=60)
        message = q.dequeue()
        assert message is not None
        stats = q.stats()
    values = [
        message,
        stats,
        stats.readers["default"],
        Item(b"x", headers={"a": "b"}, priority=Priority.LOW),
        ledgerq.Options(sync="always", compression="zstd"),
        Priority.HIGH,
    ]
    for value in values:
        data = pickle.dumps(value)
        assert b"ledgerq\n" in data or b"\x07ledgerq" in data, "named by its public module"
        assert b"ledgerq._types" not in data and b"ledgerq._options" not in data
        assert pickle.loads(data) == value
    assert repr(message).startswith("Message(id=1, payload=b'payload'")


def test_open_options_declare_every_option_with_its_type() -> None:
    fields = {f.name: f.type for f in dataclasses.fields(ledgerq.Options)}
    assert typing.get_type_hints(ledgerq.OpenOptions) == typing.get_type_hints(ledgerq.Options)
    assert set(ledgerq.OpenOptions.__annotations__) == set(fields)
    assert ledgerq.OpenOptions.__required_keys__ == frozenset()  # every option may be left out


def test_type_checkers_see_the_options_of_open(tmp_path: Path) -> None:
    checked = tmp_path / "checked.py"
    checked.write_text(
        textwrap.dedent(
            """\
            import ledgerq
            import ledgerq.aio
            import ledgerq.workers

            ledgerq.open("q", sync="always", max_retries=2, compression="zstd")
            ledgerq.open("q", sync="sometimes")
            ledgerq.open("q", segmnet_size=1024)
            ledgerq.open("q", max_retries="3")
            ledgerq.aio.open("q", compression="gzip")
            ledgerq.open_sharded("q", 4, sync="sometimes")
            ledgerq.workers.run("q", print, priorities="yes")
            ledgerq.open("q").reader("r", start="middle")
            mode: ledgerq.SyncMode = "never"
            ledgerq.Options(sync=mode, compression="none")
            ledgerq.Options(compression="lz4")
            """
        )
    )
    cache = tmp_path / "mypy_cache"
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache), str(checked)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).resolve().parents[2],  # this checkout's ledgerq, with py.typed
    )
    errors = sorted(
        int(line.split(":")[1]) for line in proc.stdout.splitlines() if ": error:" in line
    )
    # Every misuse is flagged on its line, and nothing else is: line 5 and 13-14 are fine.
    assert errors == [6, 7, 8, 9, 10, 11, 12, 15], proc.stdout + proc.stderr


def test_options_are_remembered_on_reopen(qpath: Path) -> None:
    with ledgerq.open(qpath, priorities=True, max_retries=7, segment_size=4096) as q:
        q.enqueue(b"low", priority=Priority.LOW)
        q.enqueue(b"high", priority=Priority.HIGH)
    with ledgerq.open(qpath) as q:
        assert q.options.priorities and q.options.max_retries == 7
        assert q.options.segment_size == 4096
        msg = q.dequeue()
        assert msg is not None and msg.payload == b"high"
    with ledgerq.open(qpath, max_retries=2) as q:  # keywords override, the rest stays
        assert q.options.max_retries == 2 and q.options.priorities
    with ledgerq.open(qpath, options=ledgerq.Options()) as q:  # an object is taken whole
        assert not q.options.priorities


def test_a_stored_option_that_no_longer_validates_drops_only_itself(
    qpath: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with ledgerq.open(qpath, priorities=True, max_retries=7, dedup_window=60.0):
        pass
    meta_path = qpath / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["options"]["max_retries"] = -5  # stored by an older ledgerq, or edited by hand
    meta_path.write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING, logger="ledgerq"), ledgerq.open(qpath) as q:
        assert q.options.priorities and q.options.dedup_window == 60.0
        assert q.options.max_retries == ledgerq.Options().max_retries
    assert any("max_retries" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- one argument, one error

_BAD_VALUES: dict[str, list[tuple[object, type[Exception]]]] = {
    # what is wrong with the argument -> the error every public callable raises for it
    "n": [("3", TypeError), (3.0, TypeError), (True, TypeError), (0, ValueError), (-2, ValueError)],
    "timeout": [
        ("1", TypeError),
        (True, TypeError),
        (False, TypeError),
        (-1, ValueError),
        (math.nan, ValueError),
    ],
    "id": [("1", TypeError), (1.0, TypeError), (True, TypeError), (None, TypeError)],
    "reason": [(5, TypeError), (b"bytes", TypeError), (None, TypeError)],
    "priority": [("HIGH", TypeError), (1.0, TypeError), (True, TypeError), (7, ValueError)],
    "reader name": [(5, TypeError), (b"audit", TypeError), ("", ValueError), (".x", ValueError)],
    "reader start": [
        (1.5, TypeError),
        (None, TypeError),
        (b"latest", TypeError),
        ("middle", ValueError),
    ],
    "processes": [("4", TypeError), (2.0, TypeError), (True, TypeError), (0, ValueError)],
    "task_timeout": [
        ("5", TypeError),
        (True, TypeError),
        (0, ValueError),
        (-1, ValueError),
        (math.nan, ValueError),
    ],
}


class _Faces:
    """One queue seen through every public face that takes these arguments."""

    def __init__(self, root: Path) -> None:
        self.path = root / "q"
        self.queue = ledgerq.open(self.path, sync="never")
        self.queue.enqueue(b"x")
        self.reader = self.queue.reader("other")
        self.aio = ledgerq.aio.AsyncQueue(self.queue)
        self.sharded = ledgerq.open_sharded(root / "sharded", 2, sync="never")
        self.sharded.enqueue_batch([b"x", b"y"])

    def close(self) -> None:
        self.queue.close()
        self.sharded.close()


def _aio(coroutine: Coroutine[object, object, object]) -> object:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


_CALLS: dict[str, list[tuple[str, Callable[[_Faces, Any], object]]]] = {
    "n": [
        ("Queue.peek", lambda f, v: f.queue.peek(v)),
        ("Queue.dequeue_batch", lambda f, v: f.queue.dequeue_batch(v)),
        ("Reader.peek", lambda f, v: f.reader.peek(v)),
        ("Reader.dequeue_batch", lambda f, v: f.reader.dequeue_batch(v)),
        ("ShardedQueue.peek", lambda f, v: f.sharded.peek(v)),
        ("ShardedQueue.dequeue_batch", lambda f, v: f.sharded.dequeue_batch(v)),
        ("AsyncQueue.peek", lambda f, v: _aio(f.aio.peek(v))),
        ("AsyncQueue.dequeue_batch", lambda f, v: _aio(f.aio.dequeue_batch(v, 1))),
    ],
    "timeout": [
        ("Queue.dequeue", lambda f, v: f.queue.dequeue(v)),
        ("Queue.dequeue_batch", lambda f, v: f.queue.dequeue_batch(1, v)),
        ("Reader.dequeue", lambda f, v: f.reader.dequeue(v)),
        ("Reader.dequeue_batch", lambda f, v: f.reader.dequeue_batch(1, v)),
        ("ShardedQueue.dequeue", lambda f, v: f.sharded.dequeue(v)),
        ("ShardedQueue.dequeue_batch", lambda f, v: f.sharded.dequeue_batch(1, v)),
        ("AsyncQueue.dequeue", lambda f, v: _aio(f.aio.dequeue(v))),
        ("AsyncQueue.dequeue_batch", lambda f, v: _aio(f.aio.dequeue_batch(1, v))),
        ("follow", lambda f, v: ledgerq.follow(f.path, timeout=v).close()),
    ],
    "id": [
        ("Queue.ack", lambda f, v: f.queue.ack(v)),
        ("Queue.ack_batch", lambda f, v: f.queue.ack_batch([v])),
        ("Queue.nack", lambda f, v: f.queue.nack(v)),
        ("Reader.ack", lambda f, v: f.reader.ack(v)),
        ("Reader.nack", lambda f, v: f.reader.nack(v)),
        ("Reader.seek", lambda f, v: f.reader.seek(v)),
        ("ShardedQueue.ack", lambda f, v: f.sharded.ack(v)),
        ("ShardedQueue.nack", lambda f, v: f.sharded.nack(v)),
        ("ShardedQueue.shard_of", lambda f, v: f.sharded.shard_of(v)),
        ("AsyncQueue.ack", lambda f, v: _aio(f.aio.ack(v))),
        ("AsyncQueue.ack_batch", lambda f, v: _aio(f.aio.ack_batch([v]))),
        ("AsyncQueue.nack", lambda f, v: _aio(f.aio.nack(v))),
        ("follow", lambda f, v: ledgerq.follow(f.path, from_id=v).close()),
    ],
    "reason": [
        ("Queue.nack", lambda f, v: f.queue.nack(1, v)),
        ("Reader.nack", lambda f, v: f.reader.nack(1, v)),
        ("ShardedQueue.nack", lambda f, v: f.sharded.nack(2, v)),
        ("AsyncQueue.nack", lambda f, v: _aio(f.aio.nack(1, v))),
    ],
    "priority": [
        ("Queue.enqueue", lambda f, v: f.queue.enqueue(b"p", priority=v)),
        ("Queue.enqueue_batch", lambda f, v: f.queue.enqueue_batch([Item(b"p", priority=v)])),
        ("ShardedQueue.enqueue", lambda f, v: f.sharded.enqueue(b"p", priority=v)),
        (
            "ShardedQueue.enqueue_batch",
            lambda f, v: f.sharded.enqueue_batch([Item(b"p", priority=v)]),
        ),
        ("AsyncQueue.enqueue", lambda f, v: _aio(f.aio.enqueue(b"p", priority=v))),
    ],
    "reader name": [
        ("Queue.reader", lambda f, v: f.queue.reader(v)),
        ("Queue.remove_reader", lambda f, v: f.queue.remove_reader(v)),
        ("AsyncQueue.reader", lambda f, v: _aio(f.aio.reader(v))),
    ],
    "reader start": [
        ("Queue.reader", lambda f, v: f.queue.reader("new", v)),
        ("AsyncQueue.reader", lambda f, v: _aio(f.aio.reader("new", v))),
    ],
    "processes": [("workers.run", lambda f, v: ledgerq.workers.run(f.path, print, processes=v))],
    "task_timeout": [
        ("workers.run", lambda f, v: ledgerq.workers.run(f.path, print, task_timeout=v)),
    ],
}

_CASES = [
    pytest.param(call, value, error, id=f"{name}-{kind}={value!r}")
    for kind, calls in _CALLS.items()
    for name, call in calls
    for value, error in _BAD_VALUES[kind]
]


@pytest.fixture
def faces(tmp_path: Path) -> Iterator[_Faces]:
    found = _Faces(tmp_path)
    yield found
    found.close()


@pytest.mark.parametrize(("call", "value", "error"), _CASES)
def test_the_same_wrong_argument_raises_the_same_error_everywhere(
    faces: _Faces, call: Callable[[_Faces, Any], object], value: object, error: type[Exception]
) -> None:
    with pytest.raises(error) as info:
        call(faces, value)
    assert type(info.value) in (error, ledgerq.ConfigError), "a plain type, not a subclass"
    for queue in (faces.queue, faces.sharded):
        stats = queue.stats()
        assert (stats.enqueued, stats.in_flight) == (len(queue), 0), "nothing written or leased"
