"""Fuzz targets: one function per decoder, taking arbitrary bytes.

Each target feeds the bytes to a decoder (or writes them as a file the library then
loads) and fails - raises something other than :class:`Allowed` - when the decoder
raises anything but the library's own errors, returns something inconsistent, or
allocates memory out of proportion to its input (a length field taken at its word).
:func:`run_target` adds the memory check (tracemalloc peak) and a watchdog against
hangs; hypothesis (``test_fuzz.py``) and atheris (``python -m tests.fuzz --engine
atheris``) both drive it.

Every module under fuzzing is imported at the top of this file, in one block: a module
of ledgerq's own that fails to import fails the run (the test module does not even
collect), it never skips a target.  When a module moves, that block is the one place
to change.  No target needs an optional third-party package; one that ever does would
skip with ``pytest.importorskip(package, reason=...)`` in its own test, and only then.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import struct
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard

# The code under fuzzing: modules, not names, so that a module that moves is a
# one-line change here (the targets below say ``journal3.decode_record3``).
import ledgerq.core.journal as reader_journal
import ledgerq.features.dedup as dedup
import ledgerq.features.dlq.retries as retry
import ledgerq.format.entry as entry_format
import ledgerq.format.feature_state as feature_state
import ledgerq.format.index as index_format
import ledgerq.format.reader_state as state_format
import ledgerq.format.sealing as sealing
import ledgerq.kestrel.journal3 as journal3
import ledgerq.kestrel.oldjournal as oldjournal
import ledgerq.segment.meta as meta_store
import ledgerq.server.protocol as memcache_protocol
import ledgerq.tools as tools
from ledgerq._api import open as open_queue
from ledgerq._errors import LedgerQError
from ledgerq._options import Options
from ledgerq._types import Message
from ledgerq.format.checksum import checksum, checksum_v1
from ledgerq.format.errors import CorruptRecord, DecodeError
from ledgerq.format.reader_state import StateRecordType
from tests.encryption._files import set_encryption_block

__all__ = ["TARGETS", "Target", "executions", "run_target"]

WATCHDOG_SECONDS = 30  # a decode of a few KiB taking this long is a hang
_counter = {"executions": 0}


def executions() -> int:
    """How many inputs :func:`run_target` has run in this process."""
    return _counter["executions"]


@dataclass(frozen=True)
class Target:
    """A decoder under fuzzing: ``run(data)`` and its memory allowance."""

    name: str
    run: Callable[[bytes], None]
    description: str
    fixed_bytes: int = 1 << 20  # allowed peak allocation on top of per_byte * len(data)
    per_byte: int = 128


# ---------------------------------------------------------------------- pure decoders


def _entries_at(
    data: bytes, positions: tuple[int, ...]
) -> Iterator[tuple[int, entry_format.Entry, int]]:
    """``(position, entry, stop)`` of each of ``positions`` (ascending, up to the end of
    ``data``) at which an entry decodes; a DecodeError there passes it over."""
    for pos in positions:
        if pos > len(data):
            return
        try:
            entry, stop = entry_format.decode_entry(data, pos)
        except DecodeError:
            continue
        yield pos, entry, stop


def _entry(data: bytes) -> None:
    for pos, entry, stop in _entries_at(data, (0, 1, 5)):
        assert entry.size == stop - pos
        assert entry_format.MIN_ENTRY_SIZE <= entry.size <= len(data) - pos
        # Never delivered unless the checksum its format names holds (a v1 entry CRC-32,
        # a v2 entry CRC-32C), and the format is the one its type byte says.
        assert entry.format == (2 if data[pos + 4] >> 4 == 2 else 1)
        crc = entry_format._crc32 if entry.format == 2 else entry_format._crc32_v1
        assert crc(data[pos : stop - 4]) == int.from_bytes(data[stop - 4 : stop], "little")
        assert entry.id >= 1 and 0 <= entry.priority <= 2
        assert entry.headers is None or all(
            type(k) is str and type(v) is str for k, v in entry.headers.items()
        )
    try:
        assert entry_format.peek_length(data, 0) >= entry_format.MIN_ENTRY_SIZE
    except DecodeError:
        pass
    try:
        entry_format.decode_headers(data)
    except CorruptRecord:
        pass


# The key and queue identity the sealed seeds are made with (tests/fuzz/_corpus.py).
FUZZ_KEY = bytes(range(32))
FUZZ_QUEUE_ID = bytes(range(16))
_SEALER = sealing.EntrySealer(FUZZ_KEY, FUZZ_QUEUE_ID)
_ZSTD = zstandard.ZstdDecompressor()
_SEALED_PREFIX = entry_format.ENTRY_HEADER.pack(64, 0x21, 0x80, 7, 0)


def _sealed_entry(data: bytes) -> None:
    """Decode, then open as the queue does: a sealed payload opens to exactly what was
    sealed, or raises CorruptRecord - never other bytes.  The input is also taken as the
    sealed content itself (sealed here, so the content parser sees arbitrary bytes)."""
    for _, entry, _ in _entries_at(data, (0, 1)):
        if not entry.flags & entry_format.EntryFlags.ENCRYPTED:
            continue
        try:
            opened = _SEALER.open(entry)
        except CorruptRecord:
            continue
        assert not opened.flags & entry_format.EntryFlags.ENCRYPTED
        assert (opened.id, opened.timestamp, opened.group) == (
            entry.id,
            entry.timestamp,
            entry.group,
        )
        assert opened.headers is None or all(
            type(k) is str and type(v) is str for k, v in opened.headers.items()
        )
    content_entry = entry_format.Entry(
        7, 0, None, 1, None, _SEALER.seal(_SEALED_PREFIX, data), 0x80, 1, 65
    )
    # The prefix rebuilt from these fields is not _SEALED_PREFIX (its length field says
    # 65, not 64): authentication must fail, whatever the content.
    try:
        _SEALER.open(content_entry)
    except CorruptRecord:
        pass
    else:
        raise AssertionError("a blob sealed for another prefix opened")
    prefix = entry_format.ENTRY_HEADER.pack(
        entry_format.MIN_ENTRY_SIZE + sealing.SEAL_OVERHEAD + len(data), 0x21, 0x80, 7, 0
    )
    sealed = entry_format.Entry(
        7,
        0,
        None,
        1,
        None,
        _SEALER.seal(prefix, data),
        0x80,
        1,
        entry_format.MIN_ENTRY_SIZE + sealing.SEAL_OVERHEAD + len(data),
    )
    try:
        opened = _SEALER.open(sealed)
    except CorruptRecord:
        assert not data or data[0] != 0  # content flags 0: any body is a message
        return
    # Opened: the content was well formed, and it is given back exactly.
    headers = opened.headers
    rebuilt = _SEALER.content(
        data[5 : 5 + int.from_bytes(data[1:5], "little")] if headers is not None else None,
        opened.payload,
    )
    assert rebuilt == data


def _index(data: bytes) -> None:
    try:
        entries, sealed = index_format.decode_index(data)
    except DecodeError:
        return
    for a, b in itertools.pairwise(entries):
        assert a.id < b.id and a.offset < b.offset
    if sealed:
        count = int.from_bytes(data[8:12], "little")
        assert count != index_format.OPEN_COUNT and len(entries) == count


def _reader_state(data: bytes) -> None:
    crc = state_format.state_checksum(state_format.STATE_VERSION)
    try:
        pos = state_format.decode_state_file_header(data)
        crc = state_format.state_checksum(state_format.state_file_version(data))
    except DecodeError:
        pos = 0  # walk the records anyway
    while pos < len(data):
        try:
            kind, body, nxt = state_format.decode_state_record(data, pos, crc)
        except DecodeError:
            pos += 1
            continue
        assert nxt > pos
        if kind is StateRecordType.CHECKPOINT:
            assert isinstance(body, bytes)
            _checkpoint(body)
        else:
            assert isinstance(body, tuple) and body
        pos = nxt


def _checkpoint(data: bytes) -> None:
    try:
        cp = state_format.decode_checkpoint(data)
    except CorruptRecord:
        return
    assert type(cp.head) is int and all(type(i) is int for i in cp.done)
    assert all(type(i) is int and type(n) is int for i, n in cp.deliveries)


def _feature_state(data: bytes) -> None:
    for magic in (b"LQDD", b"LQRT"):
        try:
            values, end, damaged, _ = feature_state.decode_feature_file(data, magic)
        except DecodeError:
            continue
        assert 8 <= end <= len(data)
        assert isinstance(values, list)
        assert damaged <= len(values)  # a skipped region is always followed by a record


# ---------------------------------------------------------------------- file loaders


class _Scratch:
    """One directory per process for the loaders' files (rewritten for every input)."""

    def __init__(self, base: str | None = None) -> None:
        self._base = base
        self._path: Path | None = None

    @property
    def path(self) -> Path:
        if self._path is None or not self._path.is_dir():
            self._path = Path(tempfile.mkdtemp(prefix="ledgerq-fuzz-", dir=self._base))
        return self._path


_scratch = _Scratch()
# Whole queues, opened and closed for every input: in memory where the system has a
# tmpfs, since each open and close fsyncs several files (most of an input's time on disk).
_queue_scratch = _Scratch("/dev/shm" if os.path.isdir("/dev/shm") else None)


def _meta(data: bytes) -> None:
    directory = _scratch.path / "meta"
    directory.mkdir(exist_ok=True)
    (directory / "meta.json").write_bytes(data)
    try:
        meta = meta_store.MetaStore(str(directory)).load()
    except LedgerQError:
        return
    assert isinstance(meta.next_id, int) and isinstance(meta.reserved_until, int)
    assert isinstance(meta.counters, dict) and isinstance(meta.options, dict)
    json.dumps(meta.counters)


def _journal(data: bytes) -> None:
    path = _scratch.path / "reader.state"
    path.write_bytes(data)
    journal = reader_journal.ReaderJournal(str(path))
    try:
        state = journal.load()
    except LedgerQError:
        return
    finally:
        journal.close()
    assert all(type(i) is int for i in state.done)


class _QueueStub:
    """What a feature's ``attach`` uses of the queue (an exclusive one)."""

    shared = False  # shared mode: other handles append to the feature's files too
    is_alone = True

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.corrupt_skipped = 0

    def note_corrupt_skipped(self, count: int) -> None:
        assert count > 0
        self.corrupt_skipped += count

    def keyed_digest(self, size: int) -> None:
        return None  # a plain queue: the features' unkeyed digests


def _dedup_file(data: bytes) -> None:
    root = _scratch.path / "dedup"
    (root / "features").mkdir(parents=True, exist_ok=True)
    (root / "features" / "dedup.log").write_bytes(data)
    feature = dedup.DedupFeature(Options(dedup_window=60.0))
    try:
        feature.attach(_QueueStub(root))  # type: ignore[arg-type]
    except LedgerQError:
        return
    finally:
        feature.close()


def _retry_file(data: bytes) -> None:
    path = _scratch.path / "retries.log"
    path.write_bytes(data)
    try:
        tracker = retry.RetryTracker(str(path))
    except LedgerQError:
        return
    tracker.close()


# ---------------------------------------------------------------------- an encrypted queue


def _forger(data: bytes) -> bytes:
    """``data`` with the CRC of every entry its length fields delimit made right - what
    an attacker without the key can do - so that the fuzzer reaches past the checksums
    to the readers' seal checks.  The type byte's format says which CRC (format 1: CRC-32)."""
    out = bytearray(data)
    pos = 0
    while pos + entry_format.MIN_ENTRY_SIZE <= len(out):
        (length,) = struct.unpack_from("<I", out, pos)
        if length < entry_format.MIN_ENTRY_SIZE or pos + length > len(out):
            break
        crc = checksum_v1 if out[pos + 4] >> entry_format.ENTRY_FORMAT_SHIFT == 0 else checksum
        crc_at = pos + length - 4
        out[crc_at : pos + length] = struct.pack("<I", crc(bytes(out[pos:crc_at])))
        pos += length
    return bytes(out)


def _authentic(log: bytes) -> set[tuple[int, bytes, tuple[tuple[str, str], ...]]]:
    """(id, payload, headers) of every entry at any offset of ``log`` that opens under
    the key: the only messages a reader of the encrypted queue may deliver."""
    found = set()
    for pos in range(len(log)):
        try:
            entry, _ = entry_format.decode_entry(log, pos)
            opened = _SEALER.open(entry)
        except DecodeError:
            continue
        payload = opened.payload
        if opened.flags & entry_format.EntryFlags.COMPRESSED:
            try:
                payload = _ZSTD.decompress(payload, max_output_size=1 << 20)
            except Exception:  # a frame zstd refuses is skipped by the readers too
                continue
        found.add((entry.id, payload, tuple(sorted((opened.headers or {}).items()))))
    return found


def _encrypted_queue_template() -> Path:
    """An empty encrypted queue made once per process, under the fuzz key and the fuzz
    queue identity (the one the sealed seeds are made with)."""
    template = _queue_scratch.path / "encrypted-template"
    if (template / "meta.json").exists():
        return template
    open_queue(template, encryption_key=FUZZ_KEY).close()
    block = {
        "cipher": sealing.CIPHER_NAME,
        "queue_id": FUZZ_QUEUE_ID.hex(),
        "key_check": sealing.key_check(FUZZ_KEY, FUZZ_QUEUE_ID).hex(),
    }
    set_encryption_block(template, block)
    for leftover in (template / "segments").iterdir():
        leftover.unlink()
    return template


def _forged_log(data: bytes) -> None:
    """An encrypted queue whose log is ``data`` (every CRC made right): the queue's
    dequeue (its fast path included) and peek, and the lock-free view under ``ledgerq
    dump`` and the console, deliver only entries that open under the key, as sealed."""
    log = _forger(data)
    authentic = _authentic(log)
    queue = _queue_scratch.path / "encrypted"
    shutil.rmtree(queue, ignore_errors=True)
    shutil.copytree(_encrypted_queue_template(), queue)
    (queue / "segments" / f"{1:020d}.log").write_bytes(log)

    def check(message: Message) -> None:
        key = (message.id, message.payload, tuple(sorted(message.headers.items())))
        assert key in authentic, f"delivered {key!r}, which no sealed entry holds"

    for message in tools.iter_messages(queue, encryption_key=FUZZ_KEY):
        check(message)
    try:
        q = open_queue(queue, encryption_key=FUZZ_KEY)
    except LedgerQError:
        return
    try:
        for message in q.peek(100):
            check(message)
        for _ in range(100):
            message = q.dequeue()
            if message is None:
                break
            check(message)
    finally:
        q.close()


# ---------------------------------------------------------------------- other decoders


def _memcache(data: bytes) -> None:
    parser = memcache_protocol.Parser(max_item_size=4096, max_line_bytes=512)
    # Feed in pieces (as a socket would), asking for commands after each.
    step = max(1, (data[0] if data else 1) % 17)
    for at in range(0, len(data), step):
        parser.feed(data[at : at + step])
        for _ in range(len(data) + 2):
            if parser.next_command() is None:
                break
    assert parser.buffered <= 512 + 4096 + len(data)


def _walk_records(
    data: bytes, decode: Callable[[bytes, int], Any], allowed: tuple[type[Exception], ...]
) -> None:
    """Decode record after record until the end, one of the ``allowed`` errors or a None
    (the end marker); every record decoded must move on."""
    pos = 0
    while pos < len(data):
        try:
            record = decode(data, pos)
        except allowed:
            break
        if record is None:
            break
        assert record.size > 0
        pos += record.size


def _kestrel3(data: bytes) -> None:
    _walk_records(data, journal3.decode_record3, (journal3.TruncatedRecord, journal3.BadRecord))


def _kestrel_old(data: bytes) -> None:
    _walk_records(
        data, oldjournal.decode_record, (oldjournal.TruncatedRecord, oldjournal.BadRecord)
    )


# ---------------------------------------------------------------------- registry

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("entry", _entry, "format.entry: decode_entry, peek_length, decode_headers"),
        Target("sealed_entry", _sealed_entry, "format.sealing: EntrySealer.open of an entry"),
        Target(
            "forged_log",
            _forged_log,
            "an encrypted queue's readers over a log forged without the key (CRCs made right)",
            fixed_bytes=32 << 20,  # a queue opened and closed: journals, features, buffers
        ),
        Target("index", _index, "format.index: decode_index"),
        Target("reader_state", _reader_state, "format.reader_state: header and records"),
        Target("checkpoint", _checkpoint, "format.reader_state: decode_checkpoint"),
        Target("feature_state", _feature_state, "format.feature_state: decode_feature_file"),
        Target("meta", _meta, "core.meta: MetaStore.load of meta.json"),
        Target("journal", _journal, "core.journal: ReaderJournal.load of a state file"),
        Target("dedup_file", _dedup_file, "features.dedup: loading features/dedup.log"),
        Target("retry_file", _retry_file, "features.dlq.retries: loading features/retries.log"),
        Target("memcache", _memcache, "server.protocol: Parser.feed/next_command"),
        Target("kestrel3", _kestrel3, "kestrel.journal3: decode_record3"),
        Target("kestrel_old", _kestrel_old, "kestrel.oldjournal: decode_record"),
    )
}

# ---------------------------------------------------------------------- running


class Hang(AssertionError):
    """An input kept a decoder busy past the watchdog."""


@contextmanager
def _watchdog(seconds: int) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise Hang(f"no result after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_target(name: str, data: bytes, *, measure: bool = True) -> None:
    """Run one input through a target, with the memory check and the hang watchdog."""
    target = TARGETS[name]
    _counter["executions"] += 1
    if not measure:
        with _watchdog(WATCHDOG_SECONDS):
            target.run(data)
        return
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    try:
        with _watchdog(WATCHDOG_SECONDS):
            target.run(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if started:
            tracemalloc.stop()
    allowed = target.fixed_bytes + target.per_byte * len(data)
    assert peak - base <= allowed, (
        f"{name}: {peak - base} bytes allocated for a {len(data)}-byte input "
        f"(allowed {allowed}): a length field was trusted"
    )


def scratch_cleanup() -> None:
    """Remove the loaders' scratch directories."""
    for scratch in (_scratch, _queue_scratch):
        path = scratch._path
        if path is not None and path.is_dir():
            for top, dirs, files in os.walk(path, topdown=False):
                for name in files:
                    os.unlink(os.path.join(top, name))
                for name in dirs:
                    os.rmdir(os.path.join(top, name))
            os.rmdir(path)
            scratch._path = None
