"""The server embedded in a test's own event loop (``ledgerq.server.Server``).

Here the server's own transports, tasks and threads live in the test process, so
pytest's ``filterwarnings = error`` also catches anything it leaves unclosed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

import ledgerq
from ledgerq.server import DataDirLockedError, Server, ServerConfig
from tests.aioguard import run_guarded

T = TypeVar("T")
GUARD_S = 20.0


def run(coro: Coroutine[Any, Any, T]) -> T:
    return run_guarded(coro, GUARD_S)


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def call(self, data: bytes) -> bytes:
        self.writer.write(data)
        return (await self.reader.readline()).rstrip(b"\r\n")

    async def get(self, key: str) -> bytes | None:
        line = await self.call(f"get {key}\r\n".encode())
        if line == b"END":
            return None
        size = int(line.split()[3])
        data = (await self.reader.readexactly(size + 2))[:-2]
        assert await self.reader.readline() == b"END\r\n"
        return data

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def serving(
    tmp_path: Path, body: Callable[[Server, int], Awaitable[None]], **config: Any
) -> None:
    server = Server(ServerConfig(str(tmp_path / "data"), port=0, **config))
    host, port = await server.start()
    assert host == "127.0.0.1"
    task = asyncio.get_running_loop().create_task(server.serve())
    try:
        await body(server, port)
    finally:
        server.request_shutdown()
        await task


async def until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0)  # yield to the server's callbacks; bounded by the guard


def test_set_get_and_stop(tmp_path: Path) -> None:
    async def body(server: Server, port: int) -> None:
        c = await Conn.open(port)
        assert await c.call(b"set q 3 0 2\r\nhi\r\n") == b"STORED"
        assert await c.get("q") == b"hi"
        await c.close()

    run(serving(tmp_path, body))


def test_waiters_are_woken_one_per_item_in_order(tmp_path: Path) -> None:
    async def body(server: Server, port: int) -> None:
        consumers = [await Conn.open(port) for _ in range(5)]
        tasks = []
        for n, consumer in enumerate(consumers, 1):
            tasks.append(asyncio.ensure_future(consumer.get("q/t=60000")))
            await until(lambda n=n: _waiting(server, "q") == n)  # type: ignore[misc]
        producer = await Conn.open(port)
        for i in range(3):
            assert await producer.call(b"set q 0 0 1\r\n%d\r\n" % i) == b"STORED"
        got = await asyncio.gather(*tasks[:3])
        assert got == [b"0", b"1", b"2"]
        assert _waiting(server, "q") == 2  # the other two still wait: no stampede
        await producer.call(b"set q 0 0 1\r\n3\r\n")
        await producer.call(b"set q 0 0 1\r\n4\r\n")
        assert await asyncio.gather(*tasks[3:]) == [b"3", b"4"]
        for conn in [*consumers, producer]:
            await conn.close()

    run(serving(tmp_path, body))


def _waiting(server: Server, name: str) -> int:
    for slot in server.registry.slots():
        if slot.name == name:
            return slot.waiting
    return 0


def test_stop_returns_open_reads_and_closes_queues(tmp_path: Path) -> None:
    async def body(server: Server, port: int) -> None:
        c = await Conn.open(port)
        await c.call(b"set q 0 0 1\r\na\r\n")
        await c.call(b"set q 0 0 1\r\nb\r\n")
        assert await c.get("q/open") == b"a"
        server.request_shutdown()
        assert await c.reader.read() == b""  # closed by the server
        await c.close()

    run(serving(tmp_path, body))
    with ledgerq.open(tmp_path / "data" / "q") as q:
        assert [m.payload for m in q.peek(5)] == [b"a", b"b"]


def test_a_second_server_on_the_data_dir_is_refused(tmp_path: Path) -> None:
    async def body(server: Server, port: int) -> None:
        other = Server(ServerConfig(str(tmp_path / "data"), port=0))
        with pytest.raises(DataDirLockedError):
            await other.start()

    run(serving(tmp_path, body))


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="max_open_reads"):
        ServerConfig("d", max_open_reads=0)
    with pytest.raises(ValueError, match="port"):
        ServerConfig("d", port=70000)


def test_sync_always_queues_write_in_threads(tmp_path: Path) -> None:
    async def body(server: Server, port: int) -> None:
        c = await Conn.open(port)
        for i in range(20):
            assert await c.call(b"set q 0 0 2\r\n%02d\r\n" % i) == b"STORED"
        assert await c.get("q/open") == b"00"
        assert await c.get("q/close/open") == b"01"
        assert await c.get("q/abort") is None
        assert await c.get("q") == b"01"
        await c.close()

    run(serving(tmp_path, body, queue_options={"sync": "always"}))


PIPELINED = 20_000
_PEEK_REPLY = b"VALUE q/peek 0 1\r\nx\r\n"


@pytest.mark.parametrize("keys_per_get", [1, 4000])
def test_a_long_pipeline_does_not_hold_up_other_connections(
    tmp_path: Path, keys_per_get: int
) -> None:
    # Found by the soak (tests/soak): commands that never wait - thousands of pipelined
    # peeks, or one get of thousands of keys - ran in one turn of the event loop, and
    # every other client waited for all of them (stalls of 0.5 s).
    async def body(server: Server, port: int) -> None:
        busy, other = await Conn.open(port), await Conn.open(port)
        assert await other.call(b"set q 0 0 1\r\nx\r\n") == b"STORED"
        line = b"get" + b" q/peek" * keys_per_get + b"\r\n"
        busy.writer.write(line * (PIPELINED // keys_per_get))
        assert (await other.call(b"version\r\n")).startswith(b"VERSION")
        # Answered while the pipeline was being worked through, not after it.
        assert server.stats.cmd_peek < PIPELINED // 10
        reply = (_PEEK_REPLY * keys_per_get + b"END\r\n") * (PIPELINED // keys_per_get)
        assert await busy.reader.readexactly(len(reply)) == reply
        await busy.close()
        await other.close()

    run(serving(tmp_path, body))
