"""Limits and safety: oversize items, garbage, traversal-looking names, slow clients."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server._harness import Raw, ServerProcess, serving, until


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with a 1 KiB item limit."""
    yield from serving(tmp_path_factory, "small", "--max-item-size", "1024")


def test_oversize_set_is_refused_before_its_data_is_sent(small: ServerProcess) -> None:
    with small.client() as c:
        c.send(b"set big 0 0 5000\r\n")
        # The reply comes before a single byte of the body was sent.
        assert c.line() == b"SERVER_ERROR object too large for cache"
        c.send(b"x" * 5000 + b"\r\n")
        assert c.call(b"version\r\n").startswith(b"VERSION")  # the body was skipped
        assert c.set("big", b"y" * 1024) == b"STORED"  # exactly the limit is fine
        assert c.get_one("big") == b"y" * 1024


def test_oversize_with_noreply_is_silent_and_skipped(small: ServerProcess) -> None:
    with small.client() as c:
        c.send(b"set big 0 0 2000 noreply\r\n" + b"z" * 2000 + b"\r\nversion\r\n")
        assert c.line().startswith(b"VERSION")


def test_huge_announced_size_is_skipped_as_it_streams(small: ServerProcess) -> None:
    with small.client() as c:
        c.send(b"set big 0 0 3000000\r\n")
        assert c.line() == b"SERVER_ERROR object too large for cache"
        chunk = b"q" * 65536
        for _ in range(3000000 // len(chunk)):
            c.send(chunk)
        c.send(b"q" * (3000000 % len(chunk)) + b"\r\n")
        assert c.call(b"version\r\n").startswith(b"VERSION")


def test_max_connections(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", "--max-connections", "3") as proc:
        with proc.client() as a, proc.client() as b, proc.client() as c:
            for client in (a, b, c):
                assert client.call(b"version\r\n").startswith(b"VERSION")
            with proc.client() as extra:
                assert extra.line() == b"SERVER_ERROR too many open connections"
                assert extra.is_closed_by_server()

        def accepted() -> bool:  # once the server has seen them leave
            with proc.client() as again:
                try:
                    return again.call(b"version\r\n").startswith(b"VERSION")
                except (EOFError, OSError):
                    return False

        until(accepted, "a free connection slot")


GARBAGE_LINES = [
    b"",
    b"   ",
    b"bogus",
    b"incr q 1",
    b"decr q 1",
    b"touch q 10",
    b"get",
    b"gets",
    b"set",
    b"set q",
    b"set q 0 0",
    b"set q 0 0 abc",
    b"set q 0 0 -5",
    b"delete",
    b"delete a b c",
    b"flush",
    b"flush_all now",
    b"confirm q",
    b"monitor q x",
    b"get q/bogus",
    b"get q/t=abc",
    b"get q/peek/open",
    b"get q/abort/close",
    b"get q/open/abort",
    b"get /",
    b"get +r",
    b"\x00\x01\x02\xff",
    b"GET \xff\xfe",
    b"stats detail dump",
    b"mg q v",
    b"x" * 5000,
]


def test_garbage_lines_are_answered_and_the_connection_survives(small: ServerProcess) -> None:
    with small.client() as c:
        for line in GARBAGE_LINES:
            reply = c.call(line + b"\r\n")
            assert reply == b"ERROR" or reply.startswith((b"CLIENT_ERROR", b"SERVER_ERROR")), (
                line,
                reply,
            )
        assert c.call(b"version\r\n").startswith(b"VERSION")


def test_unsupported_storage_commands_consume_their_data(small: ServerProcess) -> None:
    with small.client() as c:
        for verb in (b"add", b"replace", b"append", b"prepend"):
            assert c.call(verb + b" q 0 0 7\r\nversion\r\n") == b"ERROR"
        assert c.call(b"cas q 0 0 7 1\r\nversion\r\n") == b"ERROR"
        assert c.call(b"version\r\n").startswith(b"VERSION")


def test_lost_framing_closes_only_that_connection(small: ServerProcess) -> None:
    with small.client() as bad, small.client() as good:
        bad.send(b"set q 0 0 2\r\nabcd\r\n")
        assert bad.line() == b"CLIENT_ERROR bad data chunk"
        assert bad.is_closed_by_server()
        assert good.call(b"version\r\n").startswith(b"VERSION")


def test_random_bytes_never_kill_the_server(small: ServerProcess) -> None:
    rng = random.Random(7)
    vocabulary = [b"set q 0 0 3\r\n", b"get q\r\n", b"\r\n", b"\n", b" noreply", b"/open", b"\r"]
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", small.port)) as sock:
            pieces = [
                rng.choice(vocabulary) if rng.random() < 0.4 else rng.randbytes(rng.randint(0, 64))
                for _ in range(rng.randint(1, 30))
            ]
            try:
                sock.sendall(b"".join(pieces))
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(20)
                while sock.recv(65536):
                    pass
            except ConnectionResetError:
                pass
    with small.client() as c:
        assert c.call(b"version\r\n").startswith(b"VERSION")
        until(lambda: c.stats()["curr_connections"] == "1", "the garbage connections to end")


TRAVERSAL_KEYS = [
    "..",
    ".",
    "../escape",
    "a/../../escape",
    "..%2fescape",
    "%2e%2e",
    "a\\..\\escape",
    "~root",
    "q+..",
    "q+../x",
    "/etc/passwd",
    "nul\x00byte",
]


def test_traversal_looking_names_are_refused(
    small: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    parent = small.data_dir.parent
    before_parent = sorted(os.listdir(parent))
    before = sorted(os.listdir(small.data_dir))
    with small.client() as c:
        for key in TRAVERSAL_KEYS:
            raw = key.encode("latin-1")
            for request in (
                b"set %b 0 0 1\r\nx\r\n" % raw,
                b"get %b\r\n" % raw,
                b"get %b/t=10\r\n" % raw,
                b"delete %b\r\n" % raw,
                b"flush %b\r\n" % raw,
            ):
                reply = c.call(request)
                assert reply.startswith((b"CLIENT_ERROR", b"ERROR")), (request, reply)
        assert c.call(b"version\r\n").startswith(b"VERSION")
    assert sorted(os.listdir(small.data_dir)) == before
    assert sorted(os.listdir(parent)) == before_parent


def test_a_stalled_sender_does_not_block_others(small: ServerProcess) -> None:
    with small.client() as slow, small.client() as fast:
        slow.send(b"set q 0 0 9\r\nhal")  # ... and stalls mid-body
        slow_line = b"get q/t=60000"  # then half a line
        assert fast.set("other", b"x") == b"STORED"
        assert fast.get_one("other") == b"x"
        slow.send(b"f-done\r\n" + slow_line[:5])
        assert slow.line() == b"STORED"
        assert fast.get_one("q") == b"half-done"
        slow.send(slow_line[5:] + b"\r\n")
        assert fast.set("q", b"next") == b"STORED"
        assert slow.values() == [(b"q/t=60000", 0, b"next", None)]


def test_a_client_that_does_not_read_does_not_block_others(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data") as proc, proc.client() as writer:
        big = os.urandom(4 << 20)
        for _ in range(4):
            assert writer.set("big", big) == b"STORED"
        with socket.create_connection(("127.0.0.1", proc.port)) as stalled:
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.sendall(b"get big\r\n" * 4)  # 16 MiB of replies it never reads
            with proc.client() as other:
                assert other.set("small", b"x") == b"STORED"
                assert other.get_one("small") == b"x"
                # How many replies the kernel's socket buffers soak up before the
                # server must hold back depends on their autotuning: the stalled
                # client has been served once at least one "big" is gone.
                until(lambda: int(other.stats()["queue_big_items"]) < 4, "the first reply")
                assert other.call(b"version\r\n").startswith(b"VERSION")


def test_idle_connections_stay_cheap(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", "--max-connections", "2000") as proc:
        idle: list[Raw] = []
        try:
            for _ in range(1000):
                idle.append(proc.client())
            with proc.client() as c:
                until(lambda: int(c.stats()["curr_connections"]) == 1001, "1001 connections")
                assert c.set("q", b"x") == b"STORED"
                assert c.get_one("q") == b"x"
            # Each idle one still answers.
            for client in idle[::100]:
                assert client.call(b"version\r\n").startswith(b"VERSION")
        finally:
            for client in idle:
                client.close()
