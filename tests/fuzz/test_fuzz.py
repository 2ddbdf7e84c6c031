"""Fuzzing every decoder (targets: ``_targets.py``; inputs: ``_strategies.py``).

The normal run gives each target ``LEDGERQ_FUZZ_EXAMPLES`` inputs (default 150,
derandomized so the run is the same every time); a long run is
``LEDGERQ_FUZZ_EXAMPLES=20000 LEDGERQ_FUZZ_RANDOM=1 pytest tests/fuzz`` or
``python -m tests.fuzz --examples 20000``.  Every committed seed is also run as is.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import ledgerq
import ledgerq.format.entry as entry_format
import ledgerq.format.reader_state as state_format
from ledgerq.format.feature_state import encode_feature_file_header, encode_feature_record
from ledgerq.format.reader_state import encode_state_file_header
from ledgerq.segment import readonly
from tests.fuzz import _corpus
from tests.fuzz._strategies import inputs
from tests.fuzz._targets import TARGETS, run_target, scratch_cleanup

EXAMPLES = int(os.environ.get("LEDGERQ_FUZZ_EXAMPLES", "150"))
RANDOM = os.environ.get("LEDGERQ_FUZZ_RANDOM", "") not in ("", "0")


@pytest.fixture(autouse=True, scope="module")
def _cleanup() -> Iterator[None]:
    yield
    scratch_cleanup()


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_seed_corpus(name: str) -> None:
    seeds = _corpus.load(name)
    assert seeds, f"no committed seeds in {_corpus.CORPUS / name}"
    for data in seeds:
        if data in KNOWN_BAD_SEEDS.get(name, ()):
            continue
        run_target(name, data)


def fuzzer(name: str, examples: int, *, derandomize: bool) -> Callable[[], None]:
    """A hypothesis test running ``examples`` inputs through target ``name``."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=derandomize,
        suppress_health_check=list(HealthCheck),
    )
    @given(inputs(_corpus.load(name)))
    def fuzz(data: bytes) -> None:
        if not any(bug(name, data) for bug in KNOWN_BUGS):
            run_target(name, data)

    return fuzz  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fuzz(name: str) -> None:
    fuzzer(name, EXAMPLES, derandomize=not RANDOM)()


def test_committed_corpus_is_up_to_date() -> None:
    """The committed seeds are what ``python -m tests.fuzz --make-corpus`` writes."""
    for target, files in _corpus.seeds().items():
        for name, data in files.items():
            path = _corpus.CORPUS / target / f"{name}.bin"
            assert path.read_bytes() == data, f"{path} is stale: run --make-corpus"


# ---------------------------------------------------------------------- known bugs
#
# Inputs that hit a known, open bug are left out of the fuzz runs above (so that these
# do not stop at the first one) and shown by an xfail test.  None at the moment: the
# tests below are regression tests of bugs 12-15 of docs/reliability.md, fixed.

KNOWN_BUGS: tuple[Callable[[str, bytes], bool], ...] = ()
KNOWN_BAD_SEEDS: dict[str, tuple[bytes, ...]] = {}


# ---------------------------------------------------------------------- hostile files


def _feature_file(magic: bytes, value: list[object]) -> bytes:
    return encode_feature_file_header(magic) + encode_feature_record(value)


@pytest.mark.parametrize("name", ["dedup_file", "retry_file"])
def test_feature_file_with_infinity(name: str) -> None:
    """Bug 12: a float infinity in a feature record made open() raise OverflowError."""
    if name == "dedup_file":
        data = _feature_file(b"LQDD", [b"k" * 16, 1, float("inf")])
    else:
        data = _feature_file(b"LQRT", ["default", 1, float("inf"), "why"])
    run_target(name, data)


def test_dedup_file_with_int_key() -> None:
    """Bug 13: an int key n made the dedup table allocate n bytes (bytes(n))."""
    run_target("dedup_file", _feature_file(b"LQDD", [10_000_000, 1, 1]))


def test_bad_dedup_records_are_skipped_and_good_ones_kept(tmp_path: Path) -> None:
    """A dedup.log record of the wrong shape costs that record, not the window."""
    path = tmp_path / "q"
    with ledgerq.open(path, dedup_window=3600) as q:
        first = q.enqueue(b"a", dedup_id="order-1")
    with open(path / "features" / "dedup.log", "ab") as f:
        for bad in ([1 << 40, 1, 1], [b"k" * 16, 1, float("inf")], [b"k" * 16, "1", 1]):
            f.write(encode_feature_record(bad))
    with ledgerq.open(path, dedup_window=3600) as q:
        assert q.enqueue(b"again", dedup_id="order-1") == first
        assert [m.payload for m in q.peek(5)] == [b"a"]


def test_meta_json_nested_deeply() -> None:
    """Bug 14: a meta.json of 1000 nested arrays made open() raise RecursionError."""
    run_target("meta", b"[" * 1000)


def test_meta_json_nested_deeply_is_damage_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, max_retries=5):
        pass
    (path / "meta.json").write_bytes(b"[" * 100_000)
    with pytest.raises(ledgerq.NotAQueueError, match="damaged"):  # read-only readers
        readonly.check_queue_dir(path)
    with ledgerq.open(path) as q:  # rebuilt from the segments and options.json
        assert q.options.max_retries == 5
    (path / "meta.json").write_bytes(b"[" * 100_000)
    (path / "options.json").unlink()
    with pytest.raises(ledgerq.CorruptionError, match="verify --repair"):
        ledgerq.open(path)


# ---------------------------------------------------------------------- hostile lengths


def _crc_bytes(
    monkeypatch: pytest.MonkeyPatch, module: object, name: str = "checksum"
) -> dict[str, int]:
    """Count the bytes handed to ``module.<name>``, the CRC its decoder calls (work, not time).

    The entry decoder calls ``entry._crc32`` (zlib's, bound without a call layer), the
    reader-state decoder ``reader_state.checksum``; the tests check that some bytes were
    counted, so a decoder that stops calling the counted name cannot pass unmeasured.
    """
    seen = {"bytes": 0}
    original = getattr(module, name)

    def counting(data: bytes | memoryview, *args: int) -> int:
        seen["bytes"] += len(data)
        return original(data, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(module, name, counting)
    return seen


def _descending_lengths(size: int) -> bytes:
    """Every 4th offset holds a length reaching exactly to the end of the data."""
    return b"".join(struct.pack("<I", max(size - k, 30)) for k in range(0, size, 4))


def _checkpoint_headers(size: int) -> bytes:
    """A CHECKPOINT record header (any body size is plausible) every 5 bytes, each
    claiming to reach exactly to the end of the data."""
    out = bytearray()
    while len(out) < size:
        out += struct.pack("<IB", size - len(out), 1)
    return bytes(out[:size])


@pytest.mark.parametrize("size", [1 << 15, 1 << 18])
@pytest.mark.parametrize("crafted", [_descending_lengths, _checkpoint_headers])
def test_journal_recovery_work_is_linear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, crafted: Callable[[int], bytes]
) -> None:
    """Bug 15: every offset after a bad record held a record claiming the rest of the
    file, each checksummed: quadratic (137 GB of CRC for a 1 MiB journal)."""
    bad = b"\x11\x00\x00\x00\x03" + b"\x00" * 12  # a record with a wrong CRC
    data = encode_state_file_header() + bad + crafted(size)
    seen = _crc_bytes(monkeypatch, state_format)
    run_target("journal", data, measure=False)
    assert 0 < seen["bytes"] <= 64 * len(data), f"{seen['bytes']} bytes checksummed"


def _open_and_peek(path: Path) -> list[bytes]:
    with ledgerq.open(path, sync="never") as q:
        return [m.payload for m in q.peek(100)]


def _queue_with_tail(path: Path, tail: bytes) -> None:
    """A queue holding one message, b"first", with ``tail`` appended to its segment."""
    with ledgerq.open(path, sync="never") as q:
        q.enqueue(b"first")
    log = next((path / "segments").glob("*.log"))
    with open(log, "ab") as f:
        f.write(tail)


def test_segment_recovery_work_is_linear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug 15: recovery of the newest segment tried every offset after bad bytes and
    checksummed each plausible entry over the length it claimed: quadratic."""
    path = tmp_path / "q"
    size = 1 << 15
    garbage = bytearray()
    while len(garbage) < size:  # entry headers (type DATA, id 2**60) claiming the rest
        remaining = size - len(garbage)
        garbage += struct.pack("<IBBQq", remaining, 1, 0, 1 << 60, 0)[:22]
    _queue_with_tail(path, bytes(garbage[:size]))
    seen = _crc_bytes(monkeypatch, entry_format, "_crc32")
    assert _open_and_peek(path) == [b"first"]
    assert 0 < seen["bytes"] <= 64 * (size + 64), f"{seen['bytes']} bytes checksummed"


def test_segment_recovery_of_alternating_damage_is_linear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Valid entries, each after a header claiming the rest of the file with a wrong
    CRC: every entry read in order fails a checksum as long as the file."""
    path = tmp_path / "q"
    size = 1 << 15
    garbage = bytearray()
    message_id = 2
    while len(garbage) < size:
        remaining = size - len(garbage)
        garbage += struct.pack("<IBBQq", remaining, 1, 0, message_id, 0)
        garbage += entry_format.encode_plain_entry(message_id, 0, b"x")
        message_id += 1
    _queue_with_tail(path, bytes(garbage))
    seen = _crc_bytes(monkeypatch, entry_format, "_crc32")
    payloads = _open_and_peek(path)
    assert payloads[0] == b"first" and set(payloads[1:]) <= {b"x"}
    assert 0 < seen["bytes"] <= 64 * (len(garbage) + 64), f"{seen['bytes']} bytes checksummed"


def test_damage_more_than_a_search_window_before_the_next_index_point(tmp_path: Path) -> None:
    """A damaged entry followed by over 1 MiB of log before the next known boundary
    made the resynchronisation recurse without end (RecursionError) instead of
    skipping the entry."""
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        q.enqueue(b"b" * (3 << 19))  # 1.5 MiB: the next index point is after it
        q.enqueue(b"small")
    log = next((path / "segments").glob("*.log"))
    with open(log, "r+b") as f:
        f.seek(1 << 20)
        f.write(b"\xff")  # inside the big payload: its CRC no longer matches
    with ledgerq.open(path) as q:
        assert [m.payload for m in q.peek(5)] == [b"small"]
        assert q.stats().corrupt_skipped == 1
