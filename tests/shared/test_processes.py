"""Shared mode with real processes: producers, consumers, kill -9, and waits.

Workers (``_worker.py``) report each call after it returns; the test kills some with
SIGKILL while others go on, and checks what the reports promise: every returned
enqueue is in the queue (pending, dead-lettered or acked), ids are unique and strictly
increasing in log order, no message is leased to two live handles at once, an ack with
``sync="always"`` is never undone, the survivors keep working without reopening, and a
killed consumer's leases come back within a second as failed deliveries.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

import ledgerq
from tests._child import Children

from ._procs import Reports, start, start_holder, wait_until
from ._worker import payload, token_of


def log_ids(path: Path) -> list[int]:
    """The ids of every entry in the log, in log order (read without a lock)."""
    return [msg.id for msg in ledgerq.follow(path, timeout=0.05)]


def test_a_killed_consumers_leases_come_back_within_a_second(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        ids = q.enqueue_batch([payload(t) for t in range(5)])
        holder = start(children, "lease", path, "n=5")
        leased = [holder.line().split() for _ in ids]
        holder.wait_for("HELD")
        assert sorted(int(f[1]) for f in leased) == ids
        assert q.dequeue() is None, "every message is leased by the other process"
        assert q.stats().in_flight == 5
        holder.kill_and_drain()
        killed = time.monotonic()
        back = []
        while len(back) < 5:
            msg = q.dequeue(timeout=3)
            assert msg is not None, f"only {len(back)} of 5 leases came back within 3 s"
            back.append(msg)
        elapsed = time.monotonic() - killed
        assert elapsed < 1.0, f"the dead consumer's leases took {elapsed:.2f} s to come back"
        assert sorted(m.id for m in back) == ids
        assert {m.attempts for m in back} == {2}, "a lost lease is a failed delivery"
        for msg in back:
            q.ack(msg.id)
        assert q.stats().in_flight == 0


def test_close_returns_the_handles_leases_to_the_others(tmp_path: Path, children: Children) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        q.enqueue_batch([payload(t) for t in range(3)])
        holder = start_holder(children, path, 3)
        assert q.dequeue() is None
        holder.send("close")
        holder.wait_for("BYE")
        back = q.dequeue_batch(10)
        assert [(m.id, m.attempts) for m in back] == [(1, 2), (2, 2), (3, 2)]


WORKLOADS = {
    # Ack only: a message leased by a worker never killed is leased by no other survivor.
    "ack": ("sync='always'", "segment_size=16384", "index_interval=512", "max_retries=0"),
    # Nacks, retries into the DLQ, priorities, a rotation every few messages; a bound on
    # the backlog across the processes (producers outrun consumers: without it, judging
    # the tens of thousands of messages they would write costs most of the test).
    "nack": (
        "max_pending=500",
        "sync='interval'",
        "segment_size=2048",
        "index_interval=256",
        "max_retries=3",
        "priorities=True",
        "nack=0.3",
    ),
}


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_producers_and_consumers_with_kill9(
    tmp_path: Path, children: Children, workload: str
) -> None:
    """3 producers and 3 consumers, some killed at random moments and replaced."""
    path = tmp_path / "q"
    rng = random.Random(20240516)
    options = WORKLOADS[workload]
    queue_options = tuple(o for o in options if not o.startswith("nack="))
    # A handle of this process too: it must see everything and keep working.
    with ledgerq.open(path, shared=True, segment_size=16384) as here:
        producers: list[Reports] = []
        consumers: list[Reports] = []
        killed: list[Reports] = []
        base = 0

        def new_producer() -> None:
            nonlocal base
            batch = rng.choice([1, 1, 4])
            producers.append(
                Reports(
                    start(
                        children, "produce", path, *queue_options, f"base={base}", f"batch={batch}"
                    )
                )
            )
            base += 1_000_000

        def new_consumer() -> None:
            consumers.append(
                Reports(start(children, "consume", path, *options, f"seed={rng.random()}"))
            )

        for _ in range(3):
            new_producer()
            new_consumer()
        kill_times: list[float] = []
        for round_number in range(6):
            target = sum(r.count() for r in producers + consumers) + rng.randint(100, 400)
            wait_until(
                lambda goal=target: sum(r.count() for r in producers + consumers) >= goal,
                60,
                "progress",
            )
            pool = producers if rng.random() < 0.5 else consumers
            victim = pool.pop(rng.randrange(len(pool)))
            victim.stop()
            killed.append(victim)
            kill_times.append(time.monotonic())
            (new_producer if pool is producers else new_consumer)()
            here.enqueue(payload(999_000_000 + round_number))  # this handle goes on too
        last_kill = kill_times[-1]
        # The survivors keep working without reopening: reports after the last kill.
        wait_until(
            lambda: all(r.last_at() > last_kill + 0.2 for r in producers + consumers),
            30,
            "every surviving worker to report after the last kill",
        )
        # Enough work to judge, however slow this machine (nacks take turns from acks).
        wait_until(
            lambda: (
                sum(len(r.kinds("A")) for r in producers + consumers + killed) > 150
                and sum(len(r.kinds("E")) for r in producers + consumers + killed) > 600
            ),
            60,
            "150 acks and 600 enqueues",
        )
        for reports in producers + consumers:
            reports.stop()
        survivors = producers + consumers

    everyone = survivors + killed
    returned = [(int(i), int(t)) for r in everyone for i, t in r.kinds("E")]
    enqueued = dict(returned)
    assert len(enqueued) == len(returned), "two enqueues returned the same id"
    acked = {int(i) for r in everyone for (i,) in r.kinds("A")}
    assert len(acked) > 150 and len(enqueued) > 600, "too little work to judge"
    ids = log_ids(path)  # retention deleted the segments every reader had consumed
    assert ids == sorted(set(ids)), "ids must be unique and strictly increasing in log order"
    if workload == "ack":
        # No message leased to two live handles at once: without nacks or timeouts, a
        # message leased by a worker never killed is leased by no other survivor.
        live_leases: dict[int, int] = {}
        for number, reports in enumerate(consumers):
            for message_id, _, _ in reports.kinds("L"):
                other = live_leases.setdefault(int(message_id), number)
                assert other == number, f"message {message_id} leased by two live consumers"
    # Whatever is left is delivered once more, and nothing acked comes back.
    with ledgerq.open(path) as q:
        left = []
        while (msg := q.dequeue()) is not None:
            left.append(msg)
            q.ack(msg.id)
        dead = {int(m.headers["dlq.original_id"]) for m in q.dlq.peek(1 << 20)}
        stats = q.stats()
    again = {m.id for m in left}
    if workload == "nack":  # the bound held across the processes and their kills
        assert len(left) <= 500, f"{len(left)} messages unfinished, max_pending=500"
    assert not again & acked, f"acks undone: {sorted(again & acked)[:10]}"
    assert not dead & acked, f"acked and dead-lettered: {sorted(dead & acked)[:10]}"
    # Every worker ends killed; a consumer settles each lease right after it reports it,
    # so only its last lease may be settled unseen (killed between the call and its report).
    in_doubt = set()
    for reports in everyone:
        leases = reports.kinds("L")
        if leases and int(leases[-1][0]) not in acked:
            in_doubt.add(int(leases[-1][0]))
    lost = set(enqueued) - again - acked - dead - in_doubt
    assert not lost, (
        f"returned enqueues neither acked, dead nor delivered again: {sorted(lost)[:10]}"
    )
    missing = set(enqueued) - acked - dead - in_doubt - set(ids)
    assert not missing, f"returned enqueues neither acked nor in the log: {sorted(missing)[:10]}"
    for msg in left:
        if msg.id in enqueued:
            assert token_of(msg.payload) == enqueued[msg.id]
    assert stats.pending == 0 and stats.enqueued == ids[-1]  # no id skipped: closed cleanly


def test_a_blocked_dequeue_wakes_on_another_process_enqueue_without_spinning(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        waiter = start(children, "wait", path, "timeout=10")
        waiter.wait_for("WAITING")
        # Give it time to block (a wait that spins would burn CPU all along).
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            time.sleep(0.05)
        sent = time.monotonic()
        message_id = q.enqueue(b"wake up")
        fields = waiter.wait_for("W").split()
        waited, cpu, got, woke = (
            float(fields[1]),
            float(fields[2]),
            int(fields[3]),
            float(fields[4]),
        )
    assert got == message_id
    assert 1.0 <= waited < 2.0
    assert woke - sent < 0.05, f"woken {woke - sent:.3f} s after the enqueue"
    assert cpu < 0.1, f"the blocked process used {cpu:.3f} s of CPU in {waited:.1f} s: spinning?"
    waiter.expect_exit(0)


def test_a_blocked_dequeue_wakes_on_a_reclaimed_lease(tmp_path: Path, children: Children) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        q.enqueue(payload(1))
    holder = start_holder(children, path, 1)
    waiter = start(children, "wait", path, "timeout=10")
    waiter.wait_for("WAITING")
    holder.kill_and_drain()
    killed = time.monotonic()
    fields = waiter.wait_for("W").split()
    assert int(fields[3]) == 1
    assert float(fields[4]) - killed < 1.0
    waiter.expect_exit(0)


def test_the_polling_fallback_wakes_within_its_bound(tmp_path: Path, children: Children) -> None:
    """Where inotify is missing, the waiter looks at the files, at most 200 ms apart."""
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True) as q:
        waiter = start(children, "wait", path, "timeout=10", "poll=1")
        waiter.wait_for("WAITING")
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            time.sleep(0.05)
        sent = time.monotonic()
        q.enqueue(b"wake up")
        fields = waiter.wait_for("W").split()
    woke = float(fields[4])
    assert 0 <= woke - sent < 0.3, f"polling woke {woke - sent:.3f} s after the enqueue"
    assert float(fields[2]) < 0.2, "polling must back off, not spin"
    waiter.expect_exit(0)


def test_exclusive_and_shared_exclude_each_other_across_processes(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    ledgerq.open(path).close()
    holder = start(children, "hold", path)
    with pytest.raises(ledgerq.QueueLockedError, match="shared mode") as info:
        ledgerq.open(path)
    assert info.value.held_by == "shared"
    holder.send("close")
    holder.wait_for("BYE")
    holder.expect_exit(0)
    with ledgerq.open(path):
        tryer = children.start(["-c", _TRY_SHARED, str(path)])
        assert tryer.line() == "LOCKED exclusive"
        tryer.expect_exit(0)


_TRY_SHARED = """
import sys, ledgerq
try:
    ledgerq.open(sys.argv[1], shared=True).close()
    print("OPENED")
except ledgerq.QueueLockedError as exc:
    print("LOCKED", exc.held_by)
"""
