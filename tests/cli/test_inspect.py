"""``peek``, ``stats``, ``dump`` and ``compact``: output checked against the Python API."""

from __future__ import annotations

import base64
from pathlib import Path

import ledgerq

from ._run import fails, ok

FIELDS = (
    "id",
    "timestamp",
    "expires_at",
    "priority",
    "group",
    "headers",
    "payload",
    "payload_encoding",
)


def _build(path: Path) -> None:
    with ledgerq.open(path, segment_size=512) as q:
        q.enqueue(b"plain text", headers={"kind": "text"})
        q.enqueue(b"\x00\x01\x02\xff binary", priority=ledgerq.Priority.HIGH, ttl=600)
        q.enqueue("unicode é ✓".encode())
        for i in range(20):
            q.enqueue(b"filler %02d " % i + b"." * 40)
        first = q.dequeue()
        assert first is not None
        q.ack(first.id)  # acked, but still retained in its segment
        leased = q.dequeue()
        assert leased is not None  # leased when the queue closes: pending again


def test_peek_json_and_table_match_the_api(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build(q)
    peeked = ok("peek", q, "-n", "3", "--json").json_lines()
    with ledgerq.open(q) as queue:
        expected = queue.peek(3)
    assert [m["id"] for m in peeked] == [m.id for m in expected] == [2, 3, 4]
    for got, want in zip(peeked, expected, strict=True):
        assert got["timestamp"] == want.timestamp
        assert got["expires_at"] == want.expires_at
        assert got["priority"] == int(want.priority)
        assert got["headers"] == want.headers
        assert got["attempts"] == want.attempts
        raw = (
            base64.b64decode(got["payload"])
            if got["payload_encoding"] == "base64"
            else got["payload"].encode()
        )
        assert raw == want.payload
    assert peeked[0]["payload_encoding"] == "base64"
    assert peeked[0]["attempts"] == 2  # its lease was lost when the queue closed
    assert peeked[1]["payload"] == "unicode é ✓"

    table = ok("peek", q, "-n", "2").out
    assert "unicode é ✓" in table and "binary" in table and "high" in table


def test_stats_json_and_table(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build(q)
    with ledgerq.open(q) as queue:
        queue.reader("audit")
        expected = queue.stats()
    stats = ok("stats", q, "--json").json()
    for name in (
        "pending",
        "in_flight",
        "enqueued",
        "acked",
        "nacked",
        "dead_lettered",
        "expired",
        "duplicates",
        "dropped",
        "corrupt_skipped",
        "segments",
        "disk_bytes",
    ):
        assert type(stats[name]) is int, name
        assert stats[name] == getattr(expected, name), name
    assert isinstance(stats["oldest_pending_age"], float) and stats["oldest_pending_age"] > 0
    assert stats["pending"] == 22 and stats["acked"] == 1 and stats["segments"] > 1
    assert set(stats["readers"]) == {"default", "audit"}
    assert stats["readers"]["audit"]["pending"] == 23
    assert stats["readers"]["default"]["pending"] == 22
    assert stats["dlq"] == 0
    assert not (q / "dlq").exists()  # looking at the DLQ count does not create it

    table = ok("stats", q).out
    for word in ("pending", "in flight", "dead-letter queue", "disk", "audit", "default"):
        assert word in table, word


def test_dump_every_retained_message_as_json_lines(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build(q)
    with ledgerq.open(q) as queue:
        retained = {m.id: m for m in queue.peek(100)}
        # The Python API holds the lock: dump reads the files without it.
        lines = ok("dump", q).json_lines()
        from_id = ok("dump", q, "--from-id", "15", "--json", "-n", "3").json_lines()
    assert [m["id"] for m in lines] == list(range(1, 24))  # acked id 1 is still on disk
    for line in lines:
        assert set(line) == set(FIELDS)
        if line["id"] in retained:
            want = retained[line["id"]]
            assert (line["timestamp"], line["expires_at"], line["priority"], line["headers"]) == (
                want.timestamp,
                want.expires_at,
                int(want.priority),
                want.headers,
            )
    assert lines[0] == {**lines[0], "payload": "plain text", "payload_encoding": "utf8"}
    binary = lines[1]
    assert binary["payload_encoding"] == "base64"
    assert base64.b64decode(binary["payload"]) == b"\x00\x01\x02\xff binary"
    assert binary["priority"] == 2
    assert binary["expires_at"] == binary["timestamp"] + 600 * 10**9  # ttl=600
    assert [m["id"] for m in from_id] == [15, 16, 17]

    forced = ok("dump", q, "--payload", "base64", "-n", "1").json()
    assert forced["payload_encoding"] == "base64"
    assert base64.b64decode(forced["payload"]) == b"plain text"
    assert "not valid UTF-8" in fails("dump", q, "--payload", "utf8").err


def test_compact_applies_retention_with_the_given_options(tmp_path: Path) -> None:
    q = tmp_path / "q"
    with ledgerq.open(q, segment_size=256, retention_max_age=3600) as queue:
        for i in range(30):
            queue.enqueue(b"m%02d" % i + b"." * 40)
        for message in queue.dequeue_batch(30):
            queue.ack(message.id)
        kept = queue.stats().segments
    assert kept > 3
    # The queue remembers retention_max_age=3600: a plain compact keeps the segments.
    same = ok("compact", q, "--json").json()
    assert same["segments_before"] == same["segments_after"] == kept
    done = ok("compact", q, "--json", "-o", "retention_max_age=0").json()
    assert done["segments_before"] == kept and done["segments_after"] == 1
    assert done["disk_bytes_after"] < done["disk_bytes_before"]
    assert "1 segment" in ok("compact", q).out
