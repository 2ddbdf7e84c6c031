"""A shared-mode torture child: one process of several on one queue, until it is killed.

Usage: ``python -m tests.torture._shared_child CONFIG_JSON``.  The configuration names
the queue, its options, a *role*, the seed, the first token, and how this child is to
die: killed by the parent at a random moment, or by itself (SIGKILL) just before the
``nth`` file-changing system call made inside a chosen operation of the shared engine
(see :data:`TARGETS`), anywhere after its open, or inside its open (joining a queue
others use, or recovering it as the first handle of a session).

Roles: ``producer`` (enqueues and batches, with dedup ids), ``consumer`` (leases from
the main reader and acks or nacks - nacks move messages to the DLQ after
``max_retries`` failed deliveries), ``mixed`` (both, plus ``compact()`` and
``sync()``), ``audit`` (the named reader ``audit``: leases and acks everything).
Nothing reopens the queue: the process keeps its one handle until it dies.

Every report is one line written with one ``os.write`` *after* the call it reports
returned (whole or absent on a pipe), stamped with ``time.monotonic_ns()`` - one clock
for every process of the machine, so the parent can order reports of different
children:

    R <handle hex> <pid>                 the queue is open (``O`` before the open)
    B <t0> <op> <args...>                an operation starts at t0
    E <t1> <id> <token> <key|->          an enqueue returned (with a dedup key: the id may
                                         be another enqueue's, of any process)
    L <t1> <reader> <id> <attempts> <token>  a lease returned (reader ``-``: the main one)
    A <t1> <reader> <id>                 an ack returned
    N <t1> <reader> <id>                 a nack returned
    U <t1> <reader> <id> <why...>        an ack or nack raised UnknownMessageError: the
                                         lease had expired (only with a visibility timeout)
    D <t1> <dlq id> <original id> <token> <reader>  a message was written to the DLQ
    Z <t1>                               the operation returned

With a ``visibility_timeout``, a consumer now and then holds its leases for up to twice
that long before its next step (``B <t0> dawdle <ms>``: slow work), so leases expire in
the hands of live processes as well as dead ones.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import ledgerq
from ledgerq.core import journal
from ledgerq.core.shared_queue import SharedQueueCore
from ledgerq.core.shared_reader import SharedReaderCore
from ledgerq.segment.manager import SegmentManager
from ledgerq.segment.shared_manager import SharedSegmentManager
from tests.torture._child import Draws, Steps, checked_token, choose, emit, run_until_killed
from tests.torture._payload import make, token_of

# Where a child can be told to die: the calls (class, method) that arm its self-kill
# counter.  Each is a step of the shared engine that docs/architecture.md claims is safe
# under kill -9 ("Why it is correct under kill -9 at every step").
TARGETS: dict[str, tuple[tuple[type, str], ...]] = {
    # An append under the APPEND lock: the write of the entries, the index point.
    "append": ((SegmentManager, "append"), (SegmentManager, "append_one")),
    # A rotation: seal the index, create the next segment, publish the generation.
    "rotation": ((SharedSegmentManager, "rotate"),),
    # Retention deleting a segment every reader has consumed, under APPEND.
    "retention": ((SharedSegmentManager, "delete_first"),),
    # A reader journal rewritten as one checkpoint (temp file, fsync, rename).
    "compaction": ((SharedReaderCore, "checkpoint"),),
    # A move to the DLQ: the copy in the DLQ, the retry record, DEAD_LETTER.
    "dlq_move": ((SharedReaderCore, "_report_failure"),),
    # A housekeeper writing RECLAIM of a dead handle's leases (another victim's).
    "reclaim": ((SharedQueueCore, "_reclaim_dead"),),
}
ROLES = ("producer", "consumer", "mixed", "audit")
AUDIT = "audit"


def now() -> int:
    return time.monotonic_ns()


class SharedWorkload(Draws):
    """Random operations of one role on one shared handle; every one reported."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config, keys=40, key_share=0.3)
        self.role: str = config["role"]
        self.nack_share: float = config.get("nack", 0.25)
        self.visibility: float | None = self.options.get("visibility_timeout")
        self.q = ledgerq.open(config["path"], shared=True, **self.options)
        self.reader: Any = self.q.reader(AUDIT) if self.role == AUDIT else self.q
        self.reader_name = AUDIT if self.role == AUDIT else "-"
        self.leased: list[int] = []
        self._report_dlq_moves()
        # What a step of each role does (see choose), one random draw a step.
        consume: Steps = ((1.0, self.consume),)
        self.steps: Steps = {
            "producer": ((0.7, self.enqueue), (1.0, self.batch)),
            "consumer": consume,
            AUDIT: consume,
            "mixed": (
                (0.25, self.enqueue),
                (0.35, self.batch),
                (0.95, self.consume),
                (0.975, self.compact),
                (1.0, self.sync),
            ),
        }[self.role]

    def _report_dlq_moves(self) -> None:
        dlq = self.q.dlq
        dlq_enqueue = dlq.enqueue

        def reported(payload: bytes, **kwargs: Any) -> int:
            dlq_id = dlq_enqueue(payload, **kwargs)
            headers = kwargs["headers"]
            original, reader = headers["dlq.original_id"], headers.get("dlq.reader", "-")
            emit(f"D {now()} {dlq_id} {original} {token_of(payload)} {reader}\n")
            return dlq_id

        dlq.enqueue = reported  # type: ignore[method-assign]

    # ------------------------------------------------------------------ operations

    def enqueue(self) -> None:
        made, key = self._next()
        emit(f"B {now()} enq {made.token} {key or '-'}\n")
        message_id = self.q.enqueue(
            made.payload, headers=made.headers, priority=made.priority, dedup_id=key
        )
        emit(f"E {now()} {message_id} {made.token} {key or '-'}\n")

    def batch(self) -> None:
        tokens, keys = self._next_batch(6)
        emit(f"B {now()} batch {tokens[0]} {len(tokens)} {','.join(k or '-' for k in keys)}\n")
        items = [
            ledgerq.Item(made.payload, headers=made.headers, priority=made.priority, dedup_id=k)
            for made, k in zip(map(make, tokens), keys, strict=True)
        ]
        ids = self.q.enqueue_batch(items)
        t1 = now()
        emit(
            "".join(
                f"E {t1} {i} {t} {k or '-'}\n" for i, t, k in zip(ids, tokens, keys, strict=True)
            )
        )

    def dequeue(self) -> None:
        n = self.rng.randint(1, 3)
        emit(f"B {now()} deq {n}\n")
        got = self.reader.dequeue_batch(n)
        t1 = now()
        lines = []
        for msg in got:
            token = checked_token(msg, emit, moved=True)
            lines.append(f"L {t1} {self.reader_name} {msg.id} {msg.attempts} {token}\n")
            if msg.id not in self.leased:  # (else its lease expired and came back here)
                self.leased.append(msg.id)
        if lines:
            emit("".join(lines))

    def settle(self) -> None:
        """Ack (or, on the main reader, sometimes nack) one held lease."""
        message_id = self.leased.pop(self.rng.randrange(len(self.leased)))
        nack = self.role != AUDIT and self.rng.random() < self.nack_share
        emit(f"B {now()} {'nack' if nack else 'ack'} {self.reader_name} {message_id}\n")
        try:
            if nack:
                self.reader.nack(message_id, f"nack:{message_id}")
            else:
                self.reader.ack(message_id)
        except ledgerq.UnknownMessageError as exc:
            if self.visibility is None:
                # Our lease was taken from us: say why (the parent fails the run).
                emit(f"X lease of {message_id} lost: {exc}\n")
                raise
            # It may have expired: the parent judges by the times (and it must come back).
            why = str(exc).split(": ")[-1].replace("\n", " ")[:120]
            emit(f"U {now()} {self.reader_name} {message_id} {why}\n")
            return
        emit(f"{'N' if nack else 'A'} {now()} {self.reader_name} {message_id}\n")

    def dawdle(self) -> None:
        """Hold the leases a while (slow work): long enough, often, for them to expire."""
        assert self.visibility is not None
        seconds = self.rng.uniform(0.0, 2.0 * self.visibility)
        emit(f"B {now()} dawdle {int(seconds * 1000)}\n")
        time.sleep(seconds)

    def consume(self) -> None:
        # Mostly settle what is held at once; keep up to a few leases across steps so
        # that a kill often finds this handle holding leases.
        if self.visibility is not None and self.leased and self.rng.random() < 0.02:
            self.dawdle()
        elif len(self.leased) > 3 or (self.leased and self.rng.random() < 0.6):
            self.settle()
        else:
            self.dequeue()

    def compact(self) -> None:
        emit(f"B {now()} compact\n")
        self.q.compact()

    def sync(self) -> None:
        emit(f"B {now()} sync\n")
        self.q.sync()

    def step(self) -> None:
        choose(self.rng.random(), self.steps)()
        emit(f"Z {now()}\n")


def main(argv: list[str]) -> None:
    config = json.loads(argv[1])
    # Compact reader journals after a few KiB instead of 1 MiB, so compactions (and
    # kills inside them) happen all the time.
    journal._COMPACT_MIN_BYTES = config.get("compact_bytes", 4096)
    run_until_killed(
        config,
        TARGETS,
        SharedWorkload,
        lambda work: f"R {work.q.handle_id:016x} {os.getpid()}\n",  # type: ignore[attr-defined]
    )


if __name__ == "__main__":
    main(sys.argv)
