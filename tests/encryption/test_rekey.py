"""``ledgerq rekey``: key rotation, including a real kill -9 after every durable step."""

from __future__ import annotations

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


def _make(path: Path) -> None:
    """A queue of several segments, some messages acked, two in its DLQ."""
    with ledgerq.open(path, encryption_key=KEY, segment_size=600, max_retries=1) as q:
        for i in range(30):
            q.enqueue(b"message %d" % i, headers={"i": str(i)}, priority=i % 3)
        for message in q.dequeue_batch(2):
            q.nack(message.id, "to the dlq")
        for message in q.dequeue_batch(3):
            q.ack(message.id)


def _contents(path: Path, key: bytes) -> tuple[list[tuple[bytes, dict[str, str]]], list[bytes]]:
    with ledgerq.open(path, encryption_key=key) as q:
        main = [(m.payload, m.headers) for m in q.peek(100)]
        dead = [m.payload for m in q.dlq.peek(100)]
    return main, dead


def test_rekey_seals_everything_under_the_new_key(tmp_path: Path) -> None:
    path = tmp_path / "q"
    _make(path)
    before = _contents(path, KEY)
    assert len(before[0]) == 25 and len(before[1]) == 2
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
