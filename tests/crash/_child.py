"""A child process for the crash tests: runs a workload on a queue until it is killed.

Usage: python _child.py MODE PATH SYNC SEED TOKEN_BASE SEGMENT_SIZE

It reports on stdout, one line per event, each written with a single ``os.write`` (so
a line is whole or absent) and only *after* the call it reports has returned:

    B <n>                                   an enqueue of n messages is about to start
    E <id> <token>                          (one per message of the call) it returned id
    L <id> <attempts> <token> <ok> <intent> dequeue returned this lease; ok is 1 when
                                            payload and headers are the ones of token;
                                            intent is what the child does next: ack/keep
    A <id>                                  ack(id) returned
    O                                       ledgerq.open is about to be called
    R                                       (hold) the queue is open
    LOCKED <message> / OPENED               (tryopen) what ledgerq.open did

Modes: ``enqueue`` (enqueue and enqueue_batch forever), ``mixed`` (enqueue, dequeue and
ack some of the leases, forever), ``hold`` (open, then enqueue one message per ``enq``
line on stdin until stdin closes), ``tryopen`` (try to open once and exit).
"""

from __future__ import annotations

import os
import random
import sys

from _payload import make_item, make_message, matches, token_of

import ledgerq


def emit(text: str) -> None:
    data = text.encode()
    written = os.write(1, data)  # <= PIPE_BUF bytes to a pipe: one atomic write
    assert written == len(data)


class Workload:
    def __init__(self, q: ledgerq.Queue, rng: random.Random, token_base: int) -> None:
        self.q = q
        self.rng = rng
        self.token = token_base

    def enqueue(self) -> None:
        rng = self.rng
        n = 1 if rng.random() < 0.6 else rng.randint(2, 8)
        tokens = range(self.token, self.token + n)
        emit(f"B {n}\n")
        if n == 1 and rng.random() < 0.8:
            payload, headers = make_message(tokens[0])
            ids = [self.q.enqueue(payload, headers=headers)]
        else:
            ids = self.q.enqueue_batch([make_item(t) for t in tokens])
        emit("".join(f"E {i} {t}\n" for i, t in zip(ids, tokens, strict=True)))
        self.token += n

    def consume(self) -> None:
        msg = self.q.dequeue()
        if msg is None:
            self.enqueue()
            return
        token = token_of(msg.payload)
        ok = int(matches(msg, token))
        intent = "ack" if self.rng.random() < 0.7 else "keep"
        emit(f"L {msg.id} {msg.attempts} {token} {ok} {intent}\n")
        if intent == "ack":
            self.q.ack(msg.id)
            emit(f"A {msg.id}\n")


def main(argv: list[str]) -> None:
    mode, path, sync, seed, token_base, segment_size = argv[1:7]
    options: dict[str, object] = {
        "sync": sync,
        "segment_size": int(segment_size),
        "max_retries": 0,
    }
    if sync == "interval":
        options["sync_interval"] = 0.005  # let the background fsync run during the test
    rng = random.Random(int(seed))
    if mode == "tryopen":
        try:
            q = ledgerq.open(path, **options)
        except ledgerq.QueueLockedError as exc:
            emit(f"LOCKED {exc}\n")
        else:
            q.close()
            emit("OPENED\n")
        return
    emit("O\n")
    with ledgerq.open(path, **options) as q:
        work = Workload(q, rng, int(token_base))
        if mode == "enqueue":
            while True:
                work.enqueue()
        elif mode == "mixed":
            while True:
                if rng.random() < 0.3:
                    work.enqueue()
                else:
                    work.consume()
        elif mode == "hold":
            emit("R\n")
            while line := sys.stdin.readline():
                if line.strip() == "enq":
                    work.enqueue()
        else:
            raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)
