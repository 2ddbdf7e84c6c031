"""``workers.run(..., forward_to=)``: what the handler returns is forwarded, once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import ledgerq
import ledgerq.workers


def _results(message: ledgerq.Message) -> object:
    kind = message.payload
    if kind == b"bytes":
        return b"out:bytes"
    if kind == b"item":
        return ledgerq.Item(b"out:item", headers={"from": str(message.id)})
    if kind == b"list":
        return [b"out:list.1", ledgerq.Item(b"out:list.2")]
    if kind == b"none":
        return None
    if kind == b"text":
        return "not bytes"
    if kind == b"lambda":
        return lambda: None  # cannot cross the pipe
    raise ValueError(f"bad job {kind!r}")


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "exclusive"])
def test_what_the_handler_returns_is_forwarded(tmp_path: Path, shared: bool) -> None:
    with ledgerq.open(tmp_path / "in", shared=shared) as q:
        q.enqueue_batch([b"bytes", b"item", b"list", b"none", b"text", b"lambda", b"boom"])
    report = ledgerq.workers.run(
        tmp_path / "in",
        _results,
        processes=2,
        until_empty=True,
        shared=shared,
        max_retries=1,
        forward_to=tmp_path / "out",
    )
    assert report.processed == 4
    assert report.failed == 3
    assert report.dead_lettered == 3
    with ledgerq.open(tmp_path / "out", shared=shared) as out:
        got = {m.payload: m.headers for m in out.peek(10)}
    assert set(got) == {b"out:bytes", b"out:item", b"out:list.1", b"out:list.2"}
    assert got[b"out:item"] == {"from": "2"}
    with ledgerq.open(tmp_path / "in", shared=shared, max_retries=1) as q:
        reasons = {m.payload: m.headers["dlq.failure_reason"] for m in q.dlq.peek(10)}
    assert reasons[b"text"].startswith("forward: TypeError: forward's items must be bytes")
    assert "cannot be forwarded" in reasons[b"lambda"]
    assert reasons[b"boom"] == "ValueError: bad job b'boom'"


def test_forward_to_beside_a_consumer_of_the_target(tmp_path: Path) -> None:
    """The target is opened shared: the next stage consumes it while this one runs."""
    with ledgerq.open(tmp_path / "in", shared=True) as q:
        q.enqueue_batch([b"bytes"] * 50)
    got: list[bytes] = []
    done = threading.Event()

    def next_stage() -> None:
        with ledgerq.open(tmp_path / "out", shared=True) as out:
            while len(got) < 50:
                msg = out.dequeue(timeout=30)
                assert msg is not None
                got.append(msg.payload)
                out.ack(msg.id)
        done.set()

    with ledgerq.open(tmp_path / "out", shared=True):
        consumer = threading.Thread(target=next_stage)
        consumer.start()
        report = ledgerq.workers.run(
            tmp_path / "in", _results, processes=2, until_empty=True, forward_to=tmp_path / "out"
        )
        consumer.join(60)
    assert done.is_set()
    assert report.processed == 50
    assert got == [b"out:bytes"] * 50


def test_forward_to_must_be_a_path(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="forward_to must be a queue path"):
        ledgerq.workers.run(tmp_path / "in", _results, forward_to=42)  # type: ignore[arg-type]
    assert not (tmp_path / "in").exists()
    with pytest.raises(ValueError, match="forward_to is the queue the pool consumes"):
        ledgerq.workers.run(tmp_path / "in", _results, forward_to=tmp_path / "." / "in")
    assert not (tmp_path / "in").exists()
