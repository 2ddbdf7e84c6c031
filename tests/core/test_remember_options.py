"""``ledgerq.open(..., remember_options=False)``: options for one run, not stored.

A tool that overrides an option for one run (the CLI's ``-o``) must not change what
the application gets at its next ``ledgerq.open(path)``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ledgerq


def test_overrides_apply_and_are_not_stored(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, max_retries=5, dedup_window=60.0):
        pass
    with ledgerq.open(path, remember_options=False, max_retries=1, priorities=True) as q:
        assert q.options.max_retries == 1 and q.options.priorities
        assert q.options.dedup_window == 60.0  # the stored options still apply
        q.enqueue(b"x")
        q.dequeue()  # leases, acks, id reservations all save meta.json
    with ledgerq.open(path) as q:
        assert q.options.max_retries == 5
        assert not q.options.priorities
        assert q.options.dedup_window == 60.0


def test_a_new_queue_opened_so_stores_no_options(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, remember_options=False, max_retries=9, sync="always") as q:
        q.enqueue(b"x")
        msg = q.dequeue()
        assert msg is not None
        q.nack(msg.id)
        q.requeue_dlq()  # opens (creates) the DLQ: it stores nothing either
    # (The DLQ first: opening the queue opens its DLQ, remembering this time.)
    with ledgerq.open(path / "dlq") as dlq:
        assert dlq.options == ledgerq.Options()
    with ledgerq.open(path) as q:
        assert q.options == ledgerq.Options()


def test_remembering_stays_the_default(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, remember_options=True, max_retries=7):
        pass
    with ledgerq.open(path) as q:
        assert q.options.max_retries == 7


def test_remember_options_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="remember_options must be a bool"):
        ledgerq.open(tmp_path / "q", remember_options=0)  # type: ignore[arg-type]
    assert not (tmp_path / "q").exists()
