"""``enqueue_batch`` of bytes with a few ``Item`` among them: the plain path's runs.

Such a batch keeps the plain batch's encoding for its bytes (``_plain_runs`` /
``_write_runs``) and encodes each Item as the checked way does, in one append.  It
must write exactly what the checked way writes: compared here with the same batch
given ``timeout=None`` (which always takes the checked way), entry by entry, with a
clock the test holds still.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ledgerq
from ledgerq import Item, Priority
from ledgerq.format.entry import Entry, EntryFlags, decode_entry
from tests.clocks import SteppedClock

KEY = bytes(range(32))
Batch = list[Any]

LAYOUTS: dict[str, Callable[[], Batch]] = {
    "one item last": lambda: [b"p%d" % i for i in range(20)] + [Item(b"m", headers={"k": "v"})],
    "one item first": lambda: [Item(b"m", headers={"k": "v"})] + [b"p%d" % i for i in range(20)],
    "items between runs": lambda: [
        b"a",
        b"b",
        Item(b"h", headers={"x": "1"}),
        b"c",
        Item(b"p", priority=Priority.HIGH),
        Item(b"t", ttl=60.0, group="g"),
        b"d",
        Item(b"late", delay=30.0),
        Item(b"dedup-id without a dedup window", dedup_id="d-1"),
        b"e" * 2000,  # over the size the plain encoder copies behind its header
        b"f",
        Item(b"last", headers={"y": "2"}),
    ],
    "plain runs last": lambda: [Item(b"m", headers={"k": "v"}), b"a", b"e" * 2000],
    "a one-payload run": lambda: [b"a", Item(b"m", headers={"k": "v"})],
}


def _entries(path: Path) -> list[Entry]:
    found: list[Entry] = []
    for log in sorted((path / "segments").glob("*.log")):
        buf = log.read_bytes()
        pos = 0
        while pos < len(buf):
            entry, pos = decode_entry(buf, pos)
            found.append(entry)
    return found


def _messages(q: ledgerq.Queue) -> list[tuple[Any, ...]]:
    return [
        (m.id, m.payload, m.headers, m.priority, m.expires_at, m.group)
        for m in q.reader("check").peek(100)
    ]


def _write(path: Path, batch: Batch, timeout: float | None, **options: Any) -> list[int]:
    with ledgerq.open(path, clock=SteppedClock(), **options) as q:
        q.enqueue(b"before")
        ids = q.enqueue_batch(batch, timeout=timeout)
        q.enqueue(b"after")
        q._check()
    return ids


@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_mixed_batch_writes_what_the_checked_way_writes(
    tmp_path: Path, layout: str, shared: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = []
    original = ledgerq.Queue._write_runs
    monkeypatch.setattr(
        ledgerq.Queue,
        "_write_runs",
        lambda self, *args: runs.append(args) or original(self, *args),
    )
    ids = _write(tmp_path / "runs", LAYOUTS[layout](), 0, shared=shared)
    assert len(runs) == 1, "the batch took the plain path's runs"
    checked_ids = _write(tmp_path / "checked", LAYOUTS[layout](), None, shared=shared)
    assert len(runs) == 1, "timeout=None took the checked way"
    assert ids == checked_ids == list(range(2, 2 + len(ids)))
    written = _entries(tmp_path / "runs")
    assert written == _entries(tmp_path / "checked")
    continues = [bool(e.flags & EntryFlags.BATCH_CONTINUES) for e in written]
    assert continues == [False] + [True] * (len(ids) - 1) + [False, False]
    with ledgerq.open(tmp_path / "runs") as q, ledgerq.open(tmp_path / "checked") as c:
        assert _messages(q) == _messages(c)
        assert len(q) == len(c) == len(ids) + 2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_mixed_batch_in_an_encrypted_queue(tmp_path: Path, layout: str) -> None:
    ids = _write(tmp_path / "runs", LAYOUTS[layout](), 0, encryption_key=KEY)
    assert ids == _write(tmp_path / "checked", LAYOUTS[layout](), None, encryption_key=KEY)

    def visible(path: Path) -> list[tuple[Any, ...]]:  # all but the sealed payload
        return [(*e[:5], e.flags, *e[7:]) for e in _entries(path)]

    assert visible(tmp_path / "runs") == visible(tmp_path / "checked")
    assert all(e.flags & EntryFlags.ENCRYPTED for e in _entries(tmp_path / "runs"))
    with (
        ledgerq.open(tmp_path / "runs", encryption_key=KEY) as q,
        ledgerq.open(tmp_path / "checked", encryption_key=KEY) as c,
    ):
        assert _messages(q) == _messages(c)
        assert len(q) == len(ids) + 2


def test_a_mixed_batch_is_one_append_all_or_nothing(tmp_path: Path) -> None:
    """A cut inside the batch's last entry takes the whole batch at the reopen."""
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue(b"before")
        q.enqueue_batch([b"a", Item(b"h", headers={"k": "v"}), b"b", b"c"])
    (log,) = (path / "segments").glob("*.log")
    log.write_bytes(log.read_bytes()[:-1])
    with ledgerq.open(path) as q:
        assert [m.payload for m in q.reader("check").peek(10)] == [b"before"]
        assert q.enqueue(b"next") >= 2
        q._check()


def test_a_mixed_batch_checks_every_message_before_writing(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q", max_message_size=64) as q:
        with pytest.raises(TypeError, match="header"):
            q.enqueue_batch([b"a", Item(b"h", headers={"k": 1}), b"b"])  # type: ignore[dict-item]
        with pytest.raises(ledgerq.MessageTooLargeError):
            q.enqueue_batch([b"a", Item(b"h", headers={"k": "v"}), b"x" * 65])
        with pytest.raises(ledgerq.MessageTooLargeError):
            q.enqueue_batch([b"a", Item(b"x" * 65, headers={"k": "v"}), b"b"])
        with pytest.raises(ValueError):
            q.enqueue_batch([b"a", Item(b"h", priority=7)])
        assert len(q) == 0
        assert q.stats().next_id == 1
        q._check()


def test_a_mixed_batch_with_dedup_drops_duplicates(tmp_path: Path) -> None:
    """A dedup window takes a batch the checked way: a duplicate Item adds nothing."""
    with ledgerq.open(tmp_path / "q", dedup_window=60.0) as q:
        first = q.enqueue_batch([b"a", b"b", Item(b"m", dedup_id="d")])
        assert first == [1, 2, 3]
        again = q.enqueue_batch([b"c", b"d", Item(b"m again", dedup_id="d")])
        assert again == [4, 5, 3]
        assert q.stats().duplicates == 1
        assert [m.payload for m in q.reader("check").peek(10)] == [b"a", b"b", b"m", b"c", b"d"]
        q._check()


def test_a_mixed_batch_with_a_unique_key_is_admitted(tmp_path: Path) -> None:
    """An Item with a unique_key takes the checked way: a held key adds nothing."""
    with ledgerq.open(tmp_path / "q") as q:
        assert q.enqueue_batch([b"a", Item(b"job", unique_key="k")]) == [1, 2]
        assert q.enqueue_batch([b"b", Item(b"job again", unique_key="k")]) == [3, 2]
        assert [m.payload for m in q.reader("check").peek(10)] == [b"a", b"job", b"b"]
        q._check()
