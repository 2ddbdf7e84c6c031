"""Damage at the tail of the newest segment: a torn last entry, and bytes appended to it.

A *clean* snapshot is the directory after ``close()``; a *crashed* one is a copy taken
while the queue was open, with every write in the OS but no close - exactly what kill -9
or a power cut after the data reached the disk leaves behind.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

import ledgerq
from tests.drain import drain

from ._harness import entry_spans, segment_logs, truncate
from ._payload import make_message, matches

SEGMENT_SIZE = 1024
LAST_PAYLOAD = b"the last message, torn"
AFTER_PAYLOAD = b"enqueued after recovery"


@dataclass
class Built:
    snapshot: Path  # the queue directory to copy for each case
    expected: dict[int, int]  # id -> token of every message before the last one
    last_id: int
    log_name: str  # file name of the newest segment (it holds the last entry)
    last_start: int  # offset of the last entry in it
    last_stop: int  # its end (the file's size)


def build(tmp_path: Path, *, alone: bool, crashed: bool) -> Built:
    """A queue of several segments whose newest one ends with a rich last entry.

    ``alone``: the last entry is the only one in the newest segment.
    """
    src = tmp_path / "src"
    snapshot = tmp_path / "snapshot"
    expected: dict[int, int] = {}
    q = ledgerq.open(src, segment_size=SEGMENT_SIZE, sync="never")
    try:
        token = 0

        def add() -> None:
            nonlocal token
            payload, headers = make_message(token)
            expected[q.enqueue(payload, headers=headers)] = token
            token += 1

        while True:  # until a rotation has just left the newest segment empty
            add()
            logs = segment_logs(src)
            if len(logs) >= 3 and logs[-1].stat().st_size == 0:
                break
        if not alone:
            for _ in range(3):
                add()
        last_id = q.enqueue(
            LAST_PAYLOAD, headers={"h": "v"}, priority=ledgerq.Priority.HIGH, ttl=3600
        )
        if crashed:
            shutil.copytree(src, snapshot)
    finally:
        q.close()
    if not crashed:
        shutil.copytree(src, snapshot)
    newest = segment_logs(snapshot)[-1]
    spans = entry_spans(newest.read_bytes())
    assert spans[-1][2] == last_id, "the last entry must be in the newest segment"
    assert len(spans) == (1 if alone else 4)
    return Built(snapshot, expected, last_id, newest.name, spans[-1][0], spans[-1][1])


def check_recovered(case: Path, built: Built, *, last_kept: bool, what: str) -> None:
    """Reopen ``case``: everything before the damage intact, the tail repaired, ids new."""
    log = case / "segments" / built.log_name
    with ledgerq.open(case, segment_size=SEGMENT_SIZE) as q:
        want_size = built.last_stop if last_kept else built.last_start
        if log.exists():  # an emptied newest segment may be dropped
            assert log.stat().st_size == want_size, f"{what}: tail not cut back"
        got = drain(q)
        ids = [m.id for m in got]
        expected_ids = sorted(built.expected) + ([built.last_id] if last_kept else [])
        assert ids == expected_ids, f"{what}: got {ids[-5:]}, expected {expected_ids[-5:]}"
        for msg in got[: len(built.expected)]:
            assert matches(msg, built.expected[msg.id]), f"{what}: message {msg.id} damaged"
        if last_kept:
            last = got[-1]
            assert last.payload == LAST_PAYLOAD
            assert last.headers == {"h": "v"}
            assert last.priority == ledgerq.Priority.HIGH
            assert last.expires_at == last.timestamp + 3600 * 10**9  # ttl=3600, kept exactly
        new_id = q.enqueue(AFTER_PAYLOAD)
        assert new_id > built.last_id, f"{what}: id {new_id} reused (last was {built.last_id})"
    with ledgerq.open(case, segment_size=SEGMENT_SIZE) as q:
        after = drain(q)
        assert [(m.id, m.payload) for m in after] == [(new_id, AFTER_PAYLOAD)], what
        assert q.stats().corrupt_skipped == 0, what


@pytest.mark.parametrize("crashed", [False, True], ids=["clean", "crashed"])
@pytest.mark.parametrize("alone", [False, True], ids=["after-others", "alone"])
def test_torn_last_entry_at_every_offset(tmp_path: Path, alone: bool, crashed: bool) -> None:
    built = build(tmp_path, alone=alone, crashed=crashed)
    for cut in range(built.last_start, built.last_stop):
        case = tmp_path / f"cut-{cut}"
        shutil.copytree(built.snapshot, case)
        truncate(case / "segments" / built.log_name, cut)
        check_recovered(case, built, last_kept=False, what=f"cut at {cut}")
        shutil.rmtree(case)


def _garbage(kind: str, built: Built) -> bytes:
    log = built.snapshot / "segments" / built.log_name
    data = log.read_bytes()
    spans = entry_spans(data)
    if kind.startswith("zeros-"):
        return bytes(int(kind.removeprefix("zeros-")))
    if kind == "random":
        return random.Random(1234).randbytes(333)
    if kind == "stale-copy":  # a whole valid entry that belongs earlier in the log
        start, stop, _ = spans[0]
        return data[start:stop]
    if kind == "huge-length":
        return b"\xff\xff\xff\x7f" + bytes(40)
    if kind == "half-entry":  # a header promising more than is there
        start, stop, _ = spans[-1]
        return data[start : start + (stop - start) // 2]
    raise AssertionError(kind)


GARBAGE = [
    "zeros-1",
    "zeros-3",
    "zeros-21",
    "zeros-26",
    "zeros-4096",
    "zeros-70000",
    "random",
    "stale-copy",
    "huge-length",
    "half-entry",
]


@pytest.mark.parametrize("crashed", [False, True], ids=["clean", "crashed"])
@pytest.mark.parametrize("kind", GARBAGE)
def test_garbage_after_last_entry_is_cut(tmp_path: Path, kind: str, crashed: bool) -> None:
    """Power loss can extend a file with zeros (or leave junk) past its last entry."""
    built = build(tmp_path, alone=False, crashed=crashed)
    case = tmp_path / "case"
    shutil.copytree(built.snapshot, case)
    with open(case / "segments" / built.log_name, "ab") as f:
        f.write(_garbage(kind, built))
    check_recovered(case, built, last_kept=True, what=kind)
