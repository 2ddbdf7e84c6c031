"""``ledgerq enqueue --delay --group``; ``stats`` and ``peek`` show delayed messages and
groups."""

from __future__ import annotations

from pathlib import Path

import ledgerq

from ._run import fails, ok


def test_enqueue_with_delay_and_group(tmp_path: Path) -> None:
    q = tmp_path / "q"
    ok("enqueue", q, "later", "--delay", "3600")
    ok("enqueue", q, "first", "--group", "acct-1")
    ok("enqueue", q, "second", "--group", "acct-1")
    stats = ok("stats", q, "--json").json()
    assert (stats["pending"], stats["delayed"]) == (3, 1)
    assert stats["readers"]["default"]["delayed"] == 1
    assert "delayed" in ok("stats", q).out
    peeked = ok("peek", q, "--json").json_lines()
    assert [(m["payload"], m["group"]) for m in peeked] == [("first", "acct-1")]
    assert "acct-1" in ok("peek", q).out
    with ledgerq.open(q) as queue:
        msg = queue.dequeue()
        assert msg is not None and (msg.payload, msg.group) == (b"first", "acct-1")


def test_bad_delay_or_group_is_a_usage_error_and_writes_nothing(tmp_path: Path) -> None:
    q = tmp_path / "q"
    for args in (("--delay", "-1"), ("--delay", "nan"), ("--group", ""), ("--group", "x" * 256)):
        fails("enqueue", q, "x", *args, code=2)
    assert not q.exists()


def test_enqueue_unique_key(tmp_path: Path) -> None:
    q = tmp_path / "q"
    first = ok("enqueue", q, "rebuild", "--unique-key", "rebuild:7").out.strip()
    assert ok("enqueue", q, "again", "--unique-key", "rebuild:7").out.strip() == first
    assert ok("stats", q, "--json").json()["pending"] == 1
    for bad in ("", "x" * 1025):
        fails("enqueue", tmp_path / "other", "x", "--unique-key", bad, code=2)
    assert not (tmp_path / "other").exists()
