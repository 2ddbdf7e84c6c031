"""What the soak's clients did, and the exactly-once check over it.

Every item is a self-describing payload: ``<name>|`` followed by filler derived from the
name and the size, where the name is ``<queue>:<who>:<seq>:<flags>``.  So a client that receives
bytes can tell which item they are, check that not one byte changed, that they came
from the queue they were set to and with the flags they were set with - without a
shared table of every payload.

The :class:`Ledger` is the one table the threads share (under a lock): what was
STORED, what a vanishing sender may or may not have stored, and how often each item
was delivered and closed.  :func:`account` turns it into broken promises.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Ledger", "Tally", "account", "item_name", "parse_item", "payload"]

NEVER = "never"  # the <who> of items that must never be stored (half-sent, oversize)


def item_name(queue: str, who: str, seq: int, flags: int) -> str:
    """The name of one item: unique per (who, seq); carries its queue and flags."""
    return f"{queue}:{who}:{seq}:{flags}"


def payload(name: str, size: int) -> bytes:
    """The bytes of item ``name``: at least ``len(name) + 1`` bytes, else ``size``."""
    head = name.encode("ascii") + b"|"
    # The filler depends on the size too, so a cut payload is no payload of its own size.
    fill = hashlib.blake2b(head + b"%d" % size, digest_size=64).digest()
    body = max(size - len(head), 0)
    return head + (fill * (body // len(fill) + 1))[:body]


@dataclass(frozen=True, slots=True)
class ParsedItem:
    """A received item: its name and what the name says."""

    name: str
    queue: str
    flags: int


def parse_item(data: bytes) -> ParsedItem | None:
    """The item ``data`` is, or None if it is no soak payload or a byte changed."""
    head, sep, _ = data.partition(b"|")
    try:
        name = head.decode("ascii")
        queue, _who, _seq, flags = name.split(":")
        parsed = ParsedItem(name, queue, int(flags))
    except ValueError:
        return None
    if not sep or payload(name, len(data)) != data:
        return None
    return parsed


@dataclass
class Tally:
    """One thread's counts, merged into the report at the end (no lock while running)."""

    counts: Counter[str] = field(default_factory=Counter)
    latencies_s: dict[str, list[float]] = field(default_factory=dict)

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] += n

    def latency(self, op: str, seconds: float) -> None:
        self.latencies_s.setdefault(op, []).append(seconds)

    def merge(self, other: Tally) -> None:
        self.counts.update(other.counts)
        for op, values in other.latencies_s.items():
            self.latencies_s.setdefault(op, []).extend(values)


class Ledger:
    """The items of the run and what happened to them, shared by every client thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.stored: set[str] = set()  # the server answered STORED (or a round trip after noreply)
        self.maybe: set[str] = set()  # fully sent, the sender left before the answer
        self.closed: Counter[str] = Counter()  # plain get, or /close of an open read
        self.opened: Counter[str] = Counter()  # deliveries to an open read (any outcome)
        self.problems: list[str] = []
        self.closes = 0  # sum of ``closed``, readable while the clients run
        self._outstanding = 0  # stored and not closed yet: the producers' back-pressure

    def record_stored(self, name: str) -> None:
        with self._lock:
            self.stored.add(name)
            self._outstanding += 1

    def record_maybe(self, name: str) -> None:
        with self._lock:
            self.maybe.add(name)

    def record_closed(self, name: str) -> None:
        with self._lock:
            self.closed[name] += 1
            self.closes += 1
            self._outstanding -= 1

    def record_opened(self, name: str) -> None:
        with self._lock:
            self.opened[name] += 1

    def problem(self, text: str) -> None:
        with self._lock:
            self.problems.append(text)

    @property
    def outstanding(self) -> int:
        """Items stored and not yet closed (approximate while clients run)."""
        return self._outstanding

    def unclosed(self, queue: str) -> tuple[int, int]:
        """Items of ``queue`` not closed: (STORED ones, those plus unconfirmed sets)."""
        prefix = queue + ":"
        with self._lock:
            stored = sum(1 for n in self.stored if n.startswith(prefix) and not self.closed[n])
            unsure = self.maybe - self.stored
            maybe = sum(1 for n in unsure if n.startswith(prefix) and not self.closed[n])
        return stored, stored + maybe


def account(ledger: Ledger, leftover: Counter[str]) -> list[str]:
    """Every broken promise: a STORED item not closed exactly once, an unknown item, ...

    ``leftover`` counts the items still queued when the check runs (the drain makes
    it empty when the server behaves).  An item delivered to an open read that was
    aborted, or whose reader vanished, may be delivered again: only closes count.
    """
    problems = []
    sent = ledger.stored | ledger.maybe
    delivered = ledger.closed + leftover
    lost = [n for n in ledger.stored if not delivered[n]]
    twice = [n for n, k in delivered.items() if k > 1]
    unknown = [n for n in delivered if n not in sent]
    never = [n for n in ledger.opened if n not in sent]
    for label, names in (
        ("STORED and never delivered (lost)", lost),
        ("delivered-and-closed more than once", twice),
        ("delivered but never stored", unknown),
        ("opened but never stored", never),
    ):
        if names:
            shown = ", ".join(sorted(names)[:5])
            problems.append(f"{len(names)} item(s) {label}: {shown}")
    return problems
