"""Unique jobs: ``enqueue(..., unique_key=)`` (features/unique.py).

What holds a key (pending, delayed, leased, waiting for a retry) and what frees it
(ack, dead-letter, expiry, purge, retention's drop), with every reader; batches,
dedup beside it, reopen, encryption, records that name no message, a failed write,
the sweep, and bad keys.  The model test and the kill -9 tests are elsewhere
(test_unique_model.py, tests/crash/test_unique_kill9.py).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import xxhash

import ledgerq
from ledgerq import Item
from ledgerq.features import unique
from ledgerq.format.feature_state import encode_feature_file_header, encode_feature_record
from ledgerq.segment.files import StorageError
from ledgerq.segment.manager import SegmentManager
from tests.clocks import SteppedClock
from tests.features._key_table import key_table_records, store_key_record


def unique_table(path: Path) -> Path:
    return path / "features" / "unique.table"


def unique_log(path: Path) -> Path:
    """Where a ledgerq before the table kept the keys."""
    return path / "features" / "unique.log"


def table_records(path: Path) -> list[tuple[bytes, int, int, int]]:
    """The records of the queue's ``features/unique.table``, read as the spec says."""
    return key_table_records(unique_table(path), b"LQUT")


def store_record(path: Path, record: tuple[bytes, int, int, int]) -> None:
    store_key_record(unique_table(path), b"LQUT", record)


def test_a_held_key_returns_its_message_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        first = q.enqueue(b"report for 7", unique_key="report:7")
        assert len(table_records(path)) == 1
        segments = sorted((path / "segments").iterdir())
        log_size = sum(p.stat().st_size for p in segments)
        assert q.enqueue(b"report for 7, again", unique_key="report:7") == first
        assert len(table_records(path)) == 1
        assert sum(p.stat().st_size for p in segments) == log_size
        assert q.enqueue(b"other", unique_key="report:8") != first
        assert len(q) == 2
        assert q.stats().enqueued == 2
        assert q.stats().duplicates == 1
        # The duplicate wrote nothing: the one record and message each of report:7 and
        # report:8 are all there is.
        assert [r[1] for r in table_records(path)] == [first, first + 1]
        assert [m.payload for m in q.peek(5)] == [b"report for 7", b"other"]
        assert sum(p.stat().st_size for p in segments) > log_size


def test_a_queue_without_unique_jobs_has_no_file(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        q.enqueue(b"a")
        q.enqueue(b"b", headers={"h": "v"}, dedup_id=None)
        q.enqueue_batch([Item(b"c", priority=ledgerq.Priority.HIGH)])
    assert not unique_table(tmp_path / "q").exists()
    assert not unique_log(tmp_path / "q").exists()


def test_every_unfinished_state_holds_the_key(tmp_path: Path) -> None:
    clock = SteppedClock()
    with ledgerq.open(tmp_path / "q", clock=clock, retry_delay=60, max_retries=5) as q:
        delayed = q.enqueue(b"later", unique_key="delayed", delay=3600)
        assert q.enqueue(b"x", unique_key="delayed") == delayed  # delayed
        leased_id = q.enqueue(b"now", unique_key="leased")
        msg = q.dequeue()
        assert msg is not None and msg.id == leased_id
        assert q.enqueue(b"x", unique_key="leased") == leased_id  # leased
        q.nack(leased_id, "try later")
        assert q.dequeue() is None
        assert q.enqueue(b"x", unique_key="leased") == leased_id  # waiting for a retry
        clock.elapse(61)
        msg = q.dequeue()
        assert msg is not None and msg.id == leased_id and msg.attempts == 2
        q.release(leased_id)
        assert q.enqueue(b"x", unique_key="leased") == leased_id  # released: pending
        assert len(q) == 2


def test_ack_dead_letter_expiry_and_purge_free_the_key(tmp_path: Path) -> None:
    clock = SteppedClock()
    with ledgerq.open(tmp_path / "q", clock=clock, max_retries=1) as q:
        acked = q.enqueue(b"a", unique_key="k")
        q.ack(q.dequeue().id)  # type: ignore[union-attr]
        after_ack = q.enqueue(b"a", unique_key="k")
        assert after_ack > acked

        dead = q.dequeue()
        assert dead is not None and dead.id == after_ack
        q.nack(dead.id, "broken")  # max_retries=1: to the DLQ
        assert len(q.dlq) == 1
        after_dlq = q.enqueue(b"a", unique_key="k")
        assert after_dlq > after_ack

        q.purge()
        after_purge = q.enqueue(b"a", unique_key="k", ttl=5)
        assert after_purge > after_dlq
        assert q.enqueue(b"a", unique_key="k") == after_purge
        clock.elapse(6)  # expired - no reader has even looked at it
        after_expiry = q.enqueue(b"a", unique_key="k")
        assert after_expiry > after_purge
        msg = q.dequeue()
        assert msg is not None and msg.id == after_expiry


def test_retention_dropping_the_message_frees_the_key(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", segment_size=1000, retention_max_bytes=3000) as q:
        first = q.enqueue(b"x" * 500, unique_key="k")
        for _ in range(20):
            q.enqueue(b"y" * 500)
        assert q.stats().dropped > 0
        assert first not in [m.id for m in q.peek(100)]
        assert q.enqueue(b"x", unique_key="k") > first


def test_one_key_twice_in_a_batch_is_one_message(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        held = q.enqueue(b"h", unique_key="held")
        ids = q.enqueue_batch(
            [
                Item(b"a", unique_key="k"),
                Item(b"b"),
                Item(b"a2", unique_key="k"),
                Item(b"h2", unique_key="held"),
            ]
        )
        assert ids == [held + 1, held + 2, held + 1, held]
        assert [m.payload for m in q.peek(10)] == [b"h", b"a", b"b"]


def test_dedup_is_independent_and_may_come_along(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", dedup_window=60) as q:
        first = q.enqueue(b"x", dedup_id="d", unique_key="k1")
        q.ack(q.dequeue().id)  # type: ignore[union-attr]
        # dedup finds "d" (its window is not over): nothing is written, and k2 must not
        # be left held by the id the message would have had.
        assert q.enqueue(b"y", dedup_id="d", unique_key="k2") == first
        fresh = q.enqueue(b"z", unique_key="k2")
        assert fresh > first
        assert [m.payload for m in q.peek(5)] == [b"z"]
        # The key is free after the ack even though the dedup id is still remembered.
        assert q.enqueue(b"w", unique_key="k1") > fresh


def test_every_reader_must_finish_the_message(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        audit = q.reader("audit")
        first = q.enqueue(b"a", unique_key="k")
        q.ack(q.dequeue().id)  # type: ignore[union-attr]
        assert q.enqueue(b"a", unique_key="k") == first  # audit has not seen it
        late = q.reader("late", start="latest")  # it never has to see the message
        msg = audit.dequeue()
        assert msg is not None and msg.id == first
        audit.ack(first)
        assert late.stats().pending == 0
        second = q.enqueue(b"a", unique_key="k")
        assert second > first
    with ledgerq.open(path) as q:  # the readers on disk count after a reopen too
        assert q.enqueue(b"a", unique_key="k") == second
        q.ack(q.dequeue().id)  # type: ignore[union-attr]
        assert q.enqueue(b"a", unique_key="k") == second  # audit and late hold it
        for name in ("audit", "late"):
            reader = q.reader(name)
            reader.ack(reader.dequeue().id)  # type: ignore[union-attr]
        assert q.enqueue(b"a", unique_key="k") > second


@pytest.mark.parametrize("shared", [False, True])
def test_keys_survive_reopen(tmp_path: Path, shared: bool) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=shared) as q:
        a = q.enqueue(b"a", unique_key="a")
        b = q.enqueue(b"b", unique_key="b")
        q.ack(q.dequeue().id)  # type: ignore[union-attr]
    with ledgerq.open(path, shared=shared) as q:
        assert q.enqueue(b"b", unique_key="b") == b
        assert q.enqueue(b"a", unique_key="a") > b  # acked before the close
        assert a < b


def test_encrypted_queue_keeps_keyed_digests(tmp_path: Path) -> None:
    path = tmp_path / "q"
    key = bytes(range(32))
    with ledgerq.open(path, encryption_key=key) as q:
        first = q.enqueue(b"secret job", unique_key="invoice:42")
    assert len(table_records(path)) == 1
    data = unique_table(path).read_bytes()
    assert xxhash.xxh3_128_digest(b"unique:invoice:42") not in data
    assert b"invoice:42" not in data
    with ledgerq.open(path, encryption_key=key) as q:
        assert q.enqueue(b"again", unique_key="invoice:42") == first
        assert len(q) == 1


def test_a_record_without_its_message_holds_nothing(tmp_path: Path) -> None:
    """The record of an enqueue killed before its message was written (or a record
    whose id another message took, with another timestamp) is not believed."""
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        real = q.enqueue(b"real", unique_key="real")
        stamp = q.peek(1)[0].timestamp
    store_record(path, (unique.unique_digest("ghost"), real + 1, stamp + 1, 0))
    store_record(path, (unique.unique_digest("stolen"), real, stamp - 1, 0))
    with ledgerq.open(path) as q:
        assert q.enqueue(b"real again", unique_key="real") == real
        ghost = q.enqueue(b"ghost", unique_key="ghost")
        stolen = q.enqueue(b"stolen", unique_key="stolen")
        assert real < ghost < stolen
        assert [m.payload for m in q.peek(5)] == [b"real", b"ghost", b"stolen"]


def test_a_failed_message_write_cuts_its_record_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue(b"first", unique_key="first")
        before = table_records(path)
        write = SegmentManager.append

        def failing(self: SegmentManager, *args: object, **kwargs: object) -> None:
            raise StorageError("append to", str(path), OSError(28, "No space left on device"))

        write_one = SegmentManager.append_one
        monkeypatch.setattr(SegmentManager, "append", failing)
        monkeypatch.setattr(SegmentManager, "append_one", failing)
        with pytest.raises(ledgerq.LedgerQError):
            q.enqueue(b"job", unique_key="k")  # the path of a bytes payload with a key
        with pytest.raises(ledgerq.LedgerQError):
            q.enqueue(b"job", unique_key="k", headers={"h": "v"})  # the checked path
        with pytest.raises(ledgerq.LedgerQError):
            q.enqueue_batch([Item(b"job", unique_key="k"), Item(b"j2", unique_key="k2")])
        assert table_records(path) == before
        monkeypatch.setattr(SegmentManager, "append", write)
        monkeypatch.setattr(SegmentManager, "append_one", write_one)
        retried = q.enqueue(b"job", unique_key="k")
        assert [m.id for m in q.peek(5)][-1] == retried
        assert q.enqueue(b"job", unique_key="k") == retried


def test_the_sweep_forgets_finished_keys_and_rewrites_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unique, "_SWEEP_AT", 4)
    monkeypatch.setattr(unique, "_REWRITE_SLACK", 4)
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        for n in range(40):
            q.enqueue(b"done", unique_key=f"done{n}")
            q.ack(q.dequeue().id)  # type: ignore[union-attr]
        kept = {n: q.enqueue(b"kept", unique_key=f"kept{n}") for n in range(3)}
    assert len(table_records(path)) < 20, "the file was rewritten with the keys still held"
    with ledgerq.open(path) as q:
        for n, message_id in kept.items():
            assert q.enqueue(b"kept", unique_key=f"kept{n}") == message_id
        assert q.enqueue(b"done", unique_key="done0") > max(kept.values())


@pytest.mark.parametrize(
    ("bad", "error", "words"),
    [
        (123, TypeError, "unique_key must be a str"),
        (b"bytes", TypeError, "unique_key must be a str"),
        ("", ValueError, "1 to 1024 bytes"),
        ("x" * 1025, ValueError, "1 to 1024 bytes"),
        ("é" * 513, ValueError, "got 1026"),
        ("\ud800", ValueError, "valid unicode"),
    ],
)
def test_a_bad_key_is_refused_before_anything_is_written(
    tmp_path: Path, bad: object, error: type[Exception], words: str
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        with pytest.raises(error, match=words):
            q.enqueue(b"a", unique_key=bad)  # type: ignore[arg-type]
        with pytest.raises(error, match=words):
            q.enqueue_batch([Item(b"ok", unique_key="fine"), Item(b"a", unique_key=bad)])  # type: ignore[arg-type]
        assert len(q) == 0
        assert q.stats().enqueued == 0
        assert not unique_table(path).exists()
        longest = "k" * 1024
        assert q.enqueue(b"a", unique_key=longest) == q.enqueue(b"b", unique_key=longest)


def test_asyncio_and_sharded_faces(tmp_path: Path) -> None:
    async def main() -> tuple[int, int]:
        async with ledgerq.aio.open(tmp_path / "aio") as q:
            return (
                await q.enqueue(b"a", unique_key="k"),
                await q.enqueue(b"b", unique_key="k"),
            )

    first, again = asyncio.run(main())
    assert first == again
    with ledgerq.open_sharded(tmp_path / "sharded", 4) as sq:
        ids = {sq.enqueue(b"job", unique_key="nightly") for _ in range(8)}
        assert len(ids) == 1  # routed by the key: one shard, one message
        batch = sq.enqueue_batch([Item(b"j", unique_key="nightly"), Item(b"j", unique_key="x")])
        assert batch[0] in ids
        assert sq.stats().pending == 2


@pytest.mark.parametrize("headers", [None, {"h": "v"}], ids=["bytes-and-key", "checked"])
def test_a_message_written_before_its_append_raised_holds_its_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, headers: dict[str, str] | None
) -> None:
    """A failure after the entry reached the log (a rotation): the enqueue raised, but
    the message is there and will be delivered - so its key is held."""
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        for name in ("append", "append_one"):
            write = getattr(SegmentManager, name)

            def written_then_failing(self: SegmentManager, *args: object, _w=write) -> object:
                _w(self, *args)
                raise StorageError("rotate", str(path), OSError(28, "No space left on device"))

            monkeypatch.setattr(SegmentManager, name, written_then_failing)
        with pytest.raises(ledgerq.LedgerQError):
            q.enqueue(b"job", unique_key="k", headers=headers)
        monkeypatch.undo()
        (msg,) = q.peek(5)
        assert q.enqueue(b"job", unique_key="k") == msg.id
    with ledgerq.open(path) as q:
        assert q.enqueue(b"job", unique_key="k") == msg.id
        assert len(q) == 1


@pytest.mark.parametrize("shared", [False, True])
def test_the_keys_of_an_older_unique_log_are_moved_into_the_table(
    tmp_path: Path, shared: bool
) -> None:
    """A queue whose keys an older ledgerq kept in ``features/unique.log``: at the first
    unique enqueue they are taken (a record without its message, as ever, holds
    nothing), the table is written with them, and the old file is removed."""
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        held = q.enqueue(b"held", unique_key="held")
        stamp = q.peek(1)[0].timestamp
    unique_table(path).unlink()  # the queue as the older ledgerq left it
    unique_log(path).write_bytes(
        encode_feature_file_header(unique.UNIQUE_MAGIC)
        + encode_feature_record([unique.unique_digest("held"), held, stamp, 0])
        + encode_feature_record([unique.unique_digest("ghost"), held + 1, stamp + 1, 0])
    )
    with ledgerq.open(path, shared=shared) as q:
        assert q.enqueue(b"held again", unique_key="held") == held
        assert not unique_log(path).exists()
        assert [r[1] for r in table_records(path)] == [held, held + 1]
        assert q.enqueue(b"ghost", unique_key="ghost") > held  # no message had it
        if shared:  # another handle reads the table the first moved the records into
            with ledgerq.open(path, shared=True) as other:
                assert other.enqueue(b"held, again", unique_key="held") == held
    with ledgerq.open(path, shared=shared) as q:
        assert q.enqueue(b"held, third", unique_key="held") == held
        assert len(q) == 2


def test_a_table_with_a_damaged_header_starts_empty_and_is_counted(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        first = q.enqueue(b"a", unique_key="a")
    with open(unique_table(path), "r+b") as f:
        f.write(b"JUNK")
    with ledgerq.open(path) as q:
        again = q.enqueue(b"a", unique_key="a")  # the record was lost with the header
        assert again > first
        assert q.stats().corrupt_skipped == 1
        assert q.enqueue(b"a", unique_key="a") == again
    assert [r[1] for r in table_records(path)] == [again]


def test_the_table_grows_past_its_first_room_and_keeps_every_key(tmp_path: Path) -> None:
    path = tmp_path / "q"
    count = 4000  # 64 KiB holds 1637 records: the file grows twice
    with ledgerq.open(path) as q:
        ids = [q.enqueue(b"job", unique_key=f"job-{n}") for n in range(count)]
    assert os.path.getsize(unique_table(path)) > 64 * 1024
    assert len(table_records(path)) == count
    with ledgerq.open(path) as q:
        assert [q.enqueue(b"again", unique_key=f"job-{n}") for n in range(count)] == ids
        assert len(q) == count


@pytest.mark.parametrize("shared", [False, True])
def test_sync_always_keeps_every_key(tmp_path: Path, shared: bool) -> None:
    """``sync="always"`` takes the way that syncs each record's page before its message
    is written (single enqueues and a batch): the keys are held as on any queue."""
    path = tmp_path / "q"
    with ledgerq.open(path, sync="always", shared=shared) as q:
        ids = [q.enqueue(b"job", unique_key=f"k{n}") for n in range(3)]
        batch = q.enqueue_batch([Item(b"job", unique_key="k9"), Item(b"job", unique_key="k0")])
        assert batch == [ids[-1] + 1, ids[0]]
    with ledgerq.open(path, sync="always", shared=shared) as q:
        assert [q.enqueue(b"again", unique_key=f"k{n}") for n in range(3)] == ids
        assert q.enqueue(b"again", unique_key="k9") == batch[0]
        assert len(q) == 4
