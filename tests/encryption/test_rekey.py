"""``ledgerq rekey``: key rotation, including a real kill -9 after every durable step."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import ledgerq
from ledgerq.tools import rekey
from tests.cli._run import run
from tests.encryption._files import KEY, OTHER_KEY, files_holding

NEW_KEY = bytes(range(100, 132))
_ROOT = str(Path(__file__).resolve().parents[2])

_CHILD = """
import os, signal, sys
from ledgerq.tools import rekey
target = int(sys.argv[4])
seen = []
def step(what):
    seen.append(what)
    if len(seen) == target:
        os.kill(os.getpid(), signal.SIGKILL)
rekey(sys.argv[1], bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3]), on_step=step)
"""


_OPTIONS = {"segment_size": 600, "max_retries": 1, "dedup_window": 3600}


def _make(path: Path) -> None:
    """A queue of several segments, some messages acked, two in its DLQ, a dedup id in
    its window and a unique key held."""
    with ledgerq.open(path, encryption_key=KEY, **_OPTIONS) as q:
        for i in range(30):
            q.enqueue(b"message %d" % i, headers={"i": str(i)}, priority=i % 3)
        for message in q.dequeue_batch(2):
            q.nack(message.id, "to the dlq")
        for message in q.dequeue_batch(3):
            q.ack(message.id)
        assert q.enqueue(b"deduped", dedup_id="order-7") == 31
        assert q.enqueue(b"unique", unique_key="nightly") == 32


def _remembered(path: Path, key: bytes) -> tuple[int, int]:
    """What the queue answers for the dedup id and the unique key _make enqueued."""
    with ledgerq.open(path, encryption_key=key, **_OPTIONS) as q:
        return q.enqueue(b"again", dedup_id="order-7"), q.enqueue(b"again", unique_key="nightly")


def _contents(path: Path, key: bytes) -> tuple[list[tuple[bytes, dict[str, str]]], list[bytes]]:
    with ledgerq.open(path, encryption_key=key) as q:
        main = [(m.payload, m.headers) for m in q.peek(100)]
        dead = [m.payload for m in q.dlq.peek(100)]
    return main, dead


def test_rekey_seals_everything_under_the_new_key(tmp_path: Path) -> None:
    path = tmp_path / "q"
    _make(path)
    before = _contents(path, KEY)
    assert len(before[0]) == 27 and len(before[1]) == 2
    sizes = {p: p.stat().st_size for p in (path / "segments").glob("*.log")}
    assert rekey(path, KEY, NEW_KEY) >= len(sizes)
    assert {p: p.stat().st_size for p in (path / "segments").glob("*.log")} == sizes
    assert _contents(path, NEW_KEY) == before
    with pytest.raises(ledgerq.ConfigError, match="wrong encryption_key"):
        ledgerq.open(path, encryption_key=KEY)
    with pytest.raises(ledgerq.ConfigError, match="wrong encryption_key"):
        ledgerq.open(path / "dlq", encryption_key=KEY)
    assert rekey(path, KEY, NEW_KEY) == 0  # done already: nothing to do
    assert files_holding(path, b"message 1") == []


def test_rekey_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    path = tmp_path / "q"
    _make(path)
    with pytest.raises(ledgerq.ConfigError, match="old key is not the key"):
        rekey(path, OTHER_KEY, NEW_KEY)
    with (
        ledgerq.open(path, encryption_key=KEY, shared=True),
        pytest.raises(ledgerq.QueueLockedError),
    ):
        rekey(path, KEY, NEW_KEY)
    with ledgerq.open(tmp_path / "plain") as q:
        q.enqueue(b"x")
    with pytest.raises(ledgerq.ConfigError, match="not encrypted"):
        rekey(tmp_path / "plain", KEY, NEW_KEY)
    assert _contents(path, KEY)[0]  # untouched


def _steps(path: Path) -> list[str]:
    seen: list[str] = []
    rekey(path, KEY, NEW_KEY, on_step=seen.append)
    return seen


def test_a_kill_after_any_step_is_finished_by_running_rekey_again(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine"
    _make(pristine)
    expected = _contents(pristine, KEY)
    probe = tmp_path / "probe"
    shutil.copytree(pristine, probe)
    steps = _steps(probe)
    assert any(s.startswith("marked") for s in steps) and steps[-1].startswith("switched")
    for target in range(1, len(steps) + 1):
        path = tmp_path / f"killed-{target}"
        shutil.copytree(pristine, path)
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, str(path), KEY.hex(), NEW_KEY.hex(), str(target)],
            env={**os.environ, "PYTHONPATH": _ROOT},
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert child.returncode == -signal.SIGKILL, (target, child.stderr)
        what = steps[target - 1]
        if what.startswith("recovered"):
            assert _contents(path, KEY) == expected  # nothing marked yet: the old key opens
        elif target < len(steps):
            with pytest.raises(ledgerq.ConfigError, match="interrupted"):
                ledgerq.open(path, encryption_key=NEW_KEY)
        rekey(path, KEY, NEW_KEY)  # finishes it
        assert _contents(path, NEW_KEY) == expected, what
        assert _remembered(path, NEW_KEY) == (31, 32), what
        with pytest.raises(ledgerq.ConfigError):
            ledgerq.open(path, encryption_key=KEY)


def test_the_rekey_command(tmp_path: Path) -> None:
    path = tmp_path / "q"
    _make(path)
    old_file, new_file = tmp_path / "old", tmp_path / "new"
    old_file.write_bytes(KEY)
    new_file.write_text(NEW_KEY.hex())
    done = run("rekey", path, "--old-key-file", old_file, "--new-key-file", new_file)
    assert done.code == 0 and "re-encrypted" in done.out, done
    assert run("peek", path, "--key-file", new_file).code == 0
    again = run("rekey", path, "--old-key-file", new_file, "--new-key-file", old_file)
    assert again.code == 0
    assert _contents(path, KEY)[0]


def test_dedup_ids_and_unique_keys_outlive_rotations(tmp_path: Path) -> None:
    """Their digests are keyed (the files must not confirm a guessed id): a rotation
    keeps the digests' key, wrapped under the new key, so the window and the held keys
    answer as before - over two rotations in a row."""
    path = tmp_path / "q"
    _make(path)
    third = bytes(range(200, 232))
    rekey(path, KEY, NEW_KEY)
    assert _remembered(path, NEW_KEY) == (31, 32)
    rekey(path, NEW_KEY, third)
    assert _remembered(path, third) == (31, 32)
    with ledgerq.open(path, encryption_key=third, **_OPTIONS) as q:
        assert q.enqueue(b"new", unique_key="fresh") == 33  # and new keys are new
        assert q.enqueue(b"new", unique_key="fresh") == 33
    meta = json.loads((path / "meta.json").read_text())
    assert len(bytes.fromhex(meta["encryption"]["digest_key"])) == 12 + 32 + 16
    assert KEY.hex() not in (path / "meta.json").read_text()


def test_a_damaged_digest_key_is_refused_and_its_removal_restarts_the_windows(
    tmp_path: Path,
) -> None:
    path = tmp_path / "q"
    _make(path)
    rekey(path, KEY, NEW_KEY)
    meta_path = path / "meta.json"
    meta = json.loads(meta_path.read_text())
    good = meta["encryption"]["digest_key"]
    meta["encryption"]["digest_key"] = good[:-2] + ("00" if good[-2:] != "00" else "11")
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ledgerq.ConfigError, match=r"digest key stored in meta\.json"):
        ledgerq.open(path, encryption_key=NEW_KEY)
    del meta["encryption"]["digest_key"]
    meta_path.write_text(json.dumps(meta))
    dedup_again, unique_again = _remembered(path, NEW_KEY)
    assert dedup_again > 32 and unique_again > dedup_again  # started again, as documented


def test_a_kill_between_the_switch_of_meta_json_and_of_its_copy_heals_at_the_next_open(
    tmp_path: Path,
) -> None:
    """The switch saves meta.json, then options.json (the copy a lost meta.json is rebuilt
    from): a kill between the two leaves the copy naming the old key.  The next open
    rewrites the copy from meta.json, so a meta.json lost after that is rebuilt under the
    new key."""
    path = tmp_path / "q"
    _make(path)
    before = _contents(path, KEY)
    copy = path / "options.json"
    stale = copy.read_bytes()
    rekey(path, KEY, NEW_KEY)
    copy.write_bytes(stale)  # the state a kill between the two saves leaves
    assert _contents(path, NEW_KEY) == before  # meta.json decides: the new key opens
    assert (
        json.loads(copy.read_text())["encryption"]
        == json.loads((path / "meta.json").read_text())["encryption"]
    )
    (path / "meta.json").unlink()  # lost: rebuilt from the copy
    report = ledgerq.tools.repair(path)  # (keyless: it rebuilds meta.json, opens nothing)
    assert any("rebuilt" in action and "meta.json" in action for action in report.actions)
    assert _contents(path, NEW_KEY) == before
    with pytest.raises(ledgerq.ConfigError):
        ledgerq.open(path, encryption_key=KEY)
