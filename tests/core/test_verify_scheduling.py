"""``ledgerq verify`` on queues with delays, groups and retry times."""

from __future__ import annotations

import json
from pathlib import Path

import ledgerq
from ledgerq import tools


def test_a_queue_with_scheduled_messages_verifies_clean(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, retry_delay=5, visibility_timeout=30) as q:
        q.enqueue(b"a", delay=60)
        q.enqueue(b"b", group="g")
        q.enqueue(b"c")
        msg = q.dequeue()
        assert msg is not None
        q.nack(msg.id)  # a NOT_BEFORE record: journal version 3
        msg = q.dequeue()
        assert msg is not None
        q.touch(msg.id)
        q.release(msg.id, delay=3)
    assert tools.verify(path).problems == ()


def test_a_delayed_entry_under_meta_version_1_is_reported(tmp_path: Path) -> None:
    # ledgerq raises the version before the first such entry; a meta.json put back by
    # hand (or a segment copied in) must not go unnoticed: an older ledgerq reading
    # version 1 would skip the message as damaged.
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue(b"plain")
        late = q.enqueue(b"later", delay=60)
    meta = json.loads((path / "meta.json").read_text())
    meta["version"] = 1
    (path / "meta.json").write_text(json.dumps(meta))
    problems = tools.verify(path).problems
    assert len(problems) == 1
    assert f"message {late} is delayed or grouped but meta.json says version 1" in str(problems[0])
