"""The memcache text protocol as the Kestrel and Darner queue servers speak it, sans-IO.

Nothing here touches a socket, a queue or a clock: :class:`Parser` turns the bytes a
client sent into commands, :func:`parse_get_key` and friends turn a key into what it
addresses, and the ``*_line``/:func:`value_block` encoders turn replies into bytes.
The asyncio connection layer (``ledgerq.server._connection``) glues them to a
transport; tests drive them with plain bytes.

Framing (what keeps the connection alive or ends it):

* A request line ends at LF, with an optional CR before it; fields are separated by
  whitespace; the command name is case-insensitive, keys are not.
* ``set`` (and the storage commands a queue server does not support: ``add``,
  ``replace``, ``append``, ``prepend``, ``cas``, meta ``ms``) carry a data block of
  the announced size followed by CRLF.  A block whose size is over the item limit is
  refused with ``SERVER_ERROR object too large for cache`` as soon as the line is
  read, and then skipped as it streams in (never held in memory).
* A malformed or unknown line is answered with ``ERROR``/``CLIENT_ERROR <reason>``
  (a :class:`Reject`), and parsing goes on with the next line.
* Only a lost framing ends the connection (a :class:`Hangup`): a data block not
  followed by CRLF.  After it the parser ignores everything.
* A line longer than ``max_line_bytes`` is answered with ``CLIENT_ERROR line too
  long`` and discarded up to its LF, without being buffered.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = [
    "DEFAULT_MAX_ITEM_SIZE",
    "DEFAULT_MAX_LINE_BYTES",
    "DELETED",
    "END",
    "ERROR",
    "MAX_FLAGS",
    "NOT_STORED",
    "OK",
    "RELATIVE_EXPTIME_LIMIT",
    "STORED",
    "TOO_LARGE",
    "Command",
    "Confirm",
    "Delete",
    "DumpStats",
    "Flush",
    "FlushAll",
    "FlushAllExpired",
    "FlushExpired",
    "Get",
    "GetKey",
    "Hangup",
    "KeyProblem",
    "Monitor",
    "Parser",
    "Quit",
    "Reject",
    "Set",
    "SetKey",
    "Shutdown",
    "Stats",
    "Verbosity",
    "Version",
    "client_error",
    "exptime_to_ttl",
    "is_valid_queue_name",
    "is_valid_reader_name",
    "parse_get_key",
    "parse_queue_key",
    "parse_set_key",
    "server_error",
    "stat_line",
    "value_block",
    "version_line",
]

DEFAULT_MAX_ITEM_SIZE: Final = 16 << 20
DEFAULT_MAX_LINE_BYTES: Final = 64 << 10
MAX_FLAGS: Final = (1 << 32) - 1
_MAX_DIGITS = 19  # keeps int() of a client-supplied number cheap and within int64

# ---------------------------------------------------------------------- replies

END: Final = b"END\r\n"
STORED: Final = b"STORED\r\n"
NOT_STORED: Final = b"NOT_STORED\r\n"  # a set on a full bounded queue (max_pending...)
DELETED: Final = b"DELETED\r\n"
OK: Final = b"OK\r\n"
ERROR: Final = b"ERROR\r\n"
TOO_LARGE: Final = b"SERVER_ERROR object too large for cache\r\n"
_CRLF = b"\r\n"


def _one_line(text: str) -> bytes:
    # A reason is client-visible text on one reply line: printable ASCII only.
    cleaned = "".join(ch if " " <= ch <= "~" else (" " if ch.isspace() else "?") for ch in text)
    return " ".join(cleaned.split()).encode("ascii")


def client_error(reason: str) -> bytes:
    """``CLIENT_ERROR <reason>``: the request was malformed or not allowed."""
    return b"CLIENT_ERROR " + _one_line(reason) + _CRLF


def server_error(reason: str) -> bytes:
    """``SERVER_ERROR <reason>``: the request was fine but the server could not do it."""
    return b"SERVER_ERROR " + _one_line(reason) + _CRLF


def value_block(key: bytes, flags: int, data: bytes, cas: int | None = None) -> list[bytes]:
    """``VALUE <key> <flags> <bytes> [<cas>]`` + data + CRLF, as parts (data not copied)."""
    head = b"VALUE %b %d %d" % (key, flags, len(data))
    if cas is not None:
        head += b" %d" % cas
    return [head + _CRLF, data, _CRLF]


def stat_line(name: str, value: object) -> bytes:
    """``STAT <name> <value>``."""
    return b"STAT " + _one_line(name).replace(b" ", b"_") + b" " + _one_line(str(value)) + _CRLF


def version_line(version: str) -> bytes:
    """``VERSION x.y.z``: clients parse three numbers, so anything after them is cut."""
    found = re.match(r"\d+\.\d+\.\d+", version)
    return b"VERSION " + (found.group(0) if found else "0.0.0").encode("ascii") + _CRLF


RELATIVE_EXPTIME_LIMIT: Final = 1_000_000


def exptime_to_ttl(exptime: int, now: float) -> float | None:
    """The time to live in seconds of a ``set`` exptime (Kestrel's rule).

    0: never expires (None); below 1,000,000: seconds from now; otherwise an absolute
    unix time.  A result <= 0 (a negative exptime or a time in the past) means the
    item is already expired.
    """
    if exptime == 0:
        return None
    if exptime < RELATIVE_EXPTIME_LIMIT:
        return float(exptime)
    return exptime - now


# ---------------------------------------------------------------------- commands


@dataclass(frozen=True, slots=True)
class Set:
    """``set <key> <flags> <exptime> <bytes> [noreply]`` with its data block."""

    key: bytes
    flags: int
    exptime: int
    data: bytes
    noreply: bool = False


@dataclass(frozen=True, slots=True)
class Get:
    """``get``/``gets`` with one or more keys (``with_cas`` for ``gets``)."""

    keys: tuple[bytes, ...]
    with_cas: bool = False


@dataclass(frozen=True, slots=True)
class Delete:
    """``delete <key> [0] [noreply]``."""

    key: bytes
    noreply: bool = False


@dataclass(frozen=True, slots=True)
class Flush:
    """``flush <key> [noreply]`` (Kestrel/Darner: empty one queue)."""

    key: bytes
    noreply: bool = False


@dataclass(frozen=True, slots=True)
class FlushAll:
    """``flush_all [delay] [noreply]``."""

    delay: int = 0
    noreply: bool = False


@dataclass(frozen=True, slots=True)
class Version:
    """``version``."""


@dataclass(frozen=True, slots=True)
class Stats:
    """``stats [args...]``."""

    args: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class Quit:
    """``quit``: close the connection."""


@dataclass(frozen=True, slots=True)
class Shutdown:
    """``shutdown`` (Kestrel): stop the server."""


@dataclass(frozen=True, slots=True)
class Verbosity:
    """``verbosity [level] [noreply]``: accepted and ignored (memcached answers OK)."""

    noreply: bool = False


@dataclass(frozen=True, slots=True)
class Confirm:
    """``confirm <key> <n>`` (Kestrel): close the n oldest open reads on a queue."""

    key: bytes
    count: int


@dataclass(frozen=True, slots=True)
class FlushExpired:
    """``flush_expired <key>`` (Kestrel): drop expired items; answers their number."""

    key: bytes


@dataclass(frozen=True, slots=True)
class FlushAllExpired:
    """``flush_all_expired`` (Kestrel)."""


@dataclass(frozen=True, slots=True)
class DumpStats:
    """``dump_stats [key...]`` (Kestrel): per-queue stats in blocks."""

    keys: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class Monitor:
    """``monitor <key> <seconds> [max]`` (Kestrel): stream items as open reads."""

    key: bytes
    seconds: int
    max_items: int | None = None


@dataclass(frozen=True, slots=True)
class Reject:
    """A line to answer with an error ``reply``; the connection goes on."""

    reply: bytes
    noreply: bool = False


@dataclass(frozen=True, slots=True)
class Hangup:
    """The framing is lost: send ``reply`` and close the connection."""

    reply: bytes


Command = (
    Set
    | Get
    | Delete
    | Flush
    | FlushAll
    | Version
    | Stats
    | Quit
    | Shutdown
    | Verbosity
    | Confirm
    | FlushExpired
    | FlushAllExpired
    | DumpStats
    | Monitor
    | Reject
    | Hangup
)

_BAD_FORMAT = client_error("bad command line format")
_BAD_CHUNK = client_error("bad data chunk")
_LINE_TOO_LONG = client_error("line too long")
_NOREPLY = b"noreply"
_STORAGE = frozenset((b"set", b"add", b"replace", b"append", b"prepend", b"cas"))


def _number(token: bytes) -> int | None:
    """A non-negative decimal integer, or None."""
    if 0 < len(token) <= _MAX_DIGITS and token.isdigit():
        return int(token)
    return None


def _signed(token: bytes) -> int | None:
    if token[:1] == b"-":
        value = _number(token[1:])
        return None if value is None else -value
    return _number(token)


# ---------------------------------------------------------------------- the parser

_LINE = 0  # reading a request line
_BODY = 1  # reading a data block of a storage command
_SKIP = 2  # discarding a refused data block
_TRAILER = 3  # expecting the CRLF after a skipped data block
_DISCARD = 4  # discarding the rest of an over-long line
_BROKEN = 5  # framing lost: ignore everything


@dataclass(frozen=True, slots=True)
class _Pending:
    """A storage command whose data block has not fully arrived yet."""

    verb: bytes
    tokens: tuple[bytes, ...]
    size: int
    noreply: bool


class Parser:
    """Bytes in, commands out: ``feed(data)``, then ``next_command()`` until None.

    The parser never raises on input and never holds more than one request line
    (at most ``max_line_bytes``) plus one data block (at most ``max_item_size``)
    beyond what it has not been asked to parse yet.
    """

    def __init__(
        self,
        *,
        max_item_size: int = DEFAULT_MAX_ITEM_SIZE,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
    ) -> None:
        self.max_item_size = max_item_size
        self.max_line_bytes = max_line_bytes
        self._buf = bytearray()
        self._pos = 0  # start of unparsed bytes in _buf
        self._scan = 0  # where to resume looking for LF (bytes before it hold none)
        self._state = _LINE
        self._pending: _Pending | None = None
        self._skip = 0

    @property
    def buffered(self) -> int:
        """Bytes received and not yet consumed by a command."""
        return len(self._buf) - self._pos

    @property
    def is_broken(self) -> bool:
        """True once the framing was lost (a :class:`Hangup` was returned)."""
        return self._state == _BROKEN

    @property
    def is_idle(self) -> bool:
        """True between requests: nothing buffered, no line or data block half-read."""
        return self._state == _LINE and self.buffered == 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes received from the client."""
        if self._state == _BROKEN:
            return
        if self._state == _SKIP:
            # Discard as it arrives: a refused data block is never buffered.
            view = memoryview(data)
            dropped = min(len(view), self._skip)
            self._skip -= dropped
            if self._skip == 0:
                self._state = _TRAILER
            data = view[dropped:]
            if not data:
                return
        if self._pos and self._pos == len(self._buf):
            self._buf.clear()
            self._pos = self._scan = 0
        self._buf += data

    def next_command(self) -> Command | None:
        """The next complete command, or None when more bytes are needed."""
        while True:
            state = self._state
            if state == _LINE:
                line = self._take_line()
                if line is None:
                    return None
                if isinstance(line, Reject):
                    return line
                command = self._parse_line(line)
                if command is not None:
                    return command
            elif state == _BODY:
                return self._take_body()
            elif state == _TRAILER:
                if self.buffered < 2:
                    return None
                trailer = bytes(self._buf[self._pos : self._pos + 2])
                self._consume(2)
                if trailer != _CRLF:
                    return self._hang_up(_BAD_CHUNK)
                self._state = _LINE
            elif state == _SKIP:
                available = self.buffered
                dropped = min(available, self._skip)
                self._consume(dropped)
                self._skip -= dropped
                if self._skip:
                    return None
                self._state = _TRAILER
            elif state == _DISCARD:
                newline = self._buf.find(b"\n", self._pos)
                if newline < 0:
                    self._consume(self.buffered)
                    return None
                self._consume(newline + 1 - self._pos)
                self._state = _LINE
            else:
                return None

    # ------------------------------------------------------------------ internals

    def _consume(self, n: int) -> None:
        self._pos += n
        if self._scan < self._pos:
            self._scan = self._pos
        if self._pos == len(self._buf):
            self._buf.clear()
            self._pos = self._scan = 0
        elif self._pos > 65536 and self._pos * 2 > len(self._buf):
            del self._buf[: self._pos]
            self._scan -= self._pos
            self._pos = 0

    def _hang_up(self, reply: bytes) -> Hangup:
        self._state = _BROKEN
        self._buf.clear()
        self._pos = self._scan = 0
        self._pending = None
        return Hangup(reply)

    def _take_line(self) -> bytes | Reject | None:
        buf = self._buf
        newline = buf.find(b"\n", self._scan)
        if newline < 0:
            if len(buf) - self._pos > self.max_line_bytes:
                self._consume(self.buffered)
                self._state = _DISCARD
                return Reject(_LINE_TOO_LONG)
            self._scan = len(buf)
            return None
        if newline - self._pos > self.max_line_bytes:
            self._consume(newline + 1 - self._pos)
            return Reject(_LINE_TOO_LONG)
        end = newline - 1 if newline > self._pos and buf[newline - 1] == 13 else newline
        line = bytes(buf[self._pos : end])
        self._consume(newline + 1 - self._pos)
        return line

    def _take_body(self) -> Command | None:
        pending = self._pending
        assert pending is not None
        need = pending.size + 2
        if self.buffered < need:
            return None
        start = self._pos
        if self._buf[start + pending.size : start + need] != _CRLF:
            return self._hang_up(_BAD_CHUNK)
        data = bytes(self._buf[start : start + pending.size])
        self._consume(need)
        self._state = _LINE
        self._pending = None
        return _storage_command(pending, data)

    def _parse_line(self, line: bytes) -> Command | None:
        tokens = line.split()
        if not tokens:
            return Reject(ERROR)
        verb = tokens[0].lower()
        if verb in _STORAGE:
            return self._storage_line(verb, tokens)
        if verb == b"ms":  # meta set: skip its data block, we speak the text protocol only
            size = _number(tokens[2]) if len(tokens) > 2 else None
            if size is None:
                return Reject(ERROR)
            return self._expect_block(_Pending(verb, tuple(tokens), size, False))
        handler = _SIMPLE.get(verb)
        if handler is None:
            return Reject(ERROR, noreply=len(tokens) > 1 and tokens[-1] == _NOREPLY)
        return handler(tokens)

    def _storage_line(self, verb: bytes, tokens: list[bytes]) -> Command | None:
        expected = 6 if verb == b"cas" else 5
        noreply = len(tokens) == expected + 1 and tokens[-1] == _NOREPLY
        size = _number(tokens[4]) if len(tokens) >= 5 else None
        if size is None:
            # No usable byte count: we cannot know where a data block would end, so
            # answer the line and read whatever follows as the next request.
            return Reject(_BAD_FORMAT, noreply=tokens[-1] == _NOREPLY)
        return self._expect_block(_Pending(verb, tuple(tokens), size, noreply))

    def _expect_block(self, pending: _Pending) -> Command | None:
        if pending.size > self.max_item_size:
            self._skip = pending.size
            self._state = _SKIP
            self._skip_buffered()
            return Reject(TOO_LARGE, noreply=pending.noreply)
        self._pending = pending
        self._state = _BODY
        return None

    def _skip_buffered(self) -> None:
        dropped = min(self.buffered, self._skip)
        self._consume(dropped)
        self._skip -= dropped
        if not self._skip:
            self._state = _TRAILER


def _storage_command(pending: _Pending, data: bytes) -> Command:
    tokens = pending.tokens
    if pending.verb != b"set":
        # add/replace/append/prepend/cas/ms mean nothing for a queue: unknown here.
        return Reject(ERROR, noreply=pending.noreply)
    if len(tokens) != 5 + pending.noreply:
        return Reject(_BAD_FORMAT, noreply=tokens[-1] == _NOREPLY)
    flags = _number(tokens[2])
    exptime = _signed(tokens[3])
    if flags is None or flags > MAX_FLAGS or exptime is None:
        return Reject(_BAD_FORMAT, noreply=pending.noreply)
    return Set(tokens[1], flags, exptime, data, pending.noreply)


# ---------------------------------------------------------------------- simple commands


def _get(tokens: list[bytes]) -> Command:
    if len(tokens) < 2:
        return Reject(ERROR)
    return Get(tuple(tokens[1:]), with_cas=tokens[0].lower() == b"gets")


def _split_noreply(tokens: list[bytes]) -> tuple[list[bytes], bool]:
    if len(tokens) > 1 and tokens[-1] == _NOREPLY:
        return tokens[:-1], True
    return tokens, False


def _delete(tokens: list[bytes]) -> Command:
    args, noreply = _split_noreply(tokens)
    # memcached still accepts the legacy "delete <key> 0".
    if len(args) == 2 or (len(args) == 3 and args[2] == b"0"):
        return Delete(args[1], noreply)
    return Reject(client_error("bad command line format; usage: delete <key> [noreply]"), noreply)


def _flush(tokens: list[bytes]) -> Command:
    args, noreply = _split_noreply(tokens)
    if len(args) != 2:
        return Reject(client_error("bad command line format; usage: flush <queue>"), noreply)
    return Flush(args[1], noreply)


def _flush_all(tokens: list[bytes]) -> Command:
    args, noreply = _split_noreply(tokens)
    if len(args) == 1:
        return FlushAll(0, noreply)
    delay = _signed(args[1]) if len(args) == 2 else None
    if delay is None:
        return Reject(_BAD_FORMAT, noreply)
    return FlushAll(max(delay, 0), noreply)


def _version(tokens: list[bytes]) -> Command:
    return Version()


def _stats(tokens: list[bytes]) -> Command:
    return Stats(tuple(tokens[1:]))


def _quit(tokens: list[bytes]) -> Command:
    return Quit()


def _shutdown(tokens: list[bytes]) -> Command:
    return Shutdown()


def _verbosity(tokens: list[bytes]) -> Command:
    return Verbosity(noreply=tokens[-1] == _NOREPLY)


def _confirm(tokens: list[bytes]) -> Command:
    count = _number(tokens[2]) if len(tokens) == 3 else None
    if count is None:
        return Reject(client_error("bad command line format; usage: confirm <queue> <count>"))
    return Confirm(tokens[1], count)


def _flush_expired(tokens: list[bytes]) -> Command:
    if len(tokens) != 2:
        return Reject(client_error("bad command line format; usage: flush_expired <queue>"))
    return FlushExpired(tokens[1])


def _flush_all_expired(tokens: list[bytes]) -> Command:
    return FlushAllExpired()


def _dump_stats(tokens: list[bytes]) -> Command:
    return DumpStats(tuple(tokens[1:]))


def _monitor(tokens: list[bytes]) -> Command:
    numbers = [_number(t) for t in tokens[2:]]
    if len(tokens) not in (3, 4) or None in numbers:
        return Reject(
            client_error("bad command line format; usage: monitor <queue> <seconds> [max]")
        )
    seconds = numbers[0]
    assert seconds is not None
    return Monitor(tokens[1], seconds, numbers[1] if len(numbers) == 2 else None)


_SIMPLE = {
    b"get": _get,
    b"gets": _get,
    b"delete": _delete,
    b"flush": _flush,
    b"flush_all": _flush_all,
    b"version": _version,
    b"stats": _stats,
    b"quit": _quit,
    b"shutdown": _shutdown,
    b"verbosity": _verbosity,
    b"confirm": _confirm,
    b"flush_expired": _flush_expired,
    b"flush_all_expired": _flush_all_expired,
    b"dump_stats": _dump_stats,
    b"monitor": _monitor,
}


# ---------------------------------------------------------------------- keys

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_:.-]{1,200}")
# The rule of ledgerq.Queue.reader names (docs/usage.md).
_READER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_MAX_WAIT_MS = 10**12  # about 31 years: "forever" without overflowing a timer


class KeyProblem(ValueError):
    """A key that names no queue or has bad options; ``str()`` is the CLIENT_ERROR reason."""


def is_valid_queue_name(name: str) -> bool:
    """``[A-Za-z0-9_:.-]``, 1-200 characters, not ``.`` or ``..`` (a directory name)."""
    return bool(_QUEUE_NAME.fullmatch(name)) and name not in (".", "..")


def is_valid_reader_name(name: str) -> bool:
    """A ledgerq reader name: 1-100 of ``[A-Za-z0-9_.-]``, not starting with ``.``/``-``."""
    return bool(_READER_NAME.fullmatch(name))


@dataclass(frozen=True, slots=True)
class GetKey:
    """What one key of a ``get`` asks for: ``queue[+reader][/t=<ms>][/open]...``."""

    key: bytes  # as sent: echoed on the VALUE line
    queue: str
    reader: str | None = None  # ``queue+reader``: that reader of the queue (fan-out)
    timeout_ms: int = 0
    open: bool = False
    close: bool = False
    abort: bool = False
    peek: bool = False

    @property
    def bare_key(self) -> bytes:
        """The key without its options (what Kestrel puts on VALUE lines)."""
        return self.key.split(b"/", 1)[0]

    @property
    def takes(self) -> bool:
        """Whether this key removes an item (a plain get or an /open)."""
        return not (self.peek or self.abort or (self.close and not self.open))


def _decode(key: bytes) -> str:
    try:
        return key.decode("ascii")
    except UnicodeDecodeError:
        raise KeyProblem("keys must be ASCII") from None


def parse_queue_key(key: bytes) -> tuple[str, str | None]:
    """``queue`` or ``queue+reader`` -> (queue, reader); raises :class:`KeyProblem`."""
    text = _decode(key)
    queue, plus, reader = text.partition("+")
    if not is_valid_queue_name(queue):
        raise KeyProblem(
            f"bad queue name {queue[:60]!r}: use 1-200 of A-Z a-z 0-9 _ : . - (not . or ..)"
        )
    if not plus:
        return queue, None
    if not is_valid_reader_name(reader):
        raise KeyProblem(
            f"bad reader name {reader[:60]!r}: use 1-100 of A-Z a-z 0-9 _ . -, "
            "not starting with . or -"
        )
    return queue, reader


def parse_get_key(key: bytes) -> GetKey:
    """Parse a ``get`` key and its ``/``-separated options; raises :class:`KeyProblem`."""
    name, *options = key.split(b"/")
    queue, reader = parse_queue_key(name)
    flags = {"open": False, "close": False, "abort": False, "peek": False}
    timeout_ms = 0
    for option in options:
        text = _decode(option)
        if text in flags:
            flags[text] = True
        elif text.startswith("t="):
            value = _number(option[2:])
            if value is None:
                raise KeyProblem(f"bad timeout {text[:30]!r}: use t=<milliseconds>")
            timeout_ms = min(value, _MAX_WAIT_MS)
        else:
            raise KeyProblem(f"unknown option {text[:30]!r} (use t=<ms>, open, close, abort, peek)")
    if flags["peek"] and (flags["open"] or flags["abort"]):
        raise KeyProblem("peek cannot be combined with open or abort")
    if flags["abort"] and (flags["open"] or flags["close"]):
        raise KeyProblem("abort must be by itself")
    return GetKey(key, queue, reader, timeout_ms, **flags)


@dataclass(frozen=True, slots=True)
class SetKey:
    """What a ``set`` key addresses: ``queue[/sync]``."""

    queue: str
    sync: bool = False


def parse_set_key(key: bytes) -> SetKey:
    """Parse a ``set`` key (``/sync`` fsyncs before STORED, as Darner); raises KeyProblem."""
    name, *options = key.split(b"/")
    queue, reader = parse_queue_key(name)
    if reader is not None:
        raise KeyProblem("set to the queue, not to one of its readers (queue+reader)")
    sync = False
    for option in options:
        if option != b"sync":
            raise KeyProblem(f"unknown set option {_decode(option)[:30]!r} (use sync)")
        sync = True
    return SetKey(queue, sync)
