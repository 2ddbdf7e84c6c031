"""``ledgerq dlq list|show|requeue|purge`` on a dead-letter queue made with the Python API."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

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


class _PastClock:
    """The system's clocks, the wall clock ``behind_s`` seconds behind."""

    def __init__(self, behind_s: float) -> None:
        self._behind_ns = int(behind_s * 1e9)

    def time_ns(self) -> int:
        return time.time_ns() - self._behind_ns

    def monotonic_ns(self) -> int:
        return time.monotonic_ns()


def _dead_letter(
    path: Path,
    payload: bytes,
    reason: str,
    headers: dict[str, str],
    *,
    retries: int,
    **open_kw: Any,
) -> None:
    """Enqueue one message and fail it ``retries`` times, so that it is dead-lettered."""
    with ledgerq.open(path, max_retries=retries, **open_kw) as q:
        q.enqueue(payload, headers=headers)
        for _ in range(retries):
            message = q.dequeue()
            assert message is not None
            q.nack(message.id, reason)


def _build_varied(path: Path) -> None:
    """Five dead letters that differ in reason, age, headers and failed deliveries.

    DLQ ids: 1 old timeout (2 h ago, 1 failure), 2 "Timeout" tenant=a (3 failures),
    3 ValueError tenant=b (1), 4 ValueError tenant=a (3), 5 connection reset (1).
    """
    _dead_letter(path, b"old", "timeout after 30s", {}, retries=1, clock=_PastClock(7200))
    _dead_letter(path, b"t-a", "Timeout after 5s", {"tenant": "a"}, retries=3)
    _dead_letter(path, b"v-b", "ValueError: bad input", {"tenant": "b"}, retries=1)
    _dead_letter(path, b"v-a", "ValueError: bad input", {"tenant": "a"}, retries=3)
    _dead_letter(path, b"reset", "connection reset by peer", {"tenant": "b"}, retries=1)


def _listed(path: Path, *args: str) -> list[int]:
    return [m["id"] for m in ok("dlq", "list", path, "--json", *args).json_lines()]


def test_list_filters_choose_by_reason_age_header_and_attempts(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build_varied(q)
    assert _listed(q) == [1, 2, 3, 4, 5]
    assert _listed(q, "--reason", "^time") == [1, 2]  # a regex, ignoring case
    assert _listed(q, "--reason", r"after \d+s$") == [1, 2]
    assert _listed(q, "--reason", "value|reset") == [3, 4, 5]
    assert _listed(q, "--older-than", "1h") == [1]
    assert _listed(q, "--older-than", "3h") == []
    assert _listed(q, "--header", "tenant=a") == [2, 4]
    assert _listed(q, "--header", "tenant=a", "--header", "tenant=b") == []
    assert _listed(q, "--attempts-at-least", "3") == [2, 4]
    assert _listed(q, "--attempts-at-least", "0") == [1, 2, 3, 4, 5]
    assert _listed(q, "--reason", "value", "--header", "tenant=a", "--attempts-at-least", "2") == [
        4
    ]
    table = ok("dlq", "list", q, "--reason", "nothing like this").out
    assert "no message with reason matching /nothing like this/" in table


def test_bad_filters_are_usage_errors_naming_the_option(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build_varied(q)

    def refused(*args: str) -> str:
        return fails("dlq", *args, code=2).err

    err = refused("list", str(q), "--reason", "(unclosed")
    assert "--reason" in err and "not a valid regular expression" in err
    err = refused("purge", str(q), "--header", "tenant", "--yes")
    assert "--header" in err and "KEY=VALUE" in err
    err = refused("requeue", str(q), "--older-than", "soon")
    assert "--older-than" in err and "not a duration" in err
    assert "--attempts-at-least" in refused("list", str(q), "--attempts-at-least", "-1")
    assert "--all requeues everything" in refused("requeue", str(q), "--all", "--reason", "x")
    assert "not both" in refused("requeue", str(q), "--reason", "x", "--where-reason", "y")
    assert "--rate" in refused("requeue", str(q), "--rate", "0")
    assert _listed(q) == [1, 2, 3, 4, 5]  # nothing moved


def test_requeue_matching_moves_exactly_those(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build_varied(q)
    moved = ok("dlq", "requeue", q, "--header", "tenant=a", "--reason", "value", "--json")
    assert moved.json()["requeued"] == 1
    assert _main_payloads(q) == [b"v-a"]
    assert _listed(q) == [1, 2, 3, 5]
    assert ok("dlq", "requeue", q, "--attempts-at-least", "2").out.startswith("requeued 1 ")
    assert _main_payloads(q) == [b"v-a", b"t-a"]
    # --id with a filter: the given ids that match; an id not there is an error.
    assert ok("dlq", "requeue", q, "--id", "1", "--id", "3", "--older-than", "1h").out.startswith(
        "requeued 1 "
    )
    assert _main_payloads(q) == [b"v-a", b"t-a", b"old"]
    assert "no message 4" in fails("dlq", "requeue", q, "--id", "4").err
    assert _listed(q) == [3, 5]


def test_purge_matching_and_by_id(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build_varied(q)
    refused = fails("dlq", "purge", q, "--reason", "value")
    assert "2 messages" in refused.err and "--yes" in refused.err
    assert ok("dlq", "purge", q, "--reason", "value", "--yes").out == "purged 2 messages\n"
    assert _listed(q) == [1, 2, 5]
    assert ok("dlq", "purge", q, "--id", "5", "--header", "tenant=b", "--yes", "--json").json() == {
        "queue": str(q),
        "purged": 1,
    }
    assert _listed(q) == [1, 2]
    assert ok("dlq", "purge", q, "--header", "tenant=zzz").out == "purged 0 messages\n"
    assert _main_payloads(q) == []  # purge never requeues


def test_requeue_rate_paces_the_moves(tmp_path: Path) -> None:
    q = tmp_path / "q"
    with ledgerq.open(q, max_retries=1) as queue:
        queue.enqueue_batch([b"m%d" % i for i in range(12)])
        for message in queue.dequeue_batch(12):
            queue.nack(message.id, "boom")
        assert len(queue.dlq) == 12
    started = time.monotonic()
    assert ok("dlq", "requeue", q, "--rate", "20", "--json").json()["requeued"] == 12
    # 12 messages at 20/s in slices of 2 (a tenth of a second's worth): the last slice
    # starts 0.5 s after the first; the process itself only adds to that.
    assert time.monotonic() - started >= 0.5
    assert _main_payloads(q) == [b"m%d" % i for i in range(12)]


def test_requeue_with_a_delay_holds_the_messages_back(tmp_path: Path) -> None:
    q = tmp_path / "q"
    _build(q)
    assert ok("dlq", "requeue", q, "--delay", "3600", "--json").json()["requeued"] == 4
    with ledgerq.open(q) as queue:
        assert queue.peek(10) == []  # held back for an hour
        assert queue.stats().pending == 4
