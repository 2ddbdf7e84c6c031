"""``import_kestrel``: journals written byte by byte, imported queues checked item by item."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import ledgerq
from ledgerq.kestrel import LEDGER_NAME, ImportReport, KestrelImportError, import_kestrel
from tests.kestrel._writer import OldJournal, bookmark_file, put_record, writer_file

NOW_MS = int(time.time() * 1000)
FAR_MS = NOW_MS + 10 * 86_400_000  # ten days ahead
PAST_MS = NOW_MS - 86_400_000


def messages(dest: Path) -> list[ledgerq.Message]:
    """Every message of the queue, in id order, read without leasing."""
    with ledgerq.follow(dest, timeout=0) as found:
        return list(found)


def payloads(dest: Path) -> list[bytes]:
    return [m.payload for m in messages(dest)]


def _timed_import(src: Path, dest: Path) -> tuple[ImportReport, int]:
    """Import ``src`` into ``dest``; return the report and how far (ns) an expiry the
    import computed from a TTL may be off: the time the import took, plus 1 ms."""
    before = time.time_ns()
    report = import_kestrel(src, dest)
    return report, time.time_ns() - before + 1_000_000


def strip(headers: dict[str, str]) -> dict[str, str]:
    """Headers without the bookkeeping ones every message has."""
    return {k: v for k, v in headers.items() if k not in ("kestrel.import_key", "kestrel.queue")}


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "kestrel"
    path.mkdir()
    return path


# ---------------------------------------------------------------------- old journals


def test_every_opcode_is_replayed_and_imported_item_by_item(src: Path, tmp_path: Path) -> None:
    (
        OldJournal()
        # A Kestrel 1.x roll: two open transactions, the xid counter saved at 7.
        .roll_1x([(7, b"open-seven", 1000), (3, b"open-three", 1100)], saved_xid=7)
        # Then operations as they happen.
        .add(b"starling", 0)
        .addx(b"one", 2000)
        .remove()  # the starling item
        .addx(b"two", 2100, FAR_MS)
        .remove_tentative()  # one: xid 8
        .addx(b"three", 2200)
        .remove_tentative_xid(12)  # two
        .unremove(8)  # one back at the head
        .confirm_remove(3)  # open-three done
        .continue_(12, b"four", 2300, FAR_MS)  # two done, four added
        .remove_tentative()  # one again: xid 13
        .confirm_remove(7)  # open-seven done
        .remove_tentative_xid(10)  # three
        .add(b"starling-2", FAR_MS // 1000)
        .write(src / "jobs")
    )
    dest = tmp_path / "dest"
    report, slack = _timed_import(src, dest)
    assert report.ok and report.format == "kestrel-1/2" and report.queue == "jobs"
    assert (report.found, report.imported, report.open_transactions) == (4, 4, 2)
    got = messages(dest)
    assert [m.payload for m in got] == [b"three", b"one", b"four", b"starling-2"]
    assert [m.id for m in got] == [1, 2, 3, 4]
    three, one, four, starling = got
    assert strip(three.headers) == {"kestrel.add_time": "2200", "kestrel.xid": "10"}
    assert strip(one.headers) == {"kestrel.add_time": "2000", "kestrel.xid": "13"}
    assert strip(four.headers) == {"kestrel.add_time": "2300", "kestrel.expire_time": str(FAR_MS)}
    assert strip(starling.headers) == {"kestrel.expire_time": str(FAR_MS // 1000 * 1000)}
    assert three.headers["kestrel.queue"] == "jobs"
    assert three.expires_at is None
    # The TTL is the time left before the Kestrel expiry.
    assert four.expires_at is not None
    assert abs(four.expires_at - FAR_MS * 1_000_000) <= slack
    assert any("starling ADD" in q for q in report.quirks)
    assert any("named xid" in q for q in report.quirks)


def test_rotated_files_are_replayed_in_timestamp_order_current_last(
    src: Path, tmp_path: Path
) -> None:
    OldJournal().addx(b"a", 1).addx(b"b", 2).write(src / "q.900")
    OldJournal().remove().addx(b"c", 3).write(src / "q.1000")  # sorts before q.900 as text
    OldJournal().addx(b"d", 4).write(src / "q")
    report = import_kestrel(src, tmp_path / "dest")
    assert payloads(tmp_path / "dest") == [b"b", b"c", b"d"]
    assert report.files == ("q.900", "q.1000", "q")
    assert not report.quirks


def test_pack_files_supersede_older_rotations_and_temp_files_are_ignored(
    src: Path, tmp_path: Path
) -> None:
    OldJournal().addx(b"stale-904", 1).write(src / "q.904")
    OldJournal().addx(b"stale-950", 2).write(src / "q.950")
    OldJournal().addx(b"packed-1", 3).addx(b"packed-2", 4).write(src / "q.950.pack")
    OldJournal().remove().write(src / "q.951")
    OldJournal().addx(b"current", 5).write(src / "q")
    OldJournal().addx(b"half-packed", 6).raw(b"\xff\xff").write(src / "q~~1700000000000")
    report = import_kestrel(src, tmp_path / "dest")
    assert payloads(tmp_path / "dest") == [b"packed-2", b"current"]
    assert report.files == ("q.950.pack", "q.951", "q")
    assert {name for name, _ in report.ignored} == {"q.904", "q.950", "q~~1700000000000"}
    assert report.ok


def test_a_torn_tail_of_the_newest_file_is_cut_and_reported(src: Path, tmp_path: Path) -> None:
    OldJournal().addx(b"rotated", 1).write(src / "q.100")
    journal = OldJournal().addx(b"a", 1).addx(b"b", 2).remove_tentative_xid(4)
    journal.addx(b"last item, cut short", 3, FAR_MS)
    blob = journal.bytes()
    start = journal.offsets[-1]
    # Every cut point is checked record by record in test_oldjournal; here: inside the
    # opcode's fields, the size field, the times and the payload.
    for cut in (start + 1, start + 3, start + 5, start + 13, start + 21, len(blob) - 1):
        (src / "q").write_bytes(blob[:cut])
        dest = tmp_path / f"dest-{cut}"
        report = import_kestrel(src, dest)
        assert payloads(dest) == [b"rotated", b"a", b"b"]  # rotated: open transaction 4
        assert report.ok and report.damage == ()
        (torn,) = report.cut
        assert (torn.file, torn.offset, torn.is_torn) == ("q", start, True)
        assert f"{cut - start} bytes not replayed" in torn.message


def test_a_torn_older_file_is_damage(src: Path, tmp_path: Path) -> None:
    rotated = OldJournal().addx(b"a", 1).addx(b"torn", 2)
    (src / "q.100").write_bytes(rotated.bytes()[:-1])
    OldJournal().addx(b"c", 3).write(src / "q")
    report = import_kestrel(src, tmp_path / "dest")
    assert payloads(tmp_path / "dest") == [b"a", b"c"]
    assert not report.ok and report.cut == ()
    assert [(d.file, d.offset) for d in report.damage] == [("q.100", rotated.offsets[1])]


def test_bytes_that_are_no_record_at_the_end_of_the_newest_file_are_damage(
    src: Path, tmp_path: Path
) -> None:
    journal = OldJournal().addx(b"a", 1).addx(b"b", 2)
    for tail in (b"\x0c", b"\x02\x03\x00\x00\x00"):  # an unknown opcode; ADDX of size 3
        (src / "q").write_bytes(journal.bytes() + tail)
        report = import_kestrel(src, tmp_path / f"dest-{tail[0]}")
        assert payloads(tmp_path / f"dest-{tail[0]}") == [b"a", b"b"]
        assert not report.ok and report.cut == ()
        (damage,) = report.damage
        assert (damage.file, damage.offset, damage.is_torn) == ("q", len(journal.bytes()), False)


def test_without_a_current_file_the_newest_rotated_file_may_be_torn(
    src: Path, tmp_path: Path
) -> None:
    OldJournal().addx(b"a", 1).write(src / "q.100")
    journal = OldJournal().addx(b"b", 2).addx(b"torn", 3)
    (src / "q.200").write_bytes(journal.bytes()[:-1])
    report = import_kestrel(src, tmp_path / "dest")
    assert payloads(tmp_path / "dest") == [b"a", b"b"]
    assert report.ok and [(d.file, d.offset) for d in report.cut] == [("q.200", 22)]


def test_a_fan_out_child_with_a_torn_newest_file_is_cut_too(src: Path, tmp_path: Path) -> None:
    OldJournal().addx(b"a", 1).addx(b"b", 2).write(src / "q")
    child = OldJournal().addx(b"a", 1).addx(b"b", 2)
    (src / "q+audit").write_bytes(child.bytes()[:-1])
    report = import_kestrel(src, tmp_path / "dest")
    assert report.ok and [(d.file, d.offset) for d in report.cut] == [("q+audit", 22)]
    with ledgerq.open(tmp_path / "dest") as q:
        assert [m.payload for m in q.peek(10)] == [b"a", b"b"]
        assert [m.payload for m in q.reader("audit").peek(10)] == [b"a"]


def test_damage_in_a_rotated_file_skips_its_rest_and_goes_on(src: Path, tmp_path: Path) -> None:
    rotated = OldJournal().addx(b"a", 1).raw(b"\x0b").addx(b"never", 2)
    rotated.write(src / "q.5")
    OldJournal().addx(b"c", 3).write(src / "q")
    report = import_kestrel(src, tmp_path / "dest")
    assert payloads(tmp_path / "dest") == [b"a", b"c"]
    assert [(d.file, d.offset) for d in report.damage] == [("q.5", rotated.offsets[1])]


def test_expired_items_are_dropped_and_counted_unless_kept(src: Path, tmp_path: Path) -> None:
    (
        OldJournal()
        .addx(b"expired", 1, PAST_MS)
        .addx(b"fresh", 2, FAR_MS)
        .addx(b"forever", 3)
        .add(b"old-starling", PAST_MS // 1000)
        .write(src / "q")
    )
    report = import_kestrel(src, tmp_path / "dropped")
    assert payloads(tmp_path / "dropped") == [b"fresh", b"forever"]
    assert (report.imported, report.expired_dropped) == (2, 2)
    kept = import_kestrel(src, tmp_path / "kept", keep_expired=True)
    assert payloads(tmp_path / "kept") == [b"expired", b"fresh", b"forever", b"old-starling"]
    assert (kept.imported, kept.expired_kept) == (4, 2)
    expired = messages(tmp_path / "kept")[0]
    assert expired.expires_at is None  # kept deliverable; the expiry stays in a header
    assert expired.headers["kestrel.expire_time"] == str(PAST_MS)
    with ledgerq.open(tmp_path / "kept") as q:
        assert q.dequeue_batch(10)[0].payload == b"expired"


def test_a_second_run_imports_nothing(src: Path, tmp_path: Path) -> None:
    OldJournal().addx(b"a", 1).addx(b"b", 2).addx(b"a", 1).write(src / "q")
    dest = tmp_path / "dest"
    first = import_kestrel(src, dest)
    second = import_kestrel(src, dest)
    assert (first.imported, second.imported, second.already_imported) == (3, 0, 3)
    assert payloads(dest) == [b"a", b"b", b"a"]


def test_a_run_killed_before_recording_its_keys_is_not_imported_twice(
    src: Path, tmp_path: Path
) -> None:
    OldJournal().addx(b"a", 1).addx(b"b", 2).write(src / "q")
    dest = tmp_path / "dest"
    import_kestrel(src, dest)
    ledger = dest / LEDGER_NAME
    lines = ledger.read_bytes().splitlines(keepends=True)
    ledger.write_bytes(lines[0] + lines[1][:5])  # the second key torn, as by a kill
    again = import_kestrel(src, dest)
    assert (again.imported, again.already_imported) == (0, 2)
    ledger.unlink()
    assert import_kestrel(src, dest).imported == 0
    assert payloads(dest) == [b"a", b"b"]


def test_consumed_messages_are_not_imported_again(src: Path, tmp_path: Path) -> None:
    OldJournal().addx(b"a" * 100, 1).addx(b"b" * 100, 2).addx(b"c" * 100, 3).write(src / "q")
    dest = tmp_path / "dest"
    import_kestrel(src, dest, segment_size=150)
    with ledgerq.open(dest) as q:
        for message in q.dequeue_batch(10):
            q.ack(message.id)
        q.compact()
    assert import_kestrel(src, dest).imported == 0


def test_a_journal_that_grew_imports_only_the_new_items(src: Path, tmp_path: Path) -> None:
    journal = OldJournal().addx(b"a", 1)
    journal.write(src / "q")
    dest = tmp_path / "dest"
    import_kestrel(src, dest)
    journal.addx(b"b", 2).write(src / "q")
    report = import_kestrel(src, dest)
    assert (report.imported, report.already_imported) == (1, 1)
    assert payloads(dest) == [b"a", b"b"]


def test_fan_out_children_become_readers(src: Path, tmp_path: Path) -> None:
    # The parent consumed a; child audit was created after a and consumed b and c;
    # child x was created before a and also got an item set on it directly.
    OldJournal().addx(b"a", 1).addx(b"b", 2).addx(b"c", 3).addx(b"d", 4).remove().write(src / "q")
    OldJournal().addx(b"b", 2).addx(b"c", 3).addx(b"d", 4).remove().remove().write(src / "q+audit")
    OldJournal().addx(b"a", 1).addx(b"b", 2).addx(b"c", 3).addx(b"d", 4).addx(b"x-only", 5).write(
        src / "q+x"
    )
    dest = tmp_path / "dest"
    report = import_kestrel(src, dest)
    assert report.queue == "q" and report.ok
    assert payloads(dest) == [b"a", b"b", b"c", b"d", b"x-only"]  # every item, once
    assert dict(report.readers).keys() == {"audit", "x"}
    with ledgerq.open(dest) as q:
        assert [m.payload for m in q.dequeue_batch(10)] == [b"b", b"c", b"d"]
        assert [m.payload for m in q.reader("audit").dequeue_batch(10)] == [b"d"]
        assert [m.payload for m in q.reader("x").dequeue_batch(10)] == [
            b"a",
            b"b",
            b"c",
            b"d",
            b"x-only",
        ]
    again = import_kestrel(src, dest)
    assert again.imported == 0
    assert all("exists" in what for _, what in again.readers)


def test_a_child_reader_sees_only_its_items_in_a_queue_that_had_messages(
    src: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    with ledgerq.open(dest) as q:
        q.enqueue(b"was there before")
    OldJournal().addx(b"a", 1).addx(b"b", 2).write(src / "q")
    OldJournal().addx(b"b", 2).write(src / "q+late")
    import_kestrel(src, dest)
    with ledgerq.open(dest) as q:
        assert [m.payload for m in q.dequeue_batch(10)] == [b"was there before", b"a", b"b"]
        assert [m.payload for m in q.reader("late").dequeue_batch(10)] == [b"b"]


def test_fan_out_children_as_separate_queues(src: Path, tmp_path: Path) -> None:
    OldJournal().addx(b"a", 1).addx(b"b", 2).remove().write(src / "q")
    OldJournal().addx(b"a", 1).addx(b"b", 2).write(src / "q+audit")
    report = import_kestrel(src, tmp_path / "dest", children_as_queues=True)
    assert payloads(tmp_path / "dest") == [b"b"]
    assert payloads(tmp_path / "dest+audit") == [b"a", b"b"]
    (child,) = report.children
    assert (child.queue, child.imported) == ("q+audit", 2)


def test_a_fanout_only_parent_has_only_readers(src: Path, tmp_path: Path) -> None:
    OldJournal().addx(b"a", 1).addx(b"b", 2).write(src / "q+one")
    OldJournal().addx(b"b", 2).write(src / "q+two")
    report = import_kestrel(src, tmp_path / "dest")
    assert report.queue == "q"
    assert any("fanoutOnly" in quirk for quirk in report.quirks)
    with ledgerq.open(tmp_path / "dest") as q:
        assert q.dequeue_batch(10) == []
        assert [m.payload for m in q.reader("one").dequeue_batch(10)] == [b"a", b"b"]
        assert [m.payload for m in q.reader("two").dequeue_batch(10)] == [b"b"]


def test_a_directory_of_several_queues_needs_a_choice(src: Path, tmp_path: Path) -> None:
    OldJournal().addx(b"one", 1).write(src / "first")
    OldJournal().addx(b"two", 2).write(src / "second")
    with pytest.raises(KestrelImportError, match="--queue"):
        import_kestrel(src, tmp_path / "dest")
    import_kestrel(src, tmp_path / "dest", queue="second")
    assert payloads(tmp_path / "dest") == [b"two"]
    with pytest.raises(KestrelImportError, match="no journal of queue 'third'"):
        import_kestrel(src, tmp_path / "other", queue="third")


def test_a_journal_file_names_its_queue(src: Path, tmp_path: Path) -> None:
    OldJournal().addx(b"one", 1).write(src / "first")
    OldJournal().addx(b"two", 2).write(src / "second")
    report = import_kestrel(src / "second", tmp_path / "dest")
    assert report.queue == "second"
    assert payloads(tmp_path / "dest") == [b"two"]


def test_a_missing_source_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KestrelImportError, match="does not exist"):
        import_kestrel(tmp_path / "nothing", tmp_path / "dest")
    assert not (tmp_path / "dest").exists()


# ---------------------------------------------------------------------- Kestrel 3


def write_v3(src: Path) -> None:
    src.joinpath("q.1700000000100").write_bytes(
        writer_file(
            [
                put_record(1, b"one", 1001),
                put_record(2, b"two", 1002, error_count=1),
                put_record(3, b"three", 1003, expire_ms=FAR_MS, error_count=2),
                put_record(4, b"four", 1004),
                put_record(5, b"five", 1005, expire_ms=PAST_MS),
            ],
            padding=512,
        )
    )
    src.joinpath("q.1700000000200").write_bytes(
        writer_file([put_record(6, b"six", 1006), put_record(7, b"seven", 1007)])
    )


def test_v3_imports_only_what_the_reader_has_not_read(src: Path, tmp_path: Path) -> None:
    write_v3(src)
    src.joinpath("q.read.").write_bytes(bookmark_file(2, [4, 7]))
    dest = tmp_path / "dest"
    report, slack = _timed_import(src, dest)
    assert report.ok and report.format == "kestrel-3" and report.reader == ""
    assert (report.found, report.read_by_reader, report.expired_dropped) == (7, 4, 1)
    got = messages(dest)
    assert [m.payload for m in got] == [b"three", b"six"]
    three, six = got
    assert strip(three.headers) == {
        "kestrel.id": "3",
        "kestrel.add_time": "1003",
        "kestrel.expire_time": str(FAR_MS),
        "kestrel.error_count": "2",
    }
    assert strip(six.headers) == {
        "kestrel.id": "6",
        "kestrel.add_time": "1006",
        "kestrel.error_count": "0",
    }
    assert three.expires_at is not None
    assert abs(three.expires_at - FAR_MS * 1_000_000) <= slack
    assert import_kestrel(src, dest).imported == 0


def test_v3_files_are_read_in_order_of_their_first_id(src: Path, tmp_path: Path) -> None:
    src.joinpath("q.500").write_bytes(writer_file([put_record(10, b"ten", 1)]))
    src.joinpath("q.900").write_bytes(writer_file([put_record(1, b"one", 1)]))
    report = import_kestrel(src, tmp_path / "dest")
    assert payloads(tmp_path / "dest") == [b"one", b"ten"]
    assert report.files == ("q.900", "q.500")
    assert any("no reader bookmark" in q for q in report.quirks)


def test_v3_readers_become_ledgerq_readers_of_the_same_name(src: Path, tmp_path: Path) -> None:
    write_v3(src)
    src.joinpath("q.read.a").write_bytes(bookmark_file(5))
    src.joinpath("q.read.b").write_bytes(bookmark_file(1, [3]))
    src.joinpath("q.read.").write_bytes(bookmark_file(7))  # libkestrel deletes it: ignored
    src.joinpath("q.read.a~~1700000000300").write_bytes(bookmark_file(0))  # a temp file
    dest = tmp_path / "dest"
    with ledgerq.open(dest) as q:
        q.enqueue(b"was there before")
    report = import_kestrel(src, dest)
    assert report.ok and report.reader is None
    # 1 and 3 were read by both; 5 expired; the rest once each, whoever has it to read.
    assert (report.found, report.read_by_reader, report.expired_dropped) == (7, 2, 1)
    assert payloads(dest) == [b"was there before", b"two", b"four", b"six", b"seven"]
    assert dict(report.readers) == {
        "a": "reader created with 2 pending messages",
        "b": "reader created with 4 pending messages",
    }
    assert {name for name, _ in report.ignored} >= {"q.read.", "q.read.a~~1700000000300"}
    with ledgerq.open(dest) as q:
        assert [m.payload for m in q.peek(10)] == [b"was there before"]
        a, b = q.reader("a"), q.reader("b")
        assert [m.payload for m in a.peek(10)] == [b"six", b"seven"]
        assert [m.payload for m in b.peek(10)] == [b"two", b"four", b"six", b"seven"]
        assert [m.headers["kestrel.id"] for m in b.peek(10)] == ["2", "4", "6", "7"]
        taken = b.dequeue()
        assert taken is not None and taken.payload == b"two"
        b.ack(taken.id)
    # A second run imports nothing and leaves the readers where they are.
    again = import_kestrel(src, dest)
    assert (again.imported, again.already_imported) == (0, 4)
    assert all(what == "reader exists already: left as it is" for _, what in again.readers)
    with ledgerq.open(dest) as q:
        assert len(payloads(dest)) == 5
        assert [m.payload for m in q.reader("b").peek(10)] == [b"four", b"six", b"seven"]
        assert [m.payload for m in q.reader("a").peek(10)] == [b"six", b"seven"]
        assert [m.payload for m in q.peek(10)] == [b"was there before"]


def test_v3_a_run_stopped_before_placing_readers_is_completed_by_the_next(
    src: Path, tmp_path: Path
) -> None:
    # A first run that enqueued every item (for the default reader) and recorded it, but
    # stopped before purging and creating readers, leaves what a run without bookmarks
    # leaves: the keys are the same.
    write_v3(src)
    dest = tmp_path / "dest"
    assert import_kestrel(src, dest).imported == 6
    src.joinpath("q.read.a").write_bytes(bookmark_file(5))
    src.joinpath("q.read.b").write_bytes(bookmark_file(0))  # b has read nothing
    again = import_kestrel(src, dest)
    assert (again.imported, again.already_imported) == (0, 6)
    assert dict(again.readers) == {
        "a": "reader created with 2 pending messages",
        "b": "reader created with 6 pending messages",
    }
    with ledgerq.open(dest) as q:
        assert q.peek(10) == []
        assert [m.payload for m in q.reader("a").peek(10)] == [b"six", b"seven"]
        assert [m.payload for m in q.reader("b").peek(10)] == [
            b"one",
            b"two",
            b"three",
            b"four",
            b"six",
            b"seven",
        ]


def test_v3_reader_choice_imports_one_reader_for_the_default_reader(
    src: Path, tmp_path: Path
) -> None:
    write_v3(src)
    src.joinpath("q.read.a").write_bytes(bookmark_file(5))
    src.joinpath("q.read.b").write_bytes(bookmark_file(1, [3]))
    with pytest.raises(KestrelImportError, match="no reader 'c'"):
        import_kestrel(src, tmp_path / "dest", reader="c")
    report = import_kestrel(src, tmp_path / "a", reader="a")
    assert (report.reader, report.readers) == ("a", ())
    assert payloads(tmp_path / "a") == [b"six", b"seven"]
    import_kestrel(src, tmp_path / "b", reader="b")
    with ledgerq.open(tmp_path / "b") as q:
        assert [m.payload for m in q.peek(10)] == [b"two", b"four", b"six", b"seven"]
        assert set(q.stats().readers) == {"default"}


def test_v3_one_named_reader_is_a_reader_of_its_name(src: Path, tmp_path: Path) -> None:
    write_v3(src)
    src.joinpath("q.read.only").write_bytes(bookmark_file(3, [6]))
    report = import_kestrel(src, tmp_path / "dest")
    assert dict(report.readers) == {"only": "reader created with 2 pending messages"}
    with ledgerq.open(tmp_path / "dest") as q:
        assert q.peek(10) == []
        assert [m.payload for m in q.reader("only").peek(10)] == [b"four", b"seven"]


def test_v3_readers_ledgerq_cannot_name_are_reported_and_skipped(src: Path, tmp_path: Path) -> None:
    write_v3(src)
    src.joinpath("q.read.ok").write_bytes(bookmark_file(6))
    src.joinpath("q.read.a:b").write_bytes(bookmark_file(0))  # ':' is fine in Kestrel 3
    src.joinpath("q.read.-x").write_bytes(bookmark_file(0))
    src.joinpath("q.read.default").write_bytes(bookmark_file(0))
    report = import_kestrel(src, tmp_path / "dest")
    readers = dict(report.readers)
    assert readers["ok"] == "reader created with 1 pending messages"
    assert readers["a:b"].startswith("not created: invalid reader name 'a:b'")
    assert readers["-x"].startswith("not created: invalid reader name '-x'")
    assert readers["default"] == "'default' is the name of ledgerq's default reader: not created"
    assert report.ok
    with ledgerq.open(tmp_path / "dest") as q:
        assert set(q.stats().readers) == {"default", "ok"}
        assert q.peek(10) == []
        assert [m.payload for m in q.reader("ok").peek(10)] == [b"seven"]


def test_v3_a_reader_that_read_everything_starts_at_the_tail(src: Path, tmp_path: Path) -> None:
    write_v3(src)
    src.joinpath("q.read.done").write_bytes(bookmark_file(7))
    src.joinpath("q.read.new").write_bytes(bookmark_file(5))
    import_kestrel(src, tmp_path / "dest")
    with ledgerq.open(tmp_path / "dest") as q:
        assert q.reader("done").peek(10) == []
        assert [m.payload for m in q.reader("new").peek(10)] == [b"six", b"seven"]
        q.enqueue(b"later")
        assert [m.payload for m in q.reader("done").peek(10)] == [b"later"]


def test_v3_truncated_writer_file_imports_the_items_before(src: Path, tmp_path: Path) -> None:
    last = put_record(3, b"cut short", 3)
    blob = writer_file([put_record(1, b"one", 1), put_record(2, b"two", 2), last])
    src.joinpath("q.1").write_bytes(blob[:-4])
    src.joinpath("q.2").write_bytes(writer_file([put_record(4, b"four", 4)]))
    report = import_kestrel(src, tmp_path / "dest")
    assert payloads(tmp_path / "dest") == [b"one", b"two", b"four"]
    assert not report.ok
    (damage,) = report.damage
    assert (damage.file, damage.offset) == ("q.1", len(blob) - len(last))


def test_v3_torn_tail_of_the_newest_writer_file_is_cut(src: Path, tmp_path: Path) -> None:
    src.joinpath("q.1").write_bytes(writer_file([put_record(1, b"one", 1)]))
    last = put_record(3, b"cut short", 3)
    blob = writer_file([put_record(2, b"two", 2), last])
    src.joinpath("q.2").write_bytes(blob[:-4])  # written without the mmap's zero padding
    report = import_kestrel(src, tmp_path / "dest")
    assert payloads(tmp_path / "dest") == [b"one", b"two"]
    assert report.ok and report.damage == ()
    (torn,) = report.cut
    assert (torn.file, torn.offset) == ("q.2", len(blob) - len(last))


def test_v3_newest_writer_file_torn_inside_its_first_record_is_cut(
    src: Path, tmp_path: Path
) -> None:
    src.joinpath("q.100").write_bytes(writer_file([put_record(1, b"one", 1)]))
    src.joinpath("q.200").write_bytes(writer_file([put_record(2, b"cut short", 2)])[:20])
    report = import_kestrel(src, tmp_path / "dest")
    assert payloads(tmp_path / "dest") == [b"one"]
    assert report.ok and [(d.file, d.offset) for d in report.cut] == [("q.200", 4)]
    # The same file, older than another: damage.
    src.joinpath("q.300").write_bytes(writer_file([put_record(3, b"three", 3)]))
    report = import_kestrel(src, tmp_path / "dest")
    assert not report.ok and [(d.file, d.offset) for d in report.damage] == [("q.200", 4)]
    assert payloads(tmp_path / "dest") == [b"one", b"three"]


def test_v3_a_bad_record_in_the_newest_writer_file_is_damage(src: Path, tmp_path: Path) -> None:
    bad = put_record(0, b"id zero", 2)
    src.joinpath("q.1").write_bytes(writer_file([put_record(1, b"one", 1), bad]))
    report = import_kestrel(src, tmp_path / "dest")
    assert payloads(tmp_path / "dest") == [b"one"]
    assert not report.ok and report.cut == ()
    assert "id 0" in report.damage[0].message


def test_v3_a_torn_bookmark_is_damage(src: Path, tmp_path: Path) -> None:
    write_v3(src)
    src.joinpath("q.read.").write_bytes(bookmark_file(2, [4])[:-3])
    report = import_kestrel(src, tmp_path / "dest")
    assert not report.ok and report.cut == ()
    assert report.damage[0].file == "q.read."
    assert payloads(tmp_path / "dest") == [b"three", b"four", b"six", b"seven"]


def test_v3_empty_and_header_only_files_are_skipped(src: Path, tmp_path: Path) -> None:
    src.joinpath("q.1").write_bytes(b"")  # libkestrel issue #4
    src.joinpath("q.2").write_bytes(writer_file([], padding=64))
    src.joinpath("q.3").write_bytes(writer_file([put_record(1, b"one", 1)]))
    src.joinpath("q.read.").write_bytes(bookmark_file(0))
    report = import_kestrel(src, tmp_path / "dest")
    assert payloads(tmp_path / "dest") == [b"one"]
    ignored = dict(report.ignored)
    assert "zero-byte" in ignored["q.1"] and "header only" in ignored["q.2"]
    assert report.ok


def test_v3_reader_option_on_an_old_journal_is_an_error(src: Path, tmp_path: Path) -> None:
    OldJournal().addx(b"a", 1).write(src / "q")
    with pytest.raises(KestrelImportError, match="no readers"):
        import_kestrel(src, tmp_path / "dest", reader="x")


def test_report_is_a_frozen_value(src: Path, tmp_path: Path) -> None:
    OldJournal().addx(b"a", 1).write(src / "q")
    report = import_kestrel(src, tmp_path / "dest")
    assert isinstance(report, ImportReport)
    with pytest.raises(AttributeError):
        report.imported = 5  # type: ignore[misc]
    assert os.path.isfile(tmp_path / "dest" / LEDGER_NAME)
