"""``ledgerq serve --shared``: a memcache client and a Python process on one queue."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import ledgerq
from tests.server._harness import GUARD_S, ServerProcess, until, waiters

pymemcache = pytest.importorskip("pymemcache")
from pymemcache.client.base import Client  # noqa: E402


def test_a_memcache_client_and_a_python_process_share_a_queue(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with ServerProcess(data, "--shared") as server:
        mc = Client(("127.0.0.1", server.port), timeout=GUARD_S, default_noreply=False)
        try:
            assert mc.set("jobs", b"from memcache 1") and mc.set("jobs", b"from memcache 2")
            with ledgerq.open(data / "jobs", shared=True) as q:  # beside the server
                taken = q.dequeue()
                assert taken is not None and taken.payload == b"from memcache 1"
                q.enqueue(b"from python")
                # The Python handle's lease is its own: the server serves what follows.
                assert mc.get("jobs") == b"from memcache 2"
                assert mc.get("jobs") == b"from python"
                assert mc.get("jobs") is None

                # A client waiting in the server is woken by the Python process's enqueue.
                got: list[bytes | None] = []
                waiting = threading.Thread(target=lambda: got.append(mc.get("jobs/t=60000")))
                waiting.start()
                with server.client() as admin:
                    until(lambda: waiters(admin, "jobs") == 1, "the client to wait")
                    # Another handle, closed at once (tests/workers/test_wakeup.py: a
                    # lost wake-up of the engine that a handle left open can meet).
                    with ledgerq.open(data / "jobs", shared=True) as producer:
                        producer.enqueue(b"wake up")
                    waiting.join(GUARD_S)
                    assert got == [b"wake up"]

                    # The queue is in use here: the server refuses to delete it.
                    refused = admin.call(b"delete jobs\r\n")
                    assert refused.startswith(b"SERVER_ERROR"), refused
                    assert (data / "jobs").is_dir()
                    q.ack(taken.id)
                    assert q.stats().acked == 4 and len(q) == 0
            assert mc.delete("jobs") is True  # nobody else has it open now
            assert not (data / "jobs").exists()
        finally:
            mc.close()
    assert server.returncode == 0, server.stderr


def test_without_shared_the_server_keeps_its_queues_to_itself(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with ServerProcess(data) as server, server.client() as client:
        assert client.set("jobs", b"x") == b"STORED"
        with pytest.raises(ledgerq.QueueLockedError) as caught:
            ledgerq.open(data / "jobs", shared=True)
        assert caught.value.held_by == "exclusive"
