"""Misuse that must fail loudly, before anything changes (issue 15 items 9, 14, 17).

Each test is one thing a user did - requeue DLQ ids given as a string, pickle a queue to
send it to a worker, put 100 MB in a header, open ``""`` - on real queue directories.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import ledgerq
import ledgerq.aio


@pytest.fixture
def dead(tmp_path: Path) -> Iterator[ledgerq.Queue]:
    """A queue with messages 1..12 in its DLQ (DLQ ids 1..12) and 3 pending."""
    with ledgerq.open(tmp_path / "q", sync="never", max_retries=1) as q:
        q.enqueue_batch([b"dead-%d" % n for n in range(1, 13)])
        for message in q.dequeue_batch(12):
            q.nack(message.id, "boom")
        q.enqueue_batch([b"live-1", b"live-2", b"live-3"])
        assert len(q.dlq) == 12
        yield q


# ---------------------------------------------------------------- ids (item 14)


@pytest.mark.parametrize(
    "ids", ["12", b"12", bytearray(b"12"), [1.5], [True], [1, "2"], [None], 12, 3.0]
)
def test_requeue_dlq_refuses_ids_that_are_not_ints_and_moves_nothing(
    dead: ledgerq.Queue, ids: object
) -> None:
    with pytest.raises(TypeError, match=r"ids must be an iterable|message id must be an int"):
        dead.requeue_dlq(ids)  # type: ignore[arg-type]
    assert len(dead.dlq) == 12, "nothing left the DLQ"
    assert len(dead) == 3, "nothing came back"


@pytest.mark.parametrize("ids", ["12", b"1", [1.0], [False], 7])
def test_purge_refuses_ids_that_are_not_ints_and_removes_nothing(
    dead: ledgerq.Queue, ids: object
) -> None:
    with pytest.raises(TypeError):
        dead.purge(ids)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        dead.dlq.purge(ids)  # type: ignore[arg-type]
    assert (len(dead), len(dead.dlq)) == (3, 12)


def test_asyncio_requeue_dlq_checks_ids_the_same_way(dead: ledgerq.Queue) -> None:
    aq = ledgerq.aio.AsyncQueue(dead)
    with pytest.raises(TypeError, match="ids must be an iterable"):
        asyncio.run(aq.requeue_dlq("12"))  # type: ignore[arg-type]
    assert len(dead.dlq) == 12
    assert asyncio.run(aq.requeue_dlq(i for i in (1, 2))) == 2, "a generator is read once"
    assert len(dead.dlq) == 10


def test_int_ids_still_move_exactly_those(dead: ledgerq.Queue) -> None:
    assert dead.requeue_dlq([12]) == 1
    assert dead.requeue_dlq((1, 2)) == 2
    assert sorted(int(m.headers["dlq.original_id"]) for m in dead.dlq.peek(20)) == list(
        range(3, 12)
    )
    assert dead.purge({13, 14}) == 2, "live-1 and live-2 (ids 13, 14) removed"
