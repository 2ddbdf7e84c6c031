"""``ledgerq ui`` on the command line: listed, documented, and clear without its extra."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

import ledgerq
from tests._child import Children, child_environment

from ._console import Client, start_console

_WITHOUT_STARLETTE = """
import sys
sys.modules["starlette"] = None  # as if ledgerq[ui] were not installed
from ledgerq.cli import main
sys.exit(main(["ui", sys.argv[1]]))
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_environment(),
        check=False,
    )


def test_ui_is_a_command_with_its_options() -> None:
    assert "  ui " in _run("-m", "ledgerq.cli", "--help").stdout
    helped = _run("-m", "ledgerq.cli", "ui", "--help").stdout
    options = ("--host", "--port", "--token", "LEDGERQ_UI_TOKEN", "--interval", "--history")
    for option in (*options, "--key-file"):
        assert option in helped, option


def test_without_the_ui_extra_it_says_what_to_install(tmp_path: Path) -> None:
    result = _run("-c", _WITHOUT_STARLETTE, str(tmp_path))
    assert result.returncode == 1, result
    assert result.stderr.startswith("ledgerq: error: ")
    assert "pip install 'ledgerq[ui]'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_stops_it_quietly(
    tmp_path: Path, children: Children, signum: int
) -> None:
    """Stopping a server is no error (issue 25: SIGTERM printed 'ledgerq: error:
    terminated' and exited 143): exit 0, nothing on stderr, as ``ledgerq serve``."""
    with ledgerq.open(tmp_path / "q") as q:
        q.enqueue(b"x")
    console, base = start_console(children, tmp_path)
    assert Client(base).get("/api/queues").status == 200
    console.signal(signum)
    console.expect_exit(0)
    assert console.stderr_text() == ""
