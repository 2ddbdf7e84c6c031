"""``ledgerq enqueue`` and ``ledgerq dequeue`` through a real subprocess."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

import ledgerq

from ._run import COMMAND, environment, fails, finish, ok, run, start_ready


def _all(path: Path) -> list[ledgerq.Message]:
    with ledgerq.open(path) as q:
        return q.peek(1000)


def test_enqueue_from_argument_file_stdin_and_lines(tmp_path: Path) -> None:
    q = tmp_path / "q"
    data_file = tmp_path / "payload.bin"
    data_file.write_bytes(b"\x00\xffbinary\n")
    lines_file = tmp_path / "lines.txt"
    lines_file.write_bytes(b"one\r\ntwo\n\nfour")

    assert ok("enqueue", q, "hello", "--header", "k=v", "--header", "x=a=b").out == "1\n"
    assert ok("enqueue", q, "--file", data_file).out == "2\n"
    assert ok("enqueue", q, "-", "--file", data_file).out == "3\n"
    assert ok("enqueue", q, stdin=b"from stdin\n").out == "4\n"
    assert ok("enqueue", q, "-", "--priority", "high", "--ttl", "3600", stdin=b"dash").out == "5\n"
    assert ok("enqueue", q, "--lines", stdin=b"a\nb\nc\n").out == "6\n7\n8\n"
    assert ok("enqueue", q, "--lines", "--file", lines_file).out == "9\n10\n11\n12\n"
    assert ok("enqueue", q, "p\nq", "--lines").out == "13\n14\n"

    messages = _all(q)
    assert [m.id for m in messages] == list(range(1, 15))
    payloads = [m.payload for m in messages]
    assert payloads == [
        b"hello",
        b"\x00\xffbinary\n",
        b"\x00\xffbinary\n",
        b"from stdin\n",
        b"dash",
        b"a",
        b"b",
        b"c",
        b"one",
        b"two",
        b"",
        b"four",
        b"p",
        b"q",
    ]
    assert messages[0].headers == {"k": "v", "x": "a=b"}
    assert messages[4].priority is ledgerq.Priority.HIGH
    assert messages[4].expires_at == messages[4].timestamp + 3600 * 10**9  # --ttl 3600
    assert messages[5].priority is ledgerq.Priority.MEDIUM and messages[5].expires_at is None


def test_enqueue_usage_errors_write_nothing(tmp_path: Path) -> None:
    q = tmp_path / "q"
    data_file = tmp_path / "f"
    data_file.write_bytes(b"x")
    fails("enqueue", q, "data", "--file", data_file, code=2)
    fails("enqueue", q, "data", "--header", "novalue", code=2)
    fails("enqueue", q, "data", "--priority", "urgent", code=2)
    fails("enqueue", q, "data", "-o", "no_such_option=1", code=2)
    assert not q.exists()  # a usage error never creates the queue


def test_dequeue_acks_and_no_ack_brings_the_message_back(tmp_path: Path) -> None:
    q = tmp_path / "q"
    with ledgerq.open(q) as queue:
        queue.enqueue(b"first")
        queue.enqueue(b"second", headers={"h": "1"})
        queue.enqueue(b"\xff\xfe")

    assert ok("dequeue", q).stdout == b"first\n"
    leased = ok("dequeue", q, "--no-ack", "--json").json()
    assert leased["id"] == 2 and leased["attempts"] == 1
    assert leased["payload"] == "second" and leased["payload_encoding"] == "utf8"
    assert leased["headers"] == {"h": "1"}
    again = ok("dequeue", q, "--json").json()  # the un-acked lease came back
    assert again["id"] == 2 and again["attempts"] == 2
    binary = ok("dequeue", q, "--json").json()
    assert binary["payload_encoding"] == "base64" and binary["payload"] == "//4="

    started = time.monotonic()
    empty = run("dequeue", q, "--timeout", "0.3")
    assert empty.code == 3 and empty.stdout == b"" and "no message" in empty.err
    assert time.monotonic() - started >= 0.3

    with ledgerq.open(q) as queue:
        stats = queue.stats()
        assert (stats.pending, stats.in_flight, stats.acked) == (0, 0, 3)
        # A named reader has its own position: it replays from the oldest message.
    batch = ok("dequeue", q, "--reader", "audit", "-n", "5", "--json").json_lines()
    assert [m["id"] for m in batch] == [1, 2, 3]
    fails("dequeue", q, "--reader", ".bad", code=2)


def test_a_waiting_dequeue_stops_cleanly_on_sigint_and_sigterm(tmp_path: Path) -> None:
    q = tmp_path / "q"
    with ledgerq.open(q):
        pass
    stops = [(signal.SIGTERM, 143, "terminated")]
    # A command started with SIGINT ignored (nohup, a background job of a script) keeps
    # ignoring it, as every Unix program does: Ctrl-C is then not its to act on.
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        stops.insert(0, (signal.SIGINT, 130, "interrupted"))
    for sig, code, word in stops:
        proc = start_ready("dequeue", q, "--timeout", "inf")
        with pytest.raises(ledgerq.QueueLockedError):
            ledgerq.open(q)  # ready means the queue is open (and the wait begins)
        proc.send_signal(sig)
        out, err = finish(proc)
        assert (proc.returncode, out, err) == (code, b"", f"ledgerq: error: {word}\n".encode())
        assert json.loads((q / "meta.json").read_text())["clean"] is True  # closed, not killed


def test_ready_fd_says_when_the_wait_began_and_changes_no_output(tmp_path: Path) -> None:
    q = tmp_path / "q"
    with ledgerq.open(q) as queue:
        queue.enqueue(b"job")
    signal_file = tmp_path / "ready"
    for expected_code, expected_out in ((0, b"job\n"), (3, b"")):
        with open(signal_file, "wb") as sink:
            proc = subprocess.run(
                [*COMMAND, "dequeue", str(q), "--ready-fd", str(sink.fileno())],
                capture_output=True,
                env=environment(),
                pass_fds=(sink.fileno(),),
                timeout=60,
                check=False,
            )
        assert (proc.returncode, proc.stdout) == (expected_code, expected_out)
        assert signal_file.read_bytes() == b"ready\n"  # one line, the same for every outcome
        no_message = f"ledgerq: no message in {q}\n".encode()
        assert proc.stderr == (b"" if expected_code == 0 else no_message)


def test_ready_fd_must_be_an_open_descriptor_past_the_standard_streams(tmp_path: Path) -> None:
    q = tmp_path / "q"
    with ledgerq.open(q) as queue:
        queue.enqueue(b"kept")
    assert "not an open file descriptor" in fails("dequeue", q, "--ready-fd", "9", code=2).err
    fails("dequeue", q, "--ready-fd", "1", code=2)  # stdout is the output, never a signal
    assert [m.payload for m in _all(q)] == [b"kept"]  # a usage error leases nothing
