"""Kestrel 1.x/2.x journals: record layouts, every opcode, replay semantics, file order."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerq.kestrel import oldjournal
from ledgerq.kestrel.oldjournal import (
    BadRecord,
    Opcode,
    Replay,
    TruncatedRecord,
    decode_record,
    iter_records,
    order_journal_files,
)
from tests.kestrel._writer import OldJournal


def replay(*journals: OldJournal) -> Replay:
    """Replay journals as consecutive files of queue q."""
    r = Replay("q")
    for i, journal in enumerate(journals):
        r.replay_bytes(journal.bytes(), f"q.{i}")
    return r


def pending(r: Replay) -> list[tuple[bytes, int | None]]:
    return [(item.data, item.xid) for item in r.pending()]


# ---------------------------------------------------------------------- records


def test_record_sizes_are_the_reference_sizes() -> None:
    assert len(OldJournal().addx(b"", 1).bytes()) == 21
    assert len(OldJournal().addx(b"x" * 8192, 1).bytes()) == 8213
    assert len(OldJournal().remove().bytes()) == 1
    assert len(OldJournal().remove_tentative().bytes()) == 1
    for record in (
        OldJournal().save_xid(1),
        OldJournal().unremove(1),
        OldJournal().confirm_remove(1),
        OldJournal().remove_tentative_xid(1),
    ):
        assert len(record.bytes()) == 5


def test_every_opcode_decodes_with_its_fields() -> None:
    journal = (
        OldJournal()
        .add(b"a", 100)
        .remove()
        .addx(b"bb", 5, 6)
        .remove_tentative()
        .save_xid(7)
        .unremove(8)
        .confirm_remove(9)
        .add_xid(10, b"c", 11, 12)
        .continue_(13, b"d", 14, 0)
        .remove_tentative_xid(-15)
    )
    records = list(iter_records(journal.bytes()))
    assert [r.op for r in records] == list(Opcode)
    assert [r.offset for r in records] == journal.offsets
    add, _, addx, _, save, unremove, confirm, add_xid, cont, rtx = records
    assert (add.data, add.add_ms, add.expiry_ms) == (b"a", None, 100_000)
    assert (addx.data, addx.add_ms, addx.expiry_ms) == (b"bb", 5, 6)
    assert (save.xid, unremove.xid, confirm.xid, rtx.xid) == (7, 8, 9, -15)
    assert (add_xid.xid, add_xid.data, add_xid.add_ms, add_xid.expiry_ms) == (10, b"c", 11, 12)
    assert (cont.xid, cont.data, cont.add_ms, cont.expiry_ms) == (13, b"d", 14, None)


@pytest.mark.parametrize(
    "journal",
    [
        OldJournal().add(b"payload", 5),
        OldJournal().addx(b"payload", 1, 2),
        OldJournal().add_xid(3, b"payload", 1, 2),
        OldJournal().continue_(3, b"payload", 1, 2),
        OldJournal().save_xid(1),
        OldJournal().remove_tentative_xid(9),
    ],
    ids=["add", "addx", "add_xid", "continue", "save_xid", "remove_tentative_xid"],
)
def test_a_record_cut_anywhere_is_truncated(journal: OldJournal) -> None:
    blob = journal.bytes()
    assert decode_record(blob, 0).size == len(blob)
    for cut in range(1, len(blob)):
        with pytest.raises(TruncatedRecord):
            decode_record(blob[:cut], 0)


@pytest.mark.parametrize(
    "blob",
    [
        bytes([10]),  # no such opcode
        bytes([255]),
        b"\x00" + (3).to_bytes(4, "little") + b"xyz",  # ADD size below 4
        b"\x02" + (15).to_bytes(4, "little") + b"\x00" * 15,  # ADDX size below 16
        b"\x02" + (-1).to_bytes(4, "little", signed=True),  # negative size
        b"\x07" + (1).to_bytes(4, "little") + (8).to_bytes(4, "little") + b"\x00" * 8,
    ],
)
def test_impossible_records_are_bad(blob: bytes) -> None:
    with pytest.raises(BadRecord):
        decode_record(blob, 0)


# ---------------------------------------------------------------------- replay


def test_adds_and_removes_are_fifo() -> None:
    r = replay(OldJournal().addx(b"a", 1).addx(b"b", 2).remove().addx(b"c", 3))
    assert pending(r) == [(b"b", None), (b"c", None)]


def test_tentative_removes_confirm_and_unremove() -> None:
    journal = (
        OldJournal()
        .addx(b"a", 1)
        .addx(b"b", 2)
        .addx(b"c", 3)
        .remove_tentative_xid(1)  # a
        .remove_tentative_xid(2)  # b
        .confirm_remove(1)
    )
    assert pending(replay(journal)) == [(b"b", 2), (b"c", None)]
    journal.unremove(2)
    assert pending(replay(journal)) == [(b"b", None), (b"c", None)]


def test_open_transactions_come_back_at_the_head_in_ascending_xid_order() -> None:
    journal = (
        OldJournal()
        .addx(b"a", 1)
        .addx(b"b", 2)
        .addx(b"c", 3)
        .addx(b"d", 4)
        .remove_tentative_xid(5)  # a
        .remove_tentative_xid(3)  # b
        .remove_tentative_xid(9)  # c
    )
    assert pending(replay(journal)) == [(b"b", 3), (b"a", 5), (b"c", 9), (b"d", None)]


def test_implied_xids_count_up_from_the_saved_xid_skipping_open_ones_and_zero() -> None:
    journal = (
        OldJournal()
        .save_xid(10)
        .addx(b"a", 1)
        .addx(b"b", 2)
        .addx(b"c", 3)
        .remove_tentative()  # a: 11
        .remove_tentative()  # b: 12
        .confirm_remove(11)
    )
    assert pending(replay(journal)) == [(b"b", 12), (b"c", None)]
    skipping = (
        OldJournal()
        .addx(b"a", 1)
        .addx(b"b", 2)
        .addx(b"c", 3)
        .remove_tentative_xid(2)  # a: 2, counter = 2
        .save_xid(1)
        .remove_tentative()  # b: 2 is open, so 3
        .save_xid(-1)
        .remove_tentative()  # c: 0 is never handed out, so 1
    )
    assert pending(replay(skipping)) == [(b"c", 1), (b"a", 2), (b"b", 3)]


def test_a_rolled_1x_journal_keeps_the_named_xids_of_add_xid() -> None:
    # Kestrel 1.x's roll: ADD_XID + REMOVE_TENTATIVE per open transaction, SAVE_XID, items.
    # The reference semantics keep the named xids, so a later CONFIRM_REMOVE(3) confirms
    # the item opened as 3 (1.x itself renumbered them 1..n and confirmed the wrong one).
    journal = (
        OldJournal()
        .roll_1x([(7, b"seven", 1), (3, b"three", 2)], saved_xid=7)
        .addx(b"queued", 3)
        .confirm_remove(3)
        .remove_tentative()  # queued: next xid after 7 is 8
    )
    r = replay(journal)
    assert pending(r) == [(b"seven", 7), (b"queued", 8)]
    assert r.quirks[oldjournal.Q_NAMED_XID] == 2


def test_a_2x_rewrite_reopens_transactions_with_their_xids() -> None:
    # Kestrel 2.x rewrite: ADDX + REMOVE_TENTATIVE_XID pairs, highest xid first, then ADDX.
    journal = (
        OldJournal()
        .addx(b"nine", 1)
        .remove_tentative_xid(9)
        .addx(b"four", 2)
        .remove_tentative_xid(4)
        .addx(b"queued", 3)
    )
    assert pending(replay(journal)) == [(b"four", 4), (b"nine", 9), (b"queued", None)]


def test_continue_confirms_its_xid_and_appends_an_item() -> None:
    journal = OldJournal().addx(b"a", 1).remove_tentative_xid(1).continue_(1, b"b", 2)
    r = replay(journal)
    assert pending(r) == [(b"b", None)]
    assert not r.open


def test_pent_up_deletes_of_a_read_behind_pack_consume_dummy_items() -> None:
    journal = OldJournal().addx(b"", 0).addx(b"", 0).addx(b"real", 1).remove().remove()
    assert pending(replay(journal)) == [(b"real", None)]


def test_starling_add_has_an_expiry_in_seconds_and_no_add_time() -> None:
    r = replay(OldJournal().add(b"old", 2_000_000_000))
    (item,) = r.pending()
    assert (item.data, item.add_time_ms, item.expire_time_ms) == (b"old", None, 2_000_000_000_000)
    assert r.quirks[oldjournal.Q_STARLING_ADD] == 1


def test_oddities_are_replayed_as_kestrel_does_and_reported() -> None:
    journal = (
        OldJournal()
        .remove()  # empty queue
        .remove_tentative()  # empty queue
        .unremove(4)  # not open
        .confirm_remove(4)  # not open
        .continue_(4, b"x", 1)  # not open: the item is added anyway
        .addx(b"y", 2)
        .remove_tentative_xid(2)  # x
        .remove_tentative_xid(2)  # y, with an xid that is open: x is lost, as in Kestrel
        .add_xid(8, b"z", 3)
        .addx(b"w", 4)  # ADD_XID not followed by REMOVE_TENTATIVE
    )
    r = replay(journal)
    assert pending(r) == [(b"y", 2), (b"z", None), (b"w", None)]
    for kind in (
        oldjournal.Q_REMOVE_EMPTY,
        oldjournal.Q_TENTATIVE_EMPTY,
        oldjournal.Q_UNREMOVE_UNKNOWN,
        oldjournal.Q_CONFIRM_UNKNOWN,
        oldjournal.Q_CONTINUE_UNKNOWN,
        oldjournal.Q_XID_REUSED,
        oldjournal.Q_ADD_XID_UNUSED,
    ):
        assert r.quirks[kind] == 1, kind
    assert any(oldjournal.Q_XID_REUSED in line for line in r.quirk_lines())


def test_several_open_opcode_3_transactions_are_reported() -> None:
    journal = OldJournal().addx(b"a", 1).addx(b"b", 2).remove_tentative().remove_tentative()
    r = replay(journal)
    assert pending(r) == [(b"a", 1), (b"b", 2)]
    assert r.quirks[oldjournal.Q_IMPLIED_OPEN] == 2


def test_damage_ends_the_file_and_replay_goes_on_with_the_next() -> None:
    first = OldJournal().addx(b"a", 1).raw(b"\x0c").addx(b"never", 2)
    second = OldJournal().addx(b"b", 3)
    r = replay(first, second)
    assert pending(r) == [(b"a", None), (b"b", None)]
    (damage,) = r.damage
    assert (damage.file, damage.offset) == ("q.0", first.offsets[1])
    assert "invalid opcode 12" in damage.message


def test_files_are_replayed_as_one_stream() -> None:
    journal = (
        OldJournal()
        .addx(b"a", 1)
        .addx(b"b", 2)
        .remove_tentative()
        .addx(b"c", 3)
        .unremove(1)
        .remove()
    )
    whole = pending(replay(journal))
    blob = journal.bytes()
    for cut in journal.offsets[1:]:
        head, tail = OldJournal(), OldJournal()
        head.raw(blob[:cut])
        tail.raw(blob[cut:])
        assert pending(replay(head, tail)) == whole


# ---------------------------------------------------------------------- model check


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_replay_matches_a_model_of_the_queue(data: st.DataObject) -> None:
    journal = OldJournal()
    queue: deque[bytes] = deque()
    open_items: dict[int, bytes] = {}
    counter = 0
    for step in range(data.draw(st.integers(0, 40))):
        choices = ["addx", "save_xid"]
        if queue:
            choices += ["remove", "remove_tentative", "remove_tentative_xid"]
        if open_items:
            choices += ["confirm", "unremove", "continue"]
        op = data.draw(st.sampled_from(choices))
        payload = f"item-{step}".encode()
        if op == "addx":
            journal.addx(payload, step)
            queue.append(payload)
        elif op == "save_xid":
            counter = data.draw(st.integers(0, 20))
            journal.save_xid(counter)
        elif op == "remove":
            journal.remove()
            queue.popleft()
        elif op == "remove_tentative":
            journal.remove_tentative()
            while True:
                counter += 1
                if counter != 0 and counter not in open_items:
                    break
            open_items[counter] = queue.popleft()
        elif op == "remove_tentative_xid":
            xid = data.draw(st.integers(1, 30).filter(lambda x: x not in open_items))
            journal.remove_tentative_xid(xid)
            counter = xid
            open_items[xid] = queue.popleft()
        else:
            xid = data.draw(st.sampled_from(sorted(open_items)))
            item = open_items.pop(xid)
            if op == "confirm":
                journal.confirm_remove(xid)
            elif op == "unremove":
                journal.unremove(xid)
                queue.appendleft(item)
            else:
                journal.continue_(xid, payload, step)
                queue.append(payload)
    # Split the stream into rotated files at record boundaries: one stream all the same.
    blob = journal.bytes()
    cuts = sorted(set(data.draw(st.lists(st.sampled_from([0, *journal.offsets]), max_size=3))))
    parts = [blob[a:b] for a, b in zip([0, *cuts], [*cuts, len(blob)], strict=True)]
    r = Replay("q")
    for i, part in enumerate(parts):
        r.replay_bytes(part, f"q.{i}")
    expected = [(open_items[x], x) for x in sorted(open_items)] + [(p, None) for p in queue]
    assert pending(r) == expected
    assert not r.damage


# ---------------------------------------------------------------------- file order


def test_rotated_files_go_by_numeric_timestamp_and_the_current_file_last() -> None:
    files = order_journal_files("q", ["q", "q.1000", "q.900", "q.20"])
    assert files.order == ("q.20", "q.900", "q.1000", "q")


def test_a_pack_file_supersedes_older_rotations() -> None:
    files = order_journal_files("q", ["q.904", "q.950", "q.951", "q.950.pack", "q"])
    assert files.order == ("q.950.pack", "q.951", "q")
    assert {name for name, _ in files.ignored} == {"q.904", "q.950"}


def test_a_later_pack_supersedes_an_earlier_one() -> None:
    names = ["q.100", "q.200.pack", "q.300", "q.400.pack", "q.500"]
    files = order_journal_files("q", names)
    assert files.order == ("q.400.pack", "q.500")
    assert {name for name, _ in files.ignored} == {"q.100", "q.200.pack", "q.300"}


def test_temporary_and_foreign_files_are_not_replayed() -> None:
    names = ["q", "q~~1234", "q.5~~9", "q+child", "q+child.7", "qq", "q.notanumber", "other.5"]
    files = order_journal_files("q", names)
    assert files.order == ("q",)
    ignored = dict(files.ignored)
    assert set(ignored) == {"q~~1234", "q.5~~9", "q.notanumber"}
    assert "temporary" in ignored["q~~1234"]
