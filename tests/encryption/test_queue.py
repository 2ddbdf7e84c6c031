"""Encryption at rest (issue 18 item 2): a queue opened with ``encryption_key``.

Real files throughout: what the directory holds is read back byte for byte.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ledgerq
from ledgerq.format.checksum import checksum
from ledgerq.format.entry import EntryFlags, decode_entry
from ledgerq.segment import meta as meta_mod
from tests.encryption._files import (
    KEY,
    OTHER_KEY,
    files_holding,
    segment_bytes,
    snapshot,
)

SECRET = b"attack at dawn: the secret payload"
HEADER_VALUE = "secret-header-value"


def _fill(path: Path, count: int = 5, **options: object) -> None:
    with ledgerq.open(path, encryption_key=KEY, **options) as q:  # type: ignore[arg-type]
        for i in range(count):
            q.enqueue(SECRET + b" %d" % i, headers={"h": HEADER_VALUE})


# ---------------------------------------------------------------- round trip


def test_messages_round_trip_and_stay_sealed_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, encryption_key=KEY) as q:
        first = q.enqueue(SECRET, headers={"h": HEADER_VALUE}, priority=ledgerq.Priority.HIGH)
        q.enqueue_batch(
            [SECRET + b"-batch", ledgerq.Item(SECRET + b"-grouped", group="g", ttl=3600)]
        )
        q.enqueue(b"")  # an empty body seals too
        got = q.dequeue()
        assert got is not None
        assert (got.id, got.payload, got.headers) == (first, SECRET, {"h": HEADER_VALUE})
        assert got.priority == ledgerq.Priority.HIGH
    with ledgerq.open(path, encryption_key=KEY) as q:  # reopen: the lease comes back
        got_all = q.dequeue_batch(10)
    assert [m.payload for m in got_all] == [SECRET, SECRET + b"-batch", SECRET + b"-grouped", b""]
    assert got_all[2].group == "g" and got_all[2].expires_at is not None
    assert got_all[0].attempts == 2
    raw = segment_bytes(path)
    assert SECRET not in raw and HEADER_VALUE.encode() not in raw
    entry, _ = decode_entry(raw, 0)
    assert entry.flags & EntryFlags.ENCRYPTED and not entry.flags & EntryFlags.HAS_HEADERS
    meta = json.loads((path / "meta.json").read_text())
    assert meta["version"] == meta_mod.ENCRYPTED_VERSION
    assert set(meta["encryption"]) == {"cipher", "queue_id", "key_check"}
    assert KEY.hex() not in (path / "meta.json").read_text()
    assert "encryption_key" not in meta["options"]
    assert "encryption_key" not in json.loads((path / "options.json").read_text())["options"]


@pytest.mark.parametrize("shared", [False, True])
def test_a_delayed_message_is_sealed_and_held_back(tmp_path: Path, shared: bool) -> None:
    from tests.clocks import SteppedClock

    clock = SteppedClock()
    path = tmp_path / "q"
    with ledgerq.open(path, encryption_key=KEY, shared=shared, clock=clock) as q:
        later = q.enqueue(SECRET + b"-later", delay=60.0)  # the plain path, sealed
        q.enqueue_batch([ledgerq.Item(SECRET + b"-later-too", delay=60.0)])
        assert q.dequeue() is None and q.stats().delayed == 2
    assert SECRET not in segment_bytes(path)
    with ledgerq.open(path, encryption_key=KEY, shared=shared, clock=clock) as q:
        assert q.dequeue() is None  # a reopen does not shorten the delay
        clock.elapse(61)
        got = q.dequeue_batch(5)
    assert [(m.id, m.payload) for m in got][:1] == [(later, SECRET + b"-later")]
    assert [m.payload for m in got] == [SECRET + b"-later", SECRET + b"-later-too"]


def test_compression_comes_before_sealing(tmp_path: Path) -> None:
    path = tmp_path / "q"
    body = SECRET * 200
    with ledgerq.open(path, encryption_key=KEY, compression="zstd") as q:
        q.enqueue(body)
        entry, _ = decode_entry(segment_bytes(path), 0)
        assert entry.flags & EntryFlags.COMPRESSED and entry.flags & EntryFlags.ENCRYPTED
        assert entry.size < len(body) // 10  # compressed: ciphertext does not compress
        got = q.dequeue()
    assert got is not None and got.payload == body


# ---------------------------------------------------------------- keys


def test_the_key_is_checked_and_masked() -> None:
    with pytest.raises(TypeError, match="bytes"):
        ledgerq.Options(encryption_key="0" * 32)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bytes"):
        ledgerq.Options(encryption_key=bytearray(32))  # type: ignore[arg-type]
    with pytest.raises(ledgerq.ConfigError, match="exactly 32 bytes") as info:
        ledgerq.Options(encryption_key=KEY[:16])
    assert KEY[:16].hex() not in str(info.value) and repr(KEY[:16]) not in str(info.value)
    shown = repr(ledgerq.Options(encryption_key=KEY))
    assert "hidden" in shown and repr(KEY) not in shown and KEY.hex() not in shown


@pytest.mark.parametrize(
    ("encrypted", "key", "message"),
    [
        (True, None, "is encrypted"),
        (True, OTHER_KEY, "wrong encryption_key"),
        (False, KEY, "is not encrypted"),
    ],
    ids=["encrypted-no-key", "encrypted-wrong-key", "plain-with-key"],
)
def test_a_missing_wrong_or_unexpected_key_changes_nothing(
    tmp_path: Path, encrypted: bool, key: bytes | None, message: str
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, encryption_key=KEY if encrypted else None) as q:
        q.enqueue(b"one")
        q.enqueue(b"two")
        q.dequeue()  # a lease lost at close: a reopen would write a journal record
    before = snapshot(path)
    with pytest.raises(ledgerq.ConfigError, match=message) as info:
        ledgerq.open(path, encryption_key=key)
    assert snapshot(path) == before  # bytes and mtimes: nothing written, not even LOCK
    if key is not None:
        assert key.hex() not in str(info.value)
    with pytest.raises(ledgerq.ConfigError, match=message):
        ledgerq.open(path, shared=True, encryption_key=key)
    assert snapshot(path) == before


def test_an_older_ledgerq_refuses_an_encrypted_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A format 2 ledgerq reads meta.json versions up to 2: it refuses version 3."""
    path = tmp_path / "q"
    _fill(path, 1)
    monkeypatch.setattr(meta_mod, "NEWEST_VERSION", meta_mod.FORMAT_VERSION)
    with pytest.raises(ledgerq.IncompatibleFormatError, match="upgrade ledgerq"):
        meta_mod.MetaStore(str(path)).load()


def test_a_lost_meta_json_keeps_the_queue_identity(tmp_path: Path) -> None:
    path = tmp_path / "q"
    _fill(path, 3)
    (path / "meta.json").unlink()
    with pytest.raises(ledgerq.ConfigError, match="wrong encryption_key"):
        ledgerq.open(path, encryption_key=OTHER_KEY)
    with ledgerq.open(path, encryption_key=KEY) as q:  # rebuilt from options.json
        assert [m.payload for m in q.dequeue_batch(5)] == [SECRET + b" %d" % i for i in range(3)]


# ---------------------------------------------------------------- tampering


def _entries(log: Path) -> list[tuple[int, int, int]]:
    """(offset, size, payload offset) of each entry of ``log``."""
    raw = log.read_bytes()
    found = []
    pos = 0
    while pos < len(raw):
        entry, end = decode_entry(raw, pos)
        found.append((pos, entry.size, end - 4 - len(entry.payload)))
        pos = end
    return found


def _reseal_crc(raw: bytearray, offset: int, size: int) -> None:
    """Write the CRC an entry's bytes need: only the authentication can then fail."""
    crc_at = offset + size - 4
    raw[crc_at : crc_at + 4] = struct.pack("<I", checksum(bytes(raw[offset:crc_at])))


def _tampered(path: Path, change: str) -> list[bytes]:
    """Tamper with entries 2 and 3 of five; return the payloads the queue then delivers."""
    _fill(path, 5)
    (log,) = (path / "segments").glob("*.log")
    raw = bytearray(log.read_bytes())
    entries = _entries(log)
    (a, a_size, a_payload), (b, b_size, b_payload) = entries[1], entries[2]
    if change == "flip":
        raw[a_payload + 20] ^= 0x01
        _reseal_crc(raw, a, a_size)
    elif change == "swap":  # the same sizes: each blob where the other belongs
        blob_a = raw[a_payload : a + a_size - 4]
        raw[a_payload : a + a_size - 4] = raw[b_payload : b + b_size - 4]
        raw[b_payload : b + b_size - 4] = blob_a
        _reseal_crc(raw, a, a_size)
        _reseal_crc(raw, b, b_size)
    elif change == "truncate":  # the last entry's blob one byte short, length and CRC fixed
        last, last_size, _ = entries[-1]
        del raw[last + last_size - 5]
        raw[last : last + 4] = struct.pack("<I", last_size - 1)
        _reseal_crc(raw, last, last_size - 1)
    log.write_bytes(bytes(raw))
    with ledgerq.open(path, encryption_key=KEY) as q:
        got = [m.payload for m in q.dequeue_batch(10)]
        corrupt = q.stats().corrupt_skipped
        assert q.dequeue() is None
    expected_corrupt = {"flip": 1, "swap": 2, "truncate": 1}[change]
    assert corrupt == expected_corrupt
    return got


def test_a_flipped_ciphertext_byte_is_skipped_and_counted(tmp_path: Path) -> None:
    got = _tampered(tmp_path / "q", "flip")
    assert got == [SECRET + b" %d" % i for i in (0, 2, 3, 4)]


def test_swapped_sealed_payloads_are_skipped_and_counted(tmp_path: Path) -> None:
    got = _tampered(tmp_path / "q", "swap")
    assert got == [SECRET + b" %d" % i for i in (0, 3, 4)]


def test_a_truncated_sealed_payload_is_skipped_and_counted(tmp_path: Path) -> None:
    got = _tampered(tmp_path / "q", "truncate")
    assert got == [SECRET + b" %d" % i for i in (0, 1, 2, 3)]


def test_an_entry_copied_from_another_queue_fails(tmp_path: Path) -> None:
    """Same key, same id: the queue identity in the associated data tells them apart."""
    _fill(tmp_path / "a", 1)
    with ledgerq.open(tmp_path / "b", encryption_key=KEY) as q:
        q.enqueue(b"b's own")
    (a_log,) = (tmp_path / "a" / "segments").glob("*.log")
    (b_log,) = (tmp_path / "b" / "segments").glob("*.log")
    b_log.write_bytes(a_log.read_bytes())  # a's entry 1 in b's log (a valid CRC)
    with ledgerq.open(tmp_path / "b", encryption_key=KEY) as q:
        assert q.dequeue() is None
        assert q.stats().corrupt_skipped == 1


# ---------------------------------------------------------------- DLQ, readers, retention


def test_the_dlq_is_sealed_and_requeue_restores_the_message(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, encryption_key=KEY, max_retries=1) as q:
        q.enqueue(SECRET, headers={"h": HEADER_VALUE})
        got = q.dequeue()
        assert got is not None
        q.nack(got.id, "failed")
        dead = q.dlq.peek(1)
        assert dead[0].payload == SECRET and dead[0].headers["h"] == HEADER_VALUE
        dlq_meta = json.loads((path / "dlq" / "meta.json").read_text())
        assert (
            dlq_meta["encryption"]["queue_id"]
            != json.loads((path / "meta.json").read_text())["encryption"]["queue_id"]
        )
        raw = segment_bytes(path / "dlq")
        assert raw and SECRET not in raw and HEADER_VALUE.encode() not in raw
        assert decode_entry(raw, 0)[0].flags & EntryFlags.ENCRYPTED
        assert q.requeue_dlq() == 1
        back = q.dequeue()
    assert back is not None
    assert (back.payload, back.headers) == (SECRET, {"h": HEADER_VALUE})
    assert files_holding(path, SECRET) == []


def test_named_readers_and_retention(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, encryption_key=KEY, segment_size=400, retention_max_bytes=1200) as q:
        reader = q.reader("audit")
        for i in range(40):
            q.enqueue(SECRET + b" %d" % i)
        got = reader.dequeue_batch(100)
        stats = q.stats()
        assert stats.dropped > 0  # retention dropped the oldest segments
        assert [m.payload for m in got] == [SECRET + b" %d" % i for i in range(40 - len(got), 40)]
        assert len(q.dequeue_batch(100)) == stats.pending


def test_dedup_ids_are_stored_keyed(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, encryption_key=KEY, dedup_window=60) as q:
        first = q.enqueue(b"x", dedup_id="order-42")
        assert q.enqueue(b"y", dedup_id="order-42") == first
        q.sync()
    from ledgerq.features.dedup import dedup_key

    assert files_holding(path, dedup_key("order-42")) == []  # not the unkeyed digest
    assert files_holding(path, b"order-42") == []
    with ledgerq.open(path, encryption_key=KEY, dedup_window=60) as q:
        assert q.enqueue(b"z", dedup_id="order-42") == first


def test_no_file_of_the_queue_holds_a_payload_or_header_in_clear(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(
        path, encryption_key=KEY, max_retries=1, dedup_window=60, priorities=True
    ) as q:
        for i in range(20):
            q.enqueue(SECRET + b" %d" % i, headers={"h": HEADER_VALUE}, dedup_id=f"d{i}")
        reader = q.reader("other")
        reader.dequeue_batch(5)
        for message in q.dequeue_batch(10):
            q.nack(message.id)  # to the DLQ
        q.sync()
        assert q.dlq.stats().pending == 10
    assert files_holding(path, SECRET) == []
    assert files_holding(path, HEADER_VALUE.encode()) == []
    assert files_holding(path, KEY) == []
    assert files_holding(path, KEY.hex().encode()) == []


# ---------------------------------------------------------------- processes


_SHARED_CHILD = """
import sys, ledgerq
with ledgerq.open(sys.argv[1], shared=True, encryption_key=bytes.fromhex(sys.argv[2])) as q:
    q.enqueue_batch([b"from-child-%d" % i for i in range(10)])
"""


def test_two_processes_share_an_encrypted_queue(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True, encryption_key=KEY) as q:
        q.enqueue(b"from-parent")
        subprocess.run(
            [sys.executable, "-c", _SHARED_CHILD, str(path), KEY.hex()],
            check=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
        got = [m.payload for m in q.dequeue_batch(20)]
    assert got == [b"from-parent"] + [b"from-child-%d" % i for i in range(10)]
    assert b"from-child" not in segment_bytes(path)


def test_follow_needs_the_key(tmp_path: Path) -> None:
    path = tmp_path / "q"
    _fill(path, 3)
    with pytest.raises(ledgerq.ConfigError, match="is encrypted"):
        ledgerq.follow(path, timeout=0)
    with pytest.raises(ledgerq.ConfigError, match="wrong"):
        ledgerq.follow(path, timeout=0, encryption_key=OTHER_KEY)
    with ledgerq.follow(path, timeout=0, encryption_key=KEY) as follower:
        got = [(m.payload, m.headers) for m in follower]
    assert got == [(SECRET + b" %d" % i, {"h": HEADER_VALUE}) for i in range(3)]


# ---------------------------------------------------------------- property


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.binary(max_size=3000),
            st.none() | st.dictionaries(st.text(max_size=8), st.text(max_size=20), max_size=4),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_any_payload_and_headers_round_trip(
    tmp_path_factory: pytest.TempPathFactory, messages: list[tuple[bytes, dict[str, str] | None]]
) -> None:
    path = tmp_path_factory.mktemp("q") / "q"
    with ledgerq.open(path, encryption_key=KEY, compression="zstd", sync="never") as q:
        q.enqueue_batch([ledgerq.Item(p, headers=h) for p, h in messages])
    with ledgerq.open(path, encryption_key=KEY) as q:
        got = q.dequeue_batch(len(messages))
    assert [(m.payload, m.headers) for m in got] == [(p, h or {}) for p, h in messages]


def test_ship_copies_the_ciphertext_and_the_hub_reads_it_with_the_key(tmp_path: Path) -> None:
    from ledgerq.ship import ship_queue

    src = tmp_path / "orders"
    _fill(src, 4, segment_size=300)
    report = ship_queue(src, tmp_path / "hub", "edge-1")
    dest = tmp_path / "hub" / "edge-1.orders"
    assert report.messages == 4
    for log in (src / "segments").glob("*.log"):
        assert (dest / "segments" / log.name).read_bytes() == log.read_bytes()
    assert files_holding(dest, SECRET) == []
    with pytest.raises(ledgerq.ConfigError, match="is encrypted"):
        ledgerq.open(dest)
    with ledgerq.open(dest, encryption_key=KEY) as hub:
        assert [m.payload for m in hub.dequeue_batch(10)] == [SECRET + b" %d" % i for i in range(4)]
