"""Several shared handles of one process on one queue, driven at random on one clock.

Handles of one process exclude each other as processes do, so this is the shared
engine's coordination (journals caught up, leases, expiries, compactions, retention,
closes) without processes, kills or timing: each run is a function of its seed, and a
few thousand steps take about a second.  The clock is the test's (``clock=``): leases
expire when a step moves it past their visibility timeout.

Steps, on a random handle: enqueue 1-4 messages (a priority each, with priorities on);
dequeue 1-3; ack or nack one of its leases (``UnknownMessageError``: it expired, which
the model allows); ``compact()``; close and open again (its leases come back); or move
the clock on by up to 0.4 s.  Checked at every delivery and at the end (a drain by an
exclusive handle):

* no message whose ack returned is delivered again;
* attempts grow with every delivery of a message;
* nothing lost: every enqueued message was acked or is delivered by the drain
  (``max_retries=0``: nothing is dead-lettered).

Found issue 25 item 7's two losses (docs/reliability.md, bugs 36 and 37).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import ledgerq
from ledgerq.core import journal
from tests.torture._model import ModelError

__all__ = ["run_handles_fuzz"]

_WALL = 1_800_000_000_000_000_000


class _Time:
    """Monotonic nanoseconds, shared by the handles' clocks."""

    now = 1_000_000_000_000


class _Clock:
    """One handle's clock: the shared monotonic time, a wall clock ``skew`` ns off."""

    def __init__(self, skew: int) -> None:
        self._wall = _WALL + skew

    def time_ns(self) -> int:
        return self._wall + _Time.now

    def monotonic_ns(self) -> int:
        return _Time.now


def run_handles_fuzz(
    path: Path,
    seed: int,
    *,
    steps: int = 2000,
    handles: int = 3,
    priorities: bool = False,
    visibility_timeout: float | None = 0.5,
    skew: float = 0.0,
) -> None:
    """One run on a new queue at ``path``; raise :class:`ModelError` on a broken promise.

    ``skew``: each handle's wall clock is up to that many seconds ahead (their queue
    clocks then differ as those of processes opened at different moments can).
    """
    rng = random.Random(seed)
    where = f"handles fuzz seed={seed} priorities={priorities} timeout={visibility_timeout}"
    shutil.rmtree(path, ignore_errors=True)
    options: dict[str, Any] = {
        "visibility_timeout": visibility_timeout,
        "max_retries": 0,
        "segment_size": 1024,
        "priorities": priorities,
    }
    compact_bytes = journal._COMPACT_MIN_BYTES
    journal._COMPACT_MIN_BYTES = 512  # compactions all the time
    try:
        with ledgerq.open(path, **options):
            pass

        def new_handle() -> ledgerq.Queue:
            clock = _Clock(rng.randrange(int(skew * 1e9) + 1))
            return ledgerq.open(path, shared=True, clock=clock, **options)

        queues = [new_handle() for _ in range(handles)]
        held: list[set[int]] = [set() for _ in queues]
        enqueued: set[int] = set()
        acked: dict[int, int] = {}  # id -> step
        attempts: dict[int, int] = {}
        try:
            for step in range(steps):
                n = rng.randrange(handles)
                q, r = queues[n], rng.random()
                if r < 0.2:
                    for _ in range(rng.randint(1, 4)):
                        priority = {"priority": rng.randint(0, 2)} if priorities else {}
                        enqueued.add(q.enqueue(b"x" * rng.randint(1, 50), **priority))
                elif r < 0.5:
                    for msg in q.dequeue_batch(rng.randint(1, 3)):
                        if msg.id in acked:
                            raise ModelError(
                                f"{where}: step {step}: message {msg.id} delivered "
                                f"(attempt {msg.attempts}) after its ack at step {acked[msg.id]}"
                            )
                        if msg.attempts <= attempts.get(msg.id, 0):
                            raise ModelError(
                                f"{where}: step {step}: message {msg.id} delivered with "
                                f"attempt {msg.attempts} after {attempts[msg.id]}"
                            )
                        attempts[msg.id] = msg.attempts
                        held[n].add(msg.id)
                elif r < 0.8 and held[n]:
                    message_id = rng.choice(sorted(held[n]))
                    held[n].discard(message_id)
                    try:
                        if rng.random() < 0.3:
                            q.nack(message_id, "fuzz")
                        else:
                            q.ack(message_id)
                            acked[message_id] = step
                    except ledgerq.UnknownMessageError:
                        pass  # its lease expired (and may be another handle's now)
                elif r < 0.95:
                    _Time.now += int(rng.uniform(0, 0.4) * 1e9)
                elif r < 0.98:
                    q.compact()
                else:
                    q.close()
                    held[n] = set()
                    queues[n] = new_handle()
        finally:
            for q in queues:
                q.close()
        drained: set[int] = set()
        with ledgerq.open(path, clock=_Clock(0), **{**options, "visibility_timeout": None}) as q:
            while batch := q.dequeue_batch(64):
                for msg in batch:
                    if msg.id in acked:
                        raise ModelError(f"{where}: the drain delivered acked message {msg.id}")
                    drained.add(msg.id)
                    q.ack(msg.id)
        lost = enqueued - set(acked) - drained
        if lost:
            raise ModelError(
                f"{where}: {len(lost)} of {len(enqueued)} messages lost (neither acked nor "
                f"in the drain): {sorted(lost)[:10]}"
            )
    finally:
        journal._COMPACT_MIN_BYTES = compact_bytes
        shutil.rmtree(path, ignore_errors=True)
