"""A ``set`` on a full bounded queue (``max_pending``, ``max_pending_bytes``)."""

from __future__ import annotations

from pathlib import Path

import ledgerq
from ledgerq.server import Server

from .test_inprocess import Conn, run, serving


def test_a_set_on_a_full_queue_answers_not_stored(tmp_path: Path) -> None:
    async def body(server: Server, port: int) -> None:
        c = await Conn.open(port)
        assert await c.call(b"set q 0 0 1\r\na\r\n") == b"STORED"
        assert await c.call(b"set q 0 0 1\r\nb\r\n") == b"STORED"
        assert await c.call(b"set q 0 0 1\r\nc\r\n") == b"NOT_STORED"
        reply = await c.call(b"set q 0 0 1 noreply\r\nc\r\nversion\r\n")
        assert reply.startswith(b"VERSION ")  # noreply: nothing before the next answer
        assert await c.get("q") == b"a"  # a plain get consumes (acks): room for one
        assert await c.call(b"set q 0 0 1\r\nd\r\n") == b"STORED"
        assert await c.call(b"set q 0 0 1\r\ne\r\n") == b"NOT_STORED"
        await c.close()

    run(serving(tmp_path, body, queue_options={"max_pending": 2}))
    with ledgerq.open(tmp_path / "data" / "q") as q:
        assert [m.payload for m in q.peek(5)] == [b"b", b"d"]


def test_an_item_larger_than_the_bytes_bound_is_too_large(tmp_path: Path) -> None:
    async def body(server: Server, port: int) -> None:
        c = await Conn.open(port)
        assert (
            await c.call(b"set q 0 0 5\r\n12345\r\n") == b"SERVER_ERROR object too large for cache"
        )
        assert await c.call(b"set q 0 0 4\r\n1234\r\n") == b"STORED"
        assert await c.call(b"set q 0 0 1\r\n5\r\n") == b"NOT_STORED"
        await c.close()

    run(serving(tmp_path, body, queue_options={"max_pending_bytes": 4}))
