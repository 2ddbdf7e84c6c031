"""Group commit: concurrent writers that wait for durability share fsyncs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from ledgerq.segment.sync import GroupCommit


def wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll ``condition`` (a state other threads reach) until it holds or time is up."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the other threads never got there")
        threading.Event().wait(0.001)


class BlockingSync:
    """A sync function that records what each round covered and can be held."""

    def __init__(self, commit: Callable[[], GroupCommit]) -> None:
        self._commit = commit
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()
        self.covered: list[int] = []  # the write count each fsync started with

    def __call__(self) -> None:
        self.covered.append(self._commit()._written)
        self.entered.set()
        self.release.wait()


def test_writers_waiting_during_an_fsync_share_the_next_one() -> None:
    commit: GroupCommit
    sync = BlockingSync(lambda: commit)
    commit = GroupCommit(sync)
    sync.release.clear()
    first = threading.Thread(target=commit.wait_durable, args=(commit.note_write(),))
    first.start()
    assert sync.entered.wait(10)  # the first round is in its fsync

    writers = [
        threading.Thread(target=commit.wait_durable, args=(commit.note_write(),)) for _ in range(8)
    ]
    for w in writers:
        w.start()
    wait_until(lambda: commit._waiting == 9)  # all of them wait for the next round
    sync.release.set()
    first.join(10)
    for w in writers:
        w.join(10)
    assert not first.is_alive() and not any(w.is_alive() for w in writers)
    assert commit.rounds == 2, "the 8 later writers should have shared one fsync"
    assert sync.covered == [1, 9]
    assert not commit.is_dirty


def test_a_lone_writer_does_not_wait_for_company() -> None:
    calls: list[int] = []
    commit = GroupCommit(lambda: calls.append(1))
    for _ in range(50):
        commit.wait_durable(commit.note_write())
    assert commit.rounds == 50 and not commit.is_dirty
    assert commit._crowded is False


def test_a_failed_fsync_raises_to_its_waiter_and_the_next_round_retries() -> None:
    outcomes = [OSError(5, "EIO"), None]

    def sync() -> None:
        outcome = outcomes.pop(0)
        if outcome is not None:
            raise outcome

    commit = GroupCommit(sync)
    ticket = commit.note_write()
    with pytest.raises(OSError):
        commit.wait_durable(ticket)
    assert commit.is_dirty  # not durable: the failed round published nothing
    commit.wait_durable(ticket)
    assert not commit.is_dirty
