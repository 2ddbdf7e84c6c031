"""50 concurrent connections producing and consuming: nothing lost, nothing twice."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import pytest

from tests.server._harness import GUARD_S, Raw, ServerProcess

PRODUCERS = 20
CONSUMERS = 30
PER_PRODUCER = 50
TOTAL = PRODUCERS * PER_PRODUCER


class Tally:
    """What the consumers confirmed, shared between their threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.confirmed: Counter[bytes] = Counter()
        self.errors: list[BaseException] = []

    def add(self, item: bytes) -> None:
        with self.lock:
            self.confirmed[item] += 1

    @property
    def is_done(self) -> bool:
        with self.lock:
            return sum(self.confirmed.values()) >= TOTAL or bool(self.errors)


def produce(port: int, index: int, use_pymemcache: bool) -> None:
    items = [b"p%02d-%03d" % (index, n) for n in range(PER_PRODUCER)]
    if use_pymemcache:
        from pymemcache.client.base import Client

        client = Client(("127.0.0.1", port), timeout=GUARD_S)  # noreply, the default
        try:
            for item in items:
                client.set("work", item)
            client.version()  # a round trip: every noreply set before it was read
        finally:
            client.close()
        return
    with Raw(port) as raw:
        for item in items:
            assert raw.set("work", item) == b"STORED"


def consume(port: int, index: int, tally: Tally) -> None:
    style = index % 3  # 0: plain get, 1: open/close, 2: open/close with aborts
    raw = Raw(port)
    n = 0
    try:
        while not tally.is_done:
            n += 1
            if style == 0:
                item = raw.get_one("work/t=100")
                if item is not None:
                    tally.add(item)
                continue
            item = raw.get_one("work/t=100/open")
            if item is None:
                continue
            if index == 1 and n == 3:
                # Walk away holding an open read: the server must give it back.
                raw.close()
                raw = Raw(port)
                continue
            if style == 2 and n % 4 == 0:
                assert raw.get("work/abort") == []
                continue
            assert raw.get("work/close") == []
            tally.add(item)
    except BaseException as exc:
        with tally.lock:
            tally.errors.append(exc)
    finally:
        raw.close()


@pytest.mark.parametrize("threads", ["1", "8"])
def test_fifty_connections_lose_nothing_and_duplicate_nothing(tmp_path: Path, threads: str) -> None:
    with ServerProcess(tmp_path / "data", "--threads", threads) as proc:
        tally = Tally()
        workers = [
            threading.Thread(target=consume, args=(proc.port, i, tally)) for i in range(CONSUMERS)
        ] + [
            threading.Thread(target=produce, args=(proc.port, i, i % 4 == 0))
            for i in range(PRODUCERS)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(GUARD_S * 3)
        assert not any(worker.is_alive() for worker in workers), "a client hung"
        assert not tally.errors, tally.errors
        expected = {b"p%02d-%03d" % (i, n) for i in range(PRODUCERS) for n in range(PER_PRODUCER)}
        assert set(tally.confirmed) == expected  # nothing lost
        assert max(tally.confirmed.values()) == 1  # nothing twice
        with proc.client() as c:
            stats = c.stats()
            assert stats["queue_work_items"] == "0"
            assert stats["queue_work_open_transactions"] == "0"
            assert stats["queue_work_total_items"] == str(TOTAL)
