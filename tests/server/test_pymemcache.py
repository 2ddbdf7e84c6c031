"""A real memcache client, pymemcache, as producer and worker (both noreply modes)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tests.server._harness import ServerProcess, until, waiters

pymemcache = pytest.importorskip("pymemcache")
from pymemcache.client.base import Client  # noqa: E402
from pymemcache.exceptions import (  # noqa: E402
    MemcacheClientError,
    MemcacheServerError,
)
from pymemcache.serde import pickle_serde  # noqa: E402

GUARD_S = 20.0


@pytest.fixture(params=[False, True], ids=["noreply-off", "noreply-default"])
def mc(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Client]:
    """``default_noreply=False``, and the client's own default (noreply=True)."""
    kwargs = {} if request.param else {"default_noreply": False}
    client = Client(("127.0.0.1", server.port), timeout=GUARD_S, connect_timeout=GUARD_S, **kwargs)
    try:
        yield client
    finally:
        client.close()


def test_set_and_get(mc: Client, qname: str) -> None:
    assert mc.set(qname, b"hello") is True
    assert mc.set(qname, b"world") is True
    assert mc.get(qname) == b"hello"
    assert mc.get(qname) == b"world"
    assert mc.get(qname) is None


def test_reliable_read_keys_come_back_as_requested(mc: Client, qname: str) -> None:
    mc.set(qname, b"a")
    mc.set(qname, b"b")
    assert mc.get(f"{qname}/open") == b"a"  # would be KeyError with a bare VALUE key
    assert mc.get(f"{qname}/close/open") == b"b"
    assert mc.get(f"{qname}/close") is None
    assert mc.get(f"{qname}/t=1") is None


def test_abort_and_peek(mc: Client, qname: str) -> None:
    mc.set(qname, b"x")
    assert mc.get(f"{qname}/peek") == b"x"
    assert mc.get(f"{qname}/open") == b"x"
    assert mc.get(f"{qname}/abort") is None
    assert mc.get(qname) == b"x"


def test_get_many_serves_every_key(mc: Client, qname: str) -> None:
    other = qname + "_b"
    mc.set(qname, b"1")
    mc.set(other, b"2")
    assert mc.get_many([qname, other, qname + "_missing"]) == {qname: b"1", other: b"2"}


def test_gets_returns_the_id_as_cas(mc: Client, qname: str) -> None:
    mc.set(qname, b"v")
    value, cas = mc.gets(f"{qname}/peek")
    assert value == b"v"
    assert int(cas) > 0
    assert mc.gets(qname) == (b"v", cas)


def test_delete_flush_all_version_stats(mc: Client, qname: str) -> None:
    mc.set(qname, b"v")
    assert mc.delete(qname) is True
    mc.set(qname, b"v")
    assert mc.flush_all() is True
    assert mc.get(qname) is None
    version = mc.version()
    assert len(version.split(b".")) == 3
    mc.set(qname, b"v")
    stats = mc.stats()
    assert stats[f"queue_{qname}_items".encode()] == 1
    assert stats[b"curr_connections"] >= 1


def test_flags_carry_the_value_type(server: ServerProcess, qname: str) -> None:
    client = Client(("127.0.0.1", server.port), serde=pickle_serde, default_noreply=False)
    try:
        for value in (42, "text", {"a": [1, 2]}, b"raw"):
            assert client.set(qname, value) is True
        assert [client.get(qname) for _ in range(4)] == [42, "text", {"a": [1, 2]}, b"raw"]
    finally:
        client.close()


def test_errors_are_raised_and_the_client_goes_on(mc: Client, qname: str) -> None:
    with pytest.raises(MemcacheClientError):
        mc.get(f"{qname}/bogus")
    mc.set(qname, b"x")
    assert mc.get(f"{qname}/open") == b"x"
    mc.set(qname, b"y")
    with pytest.raises(MemcacheClientError):
        mc.get(f"{qname}/open")  # a second open read on the same queue
    # pymemcache drops its connection after an error, so the server gave the open
    # read back; both items are still there, each served once.
    got = [mc.get(f"{qname}/t=20000"), mc.get(f"{qname}/t=20000")]
    assert sorted(got) == [b"x", b"y"]
    assert mc.get(qname) is None


def test_oversize_set_raises_server_error(tmp_path_factory: pytest.TempPathFactory) -> None:
    data = tmp_path_factory.mktemp("mc") / "data"
    with ServerProcess(data, "--max-item-size", "100") as proc:
        client = Client(("127.0.0.1", proc.port), default_noreply=False, timeout=GUARD_S)
        try:
            with pytest.raises(MemcacheServerError, match="too large"):
                client.set("q", b"x" * 101)
            assert client.set("q", b"x" * 100) is True
            assert client.get("q") == b"x" * 100
        finally:
            client.close()


def test_waiting_worker_woken_by_a_producer(server: ServerProcess, qname: str) -> None:
    worker = Client(("127.0.0.1", server.port), default_noreply=False, timeout=GUARD_S)
    producer = Client(("127.0.0.1", server.port))  # noreply by default
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(worker.get(f"{qname}/t=60000/open")))
    try:
        thread.start()
        with server.client() as probe:
            until(lambda: waiters(probe, qname) == 1, "the worker to wait")
        assert producer.set(qname, b"job") is True
        thread.join(GUARD_S)
        assert got == [b"job"]
        assert worker.get(f"{qname}/close") is None
    finally:
        thread.join(GUARD_S)
        worker.close()
        producer.close()


def test_quit(mc: Client) -> None:
    mc.quit()
    assert mc.version()  # pymemcache reconnects
