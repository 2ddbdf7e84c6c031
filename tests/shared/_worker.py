"""A process that uses a queue in shared mode, for the multi-process tests.

Usage: python -m tests.shared._worker MODE PATH [KEY=VALUE ...]

Every line on stdout is one event, written with a single ``os.write`` *after* the call
it reports has returned (so a line is whole or absent, and a killed worker reported
only what happened):

    READY <handle-id hex> <pid>          the queue is open
    E <id> <token>                       enqueue returned id for the payload of token
    L <id> <attempts> <token>            dequeue returned this lease
    A <id>                               ack(id) returned
    N <id>                               nack(id) returned
    W <seconds waited> <cpu seconds> <id or 0> <monotonic at return>
                                         (wait) a blocked dequeue returned
    X <type> <message>                   a call raised (the worker goes on)
    BYE                                  the worker closed the queue and ends

Modes (KEY=VALUE options in brackets):

* ``produce`` [sync, base, count, batch, delay]: enqueue payloads of tokens base,
  base+1, ... (``count`` of them, forever by default), ``batch`` at a time;
* ``consume`` [sync, count, keep, nack]: dequeue (waiting up to 0.2 s) and ack,
  forever or ``count`` times; with ``keep`` it keeps every lease (never acks);
  ``nack`` is the share of leases nacked instead;
* ``lease`` [n]: dequeue_batch(n), report, then hold the leases until killed or told
  ``close`` (then close: the leases come back);
* ``wait`` [timeout, poll]: one ``dequeue(timeout)``, reporting the time waited and the
  CPU time the process used meanwhile (``poll=1``: without inotify);
* ``hold``: open, report READY, and execute stdin commands until stdin closes:
  ``enq <token>``, ``deq``, ``ack <id>``, ``stats``, ``close``.

Any other key is a queue option (``segment_size=4096``...), parsed as a Python literal.
"""

from __future__ import annotations

import ast
import os
import random
import resource
import sys
import time

import ledgerq

PAD = b"." * 40


def emit(text: str) -> None:
    data = (text + "\n").encode()
    written = os.write(1, data)  # <= PIPE_BUF bytes to a pipe: one atomic write
    assert written == len(data)


def payload(token: int, size: int = 0) -> bytes:
    head = b"token:%d;" % token
    return head + PAD[: max(0, size - len(head))] if size < 1 << 16 else head + b"x" * size


def token_of(data: bytes) -> int:
    return int(data.split(b";", 1)[0].split(b":")[1])


def _token_or_none(data: bytes) -> int | None:
    """The token of a worker's payload; None for one no worker wrote (a fixture's)."""
    try:
        return token_of(data)
    except (IndexError, ValueError):
        return None


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str]) -> None:
    mode, path, *pairs = argv
    settings: dict[str, object] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            settings[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            settings[key] = value
    own = {"base", "count", "batch", "keep", "nack", "n", "timeout", "poll", "size", "seed"}
    mine = {k: settings.pop(k) for k in list(settings) if k in own}
    if mine.get("poll"):
        os.environ["LEDGERQ_WATCH"] = "poll"  # read by the housekeeper's first watch
    q = ledgerq.open(path, shared=True, **settings)  # type: ignore[arg-type]
    emit(f"READY {q.handle_id:016x} {os.getpid()}")  # type: ignore[attr-defined]
    rng = random.Random(int(mine.get("seed", 0)))  # type: ignore[arg-type]
    if mode == "produce":
        produce(q, mine)
    elif mode == "consume":
        consume(q, mine, rng)
    elif mode == "lease":
        got = q.dequeue_batch(int(mine.get("n", 1)))  # type: ignore[arg-type]
        for msg in got:
            emit(f"L {msg.id} {msg.attempts} {token_of(msg.payload)}")
        emit("HELD")
        if sys.stdin.readline().strip() == "close":
            q.close()
            emit("BYE")
        return
    elif mode == "wait":
        timeout = float(mine.get("timeout", 5.0))  # type: ignore[arg-type]
        emit("WAITING")
        cpu, start = cpu_seconds(), time.monotonic()
        msg = q.dequeue(timeout=timeout)
        waited, used = time.monotonic() - start, cpu_seconds() - cpu
        emit(f"W {waited:.6f} {used:.6f} {msg.id if msg else 0} {time.monotonic():.6f}")
        if msg is not None:
            q.ack(msg.id)
    elif mode == "hold":
        hold(q)
        return
    q.close()
    emit("BYE")


def produce(q: ledgerq.Queue, mine: dict[str, object]) -> None:
    token = int(mine.get("base", 0))  # type: ignore[arg-type]
    count = int(mine.get("count", 1 << 62))  # type: ignore[arg-type]
    batch = int(mine.get("batch", 1))  # type: ignore[arg-type]
    size = int(mine.get("size", 0))  # type: ignore[arg-type]
    end = token + count
    while token < end:
        n = min(batch, end - token)
        try:
            if n == 1:
                ids = [q.enqueue(payload(token, size))]
            else:
                ids = q.enqueue_batch([payload(t, size) for t in range(token, token + n)])
        except ledgerq.LedgerQError as exc:
            emit(f"X {type(exc).__name__} {str(exc)[:200]}")
            time.sleep(0.01)
            continue
        for offset, message_id in enumerate(ids):
            emit(f"E {message_id} {token + offset}")
        token += n


def consume(q: ledgerq.Queue, mine: dict[str, object], rng: random.Random) -> None:
    count = int(mine.get("count", 1 << 62))  # type: ignore[arg-type]
    keep = bool(mine.get("keep", 0))
    nack_share = float(mine.get("nack", 0.0))  # type: ignore[arg-type]
    done = 0
    while done < count:
        msg = q.dequeue(timeout=0.2)
        if msg is None:
            continue
        emit(f"L {msg.id} {msg.attempts} {token_of(msg.payload)}")
        done += 1
        if keep:
            continue
        if rng.random() < nack_share:
            q.nack(msg.id, "worker says no")
            emit(f"N {msg.id}")
        else:
            q.ack(msg.id)
            emit(f"A {msg.id}")


def hold(q: ledgerq.Queue) -> None:
    for line in sys.stdin:
        command, *args = line.split()
        try:
            if command == "enq":
                emit(f"E {q.enqueue(payload(int(args[0])))} {args[0]}")
            elif command == "deq":
                msg = q.dequeue()
                emit(
                    "L 0 0 0"
                    if msg is None
                    else f"L {msg.id} {msg.attempts} {_token_or_none(msg.payload)}"
                )
            elif command == "ack":
                q.ack(int(args[0]))
                emit(f"A {args[0]}")
            elif command == "stats":
                s = q.stats()
                figures = (s.pending, s.in_flight, s.enqueued, s.acked, s.duplicates)
                emit("S " + " ".join(map(str, (*figures, s.corrupt_skipped))))
            elif command == "close":
                q.close()
                emit("BYE")
                return
        except ledgerq.LedgerQError as exc:
            emit(f"X {type(exc).__name__} {str(exc)[:200]}")
    q.close()


if __name__ == "__main__":
    main(sys.argv[1:])
