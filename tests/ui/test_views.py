"""What the pages list: next messages, one message, pages of dead letters, previews."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import ledgerq
from ledgerq import tools
from ledgerq.segment.readonly import JournalTail
from ledgerq.ui import _browse
from ledgerq.ui._figures import QueueFiles
from ledgerq.ui._preview import HEX_BYTES, PREVIEW_BYTES, preview, short
from ledgerq.ui._schedule import ScheduleTail
from tests._child import child_environment


def _dead_letters(path: Path, reasons: list[str]) -> QueueFiles:
    """A queue whose DLQ holds one message per reason (DLQ ids 1..n); its DLQ's files."""
    with ledgerq.open(path, max_retries=1) as q:
        q.enqueue_batch(
            [ledgerq.Item(b"p%d" % i, headers={"n": str(i)}) for i in range(len(reasons))]
        )
        for reason in reasons:
            m = q.dequeue()
            assert m is not None
            q.nack(m.id, reason)
    dlq = QueueFiles(str(path)).dlq()
    assert dlq is not None
    return dlq


def test_next_messages_skip_finished_and_leased_ones(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue_batch([b"%d" % i for i in range(1, 11)])
        batch = q.dequeue_batch(4)  # 1-4 leased
        q.ack(batch[1].id)  # 2 finished out of order
        files = QueueFiles(str(path))
        views = _browse.next_messages(files, 3)
        assert [v.id for v in views] == [5, 6, 7]
        assert {v.status for v in views} == {"pending"}
        assert [v.id for v in _browse.in_flight_messages(files, 10)] == [1, 3, 4]
        one = _browse.find_message(files, 3)
        assert one is not None and (one.status, one.attempts) == ("in flight", 1)
        done = _browse.find_message(files, 2)
        assert done is not None and done.status == "finished"
        assert _browse.find_message(files, 11) is None  # not written yet
        assert _browse.find_message(files, 0) is None
        assert [r[:2] for r in _browse.reader_statuses(files, 3)] == [("default", "in flight")]


def test_dead_letter_pages_follow_on_and_never_read_everything(tmp_path: Path) -> None:
    reasons = ["timeout" if i % 4 == 0 else "bad input" for i in range(40)]
    dlq = _dead_letters(tmp_path / "q", reasons)
    every = tools.DeadLetterFilter()
    first = _browse.dead_letter_page(dlq, every, limit=15)
    assert [m.id for m in first.messages] == list(range(1, 16))
    assert first.next_after == 15 and not first.budget_spent
    last = _browse.dead_letter_page(dlq, every, after=30, limit=15)
    assert [m.id for m in last.messages] == list(range(31, 41)) and last.next_after is None

    timeouts = tools.DeadLetterFilter(reason="time")
    page = _browse.dead_letter_page(dlq, timeouts, limit=4)
    assert [m.id for m in page.messages] == [1, 5, 9, 13] and page.next_after == 13
    # A budget of 6 entries read: the page stops early and says where it got to.
    short_budget = _browse.dead_letter_page(dlq, timeouts, limit=4, budget=6)
    assert [m.id for m in short_budget.messages] == [1, 5]
    assert short_budget.budget_spent and short_budget.next_after == 6
    rest = _browse.dead_letter_page(dlq, timeouts, after=6, limit=4, budget=6)
    assert [m.id for m in rest.messages] == [9]
    assert _browse.matching_dead_letters(dlq, timeouts) == list(range(1, 41, 4))


def test_requeued_and_purged_dead_letters_are_no_longer_listed(tmp_path: Path) -> None:
    path = tmp_path / "q"
    dlq = _dead_letters(path, ["a", "b", "c", "d"])
    with ledgerq.open(path) as q:
        assert q.requeue_dlq([2]) == 1
        assert q.dlq.purge([4]) == 1
    assert _browse.matching_dead_letters(dlq, tools.DeadLetterFilter()) == [1, 3]
    assert QueueFiles(str(path)).figures().dlq == 2


def test_previews_choose_json_text_or_hex_and_truncate() -> None:
    value = {"user": "ada", "items": [1, 2]}
    shown = preview(json.dumps(value).encode())
    assert shown.kind == "json" and json.loads(shown.text) == value and not shown.truncated
    assert preview(b"plain words").kind == "text"
    assert preview(b"\x00\x01\x02\xff\xfe").kind == "hex"
    assert preview(b"not json", "json").kind == "text"  # asked for JSON, shown as text
    assert preview(b"{}", "hex").text.startswith("00000000  7b 7d")
    big = preview(b"a" * (PREVIEW_BYTES * 3))
    assert big.truncated and big.shown_bytes == PREVIEW_BYTES and len(big.text) == PREVIEW_BYTES
    assert preview(bytes(HEX_BYTES * 2)).shown_bytes == HEX_BYTES
    # A multi-byte character cut by the limit is dropped, not shown as garbage.
    cut = preview("é".encode() * PREVIEW_BYTES)
    assert cut.kind == "text" and cut.text == "é" * (PREVIEW_BYTES // 2)
    # Terminal escapes and bidirectional overrides are shown, not obeyed.
    assert preview("a\u202eb\x1b[31m".encode()).text == "a\\u202eb\\x1b[31m"
    assert short(b"x" * 500).endswith("…") and len(short(b"x" * 500)) == 80
    assert short(b"two\n  lines") == "two lines"


def test_a_message_shows_its_group_and_when_it_may_be_delivered(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue(b"a", group="customer-7")
        q.enqueue(b"b", delay=3600.0)
        later = time.time_ns()
    files = QueueFiles(str(path))
    grouped = _browse.find_message(files, 1)
    delayed = _browse.find_message(files, 2)
    assert grouped is not None and (grouped.group, grouped.not_before) == ("customer-7", None)
    assert delayed is not None and delayed.group is None
    assert delayed.not_before is not None
    assert later + 3500 * 10**9 < delayed.not_before < later + 3700 * 10**9
    assert [v.group for v in _browse.next_messages(files, 5)] == ["customer-7", None]


def test_a_listing_reads_the_journals_and_the_delays_once_not_per_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next messages of a queue with delayed ones (issue 25: each message's
    not-before time re-read the journals and walked every delayed message, so 500
    messages of a queue with 50,000 delayed took 5 s)."""
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue_batch(
            [ledgerq.Item(b"%d" % i, delay=3600.0 if i % 2 else None) for i in range(400)]
        )
        q.reader("audit")  # a second reader: its journal is read too
        retried = q.dequeue()
        assert retried is not None
        q.nack(retried.id, "later", delay=3600.0)
    files = QueueFiles(str(path))
    files.figures()
    reads = {"journal": 0, "schedule": 0}

    def counting(kind: str, method: Any) -> Any:
        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            reads[kind] += 1
            return method(self, *args, **kwargs)

        return counted

    monkeypatch.setattr(JournalTail, "read", counting("journal", JournalTail.read))
    monkeypatch.setattr(ScheduleTail, "refresh", counting("schedule", ScheduleTail.refresh))
    per_listing = []
    for limit in (5, 300):
        reads.update(journal=0, schedule=0)
        views = _browse.next_messages(files, limit)
        assert len(views) == limit
        per_listing.append(dict(reads))
    assert per_listing[0] == per_listing[1]  # the same for 5 messages as for 300
    # One look at the new entries; each journal looked at twice at most (the reader
    # snapshot, then the delays of every reader).
    assert per_listing[1]["schedule"] == 1 and per_listing[1]["journal"] <= 4
    # And what it found is right: the retry delay, the entries' delays, none for the rest.
    views = {v.id: v for v in _browse.next_messages(files, 300)}
    assert views[retried.id].not_before is not None
    assert views[retried.id].not_before > time.time_ns() + 3500 * 10**9
    assert all((v.not_before is not None) == (v.id % 2 == 0) for v in views.values() if v.id > 1)


def test_attempts_count_as_ledgerq_peek_counts_them(tmp_path: Path) -> None:
    """A message never delivered is on attempt 1, as ``ledgerq peek`` says (issue 25:
    the console said 0); one nacked once, 2; one in flight, the delivery under way."""
    path = tmp_path / "q"
    with ledgerq.open(path, max_retries=5) as q:
        q.enqueue_batch([b"a", b"b", b"c", b"d"])
        first = q.dequeue()
        assert first is not None
        q.nack(first.id, "once")
        again = q.dequeue()  # the nacked one, on its second delivery
        assert again is not None and again.id == first.id and again.attempts == 2
        q.nack(again.id, "twice")
        q.dequeue()  # 1 again, on its third: in flight from here on
        files = QueueFiles(str(path))
        flying = _browse.find_message(files, first.id)
        assert flying is not None and (flying.status, flying.attempts) == ("in flight", 3)
        assert _browse.reader_statuses(files, first.id) == [("default", "in flight", 3)]
    peeked = subprocess.run(
        [sys.executable, "-m", "ledgerq.cli", "peek", str(path), "--json"],
        capture_output=True,
        text=True,
        check=True,
        env=child_environment(),
    )
    said = {m["id"]: m["attempts"] for m in map(json.loads, peeked.stdout.splitlines())}
    assert said == {1: 4, 2: 1, 3: 1, 4: 1}  # 1 came back with the close: a failed delivery
    files = QueueFiles(str(path))
    shown = {v.id: v.attempts for v in _browse.next_messages(files, 10)}
    assert shown == said
