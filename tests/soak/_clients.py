"""The soak's clients: honest producers and consumers, a slow client, and abusers.

Each client is a function ``run(ctx, who, rng, tally)`` looping until ``ctx.stop`` is
set, on its own thread.  Honest clients check every reply of every well-formed
command they send: a missing, late (past the socket guard) or wrong reply is a
problem written to the ledger, and the client carries on with a new connection.
Abusers check the replies the protocol promises (``SERVER_ERROR object too large``,
``CLIENT_ERROR ...``, the connection still answering ``version`` after them) and
count what they did.

The pauses here (``ctx.stop.wait``) pace the load - a byte every few milliseconds
for the slow client, a back-off while the queues are deep - and never stand in for
waiting on the server: what must have happened is asked of the server.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.server._harness import GUARD_S, Raw, Value
from tests.soak._ledger import NEVER, Ledger, Tally, item_name, parse_item, payload

__all__ = [
    "ABUSES",
    "Client",
    "Context",
    "Unanswered",
    "abuser",
    "check_value",
    "consumer",
    "dribbler",
    "producer",
    "reset",
    "run_client",
]

VERSION_REQUEST = b"version\r\n"
WAIT_MS = 50  # how long a consumer that found nothing waits on its next get


class Unanswered(Exception):
    """The server did not answer a command as the protocol says (or not at all)."""


@dataclass(frozen=True, slots=True)
class Context:
    """What every client of one run shares."""

    port: int
    queues: tuple[str, ...]
    max_item_size: int
    backlog: int  # producers pause while this many items are stored and not closed
    ledger: Ledger
    stop: threading.Event


Client = Callable[[Context, str, random.Random, Tally], None]


def run_client(client: Client, ctx: Context, who: str, seed: int, tally: Tally) -> None:
    """Run one client until ``ctx.stop``; an unexpected exception is a problem, not a crash."""
    try:
        client(ctx, who, random.Random(seed), tally)
    except Exception as exc:  # the soak reports it; the other clients go on
        ctx.ledger.problem(f"{who}: {type(exc).__name__}: {exc}")


# ---------------------------------------------------------------------- helpers


def _set_request(key: str, flags: int, data: bytes, noreply: bool = False) -> bytes:
    tail = b" noreply" if noreply else b""
    return b"set %b %d 0 %d%b\r\n%b\r\n" % (key.encode(), flags, len(data), tail, data)


def _item_size(rng: random.Random, max_item_size: int) -> int:
    """Mostly small items; some over the server's inline-write limit; a few at the limit."""
    roll = rng.random()
    if roll < 0.70:
        return rng.randint(16, 512)
    if roll < 0.92:
        return rng.randint(512, 8 << 10)
    if roll < 0.99:
        return rng.randint(16 << 10, 64 << 10)
    return rng.choice((max_item_size, rng.randint(64 << 10, max_item_size)))


def _flags(rng: random.Random) -> int:
    return 0 if rng.random() < 0.5 else rng.randrange(1 << 32)


def _raw(ctx: Context, tally: Tally) -> Raw:
    tally.count("connections")
    return Raw(ctx.port)


def reset(sock: socket.socket) -> None:
    """Make ``close()`` send a reset (SO_LINGER 0), as the death of a client's process can."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _vanish(sock: socket.socket, rng: random.Random) -> None:
    """Close without a goodbye: half the time with a reset, else a FIN."""
    if rng.random() < 0.5:
        reset(sock)
    sock.close()


def _values(raw: Raw, what: str) -> list[Value]:
    try:
        return raw.values()
    except (AssertionError, ValueError, IndexError) as exc:
        raise Unanswered(f"{what}: malformed reply ({exc})") from None


def check_value(ledger: Ledger, value: Value, keys: list[bytes], with_cas: bool) -> str:
    """The name of a received item, after checking every promise about it."""
    key, flags, data, cas = value
    if key not in keys:
        raise Unanswered(f"VALUE for {key!r}, which was not asked for ({keys!r})")
    item = parse_item(data)
    if item is None:
        ledger.problem(f"corrupt item from {key!r}: {data[:60]!r}... ({len(data)} bytes)")
        raise Unanswered("a corrupt item")
    queue = key.split(b"/", 1)[0].decode()
    if item.queue != queue:
        ledger.problem(f"item {item.name} was set to {item.queue} and read from {queue}")
    if item.flags != flags:
        ledger.problem(f"item {item.name}: flags {flags} on the VALUE line")
    if with_cas and cas is None:
        raise Unanswered(f"gets {key!r}: VALUE without a cas field")
    return item.name


# ---------------------------------------------------------------------- honest producer


def producer(ctx: Context, who: str, rng: random.Random, tally: Tally) -> None:
    """Set items: one at a time (timed), pipelined batches, and noreply runs + a round trip."""
    seq = 0
    raw = _raw(ctx, tally)
    try:
        while not ctx.stop.is_set():
            if ctx.ledger.outstanding > ctx.backlog:
                tally.count("producer back-offs")
                ctx.stop.wait(0.01)
                continue
            roll = rng.random()
            count = 1 if roll < 0.85 else rng.randint(2, 8)
            noreply = roll >= 0.97
            names = []
            requests = []
            op = "set"  # what the latency of a single set counts as
            for _ in range(count):
                seq += 1
                queue = rng.choice(ctx.queues)
                flags = _flags(rng)
                name = item_name(queue, who, seq, flags)
                size = _item_size(rng, ctx.max_item_size) if count == 1 else rng.randint(16, 2000)
                key = queue
                if rng.random() < 0.03:
                    key, op = queue + "/sync", "set/sync"  # answered after an fsync
                names.append(name)
                requests.append(_set_request(key, flags, payload(name, size), noreply))
            try:
                _send_sets(raw, names, requests, noreply, op, tally, ctx.ledger)
            except (Unanswered, OSError, EOFError) as exc:
                ctx.ledger.problem(f"{who}: {exc}")
                raw.close()
                raw = _raw(ctx, tally)
    finally:
        raw.close()


def _send_sets(
    raw: Raw,
    names: list[str],
    requests: list[bytes],
    noreply: bool,
    op: str,
    tally: Tally,
    ledger: Ledger,
) -> None:
    started = time.perf_counter()
    raw.send(b"".join(requests) + (VERSION_REQUEST if noreply else b""))
    if noreply:
        # Commands of one connection run in order: once version is answered, every
        # noreply set before it was executed - and a failure would have been silent.
        line = raw.line()
        if not line.startswith(b"VERSION "):
            raise Unanswered(f"version after {len(names)} noreply sets: {line!r}")
        for name in names:
            ledger.record_stored(name)
        tally.count("sets (noreply)", len(names))
        return
    for name in names:
        line = raw.line()
        if line != b"STORED":
            raise Unanswered(f"set of {name}: {line!r}")
        ledger.record_stored(name)
    if len(names) == 1:
        tally.latency(op, time.perf_counter() - started)
    tally.count("sets" if len(names) == 1 else "sets (pipelined)", len(names))


# ---------------------------------------------------------------------- honest consumer


class _Consumer:
    """One consumer connection and the reads it holds open (one per queue at most)."""

    def __init__(self, ctx: Context, who: str, rng: random.Random, tally: Tally) -> None:
        self.ctx = ctx
        self.who = who
        self.rng = rng
        self.tally = tally
        self.raw = _raw(ctx, tally)
        self.held: dict[str, str] = {}  # queue -> name of the item open on it
        self.found_nothing = False  # then the next get waits a little (no busy loop)

    def reconnect(self, *, polite: bool) -> None:
        """A new connection; the reads held on the old one go back to their queues."""
        if polite:
            self.raw.send(b"quit\r\n")
            if self.held:
                self.tally.count("quit with an open read")
        self.raw.close()
        self.held.clear()
        self.raw = _raw(self.ctx, self.tally)

    def get(self, keys: list[str], *, with_cas: bool = False) -> list[str]:
        """Send one get; check and return the names of the items received."""
        wire = [k.encode() for k in keys]
        verb = b"gets " if with_cas else b"get "
        timed = not any("/t=" in k for k in keys)
        started = time.perf_counter()
        self.raw.send(verb + b" ".join(wire) + b"\r\n")
        values = _values(self.raw, f"{verb.decode()}{' '.join(keys)}")
        if timed:
            self.tally.latency("get", time.perf_counter() - started)
        return [check_value(self.ctx.ledger, v, wire, with_cas) for v in values]

    def step(self) -> None:
        """One request: settle an open read, or take an item (plain, gets, multi-key, open)."""
        queue = self.rng.choice(self.ctx.queues)
        if queue in self.held:
            self._settle(queue)
        else:
            self._take(queue)

    def _wait_option(self) -> str:
        return f"/t={WAIT_MS}" if self.found_nothing else ""

    def _take(self, queue: str) -> None:
        roll = self.rng.random()
        ledger = self.ctx.ledger
        if roll < 0.5:
            free = [q for q in self.ctx.queues if q not in self.held]
            keys = [queue] if roll < 0.3 else self.rng.sample(free, min(2, len(free)))
            keys[0] += self._wait_option()
            names = self.get(keys, with_cas=roll < 0.1)
            for name in names:
                ledger.record_closed(name)
            self.tally.count("plain gets")
            self.found_nothing = not names
            return
        names = self.get([f"{queue}{self._wait_option()}/open"])
        self.tally.count("opens")
        self._hold(queue, names)

    def _hold(self, queue: str, names: list[str]) -> None:
        if len(names) > 1:
            raise Unanswered(f"an open read of {queue} delivered {len(names)} items")
        self.found_nothing = not names
        if names:
            self.held[queue] = names[0]
            self.ctx.ledger.record_opened(names[0])

    def _settle(self, queue: str) -> None:
        roll = self.rng.random()
        name = self.held.pop(queue)
        if roll < 0.15:
            if self.get([f"{queue}/abort"]):
                raise Unanswered(f"get {queue}/abort delivered an item")
            self.tally.count("aborts")
            return
        chained = roll >= 0.55
        names = self.get([f"{queue}/close/open" if chained else f"{queue}/close"])
        self.ctx.ledger.record_closed(name)
        self.tally.count("closes")
        if chained:
            self.tally.count("close/open chains")
            self._hold(queue, names)
        elif names:
            raise Unanswered(f"get {queue}/close delivered an item")


def consumer(ctx: Context, who: str, rng: random.Random, tally: Tally) -> None:
    """Take items every way a client can: get, gets, multi-key get, /open + /close or /abort."""
    client = _Consumer(ctx, who, rng, tally)
    try:
        while not ctx.stop.is_set():
            try:
                client.step()
                if rng.random() < 0.003:
                    client.reconnect(polite=True)
            except (Unanswered, OSError, EOFError) as exc:
                ctx.ledger.problem(f"{who}: {exc}")
                client.reconnect(polite=False)
        client.reconnect(polite=True)  # whatever is open goes back for the drain
    finally:
        client.raw.close()


# ---------------------------------------------------------------------- slow client


def _dribble(ctx: Context, raw: Raw, data: bytes, rng: random.Random) -> bool:
    """Send ``data`` a byte at a time, a few ms apart; False if the run stopped first."""
    for i in range(len(data)):
        if ctx.stop.wait(rng.uniform(0.0005, 0.006)):
            return False
        raw.send(data[i : i + 1])
    return True


def dribbler(ctx: Context, who: str, rng: random.Random, tally: Tally) -> None:
    """A slow client: a set, then a reliable read and its close, each sent a byte at a time."""
    seq = 0
    while not ctx.stop.is_set():
        seq += 1
        try:
            with _raw(ctx, tally) as raw:
                raw.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                _slow_round(
                    ctx, raw, item_name(rng.choice(ctx.queues), who, seq, _flags(rng)), rng, tally
                )
        except (Unanswered, OSError, EOFError) as exc:
            ctx.ledger.problem(f"{who}: {exc}")


def _slow_round(ctx: Context, raw: Raw, name: str, rng: random.Random, tally: Tally) -> None:
    """Dribble the set of ``name``, then an open read and its close; stop with the run.

    A set cut short by the end of the run was never complete: it must never be stored.
    """
    queue, _who, _seq, flags = name.split(":")
    request = _set_request(queue, int(flags), payload(name, rng.randint(30, 300)))
    if not _dribble(ctx, raw, request, rng):
        return
    ctx.ledger.record_maybe(name)  # fully sent; STORED makes it certain
    line = raw.line()
    if line != b"STORED":
        raise Unanswered(f"dribbled set of {name}: {line!r}")
    ctx.ledger.record_stored(name)
    tally.count("dribbled sets")
    key = f"{queue}/t=100/open"
    if not _dribble(ctx, raw, f"get {key}\r\n".encode(), rng):
        return
    names = [check_value(ctx.ledger, v, [key.encode()], False) for v in _values(raw, key)]
    for held in names:
        ctx.ledger.record_opened(held)
    if names and _dribble(ctx, raw, f"get {queue}/close\r\n".encode(), rng):
        if _values(raw, f"{queue}/close"):
            raise Unanswered(f"get {queue}/close delivered an item")
        ctx.ledger.record_closed(names[0])
        tally.count("dribbled reliable reads")


# ---------------------------------------------------------------------- abusers
#
# Each abuse is ``abuse(ctx, rng, tally, who)``, ``who`` unique to that one call.


def _never_item(ctx: Context, rng: random.Random, who: str, size: int) -> tuple[str, bytes]:
    """An item that must never be stored: (queue, its payload)."""
    queue = rng.choice(ctx.queues)
    return queue, payload(item_name(queue, f"{NEVER}-{who}", 0, 0), size)


def _expect(raw: Raw, request: bytes, accept: Callable[[bytes], bool], what: str) -> bytes:
    """Send ``request``; its one-line reply, which ``accept`` must like."""
    raw.send(request)
    line = raw.line()
    if not accept(line):
        raise Unanswered(f"{what}: {line!r}")
    return line


def _still_answers(raw: Raw, after: str) -> None:
    _expect(
        raw, VERSION_REQUEST, lambda line: line.startswith(b"VERSION "), f"version after {after}"
    )


def _is_error(line: bytes) -> bool:
    return line == b"ERROR" or line.startswith((b"CLIENT_ERROR ", b"SERVER_ERROR "))


def half_set(ctx: Context, rng: random.Random, tally: Tally, who: str) -> None:
    """A set cut anywhere before its last byte, then gone: nothing may be stored."""
    queue, data = _never_item(ctx, rng, who, rng.randint(40, 5000))
    request = _set_request(queue, 0, data)
    with _raw(ctx, tally) as raw:
        raw.send(request[: rng.randrange(1, len(request))])
        _vanish(raw.sock, rng)


HALF_LINES = ("get {}/open", "get {}/t=1000/open", "set {} 0 0 5", "gets {}", "stats")


def half_line(ctx: Context, rng: random.Random, tally: Tally, who: str) -> None:
    """Part of a command line, no end of line, then gone."""
    line = rng.choice(HALF_LINES).format(rng.choice(ctx.queues)).encode()
    with _raw(ctx, tally) as raw:
        raw.send(line[: rng.randint(1, len(line))])
        _vanish(raw.sock, rng)


def vanish_open(ctx: Context, rng: random.Random, tally: Tally, who: str) -> None:
    """Open a reliable read, receive the item, vanish: the item must come back."""
    key = f"{rng.choice(ctx.queues)}/t=20/open"
    with _raw(ctx, tally) as raw:
        raw.send(f"get {key}\r\n".encode())
        for value in _values(raw, f"get {key}"):
            ctx.ledger.record_opened(check_value(ctx.ledger, value, [key.encode()], False))
            tally.count("vanished with an item open")
        _vanish(raw.sock, rng)


def vanish_waiting(ctx: Context, rng: random.Random, tally: Tally, who: str) -> None:
    """Send a waiting reliable read and vanish before its answer: no item may stay leased."""
    with _raw(ctx, tally) as raw:
        raw.send(f"get {rng.choice(ctx.queues)}/t=1000/open\r\n".encode())
        ctx.stop.wait(rng.uniform(0, 0.02))
        _vanish(raw.sock, rng)


def fire_and_forget(ctx: Context, rng: random.Random, tally: Tally, who: str) -> None:
    """A whole set, then gone before the reply: stored or not, never delivered twice."""
    queue = rng.choice(ctx.queues)
    name = item_name(queue, who, 0, 0)
    ctx.ledger.record_maybe(name)
    with _raw(ctx, tally) as raw:
        raw.send(_set_request(queue, 0, payload(name, rng.randint(20, 3000))))
        _vanish(raw.sock, rng)


TOO_LARGE = b"SERVER_ERROR object too large for cache"


def oversize_value(ctx: Context, rng: random.Random, tally: Tally, who: str) -> None:
    """A value over the item limit: refused at once, its body skipped, the connection lives."""
    size = ctx.max_item_size + rng.randint(1, ctx.max_item_size)
    queue, data = _never_item(ctx, rng, who, size)
    with _raw(ctx, tally) as raw:
        # The refusal comes as soon as the line is read, before the body is sent.
        _expect(raw, b"set %b 0 0 %d\r\n" % (queue.encode(), size), TOO_LARGE.__eq__, "oversize")
        raw.send(data + b"\r\n")
        _still_answers(raw, "an oversize set")


def oversize_announced(ctx: Context, rng: random.Random, tally: Tally, who: str) -> None:
    """A set announcing terabytes, a little of them, then gone."""
    size = rng.choice((1 << 40, 10**18, (1 << 32) + 1))
    request = b"set %b 0 0 %d\r\n" % (rng.choice(ctx.queues).encode(), size)
    with _raw(ctx, tally) as raw:
        _expect(raw, request, TOO_LARGE.__eq__, f"a set announcing {size} bytes")
        raw.send(rng.randbytes(rng.randint(1, 200_000)))
        _vanish(raw.sock, rng)


def _long_key(rng: random.Random, length: int) -> bytes:
    return bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz0123456789_") for _ in range(length))


def oversize_key(ctx: Context, rng: random.Random, tally: Tally, who: str) -> None:
    """Keys past the name limits (200 for a queue, 100 for a reader): CLIENT_ERROR each."""
    queue = rng.choice(ctx.queues).encode()
    keys = (
        _long_key(rng, rng.randint(201, 20_000)),
        queue + b"+" + _long_key(rng, rng.randint(101, 500)),
    )
    with _raw(ctx, tally) as raw:
        for key in keys:
            for request in (b"set %b 0 0 3\r\nabc\r\n" % key, b"get %b/open\r\n" % key):
                what = f"{request[:20]!r}... with a {len(key)}-byte key"
                _expect(raw, request, lambda line: line.startswith(b"CLIENT_ERROR "), what)
        _still_answers(raw, "long keys")


def long_line(ctx: Context, rng: random.Random, tally: Tally, who: str) -> None:
    """A command line past 64 KiB: CLIENT_ERROR line too long, discarded, connection lives."""
    line = b"get " + _long_key(rng, 64) * rng.randint(1025, 4000)
    with _raw(ctx, tally) as raw:
        expected = b"CLIENT_ERROR line too long"
        _expect(raw, line + b"\r\n", expected.__eq__, f"a {len(line)}-byte line")
        _still_answers(raw, "a long line")


MALFORMED = (
    b"",
    b"bogus",
    b"incr junk 1",
    b"get",
    b"set",
    b"set junk 0 0 abc",
    b"set junk 0 0 -5",
    b"get junk/bogus",
    b"get junk/t=abc",
    b"get junk/peek/open",
    b"get junk/abort/close",
    b"get /",
    b"get +r",
    b"\x00\x01\x02\xff",
    b"GET \xff\xfe",
    b"stats detail dump",
    b"mg junk v",
    b"confirm junk",
    b"monitor junk x",
)


def malformed(ctx: Context, rng: random.Random, tally: Tally, who: str) -> None:
    """Malformed and unknown lines: each answered with an error line; the connection lives."""
    with _raw(ctx, tally) as raw:
        for line in rng.sample(MALFORMED, rng.randint(3, len(MALFORMED))):
            _expect(raw, line + b"\r\n", _is_error, f"malformed line {line!r}")
        _still_answers(raw, "malformed lines")


_GARBAGE_WORDS = (b"set junk 0 0 3\r\n", b"get junk\r\n", b"\r\n", b"\n", b" noreply", b"/open")


def garbage(ctx: Context, rng: random.Random, tally: Tally, who: str) -> None:
    """Binary garbage, then end of input: the server answers what it can and hangs up."""
    pieces = [
        rng.choice(_GARBAGE_WORDS) if rng.random() < 0.3 else rng.randbytes(rng.randint(0, 200))
        for _ in range(rng.randint(1, 40))
    ]
    with _raw(ctx, tally) as raw:
        try:
            raw.send(b"".join(pieces))
            raw.sock.shutdown(socket.SHUT_WR)
            while raw.sock.recv(65536):
                pass
        except TimeoutError:
            raise Unanswered(f"no hang-up {GUARD_S:.0f} s after garbage and EOF") from None
        except ConnectionResetError:
            pass  # a hang-up too (lost framing can close with unread bytes)


def no_read(ctx: Context, rng: random.Random, tally: Tally, who: str) -> None:
    """A client that pipelines hundreds of peeks and never reads the replies, then leaves."""
    queue = rng.choice(ctx.queues).encode()
    with _raw(ctx, tally) as raw:
        raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        raw.send(b"get %b/peek\r\n" % queue * rng.randint(100, 2000) + b"stats\r\n")
        ctx.stop.wait(rng.uniform(0.05, 0.5))
        _vanish(raw.sock, rng)


def churn(ctx: Context, rng: random.Random, tally: Tally, who: str) -> None:
    """Many short connections: connect, maybe ask the version, go."""
    for _ in range(rng.randint(10, 50)):
        with _raw(ctx, tally) as raw:
            if rng.random() < 0.3:
                _still_answers(raw, "connecting")
            _vanish(raw.sock, rng)


Abuse = Callable[[Context, random.Random, Tally, str], None]

ABUSES: dict[str, Abuse] = {
    "half-sent sets": half_set,
    "half-sent lines": half_line,
    "vanished open reads": vanish_open,
    "vanished waiting reads": vanish_waiting,
    "fire-and-forget sets": fire_and_forget,
    "oversize values": oversize_value,
    "oversize announced": oversize_announced,
    "oversize keys": oversize_key,
    "over-long lines": long_line,
    "malformed lines": malformed,
    "binary garbage": garbage,
    "clients not reading": no_read,
    "connection churn": churn,
}


def abuser(ctx: Context, who: str, rng: random.Random, tally: Tally) -> None:
    """Run the abuses in random order until the end of the run."""
    kinds = list(ABUSES)
    seq = 0
    while not ctx.stop.is_set():
        seq += 1
        kind = rng.choice(kinds)
        try:
            ABUSES[kind](ctx, rng, tally, f"{who}-{seq}")
            tally.count(kind)
        except (Unanswered, OSError, EOFError) as exc:
            ctx.ledger.problem(f"{who} ({kind}): {exc}")
