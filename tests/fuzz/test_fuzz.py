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
from tests.fuzz import _corpus
from tests.fuzz._strategies import inputs
from tests.fuzz._targets import TARGETS, UNAVAILABLE, run_target, scratch_cleanup

EXAMPLES = int(os.environ.get("LEDGERQ_FUZZ_EXAMPLES", "150"))
RANDOM = os.environ.get("LEDGERQ_FUZZ_RANDOM", "") not in ("", "0")


@pytest.fixture(autouse=True, scope="module")
def _cleanup() -> Iterator[None]:
    yield
    scratch_cleanup()


def _skip_if_unavailable(name: str) -> None:
    if name in UNAVAILABLE:
        pytest.skip(f"not yet covered: {UNAVAILABLE[name]}")


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_seed_corpus(name: str) -> None:
    _skip_if_unavailable(name)
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
    _skip_if_unavailable(name)
    fuzzer(name, EXAMPLES, derandomize=not RANDOM)()


def test_committed_corpus_is_up_to_date() -> None:
    """The committed seeds are what ``python -m tests.fuzz --make-corpus`` writes."""
    for target, files in _corpus.seeds().items():
        for name, data in files.items():
            path = _corpus.CORPUS / target / f"{name}.bin"
            assert path.read_bytes() == data, f"{path} is stale: run --make-corpus"


# ---------------------------------------------------------------------- known bugs
#
# Inputs that hit a known bug are left out of the fuzz runs above (so that these do
# not stop at the first one) and shown by the xfail tests below.


def _feature_record_value(name: str, data: bytes) -> list[object]:
    from ledgerq.format.feature_state import decode_feature_file

    magic = b"LQDD" if name == "dedup_file" else b"LQRT"
    try:
        values, _ = decode_feature_file(data, magic)
    except Exception:
        return []
    return values


def _bad_feature_value(name: str, data: bytes) -> bool:
    """A CRC-valid record with a float infinity or a big int where bytes belong."""
    if name not in ("dedup_file", "retry_file"):
        return False
    for value in _feature_record_value(name, data):
        if not isinstance(value, list):
            continue
        if any(isinstance(v, float) and v != v * 0 + v for v in value):  # inf, nan
            return True
        if name == "dedup_file" and value and isinstance(value[0], int):
            return True
    return False


def _deep_json(name: str, data: bytes) -> bool:
    return name == "meta" and data.count(b"[") + data.count(b"{") > 200


KNOWN_BUGS = (_bad_feature_value, _deep_json)
KNOWN_BAD_SEEDS: dict[str, tuple[bytes, ...]] = {}


def _feature_file(magic: bytes, value: list[object]) -> bytes:
    return encode_feature_file_header(magic) + encode_feature_record(value)


@pytest.mark.xfail(
    strict=True,
    reason="bug: DedupFeature.attach and RetryTracker() catch TypeError/ValueError but not "
    "OverflowError: a feature record holding a float infinity makes open() raise it",
)
@pytest.mark.parametrize("name", ["dedup_file", "retry_file"])
def test_feature_file_with_infinity(name: str) -> None:
    if name == "dedup_file":
        data = _feature_file(b"LQDD", [b"k" * 16, 1, float("inf")])
    else:
        data = _feature_file(b"LQRT", ["default", 1, float("inf"), "why"])
    run_target(name, data)


@pytest.mark.xfail(
    strict=True,
    reason="bug: DedupFeature.attach calls bytes(key) on a record's key: an int key of n "
    "makes it allocate n bytes (a 24-byte file asks for 10 MB, or for terabytes)",
)
def test_dedup_file_with_int_key() -> None:
    run_target("dedup_file", _feature_file(b"LQDD", [10_000_000, 1, 1]))


@pytest.mark.xfail(
    strict=True,
    reason="bug: MetaStore.load lets json's RecursionError out (it catches OSError and "
    "ValueError): a meta.json of 1000 nested arrays makes open() raise RecursionError",
)
def test_meta_json_nested_deeply() -> None:
    run_target("meta", b"[" * 1000)


# ---------------------------------------------------------------------- hostile lengths


def _crc_bytes(monkeypatch: pytest.MonkeyPatch, module: object) -> dict[str, int]:
    """Count the bytes handed to ``module.checksum`` (work, not time)."""
    seen = {"bytes": 0}
    original = module.checksum  # type: ignore[attr-defined]

    def counting(data: bytes | memoryview, *args: int) -> int:
        seen["bytes"] += len(data)
        return original(data, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(module, "checksum", counting)
    return seen


def _descending_lengths(size: int) -> bytes:
    """Every 4th offset holds a length reaching exactly to the end of the data."""
    return b"".join(struct.pack("<I", max(size - k, 30)) for k in range(0, size, 4))


@pytest.mark.xfail(
    strict=True,
    reason="bug: ReaderJournal.load's torn-tail test (_only_garbage_follows) decodes a "
    "record at every offset after a corrupt one, each checksumming its claimed length: "
    "quadratic work (a crafted 1 MiB journal takes minutes to open)",
)
def test_journal_recovery_work_is_linear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    size = 1 << 15
    bad = b"\x11\x00\x00\x00\x03" + b"\x00" * 12  # a record with a wrong CRC
    data = encode_state_file_header() + bad + _descending_lengths(size)
    seen = _crc_bytes(monkeypatch, state_format)
    run_target("journal", data, measure=False)
    assert seen["bytes"] <= 64 * len(data), f"{seen['bytes']} bytes checksummed"


@pytest.mark.xfail(
    strict=True,
    reason="bug: recovery of the newest segment (EntryScanner._search with no index "
    "boundary) tries every offset after bad bytes and checksums each plausible entry's "
    "claimed length: quadratic work on a crafted segment",
)
def test_segment_recovery_work_is_linear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, sync="never") as q:
        q.enqueue(b"first")
    log = next((path / "segments").glob("*.log"))
    size = 1 << 15
    garbage = bytearray()
    while len(garbage) < size:  # entry headers (type DATA, id 2**60) claiming the rest
        remaining = size - len(garbage)
        garbage += struct.pack("<IBBQq", remaining, 1, 0, 1 << 60, 0)[:22]
    with open(log, "ab") as f:
        f.write(bytes(garbage[:size]))
    seen = _crc_bytes(monkeypatch, entry_format)
    with ledgerq.open(path, sync="never") as q:
        assert [m.payload for m in q.peek(5)] == [b"first"]
    assert seen["bytes"] <= 64 * (size + 64), f"{seen['bytes']} bytes checksummed"
