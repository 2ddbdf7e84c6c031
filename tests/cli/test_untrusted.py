"""What the command line meets from outside: another user's directory, hostile message data.

* A queue this user may not reach is "permission denied", naming the path - not a
  queue that "does not exist".  (Root reads anything: the command runs as root
  without the capabilities that override file permissions, on directories owned
  by ``nobody``.)
* Failure reasons and headers come from whoever nacked or enqueued: escape sequences
  in them are printed escaped (``\\x1b``), never sent to the terminal raw.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import pytest

import ledgerq

from ._run import COMMAND, environment, ok

NOBODY = 65534
_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


def _drop_file_capabilities() -> None:
    """In the child before exec: root, but bound by file permissions like anyone."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def _without_file_capabilities(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*COMMAND, *(str(a) for a in args)],
        capture_output=True,
        text=True,
        env=environment(),
        preexec_fn=_drop_file_capabilities,
        timeout=60,
        check=False,
    )


needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="dropping root's capabilities needs root (CI runs as root)"
)


@needs_root
@pytest.mark.parametrize("command", [["stats"], ["dump"], ["verify"], ["peek"], ["config"]])
@pytest.mark.parametrize("locked", ["parent", "queue"])
def test_permission_denied_is_said_and_names_the_path(
    tmp_path: Path, command: list[str], locked: str
) -> None:
    q = tmp_path / "private" / "q"
    with ledgerq.open(q) as queue:
        queue.enqueue(b"secret")
    closed = q if locked == "queue" else q.parent
    os.chown(closed, NOBODY, NOBODY)
    closed.chmod(0o700)  # nobody's, closed to everyone else
    result = _without_file_capabilities(*command, q)
    assert result.returncode == 1, result
    assert result.stderr.startswith("ledgerq: error: permission denied: "), result.stderr
    assert str(q) in result.stderr
    assert "does not exist" not in result.stderr and "Traceback" not in result.stderr


ESC = "\x1b"
REASON = f"{ESC}[31mred alert{ESC}[0m"
HEADER = f"{ESC}]0;owned{chr(7)}"


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    q = tmp_path / "q"
    with ledgerq.open(q, max_retries=1) as queue:
        queue.enqueue(f"payload {ESC}[2J".encode(), headers={"title": HEADER})
        message = queue.dequeue()
        assert message is not None
        queue.nack(message.id, REASON)
        queue.enqueue(b"next", headers={"title": HEADER})
    return q


@pytest.mark.parametrize("command", [["dlq", "list"], ["dlq", "show", "Q", "1"], ["peek"]])
def test_escape_sequences_in_message_data_are_printed_escaped(
    hostile: Path, command: list[str]
) -> None:
    args = [hostile if a == "Q" else a for a in command]
    if "Q" not in command:
        args.append(hostile)
    out = ok(*args).out
    assert ESC not in out and chr(7) not in out
    assert "\\x1b" in out
    if command[0] == "dlq":
        assert "\\x1b[31mred alert\\x1b[0m" in out


def test_json_output_keeps_message_data_exact(hostile: Path) -> None:
    # JSON escapes control characters itself: machine-readable output stays the data.
    listed = ok("dlq", "list", hostile, "--json").json_lines()
    assert listed[0]["reason"] == REASON
    shown = ok("dlq", "show", hostile, "1", "--json").json()
    assert shown["headers"]["title"] == HEADER
