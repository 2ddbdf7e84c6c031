"""``ledgerq dlq list|show|requeue|purge`` on a dead-letter queue made with the Python API."""

from __future__ import annotations

import base64
from pathlib import Path

import ledgerq

from ._run import fails, ok, run

REASONS = ["timeout talking to db", "ValueError: boom", "timeout again", "ValueError: bang"]


def _build(path: Path) -> None:
    """Four messages nacked once with max_retries=1: all four in the DLQ."""
    with ledgerq.open(path, max_retries=1) as q:
        for i, reason in enumerate(REASONS):
            q.enqueue(b"job %d" % i if i != 3 else b"\xff\x00", headers={"job": str(i)})
            message = q.dequeue()
            assert message is not None
            q.nack(message.id, reason)
        assert len(q.dlq) == 4


def _main_payloads(path: Path) -> list[bytes]:
    with ledgerq.open(path) as q:
        return [m.payload for m in q.peek(100)]


def test_list_and_show(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build(q)
    listed = ok("dlq", "list", q, "--json").json_lines()
    assert [m["id"] for m in listed] == [1, 2, 3, 4]
    assert [m["original_id"] for m in listed] == [1, 2, 3, 4]
    assert [m["reason"] for m in listed] == REASONS
    assert all(m["retries"] == 1 for m in listed)
    assert all(isinstance(m["age"], float) and m["age"] >= 0 for m in listed)
    table = ok("dlq", "list", q).out
    assert "timeout talking to db" in table and "retries" in table

    shown = ok("dlq", "show", q, "4", "--json").json()
    assert shown["id"] == 4 and shown["original_id"] == 4
    assert base64.b64decode(shown["payload"]) == b"\xff\x00"
    assert shown["payload_encoding"] == "base64"
    assert shown["headers"]["job"] == "3"
    assert shown["headers"]["dlq.failure_reason"] == "ValueError: bang"
    assert shown["headers"]["dlq.retry_count"] == "1"
    human = ok("dlq", "show", q, "1").out
    for text in ("dlq.original_id: 1", "job: 0", "timeout talking to db", "job 0"):
        assert text in human, text

    assert "no message 99" in fails("dlq", "show", q, "99", code=1).err
    fails("dlq", "show", q, "abc", code=2)

    empty = tmp_path / "empty"
    with ledgerq.open(empty):
        pass
    assert ok("dlq", "list", empty, "--json").out == ""
    assert "empty" in ok("dlq", "list", empty).out
    assert not (empty / "dlq").exists()  # looking never creates the DLQ


def test_requeue(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build(q)
    fails("dlq", "requeue", q, "--all", "--id", "1", code=2)
    assert "no message 42" in fails("dlq", "requeue", q, "--id", "1", "--id", "42").err
    assert ok("dlq", "requeue", q, "--where-reason", "TIMEOUT").out.startswith("requeued 2 ")
    assert _main_payloads(q) == [b"job 0", b"job 2"]
    assert ok("dlq", "requeue", q, "--id", "2", "--json").json()["requeued"] == 1
    with ledgerq.open(q) as queue:
        messages = queue.peek(10)
        assert [m.payload for m in messages] == [b"job 0", b"job 2", b"job 1"]
        assert all(not k.startswith("dlq.") for m in messages for k in m.headers)
        assert [m.headers["job"] for m in messages] == ["0", "2", "1"]
        assert [m.attempts for m in messages] == [1, 1, 1]
    assert ok("dlq", "requeue", q, "--all", "--json").json()["requeued"] == 1
    assert ok("dlq", "list", q, "--json").out == ""


def test_requeue_without_a_selection_moves_everything_like_the_api(tmp_path: Path) -> None:
    by_cli, by_api = tmp_path / "cli", tmp_path / "api"
    _build(by_cli)
    _build(by_api)
    assert ok("dlq", "requeue", by_cli, "--json").json()["requeued"] == 4
    with ledgerq.open(by_api) as queue:
        assert queue.requeue_dlq() == 4
    assert (
        _main_payloads(by_cli)
        == _main_payloads(by_api)
        == [b"job 0", b"job 1", b"job 2", b"\xff\x00"]
    )
    assert ok("dlq", "list", by_cli, "--json").out == ""
    assert ok("dlq", "requeue", by_cli).out == f"requeued 0 messages to {by_cli}\n"


def test_purge(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build(q)
    refused = fails("dlq", "purge", q)  # stdin is not a terminal and no --yes
    assert "--yes" in refused.err and "not a terminal" in refused.err
    assert len(ok("dlq", "list", q, "--json").json_lines()) == 4
    assert ok("dlq", "purge", q, "--older-than", "1h", "--json").json()["purged"] == 0
    fails("dlq", "purge", q, "--older-than", "soon", "--yes", code=2)
    assert ok("dlq", "purge", q, "--older-than", "0s", "--yes").out == "purged 4 messages\n"
    assert ok("dlq", "list", q, "--json").out == ""
    assert run("dlq", "purge", q).code == 0  # nothing left: nothing to confirm
    with ledgerq.open(q) as queue:
        assert len(queue.dlq) == 0 and len(queue) == 0
