"""``forward(id, target, items)``: the items land in the target once and the source is
acked, in both modes, on named readers, encrypted and after reopen; bad input writes
nothing.  A crash between the two writes is the crash tests' (tests/crash/
test_forward_kill9.py); here the instant after the items land is reached by an ack that
raises, the message staying leased, then a reopen that delivers it again."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import ledgerq
from ledgerq.core.reader_handle import Reader
from ledgerq.segment.naming import FEATURES_DIR, FORWARDS_TABLE_NAME
from tests.features._forward import forward_losing_the_ack, lease_new
from tests.features._key_table import key_table_records

KEY = bytes(range(32))
MODES: dict[str, dict[str, Any]] = {
    "exclusive": {},
    "shared": {"shared": True},
    "encrypted": {"encryption_key": KEY},
    "shared-encrypted": {"shared": True, "encryption_key": KEY},
}


@pytest.fixture(params=list(MODES))
def options(request: pytest.FixtureRequest) -> dict[str, Any]:
    return dict(MODES[request.param])


def payloads(q: ledgerq.Queue) -> list[bytes]:
    return [m.payload for m in q.peek(1000)]


def test_forward_enqueues_into_the_target_and_acks(tmp_path: Path, options: dict[str, Any]) -> None:
    with (
        ledgerq.open(tmp_path / "a", **options) as a,
        ledgerq.open(tmp_path / "b", **options) as b,
    ):
        msg = lease_new(a)
        ids = a.forward(msg.id, b, [b"one", ledgerq.Item(b"two", headers={"h": "v"})])
        assert ids == [1, 2]
        got = b.peek(10)
        assert [(m.id, m.payload, m.headers) for m in got] == [
            (1, b"one", {}),
            (2, b"two", {"h": "v"}),
        ]
        assert a.stats().pending == 0
        assert a.stats().in_flight == 0
        assert a.stats().acked == 1
        with pytest.raises(ledgerq.UnknownMessageError):
            a.ack(msg.id)  # acked by the forward


def test_a_single_bytes_or_item_is_one_item(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "a") as a, ledgerq.open(tmp_path / "b") as b:
        a.enqueue_batch([b"1", b"2", b"3"])
        first, second, third = a.dequeue_batch(3)
        assert a.forward(first.id, b, b"x") == [1]
        assert a.forward(second.id, b, ledgerq.Item(b"y", priority=ledgerq.Priority.HIGH)) == [2]
        assert a.forward(third.id, b, []) == []  # nothing handed on: only the ack
        assert payloads(b) == [b"x", b"y"]
        assert len(a) == 0


def test_a_message_delivered_again_adds_nothing(
    tmp_path: Path, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    with ledgerq.open(tmp_path / "b", **options) as b:
        a = ledgerq.open(tmp_path / "a", **options)
        msg = lease_new(a)
        forward_losing_the_ack(monkeypatch, a, msg.id, b, [b"one", b"two"])
        assert payloads(b) == [b"one", b"two"]
        a.close()  # the lease returns: delivered again at the next open
        with ledgerq.open(tmp_path / "a", **options) as a:
            again = a.dequeue()
            assert again is not None
            assert again.id == msg.id
            assert again.attempts == 2
            # Another result this time: the first one landed, it stays the only one.
            assert a.forward(again.id, b, [b"three"]) == [1, 2]
            assert payloads(b) == [b"one", b"two"]
            assert len(a) == 0
    # And after a reopen of the target too (the keys are read back from its file).
    with (
        ledgerq.open(tmp_path / "b", **options) as b,
        ledgerq.open(tmp_path / "a", **options) as a,
    ):
        nxt = lease_new(a, b"next")
        assert a.forward(nxt.id, b, [b"four"]) == [3]
        assert payloads(b) == [b"one", b"two", b"four"]


def test_the_target_is_reopened_between_the_forward_and_the_redelivery(
    tmp_path: Path, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    a = ledgerq.open(tmp_path / "a", **options)
    b = ledgerq.open(tmp_path / "b", **options)
    msg = lease_new(a)
    forward_losing_the_ack(monkeypatch, a, msg.id, b, [b"one"])
    a.close()
    b.close()
    with (
        ledgerq.open(tmp_path / "a", **options) as a,
        ledgerq.open(tmp_path / "b", **options) as b,
    ):
        again = a.dequeue()
        assert again is not None
        assert a.forward(again.id, b, [b"other"]) == [1]
        assert payloads(b) == [b"one"]


def test_named_readers_hand_off_each_their_own(tmp_path: Path, options: dict[str, Any]) -> None:
    with (
        ledgerq.open(tmp_path / "a", **options) as a,
        ledgerq.open(tmp_path / "b", **options) as b,
    ):
        a.enqueue(b"job")
        audit = a.reader("audit")
        mine = a.dequeue()
        theirs = audit.dequeue()
        assert mine is not None
        assert theirs is not None
        assert mine.id == theirs.id
        # The same message id, two readers: two hand-offs, each once.
        assert a.forward(mine.id, b, [b"from default"]) == [1]
        assert audit.forward(theirs.id, b, [b"from audit"]) == [2]
        assert payloads(b) == [b"from default", b"from audit"]
        assert audit.stats().in_flight == 0


def test_a_redelivered_message_of_a_named_reader_adds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ledgerq.open(tmp_path / "b") as b:
        with ledgerq.open(tmp_path / "a") as a:
            a.enqueue(b"job")
            msg = a.reader("stage").dequeue()
            assert msg is not None
            forward_losing_the_ack(monkeypatch, a.reader("stage"), msg.id, b, [b"one"])
        with ledgerq.open(tmp_path / "a") as a:
            stage = a.reader("stage")
            again = stage.dequeue()
            assert again is not None
            assert stage.forward(again.id, b, [b"two"]) == [1]
            assert stage.stats().in_flight == 0
            # The default reader's delivery of the same id is a hand-off of its own.
            plain = a.dequeue()
            assert plain is not None
            assert a.forward(plain.id, b, [b"three"]) == [2]
        assert payloads(b) == [b"one", b"three"]


def test_a_plain_queue_never_forwarded_into_has_no_file(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "a") as a, ledgerq.open(tmp_path / "b") as b:
        a.enqueue(b"job")
        b.enqueue(b"plain")
        assert not (tmp_path / "b" / FEATURES_DIR / FORWARDS_TABLE_NAME).exists()
        msg = a.dequeue()
        assert msg is not None
        a.forward(msg.id, b, [b"x"])
        assert (tmp_path / "b" / FEATURES_DIR / FORWARDS_TABLE_NAME).exists()
        assert not (tmp_path / "a" / FEATURES_DIR / FORWARDS_TABLE_NAME).exists()


def test_a_featured_target_takes_the_checked_way(tmp_path: Path) -> None:
    """A target with compression and priorities (no plain path), items with options."""
    options: dict[str, Any] = {"compression": "zstd", "compression_min_size": 1, "priorities": True}
    with ledgerq.open(tmp_path / "a") as a, ledgerq.open(tmp_path / "b", **options) as b:
        a.enqueue_batch([b"1", b"2"])
        first, second = a.dequeue_batch(2)
        items = [
            ledgerq.Item(b"low" * 100, priority=ledgerq.Priority.LOW),
            ledgerq.Item(b"high" * 100, priority=ledgerq.Priority.HIGH, ttl=60.0),
        ]
        assert a.forward(first.id, b, items) == [1, 2]
        assert a.forward(second.id, b, [b"mid"]) == [3]
        assert [m.payload for m in b.peek(3)] == [b"high" * 100, b"mid", b"low" * 100]


# ---------------------------------------------------------------------- bad input


def test_an_id_not_leased_raises_and_writes_nothing(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "a") as a, ledgerq.open(tmp_path / "b") as b:
        a.enqueue(b"job")
        with pytest.raises(ledgerq.UnknownMessageError, match="not leased"):
            a.forward(1, b, [b"x"])  # never dequeued
        msg = a.dequeue()
        assert msg is not None
        a.ack(msg.id)
        with pytest.raises(ledgerq.UnknownMessageError, match="not leased"):
            a.forward(msg.id, b, [b"x"])  # already acked
        assert len(b) == 0
        assert b.stats().enqueued == 0
        assert not (tmp_path / "b" / FEATURES_DIR / FORWARDS_TABLE_NAME).exists()


def test_the_source_itself_is_refused(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "a", shared=True) as a:
        msg = lease_new(a)
        with pytest.raises(ValueError, match="source queue itself"):
            a.forward(msg.id, a, [b"x"])
        # Another handle of the same directory is the same queue.
        with (
            ledgerq.open(tmp_path / "a", shared=True) as other,
            pytest.raises(ValueError, match="source queue itself"),
        ):
            a.forward(msg.id, other, [b"x"])
        # And through a symlink.
        os.symlink(tmp_path / "a", tmp_path / "link")
        with (
            ledgerq.open(tmp_path / "link", shared=True) as linked,
            pytest.raises(ValueError, match="source queue itself"),
        ):
            a.forward(msg.id, linked, [b"x"])
        assert a.stats().enqueued == 1
        assert a.stats().in_flight == 1  # still leased: the caller may ack or forward


def test_a_closed_target_is_refused(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "a") as a:
        b = ledgerq.open(tmp_path / "b")
        b.close()
        msg = lease_new(a)
        with pytest.raises(ledgerq.QueueClosedError, match="is closed"):
            a.forward(msg.id, b, [b"x"])
        assert a.stats().in_flight == 1
    with ledgerq.open(tmp_path / "b") as b:
        assert len(b) == 0


@pytest.mark.parametrize(
    ("items", "error", "match"),
    [
        ("text", TypeError, "must be bytes, an Item"),
        (42, TypeError, "must be bytes, an Item"),
        ([b"ok", "text"], TypeError, "bytes-like"),
        ([ledgerq.Item(b"x", dedup_id="d")], ValueError, "dedup_id or unique_key"),
        ([ledgerq.Item(b"x", unique_key="k")], ValueError, "dedup_id or unique_key"),
        ([b"ok", ledgerq.Item(b"x", headers={"h": 1})], TypeError, "header"),  # type: ignore[dict-item]
    ],
)
def test_bad_items_raise_and_write_nothing(
    tmp_path: Path, items: Any, error: type[Exception], match: str
) -> None:
    with ledgerq.open(tmp_path / "a") as a, ledgerq.open(tmp_path / "b") as b:
        msg = lease_new(a)
        with pytest.raises(error, match=match):
            a.forward(msg.id, b, items)
        assert len(b) == 0
        assert a.stats().in_flight == 1
        assert a.forward(msg.id, b, [b"fine"]) == [1]


def test_a_target_that_is_not_a_queue_is_refused(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "a") as a:
        msg = lease_new(a)
        with pytest.raises(TypeError, match="open ledgerq queue"):
            a.forward(msg.id, str(tmp_path / "b"), [b"x"])  # type: ignore[arg-type]
        assert not (tmp_path / "b").exists()


def test_a_full_bounded_target_raises_having_written_nothing(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "a") as a, ledgerq.open(tmp_path / "b", max_pending=1) as b:
        a.enqueue_batch([b"1", b"2"])
        first, second = a.dequeue_batch(2)
        assert a.forward(first.id, b, [b"x"]) == [1]
        with pytest.raises(ledgerq.QueueFullError):
            a.forward(second.id, b, [b"y"])
        assert a.stats().in_flight == 1
        taken = b.dequeue()
        assert taken is not None
        b.ack(taken.id)
        assert a.forward(second.id, b, [b"y"]) == [2]


# ---------------------------------------------------------------------- the file


def test_the_file_keeps_the_newest_keys_across_a_rewrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledgerq.features import forward

    monkeypatch.setattr(forward, "KEEP_RECORDS", 4)
    path = tmp_path / "b" / FEATURES_DIR / FORWARDS_TABLE_NAME
    with ledgerq.open(tmp_path / "b") as b:
        a = ledgerq.open(tmp_path / "a")
        a.enqueue_batch([b"%d" % n for n in range(10)])
        leased = a.dequeue_batch(10)
        with monkeypatch.context() as patch:
            patch.setattr(Reader, "ack", lambda self, message_id: None)  # every ack lost
            for msg in leased:
                a.forward(msg.id, b, [msg.payload])
        # 10 records: rewritten at 8 to the newest 4, then 2 more stored.
        assert len(key_table_records(path, b"LQFT")) == 6
        a.close()
        with ledgerq.open(tmp_path / "a") as a:
            again = {m.payload: m for m in a.dequeue_batch(10)}
            # The newest keys are known: their messages are only acked.
            for n in range(4, 10):
                assert a.forward(again[b"%d" % n].id, b, [b"again"]) == [n + 1]
            assert payloads(b) == [b"%d" % n for n in range(10)]


def test_a_key_verified_here_holds_past_retention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The items were consumed and their segment deleted before the message came back:
    the record this handle wrote (known to be in the log) still says they landed."""
    with ledgerq.open(tmp_path / "b", segment_size=1024) as b:
        a = ledgerq.open(tmp_path / "a")
        msg = lease_new(a)
        with monkeypatch.context() as patch:
            patch.setattr(Reader, "ack", lambda self, message_id: None)
            assert a.forward(msg.id, b, [b"item"]) == [1]
        a.close()
        b.enqueue_batch([b"x" * 600] * 4)  # rotations past the item's segment
        while (taken := b.dequeue()) is not None:
            b.ack(taken.id)
        assert b.peek(1) == []
        assert not os.path.exists(tmp_path / "b" / "segments" / f"{1:020d}.log")
        with ledgerq.open(tmp_path / "a") as a:
            again = a.dequeue()
            assert again is not None
            assert a.forward(again.id, b, [b"item"]) == [1]
        assert b.stats().enqueued == 5


def test_sync_always_forwards(tmp_path: Path) -> None:
    with (
        ledgerq.open(tmp_path / "a", sync="always") as a,
        ledgerq.open(tmp_path / "b", sync="always") as b,
    ):
        a.enqueue_batch([b"1", b"2"])
        first, second = a.dequeue_batch(2)
        assert a.forward(first.id, b, [b"x"]) == [1]
        assert a.forward(second.id, b, [b"y", ledgerq.Item(b"z")]) == [2, 3]
        assert payloads(b) == [b"x", b"y", b"z"]


@pytest.mark.parametrize("shared", [False, True])
def test_the_hand_offs_of_an_older_forwards_log_are_moved_into_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared: bool
) -> None:
    """A target whose hand-offs an older ledgerq kept in ``features/forwards.log``: at
    the first forward they are taken (the redelivered message is only acked), the table
    is written with them, and the old file is removed."""
    from ledgerq.features.forward import FORWARDS_MAGIC
    from ledgerq.format.feature_state import encode_feature_file_header, encode_feature_record

    table = tmp_path / "b" / FEATURES_DIR / FORWARDS_TABLE_NAME
    old = tmp_path / "b" / FEATURES_DIR / "forwards.log"
    with ledgerq.open(tmp_path / "a") as a, ledgerq.open(tmp_path / "b") as b:
        msg = lease_new(a)
        forward_losing_the_ack(monkeypatch, a, msg.id, b, [b"first"])
    ((key, first_id, count, stamp),) = key_table_records(table, b"LQFT")
    table.unlink()  # the target as the older ledgerq left it
    old.write_bytes(
        encode_feature_file_header(FORWARDS_MAGIC)
        + encode_feature_record([key, first_id, count, stamp])
    )
    with (
        ledgerq.open(tmp_path / "a", shared=shared) as a,
        ledgerq.open(tmp_path / "b", shared=shared) as b,
    ):
        again = a.dequeue()
        assert again is not None and again.id == msg.id
        assert a.forward(again.id, b, [b"again"]) == [first_id]  # landed before: acked only
        assert payloads(b) == [b"first"]
        assert not old.exists()
        assert key_table_records(table, b"LQFT") == [(key, first_id, count, stamp)]
        assert a.dequeue() is None
