"""Every command against a real server process, over raw sockets (exact bytes on the wire)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server._harness import Raw, ServerProcess, until, waiters

# ---------------------------------------------------------------------- set / get


def test_set_then_get_in_order_with_flags_echoed(client: Raw, qname: str) -> None:
    assert client.set(qname, b"one", flags=0) == b"STORED"
    assert client.set(qname, b"two", flags=7) == b"STORED"
    assert client.set(qname, b"three", flags=4294967295) == b"STORED"
    assert client.get(qname) == [(qname.encode(), 0, b"one", None)]
    assert client.get(qname) == [(qname.encode(), 7, b"two", None)]
    assert client.get(qname) == [(qname.encode(), 4294967295, b"three", None)]
    assert client.get(qname) == []


def test_flags_over_32_bits_are_refused(client: Raw, qname: str) -> None:
    assert client.set(qname, b"x", flags=1 << 32).startswith(b"CLIENT_ERROR")
    assert client.call(b"version\r\n").startswith(b"VERSION")


def test_binary_payload_with_crlf_inside(client: Raw, qname: str) -> None:
    data = bytes(range(256)) + b"\r\nEND\r\n"
    assert client.set(qname, data) == b"STORED"
    assert client.get_one(qname) == data


def test_value_line_echoes_the_requested_key(client: Raw, qname: str) -> None:
    client.set(qname, b"x")
    key = f"{qname}/t=10"
    assert client.get(key) == [(key.encode(), 0, b"x", None)]


def test_gets_gives_the_message_id_as_cas(client: Raw, qname: str) -> None:
    client.set(qname, b"a")
    client.set(qname, b"b")
    client.send(f"gets {qname}\r\n".encode())
    ((_, _, data_a, cas_a),) = client.values()
    client.send(f"gets {qname}/peek {qname}\r\n".encode())
    (_, _, peeked, cas_peek), (_, _, data_b, cas_b) = client.values()
    assert (data_a, peeked, data_b) == (b"a", b"b", b"b")
    assert cas_a is not None and cas_b is not None
    assert cas_peek == cas_b > cas_a > 0


def test_noreply_set_is_silent(client: Raw, qname: str) -> None:
    client.send(f"set {qname} 0 0 1 noreply\r\na\r\n".encode())
    assert client.call(b"version\r\n").startswith(b"VERSION ")
    assert client.get_one(qname) == b"a"


def test_multi_key_get_serves_every_key(client: Raw, qname: str) -> None:
    other = qname + "_2"
    client.set(qname, b"a1")
    client.set(qname, b"a2")
    client.set(other, b"b1")
    found = client.get(qname, other, f"{qname}/peek", qname, other)
    assert [(k.decode(), d) for k, _, d, _ in found] == [
        (qname, b"a1"),
        (other, b"b1"),
        (f"{qname}/peek", b"a2"),
        (qname, b"a2"),
    ]


def test_get_of_a_missing_queue_is_empty_and_creates_nothing(
    client: Raw, qname: str, data_dir: Path
) -> None:
    assert client.get(qname) == []
    assert client.get(f"{qname}/peek") == []
    assert not (data_dir / qname).exists()
    client.set(qname, b"x")
    assert (data_dir / qname / "meta.json").is_file()


def test_exptime_in_the_past_expires_the_item(client: Raw, qname: str) -> None:
    assert client.set(qname, b"old", exptime=1_000_000) == b"STORED"  # absolute: 1970
    assert client.set(qname, b"neg", exptime=-1) == b"STORED"
    assert client.set(qname, b"live", exptime=3600) == b"STORED"  # relative: an hour
    assert client.get(f"{qname}/peek") == [(f"{qname}/peek".encode(), 0, b"live", None)]
    assert client.get_one(qname) == b"live"
    assert client.stats()[f"queue_{qname}_expired_items"] == "2"


def test_flush_expired_and_flush_all_expired(client: Raw, qname: str) -> None:
    client.set(qname, b"gone1", exptime=1_000_000)
    client.set(qname, b"gone2", exptime=1_000_001)
    client.set(qname, b"kept", exptime=0)
    assert client.call(f"flush_expired {qname}\r\n".encode()) == b"2"
    assert client.call(f"flush_expired {qname}\r\n".encode()) == b"0"
    client.set(qname, b"gone3", exptime=-5)
    assert int(client.call(b"flush_all_expired\r\n")) >= 1
    assert client.get_one(qname) == b"kept"
    assert client.call(b"flush_expired missing_queue_x\r\n") == b"0"


# ---------------------------------------------------------------------- reliable reads


def test_open_close_and_a_second_open_is_refused(client: Raw, qname: str) -> None:
    for item in (b"a", b"b", b"c"):
        client.set(qname, item)
    assert client.get_one(f"{qname}/open") == b"a"
    refused = client.call(f"get {qname}/open\r\n".encode())
    assert refused.startswith(b"CLIENT_ERROR too many open reads")
    assert client.stats()[f"queue_{qname}_open_transactions"] == "1"  # left as it was
    assert client.get_one(f"{qname}/close/open") == b"b"
    assert client.get(f"{qname}/close") == []
    assert client.get(f"{qname}/close") == []  # nothing open: still END
    assert client.get_one(qname) == b"c"
    assert client.stats()[f"queue_{qname}_open_transactions"] == "0"


def test_open_on_another_queue_is_allowed(client: Raw, qname: str) -> None:
    other = qname + "_b"
    client.set(qname, b"a")
    client.set(other, b"b")
    assert client.get_one(f"{qname}/open") == b"a"
    assert client.get_one(f"{other}/open") == b"b"
    assert client.get(f"{qname}/close", f"{other}/close") == []


def test_plain_get_while_a_read_is_open_is_refused(client: Raw, qname: str) -> None:
    client.set(qname, b"a")
    client.set(qname, b"b")
    assert client.get_one(f"{qname}/open") == b"a"
    assert client.call(f"get {qname}\r\n".encode()) == b"CLIENT_ERROR close current item first"
    assert client.get_one(f"{qname}/peek") == b"b"  # peeking is fine
    assert client.get(f"{qname}/close") == []
    assert client.get_one(qname) == b"b"


def test_abort_puts_the_item_back_at_the_head(client: Raw, qname: str) -> None:
    client.set(qname, b"first")
    client.set(qname, b"second")
    assert client.get_one(f"{qname}/open") == b"first"
    assert client.get(f"{qname}/abort") == []
    assert client.get_one(f"{qname}/open") == b"first"
    assert client.get_one(f"{qname}/close/open") == b"second"
    assert client.get(f"{qname}/close") == []
    stats = client.stats()
    assert stats[f"queue_{qname}_canceled_transactions"] == "1"
    assert stats[f"queue_{qname}_items"] == "0"


def test_disconnect_with_an_open_read_returns_the_item(server: ServerProcess, qname: str) -> None:
    with server.client() as worker:
        worker.set(qname, b"job1")
        worker.set(qname, b"job2")
        assert worker.get_one(f"{qname}/open") == b"job1"
    with server.client() as other:
        # job1 comes back to the head once the server has seen the disconnect.
        assert other.get_one(f"{qname}/t=20000") in (b"job1", b"job2")
        rest = other.get_one(f"{qname}/t=20000")
        assert rest in (b"job1", b"job2")
        assert other.get(qname) == []


def test_disconnect_returns_the_item_to_the_head(server: ServerProcess, qname: str) -> None:
    with server.client() as producer:
        producer.set(qname, b"job1")
        producer.set(qname, b"job2")
        with server.client() as worker:
            assert worker.get_one(f"{qname}/open") == b"job1"
        until(
            lambda: producer.stats()[f"queue_{qname}_open_transactions"] == "0",
            "the disconnect to be seen",
        )
        until(lambda: producer.stats()[f"queue_{qname}_items"] == "2", "job1 to come back")
        assert producer.get_one(qname) == b"job1"
        assert producer.get_one(qname) == b"job2"


def test_close_open_loop_consumes_everything_once(client: Raw, qname: str) -> None:
    items = [b"item%d" % i for i in range(20)]
    for item in items:
        client.set(qname, item)
    seen = [client.get_one(f"{qname}/open")]
    while (taken := client.get_one(f"{qname}/close/open")) is not None:
        seen.append(taken)
    assert seen == items
    assert client.stats()[f"queue_{qname}_open_transactions"] == "0"


def test_confirm(server: ServerProcess, tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", "--max-open-reads", "3") as proc, proc.client() as c:
        for i in range(4):
            c.set("q", b"%d" % i)
        assert c.get_one("q/open") == b"0"
        assert c.get_one("q/open") == b"1"
        assert c.call(b"confirm q 3\r\n") == b"ERROR"  # only two open: nothing confirmed
        assert c.call(b"confirm q 2\r\n") == b"END"
        assert c.call(b"confirm q 0\r\n") == b"END"
        assert c.stats()["queue_q_open_transactions"] == "0"
        assert c.get_one("q") == b"2"


def test_monitor_streams_open_reads(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", "--max-open-reads", "3") as proc, proc.client() as c:
        for i in range(5):
            c.set("q", b"m%d" % i)
        c.send(b"monitor q 5 2\r\n")
        assert c.values() == [(b"q", 0, b"m0", None)]
        assert c.values() == [(b"q", 0, b"m1", None)]
        assert c.values() == []  # the extra END closing the stream
        # Stops at the open-read limit too (3: two held, room for one).
        c.send(b"monitor q 5\r\n")
        assert c.values() == [(b"q", 0, b"m2", None)]
        assert c.values() == []
        assert c.call(b"confirm q 3\r\n") == b"END"
        assert c.get_one("q") == b"m3"


# ---------------------------------------------------------------------- waits


def test_wait_is_woken_by_another_connection(server: ServerProcess, qname: str) -> None:
    with server.client() as consumer, server.client() as producer:
        consumer.send(f"get {qname}/t=60000/open\r\n".encode())
        until(lambda: waiters(producer, qname) == 1, "the consumer to wait")
        assert producer.set(qname, b"wake") == b"STORED"
        assert consumer.values() == [(f"{qname}/t=60000/open".encode(), 0, b"wake", None)]
        assert consumer.get(f"{qname}/close") == []
        assert waiters(producer, qname) == 0


def test_waiters_are_served_in_arrival_order(server: ServerProcess, qname: str) -> None:
    with server.client() as producer:
        consumers = [server.client() for _ in range(4)]
        try:
            for n, consumer in enumerate(consumers, 1):
                consumer.send(f"get {qname}/t=60000\r\n".encode())
                until(lambda n=n: waiters(producer, qname) == n, f"{n} waiters")  # type: ignore[misc]
            producer.send(b"".join(f"set {qname} 0 0 2\r\nj{i}\r\n".encode() for i in range(4)))
            assert [producer.line() for _ in range(4)] == [b"STORED"] * 4
            got = [consumer.values()[0][2] for consumer in consumers]
            assert got == [b"j0", b"j1", b"j2", b"j3"]
        finally:
            for consumer in consumers:
                consumer.close()


def test_wait_times_out_with_end(client: Raw, qname: str) -> None:
    assert client.get(f"{qname}/t=1") == []
    assert client.get(f"{qname}/t=1/open") == []
    assert client.get(f"{qname}/t=1/peek") == []


def test_waiting_peek_sees_an_item_without_taking_it(server: ServerProcess, qname: str) -> None:
    with server.client() as watcher, server.client() as producer:
        watcher.send(f"get {qname}/t=60000/peek\r\n".encode())
        until(lambda: waiters(producer, qname) == 1, "the peek to wait")
        producer.set(qname, b"seen")
        assert watcher.values()[0][2] == b"seen"
        assert producer.get_one(qname) == b"seen"


def test_disconnect_while_waiting_cancels_the_wait(server: ServerProcess, qname: str) -> None:
    with server.client() as producer:
        with server.client() as consumer:
            consumer.send(f"get {qname}/t=60000\r\n".encode())
            until(lambda: waiters(producer, qname) == 1, "the consumer to wait")
        until(lambda: waiters(producer, qname) == 0, "the wait to be cancelled")
        producer.set(qname, b"kept")
        assert producer.get_one(qname) == b"kept"


# ---------------------------------------------------------------------- fan-out


def test_reader_plus_name_fans_out(client: Raw, qname: str) -> None:
    client.set(qname, b"before")  # a new reader starts at the tail, like a Kestrel child
    assert client.get(f"{qname}+audit") == []
    client.set(qname, b"x")
    client.set(qname, b"y")
    assert client.get_one(f"{qname}+audit/open") == b"x"
    assert client.get_one(f"{qname}+audit/close/open") == b"y"
    assert client.get(f"{qname}+audit/close") == []
    assert [client.get_one(qname) for _ in range(3)] == [b"before", b"x", b"y"]
    stats = client.stats()
    assert stats[f"queue_{qname}+audit_items"] == "0"
    assert client.call(f"delete {qname}+audit\r\n".encode()) == b"DELETED"
    assert f"queue_{qname}+audit_items" not in client.stats()


def test_first_reader_reference_subscribes_even_before_the_queue_exists(
    client: Raw, qname: str, data_dir: Path
) -> None:
    assert client.get(f"{qname}+audit") == []
    assert (data_dir / qname / "readers" / "audit.state").is_file()
    client.set(qname, b"x")
    assert client.get_one(f"{qname}+audit") == b"x"
    assert client.get_one(qname) == b"x"


def test_set_to_a_reader_is_refused(client: Raw, qname: str) -> None:
    assert client.set(f"{qname}+r", b"x").startswith(b"CLIENT_ERROR")


# ---------------------------------------------------------------------- delete / flush


def test_delete_drops_the_queue_and_its_files(client: Raw, qname: str, data_dir: Path) -> None:
    client.set(qname, b"x")
    assert (data_dir / qname).is_dir()
    assert client.call(f"delete {qname}\r\n".encode()) == b"DELETED"
    assert not (data_dir / qname).exists()
    assert client.get(qname) == []
    assert client.call(f"delete {qname}\r\n".encode()) == b"DELETED"  # missing: still
    client.send(f"delete {qname} noreply\r\n".encode())
    assert client.call(b"version\r\n").startswith(b"VERSION")
    client.set(qname, b"again")
    assert client.get_one(qname) == b"again"


def test_delete_wakes_waiters_and_drops_open_reads(server: ServerProcess, qname: str) -> None:
    with server.client() as holder, server.client() as waiter, server.client() as admin:
        holder.set(qname, b"held")
        assert holder.get_one(f"{qname}/open") == b"held"
        waiter.send(f"get {qname}/t=60000\r\n".encode())
        until(lambda: waiters(admin, qname) == 1, "the waiter")
        assert admin.call(f"delete {qname}\r\n".encode()) == b"DELETED"
        assert waiter.values() == []
        assert holder.get(f"{qname}/close") == []
        admin.set(qname, b"fresh")
        assert holder.get_one(f"{qname}/open") == b"fresh"
        assert holder.get(f"{qname}/close") == []


def test_flush_empties_the_queue_but_not_open_reads(client: Raw, qname: str) -> None:
    for i in range(5):
        client.set(qname, b"%d" % i)
    assert client.get_one(f"{qname}/open") == b"0"
    assert client.call(f"flush {qname}\r\n".encode()) == b"END"
    assert client.get(f"{qname}/peek") == []
    assert client.get(f"{qname}/abort") == []
    assert client.get_one(qname) == b"0"
    assert client.stats()[f"queue_{qname}_total_flushes"] == "1"
    client.send(f"flush {qname} noreply\r\n".encode())
    assert client.call(b"flush missing_queue_y\r\n") == b"END"


def test_flush_all_answers_ok(server: ServerProcess, qname: str) -> None:
    with server.client() as client:
        client.set(qname, b"x")
        client.set(qname + "_b", b"y")
        assert client.call(b"flush_all\r\n") == b"OK"
        assert client.get(qname, qname + "_b") == []
        client.set(qname, b"z")
        assert client.call(b"flush_all 0\r\n") == b"OK"
        client.send(b"flush_all 0 noreply\r\n")
        assert client.call(b"version\r\n").startswith(b"VERSION")
        assert client.call(b"flush_all 1000\r\n") == b"OK"  # scheduled, not now
        client.set(qname, b"later")
        assert client.get_one(qname) == b"later"


# ---------------------------------------------------------------------- info


def test_version_has_three_numbers(client: Raw) -> None:
    version = client.call(b"version\r\n")
    assert version.startswith(b"VERSION ")
    assert [part.isdigit() for part in version[8:].split(b".")] == [True, True, True]


def test_stats_names(client: Raw, qname: str) -> None:
    client.set(qname, b"x")
    client.get(f"{qname}/peek")
    stats = client.stats()
    for name in (
        "uptime",
        "time",
        "version",
        "curr_items",
        "total_items",
        "bytes",
        "curr_connections",
        "total_connections",
        "cmd_get",
        "cmd_set",
        "cmd_peek",
        "get_hits",
        "get_misses",
        "bytes_read",
        "bytes_written",
        "queue_creates",
        "queue_deletes",
    ):
        assert name in stats, name
    for suffix in (
        "items",
        "bytes",
        "total_items",
        "logsize",
        "expired_items",
        "age",
        "discarded",
        "waiters",
        "open_transactions",
        "canceled_transactions",
        "total_flushes",
        "in_flight",
        "acked",
        "dead_lettered",
    ):
        assert f"queue_{qname}_{suffix}" in stats, suffix
    assert stats[f"queue_{qname}_items"] == "1"
    assert int(stats["cmd_peek"]) >= 1
    assert client.call(b"stats items\r\n").startswith(b"CLIENT_ERROR")


def test_dump_stats(client: Raw, qname: str) -> None:
    client.set(qname, b"x")
    client.send(f"dump_stats {qname}\r\n".encode())
    lines = []
    while (line := client.line()) != b"END":
        lines.append(line)
    assert lines[0] == f"queue '{qname}' {{".encode()
    assert b"  items=1" in lines
    assert lines[-1] == b"}"


def test_quit_closes_the_connection(client: Raw) -> None:
    client.send(b"quit\r\n")
    assert client.is_closed_by_server()


def test_verbosity_answers_ok(client: Raw) -> None:
    assert client.call(b"verbosity 1\r\n") == b"OK"


def test_shutdown_is_refused_by_default(client: Raw) -> None:
    assert client.call(b"shutdown\r\n").startswith(b"CLIENT_ERROR shutdown is disabled")
    assert client.call(b"version\r\n").startswith(b"VERSION")


def test_pipelined_requests_are_answered_in_order(client: Raw, qname: str) -> None:
    client.send(
        f"set {qname} 0 0 1\r\na\r\nget {qname}\r\nbogus\r\nversion\r\nget {qname}\r\n".encode()
    )
    assert client.line() == b"STORED"
    assert client.values() == [(qname.encode(), 0, b"a", None)]
    assert client.line() == b"ERROR"
    assert client.line().startswith(b"VERSION")
    assert client.values() == []


@pytest.mark.parametrize("case", ["GET", "Set"])
def test_command_names_are_case_insensitive(client: Raw, qname: str, case: str) -> None:
    assert client.call(f"{case.upper()} {qname} 0 0 1\r\nz\r\n".encode()) in (b"STORED", b"END")
