"""The retry policy and ``nack(..., delay=)``.

Every failed delivery - a nack without ``delay``, an expired visibility timeout, a
lease lost to a reopen - waits ``min(retry_delay * retry_backoff**(n-1),
retry_delay_max)`` seconds (less a random fraction of at most ``retry_jitter``); the
wait is in the reader journal (NOT_BEFORE records, version 3), so a reopen does not
shorten it.  Attempts and the dead-letter rules are unchanged.  Time is a clock the
test moves.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest

import ledgerq
from ledgerq.core.retry import RetryPolicy
from ledgerq.format import reader_state as state_mod
from ledgerq.format.checksum import checksum_v1
from ledgerq.format.reader_state import STATE_FILE_HEADER
from tests.clocks import SECOND, SteppedClock


@pytest.fixture
def clock() -> SteppedClock:
    return SteppedClock()


def journal_version(path: Path, reader: str = "default") -> int:
    header = (path / "readers" / f"{reader}.state").read_bytes()[: STATE_FILE_HEADER.size]
    return state_mod.state_file_version(header)


def take(q: ledgerq.Queue) -> ledgerq.Message:
    msg = q.dequeue()
    assert msg is not None
    return msg


def test_the_policy_backs_off_to_its_maximum() -> None:
    policy = RetryPolicy(1.0, 2.0, 10.0, 0.0)
    assert [policy.delay_s(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert policy.delay_s(10_000) == 10  # no overflow
    jittered = RetryPolicy(8.0, 1.0, 100.0, 0.5)
    delays = [jittered.delay_ns(1) / SECOND for _ in range(200)]
    assert all(4.0 <= d <= 8.0 for d in delays)
    assert len(set(delays)) > 1
    assert RetryPolicy.from_options(ledgerq.Options()) is None  # the default: at once


def test_each_failed_nack_waits_longer(tmp_path: Path, clock: SteppedClock) -> None:
    opts = {"retry_delay": 1.0, "retry_backoff": 3.0, "max_retries": 0}
    with ledgerq.open(tmp_path / "q", clock=clock, **opts) as q:
        q.enqueue(b"job")
        for attempt, wait in [(1, 1.0), (2, 3.0), (3, 9.0)]:
            msg = take(q)
            assert msg.attempts == attempt
            q.nack(msg.id, "down")
            assert (len(q), q.stats().delayed) == (1, 1)
            clock.elapse(wait - 0.001)
            assert q.dequeue() is None and q.peek() == []
            clock.elapse(0.001)
        assert take(q).attempts == 4
        assert q.stats().nacked == 3


def test_a_nack_delay_overrides_the_policy(tmp_path: Path, clock: SteppedClock) -> None:
    with ledgerq.open(tmp_path / "q", clock=clock) as q:  # no policy: at once
        q.enqueue(b"job")
        q.nack(take(q).id, delay=5)
        clock.elapse(4.9)
        assert q.dequeue() is None
        clock.elapse(0.1)
        q.nack(take(q).id)  # the default policy: back at once
        msg = take(q)
        assert msg.attempts == 3
    with ledgerq.open(tmp_path / "p", clock=clock, retry_delay=60) as q:
        q.enqueue(b"job")
        q.nack(take(q).id, delay=0)  # 0: at once, whatever the policy
        assert take(q).attempts == 2


def test_dead_letter_rules_are_unchanged(tmp_path: Path, clock: SteppedClock) -> None:
    with ledgerq.open(tmp_path / "q", clock=clock, retry_delay=10, max_retries=2) as q:
        mid = q.enqueue(b"job")
        q.nack(take(q).id, "one")
        clock.elapse(10)
        q.nack(take(q).id, "two")  # the second failure: to the DLQ at once
        stats = q.stats()
        assert (stats.pending, stats.delayed, stats.dead_lettered) == (0, 0, 1)
        dead = q.dlq.dequeue()
        assert dead is not None and dead.headers["dlq.original_id"] == str(mid)
        assert dead.headers["dlq.retry_count"] == "2"


def test_an_expired_visibility_timeout_waits_the_policy(
    tmp_path: Path, clock: SteppedClock
) -> None:
    opts = {"retry_delay": 5.0, "visibility_timeout": 2.0}
    with ledgerq.open(tmp_path / "q", clock=clock, **opts) as q:
        q.enqueue(b"job")
        take(q)
        clock.elapse(2)
        assert q.dequeue() is None  # the lease expired now: it waits 5 s
        assert q.stats().delayed == 1
        clock.elapse(4.9)
        assert q.dequeue() is None
        clock.elapse(0.1)
        assert take(q).attempts == 2


def test_a_lease_lost_to_a_reopen_waits_the_policy(tmp_path: Path, clock: SteppedClock) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, clock=clock, retry_delay=5.0) as q:
        q.enqueue(b"job")
        take(q)  # never acked
    with ledgerq.open(path, clock=clock) as q:
        assert q.dequeue() is None
        assert q.stats().delayed == 1
    clock.elapse(3)
    with ledgerq.open(path, clock=clock) as q:
        assert q.dequeue() is None  # the wait began at the first reopen: not again
        clock.elapse(2)
        msg = take(q)
        assert msg.attempts == 2


def test_a_reopen_does_not_shorten_a_retry_delay(tmp_path: Path, clock: SteppedClock) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, clock=clock, retry_delay=10.0, max_retries=3) as q:
        q.enqueue(b"job")
        q.nack(take(q).id, "down")
        assert journal_version(path) == 3
    clock.elapse(6)
    with ledgerq.open(path, clock=clock) as q:
        assert q.dequeue() is None and q.peek() == []
        assert (q.stats().pending, q.stats().delayed) == (1, 1)
        q.compact()  # a checkpoint keeps the time (its sixth element)
    clock.elapse(3)
    with ledgerq.open(path, clock=clock) as q:
        assert q.dequeue() is None
        clock.elapse(1)
        msg = take(q)
        assert msg.attempts == 2
        q.ack(msg.id)
        q.compact()
    # Nothing pending any more: still version 3, the only version this ledgerq writes.
    assert journal_version(path) == 3


def test_a_ledgerq_without_retry_delays_refuses_such_a_journal(
    tmp_path: Path, clock: SteppedClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, clock=clock) as q:
        q.enqueue(b"job")
        q.nack(take(q).id, delay=60)
    monkeypatch.setattr(state_mod, "STATE_VERSION", 2)
    with pytest.raises(ledgerq.LedgerQError, match="upgrade ledgerq"):
        ledgerq.open(path, clock=clock)


def test_named_readers_have_their_own_retry_times(tmp_path: Path, clock: SteppedClock) -> None:
    with ledgerq.open(tmp_path / "q", clock=clock, retry_delay=4.0) as q:
        audit = q.reader("audit")
        mid = q.enqueue(b"job")
        msg = audit.dequeue()
        assert msg is not None
        audit.nack(msg.id)
        assert take(q).id == mid  # the default reader is not delayed
        assert audit.dequeue() is None
        clock.elapse(4)
        again = audit.dequeue()
        assert again is not None and again.attempts == 2


def test_shared_handles_see_each_others_retry_delays(tmp_path: Path, clock: SteppedClock) -> None:
    path = tmp_path / "q"
    with (
        ledgerq.open(path, shared=True, clock=clock) as first,
        ledgerq.open(path, shared=True, clock=clock) as second,
    ):
        first.enqueue(b"job")
        msg = first.dequeue()
        assert msg is not None
        first.nack(msg.id, delay=30)
        assert second.dequeue() is None and first.dequeue() is None
        clock.elapse(30)
        again = second.dequeue()
        assert again is not None and again.attempts == 2


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("retry_delay", -1),
        ("retry_delay", math.nan),
        ("retry_delay", "1"),
        ("retry_backoff", 0.5),
        ("retry_backoff", math.nan),
        ("retry_backoff", math.inf),
        ("retry_delay_max", -0.1),
        ("retry_jitter", -0.1),
        ("retry_jitter", 1.5),
        ("retry_jitter", True),
    ],
)
def test_bad_retry_options_raise_config_error(tmp_path: Path, option: str, value: object) -> None:
    with pytest.raises(ledgerq.ConfigError, match=option):
        ledgerq.open(tmp_path / "q", **{option: value})  # type: ignore[arg-type]
    assert not (tmp_path / "q").exists() or not (tmp_path / "q" / "meta.json").exists()


@pytest.mark.parametrize(
    ("delay", "error"), [(-1, ValueError), (math.nan, ValueError), ("1", TypeError)]
)
def test_a_bad_nack_delay_changes_nothing(tmp_path: Path, delay: object, error: type) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        q.enqueue(b"job")
        msg = take(q)
        with pytest.raises(error, match="delay"):
            q.nack(msg.id, delay=delay)  # type: ignore[arg-type]
        assert q.stats().in_flight == 1 and q.stats().nacked == 0
        q.ack(msg.id)


@pytest.mark.parametrize("how", ["expiry", "lost lease"])
def test_the_first_retry_wait_keeps_acks_made_out_of_order(
    tmp_path: Path, clock: SteppedClock, how: str
) -> None:
    # The first NOT_BEFORE of a journal rewrites it as a version 3 checkpoint while the
    # failed message is out of its lease (or out of the selector): that checkpoint's
    # head once passed it, dropping the acks above it - an acked message came back.
    path = tmp_path / "q"
    opts = {"retry_delay": 2.0, "visibility_timeout": 30.0}
    with ledgerq.open(path, clock=clock, **opts) as q:
        first, second = q.enqueue(b"a"), q.enqueue(b"b")
        assert take(q).id == first
        q.ack(take(q).id)  # acked above a message still leased
        if how == "expiry":
            clock.elapse(30)
            assert q.dequeue() is None  # first's lease expired: it waits 2 s
    if how == "lost lease":
        with ledgerq.open(path, clock=clock, **opts) as q:
            assert q.dequeue() is None  # first's lease was lost: it waits 2 s
    clock.elapse(2)
    with ledgerq.open(path, clock=clock, **opts) as q:
        assert (q.stats().pending, q.stats().acked) == (1, 1)
        msg = take(q)
        assert (msg.id, msg.attempts) == (first, 2)
        q.ack(msg.id)
        assert q.dequeue() is None, f"acked message {second} came back"


def test_an_older_journal_holding_a_retry_time_is_upgraded_with_it(
    tmp_path: Path, clock: SteppedClock
) -> None:
    # Journals of version 1 and 2 (CRC-32) are rewritten as version 3 at open, record by
    # record.  None was written with a NOT_BEFORE, but one that holds it keeps its wait
    # through the rewrite (the rewrite once failed on it with a ValueError).
    path = tmp_path / "q"
    with ledgerq.open(path, clock=clock) as q:
        q.enqueue(b"job")
        q.nack(take(q).id, delay=60)
    journal = path / "readers" / "default.state"
    data = journal.read_bytes()
    # The clean close left one checkpoint holding the wait: split it into a checkpoint
    # without it and a NOT_BEFORE record, each checksummed as version 2 files are.
    kind, body, _ = state_mod.decode_state_record(data, STATE_FILE_HEADER.size)
    assert kind is state_mod.StateRecordType.CHECKPOINT and isinstance(body, bytes)
    checkpoint = state_mod.decode_checkpoint(body)
    ((message_id, due_ns),) = checkpoint.not_before
    head = checkpoint._replace(not_before=[])
    framed = struct.pack(
        "<IBQQ", 5 + 16 + 4, state_mod.StateRecordType.NOT_BEFORE, due_ns, message_id
    )
    old = [
        STATE_FILE_HEADER.pack(state_mod.STATE_MAGIC, 2),
        state_mod.encode_checkpoint(head, checksum_v1),
        framed + struct.pack("<I", checksum_v1(framed)),
    ]
    journal.write_bytes(b"".join(old))
    clock.elapse(30)
    with ledgerq.open(path, clock=clock) as q:
        assert journal_version(path) == 3
        assert q.dequeue() is None and q.stats().delayed == 1
        clock.elapse(30)
        assert take(q).attempts == 2
