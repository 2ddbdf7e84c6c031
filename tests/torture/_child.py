"""The torture child: a random mixed workload on one queue, until it is killed.

Usage: ``python -m tests.torture._child CONFIG_JSON``.  The configuration names the
queue, its options, the seed, the first token, and how this child is to die: killed by
the parent at a random moment, or by itself (SIGKILL) just before the ``nth`` file
system call made inside a chosen operation (rotation, compaction, a DLQ move,
``requeue_dlq``, ``open``, or anywhere).

Every report goes to stdout as whole lines written with one ``os.write`` each (a pipe
write of at most PIPE_BUF bytes is atomic, so a line is whole or absent), and only
*after* the call it reports has returned.  This is the side log the parent checks the
reopened queue against:

    O                                   ledgerq.open is about to be called
    P                                   ledgerq.open returned
    B <op> <args...>                    an operation starts
    E <id> <token> <fresh|dup> <key|->  an enqueue into the main queue returned (also
                                        the ones requeue_dlq makes)
    L <id> <attempt> <token> <ttl>      dequeue leased this message (ttl: 1 if it has
                                        an expiry); the child stops (X line) if its
                                        bytes are not the token's
    A <id> / N <id>                     ack / nack returned
    D <dlq_id> <orig_id> <token> <retries> <reason>
                                        a message was written to the DLQ (by a nack or
                                        by a dequeue meeting too many lost leases)
    S <dlq_id> <0|1>                    requeue_dlq settled this DLQ message
    Z                                   the operation returned
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar

import ledgerq
from ledgerq._queue import Queue
from ledgerq.core.queue import QueueCore
from ledgerq.core.reader import ReaderCore
from ledgerq.segment.manager import SegmentManager
from tests.faults._shim import FAMILIES, Interposer
from tests.torture._payload import Made, make, mismatch, token_of

_real_write = os.write

# Operations the child can be told to die inside: (class, method) whose calls arm the
# self-kill counter.  ``_report_failure`` covers a whole DLQ move: the DLQ write, the
# retry tracker and the DEAD_LETTER record in the main queue.
TARGETS: dict[str, tuple[tuple[type, str], ...]] = {
    "rotation": ((SegmentManager, "rotate"),),
    "compaction": ((QueueCore, "compact"),),
    "checkpoint": ((ReaderCore, "checkpoint"),),
    "dlq_move": ((ReaderCore, "_report_failure"),),
    "requeue": ((Queue, "requeue_dlq"),),
}


def emit(text: str) -> None:
    """Write report lines with one write (atomic on a pipe up to PIPE_BUF bytes)."""
    data = text.encode()
    assert _real_write(1, data) == len(data)


def checked_token(message: ledgerq.Message, report: Callable[[str], None], *, moved: bool) -> int:
    """The token ``message`` was made from, its bytes checked against it (``moved``: see
    :func:`~tests.torture._payload.mismatch`); a mismatch is reported (``X`` line) and
    raised."""
    token = token_of(message.payload)
    if problem := mismatch(message, token, moved=moved):
        what = f"message {message.id} (token {token}): {problem}"
        report(f"X {what}\n")
        raise AssertionError(what)
    return token


class SelfKill(Interposer):
    """SIGKILL this process just before the ``nth`` mutating call made while armed."""

    def __init__(self, root: str, nth: int, *, torn: bool = False) -> None:
        super().__init__(root)
        self.nth = nth
        self.torn = torn
        self.count = 0
        self.depth = 0  # > 0 while inside an armed operation

    def around(self, name: str, path: str, call: Callable[[], Any], args: tuple[Any, ...]) -> Any:
        if self.depth > 0 and self.nth > 0:
            mutating = FAMILIES[name] != "open" or self.is_mutating_open(args[1])
            if mutating:
                self.count += 1
                if self.count >= self.nth:
                    if self.torn and FAMILIES[name] == "write":
                        self._write_first_page(name, args)
                    os.kill(os.getpid(), signal.SIGKILL)
        return call()

    def _write_first_page(self, name: str, args: tuple[Any, ...]) -> None:
        """Do what Linux does when SIGKILL arrives during a write: keep the pages copied.

        ``generic_perform_write`` checks for a fatal signal between pages and returns
        what it copied so far; the process then dies.  So a write can end at a page
        boundary of the file.
        """
        fd = args[0]
        data = b"".join(bytes(b) for b in args[1]) if name == "writev" else bytes(args[1])
        offset = args[2] if name == "pwrite" else os.fstat(fd).st_size
        keep = -offset % 4096
        if 0 < keep < len(data):
            self.real["pwrite"](fd, data[:keep], offset)

    def arm_inside(self, cls: type, method: str) -> None:
        """Count calls made inside ``cls.method`` (patched on the class)."""
        original = getattr(cls, method)
        killer = self

        def armed(*args: Any, **kwargs: Any) -> Any:
            killer.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                killer.depth -= 1

        setattr(cls, method, armed)


# A workload's steps, each with the upper bound of its share of the draws (see choose).
Steps = Sequence[tuple[float, Callable[[], None]]]


def choose(draw: float, steps: Steps) -> Callable[[], None]:
    """The step whose share of ``steps`` the ``draw`` (in [0, 1)) falls in.

    Each step comes with the upper bound of its share, the bounds growing: the first
    step whose bound is above the draw is chosen (the last one if none is).
    """
    for bound, step in steps:
        if draw < bound:
            return step
    return steps[-1][1]


class Draws:
    """What a torture child's workload draws: its tokens, dedup ids, random choices."""

    def __init__(self, config: dict[str, Any], *, keys: int, key_share: float) -> None:
        self.options: dict[str, Any] = config["options"]
        self.rng = random.Random(config["seed"])
        self.token: int = config["token_base"]
        self.dedup = self.options.get("dedup_window") is not None
        self.keys = [f"k{i}" for i in range(config.get("keys", keys))]
        self.key_share = key_share  # of enqueues with a dedup id (when dedup is on)

    def _key(self) -> str | None:
        return (
            self.rng.choice(self.keys)
            if self.dedup and self.rng.random() < self.key_share
            else None
        )

    def _next(self) -> tuple[Made, str | None]:
        """The next token's message, and its dedup id (or None)."""
        made = make(self.token)
        self.token += 1
        return made, self._key()

    def _next_batch(self, most: int) -> tuple[range, list[str | None]]:
        """The tokens of a batch of 2 to ``most``, and their dedup ids."""
        n = self.rng.randint(2, most)
        tokens = range(self.token, self.token + n)
        self.token += n
        return tokens, [self._key() for _ in tokens]


class Workload(Draws):
    """Random operations; every one reported (see the module docstring)."""

    def __init__(self, config: dict[str, Any], report: Callable[[str], None] = emit) -> None:
        super().__init__(config, keys=24, key_share=0.35)
        self.path = config["path"]
        self.emit = report
        self.max_retries = self.options.get("max_retries", 3)
        self.leased: dict[int, int] = {}  # id -> attempt
        self.q = self._open()

    # ------------------------------------------------------------------ reporting

    def _open(self) -> ledgerq.Queue:
        q = ledgerq.open(self.path, **self.options)
        try:
            self._wrap(q)  # opens the DLQ, which can fail on its own
        except BaseException:
            q.close()  # nobody else holds q: it would stay locked
            raise
        return q

    def _wrap(self, q: ledgerq.Queue) -> None:
        """Report every enqueue into the main queue and the DLQ, and every DLQ settle."""
        enqueue, enqueue_batch = q.enqueue, q.enqueue_batch

        def reported_enqueue(payload: bytes, **kwargs: Any) -> int:
            before = q._next_id
            message_id = enqueue(payload, **kwargs)
            fresh = "fresh" if message_id >= before else "dup"
            key = kwargs.get("dedup_id") or "-"
            self.emit(f"E {message_id} {token_of(payload)} {fresh} {key}\n")
            return message_id

        def reported_batch(items: list[ledgerq.Item]) -> list[int]:
            before = q._next_id
            ids = enqueue_batch(items)
            lines, seen = [], set()
            for message_id, item in zip(ids, items, strict=True):
                # A duplicate of an earlier item of the same batch gets that item's new id.
                fresh = "fresh" if message_id >= before and message_id not in seen else "dup"
                seen.add(message_id)
                token = token_of(bytes(item.payload))
                lines.append(f"E {message_id} {token} {fresh} {item.dedup_id or '-'}\n")
            self.emit("".join(lines))
            return ids

        q.enqueue = reported_enqueue  # type: ignore[method-assign]
        q.enqueue_batch = reported_batch  # type: ignore[method-assign]
        dlq = q.dlq
        dlq_enqueue, dlq_settle = dlq.enqueue, dlq._settle

        def reported_dlq_enqueue(payload: bytes, **kwargs: Any) -> int:
            dlq_id = dlq_enqueue(payload, **kwargs)
            headers = kwargs["headers"]
            reason = headers["dlq.failure_reason"].replace(" ", "_")[:60]
            self.emit(
                f"D {dlq_id} {headers['dlq.original_id']} {token_of(payload)} "
                f"{headers['dlq.retry_count']} {reason}\n"
            )
            return dlq_id

        def reported_settle(message_id: int) -> bool:
            settled = dlq_settle(message_id)
            self.emit(f"S {message_id} {int(settled)}\n")
            return settled

        dlq.enqueue = reported_dlq_enqueue  # type: ignore[method-assign]
        dlq._settle = reported_settle  # type: ignore[method-assign]

    # ------------------------------------------------------------------ operations

    def enqueue(self) -> None:
        made, key = self._next()
        self.emit(f"B enq {made.token} {key or '-'}\n")
        self.q.enqueue(
            made.payload,
            headers=made.headers,
            priority=made.priority,
            ttl=made.ttl,
            dedup_id=key,
        )

    def batch(self) -> None:
        tokens, keys = self._next_batch(8)
        self.emit(f"B batch {tokens[0]} {len(tokens)} {','.join(k or '-' for k in keys)}\n")
        self.q.enqueue_batch([make(t).item(k) for t, k in zip(tokens, keys, strict=True)])

    def dequeue(self) -> None:
        n = 1 if self.rng.random() < 0.6 else self.rng.randint(2, 4)
        self.emit(f"B deq {n}\n")
        messages = self.q.dequeue_batch(n)
        lines = []
        for msg in messages:
            token = checked_token(msg, self.emit, moved=msg.expires_at is None)
            ttl = int(msg.expires_at is not None)
            lines.append(f"L {msg.id} {msg.attempts} {token} {ttl}\n")
            self.leased[msg.id] = msg.attempts
        if lines:
            self.emit("".join(lines))

    def settle(self, ack: bool) -> None:
        if not self.leased:
            self.dequeue()
            return
        message_id = self.rng.choice(sorted(self.leased))
        attempt = self.leased.pop(message_id)
        if ack:
            self.emit(f"B ack {message_id}\n")
            self.q.ack(message_id)
            self.emit(f"A {message_id}\n")
        else:
            self.emit(f"B nack {message_id} {attempt}\n")
            self.q.nack(message_id, f"nack:{message_id}:{attempt}")
            self.emit(f"N {message_id}\n")

    def requeue(self) -> None:
        dlq = self.q.dlq
        waiting = [m.id for m in dlq.peek(64)]
        if waiting and self.rng.random() < 0.5:
            chosen: list[int] | None = self.rng.sample(waiting, self.rng.randint(1, len(waiting)))
        else:
            chosen = None
        self.emit(f"B requeue {','.join(map(str, chosen)) if chosen else 'all'}\n")
        self.q.requeue_dlq(chosen)

    def compact(self) -> None:
        self.emit("B compact\n")
        self.q.compact()

    def sync(self) -> None:
        self.emit("B sync\n")
        self.q.sync()

    def reopen(self) -> None:
        self.emit("B reopen\n")
        self.q.close()
        self.leased.clear()
        self.q = self._open()

    def close(self) -> None:
        self.emit("B close\n")
        self.q.close()
        self.emit("Z\n")

    def step(self) -> None:
        choose(
            self.rng.random(),
            (
                (0.24, self.enqueue),
                (0.32, self.batch),
                (0.56, self.dequeue),
                (0.72, partial(self.settle, ack=True)),
                (0.88, partial(self.settle, ack=False)),
                (0.92, self.requeue),
                (0.96, self.compact),
                (0.99, self.sync),
                (1.0, self.reopen),
            ),
        )()
        self.emit("Z\n")


class Stepping(Protocol):
    """A child's workload: one random operation a call, reported."""

    def step(self) -> None: ...


W = TypeVar("W", bound=Stepping)


def run_until_killed(
    config: dict[str, Any],
    targets: dict[str, tuple[tuple[type, str], ...]],
    start: Callable[[dict[str, Any]], W],
    ready: Callable[[W], str],
) -> None:
    """Open the workload (``start``), report ``ready``'s line, step until killed.

    ``config["kill"]`` says how to die: its ``target`` names calls of ``targets`` (the
    self-kill counts inside them), ``open`` (inside ``start``; right after it if its
    ``nth`` call never came), ``after_open`` or ``anywhere``; with none, the parent
    kills this process.  An exception is reported (``X`` line) and raised.
    """
    kill = config.get("kill") or {}
    target = kill.get("target")
    killer = SelfKill(
        config["path"], kill.get("nth", 0) if target else 0, torn=kill.get("torn", False)
    )
    for cls, method in targets.get(target, ()):
        killer.arm_inside(cls, method)
    killer.install()
    emit("O\n")
    if target == "open":
        killer.depth += 1
    work = start(config)
    if target == "open":
        killer.depth -= 1
    emit(ready(work))
    if target in ("after_open", "open"):  # "open": it completed before the nth call
        os.kill(os.getpid(), signal.SIGKILL)
    if target == "anywhere":
        killer.depth += 1
    try:
        while True:
            work.step()
    except Exception:
        emit("X " + traceback.format_exc().replace("\n", " | ") + "\n")
        raise


def main(argv: list[str]) -> None:
    run_until_killed(json.loads(argv[1]), TARGETS, Workload, lambda _: "P\n")


if __name__ == "__main__":
    main(sys.argv)
