"""A flipped byte inside a segment: that one message is skipped, logged and counted.

The contract: a corrupt entry found while reading is skipped (never returned as data),
logged through the ``ledgerq`` logger and counted in ``stats().corrupt_skipped``; the
other messages are intact.  The scanner resynchronises, so even a flip in an entry's
length field costs that one entry and not the rest of the segment.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

import ledgerq

from ._harness import ENTRY_FIXED_SIZE, entry_spans, segment_logs
from ._payload import make_message

SEGMENT_SIZE = 2048
MESSAGES = 80

# field -> (offset inside the entry, negative from its end, xor mask)
FLIPS = {
    "length0-01": (0, 0x01),
    "length0-ff": (0, 0xFF),
    "length1-01": (1, 0x01),
    "length1-80": (1, 0x80),
    "length2-80": (2, 0x80),
    "length3-01": (3, 0x01),
    "length3-80": (3, 0x80),
    "type": (4, 0x01),
    "flags": (5, 0x10),
    "id": (6, 0x01),
    "timestamp": (14, 0x40),
    "payload-first": (ENTRY_FIXED_SIZE, 0x01),
    "payload-last": (-5, 0x80),
    "crc": (-1, 0x01),
}

# (segment, entry): which entry of which segment gets the flip
WHERE = {
    "sealed-first": (0, 0),
    "sealed-middle": (0, "middle"),
    "second-sealed-middle": (1, "middle"),
    "newest-middle": (-1, "middle"),
}


def build(path: Path, index_interval: int) -> dict[int, bytes]:
    """A closed queue of several segments of plain messages; returns id -> payload."""
    payloads: dict[int, bytes] = {}
    with ledgerq.open(path, segment_size=SEGMENT_SIZE, index_interval=index_interval) as q:
        for token in range(MESSAGES):
            payload, _ = make_message(token)
            payloads[q.enqueue(payload)] = payload
    logs = segment_logs(path)
    assert len(logs) >= 4
    assert len(entry_spans(logs[-1].read_bytes())) >= 3, "the newest segment is too short"
    return payloads


@pytest.fixture(scope="module", params=[4096, 256], ids=["sparse-index", "dense-index"])
def built(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, int, dict[int, bytes]]:
    path = tmp_path_factory.mktemp("corruption") / "q"
    return path, request.param, build(path, request.param)


def damage(path: Path, segment_no: int, entry_no: int | str, flip: str) -> tuple[Path, int]:
    """Flip one byte of one entry; return the segment log and the damaged message's id."""
    log = segment_logs(path)[segment_no]
    data = bytearray(log.read_bytes())
    spans = entry_spans(bytes(data))
    start, stop, victim = spans[len(spans) // 2 if entry_no == "middle" else int(entry_no)]
    offset, mask = FLIPS[flip]
    data[start + offset if offset >= 0 else stop + offset] ^= mask
    log.write_bytes(bytes(data))
    return log, victim


def drain(q: ledgerq.Queue) -> list[ledgerq.Message]:
    got: list[ledgerq.Message] = []
    while msg := q.dequeue():
        got.append(msg)
        q.ack(msg.id)
    return got


def check_skipped(
    built: tuple[Path, int, dict[int, bytes]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    where: tuple[int, int | str],
    flip: str,
) -> None:
    source, index_interval, payloads = built
    path = tmp_path / "q"
    shutil.copytree(source, path)
    log, victim = damage(path, *where, flip)

    caplog.set_level(logging.WARNING, logger="ledgerq")
    with ledgerq.open(path, segment_size=SEGMENT_SIZE, index_interval=index_interval) as q:
        got = drain(q)
        skipped = q.stats().corrupt_skipped

    ids = [m.id for m in got]
    assert victim not in ids, f"the corrupt message {victim} was returned"
    assert ids == [i for i in sorted(payloads) if i != victim]
    for msg in got:
        assert msg.payload == payloads[msg.id], f"message {msg.id} damaged"
    warnings = [
        r
        for r in caplog.records
        if r.name.split(".")[0] == "ledgerq" and r.levelno >= logging.WARNING
    ]
    assert any(log.name in r.getMessage() for r in warnings), (
        f"no warning naming {log.name}: {[r.getMessage() for r in warnings]}"
    )
    assert skipped == 1, f"corrupt_skipped is {skipped}, expected 1"


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("flip", FLIPS)
def test_flipped_byte_skips_exactly_that_message(
    built: tuple[Path, int, dict[int, bytes]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    where: str,
    flip: str,
) -> None:
    check_skipped(built, tmp_path, caplog, WHERE[where], flip)


@pytest.mark.parametrize("flip", ["payload-last", "length0-01"])
def test_flipped_byte_in_last_entry_of_sealed_segment_is_counted(
    built: tuple[Path, int, dict[int, bytes]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    flip: str,
) -> None:
    """A sealed segment was fsynced before it was sealed: a bad last entry in it is
    corruption, not a torn write, and is counted like any other corrupt entry."""
    check_skipped(built, tmp_path, caplog, (0, -1), flip)


@pytest.mark.parametrize("where", ["sealed-middle", "newest-middle"])
def test_corrupt_entry_is_counted_once_across_reopens(
    built: tuple[Path, int, dict[int, bytes]], tmp_path: Path, where: str
) -> None:
    """corrupt_skipped counts corrupt entries since the queue was created: reading the
    same damaged entry again after a reopen does not count it again."""
    source, index_interval, payloads = built
    path = tmp_path / "q"
    shutil.copytree(source, path)
    damage(path, *WHERE[where], "payload-first")
    for _ in range(3):
        with ledgerq.open(path, segment_size=SEGMENT_SIZE, index_interval=index_interval) as q:
            assert len(q.peek(len(payloads))) == len(payloads) - 1
            assert q.stats().corrupt_skipped == 1
