"""The key from a file: ``--key-file`` on the commands, ``serve --encryption-key-file``."""

from __future__ import annotations

from pathlib import Path

import pytest

import ledgerq
from tests.cli._run import run
from tests.encryption._files import KEY, OTHER_KEY, files_holding
from tests.server._harness import ServerProcess

SECRET = b"cli secret payload"


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "key.hex"
    path.write_text(KEY.hex() + "\n")  # the hex form; the raw form is tested below
    return path


def test_commands_take_the_key_from_a_file(tmp_path: Path, key_file: Path) -> None:
    queue = tmp_path / "q"
    raw_key = tmp_path / "key.bin"
    raw_key.write_bytes(KEY)
    assert run("enqueue", queue, SECRET.decode(), "--key-file", key_file).code == 0
    assert run("enqueue", queue, "second", "--key-file", raw_key).code == 0
    assert files_holding(queue, SECRET) == []
    peeked = run("peek", queue, "--json", "--key-file", key_file)
    assert peeked.code == 0 and peeked.json_lines()[0]["payload"] == SECRET.decode()
    dumped = run("dump", queue, "--key-file", raw_key)
    assert [m["payload"] for m in dumped.json_lines()] == [SECRET.decode(), "second"]
    stats = run("stats", queue, "--json", "--key-file", key_file)
    assert stats.code == 0 and stats.json()["pending"] == 2
    got = run("dequeue", queue, "--key-file", key_file)
    assert got.code == 0 and SECRET in got.stdout
    with ledgerq.open(queue, encryption_key=KEY) as q:
        assert [m.payload for m in q.dequeue_batch(5)] == [b"second"]


def test_a_missing_or_wrong_key_is_a_clear_error(tmp_path: Path, key_file: Path) -> None:
    queue = tmp_path / "q"
    assert run("enqueue", queue, "x", "--key-file", key_file).code == 0
    wrong = tmp_path / "wrong.bin"
    wrong.write_bytes(OTHER_KEY)
    for args in (("peek",), ("dequeue",), ("dump",)):
        missing = run(*args, queue)
        assert missing.code != 0 and "is encrypted" in missing.err, missing
        assert "Traceback" not in missing.err
        bad = run(*args, queue, "--key-file", wrong)
        assert bad.code != 0 and "wrong encryption_key" in bad.err, bad
        assert OTHER_KEY.hex() not in bad.err
    short = tmp_path / "short"
    short.write_text("abcd")
    refused = run("peek", queue, "--key-file", short)
    assert refused.code == 2 and "32 raw bytes, or 64 hexadecimal digits" in refused.err
    assert "abcd" not in refused.err


def test_verify_says_what_it_checks_without_the_key(tmp_path: Path, key_file: Path) -> None:
    queue = tmp_path / "q"
    assert run("enqueue", queue, "x", "--key-file", key_file).code == 0
    without = run("verify", queue)
    assert without.code == 0 and "not authenticated" in without.err
    with_key = run("verify", queue, "--key-file", key_file)
    assert with_key.code == 0 and "not authenticated" not in with_key.err
    (log,) = (queue / "segments").glob("*.log")
    raw = bytearray(log.read_bytes())
    from ledgerq.format.checksum import checksum

    raw[40] ^= 1  # inside the sealed payload; the CRC made right again
    raw[-4:] = checksum(bytes(raw[:-4])).to_bytes(4, "little")
    log.write_bytes(bytes(raw))
    assert run("verify", queue).code == 0  # without the key: nothing it can see
    tampered = run("verify", queue, "--key-file", key_file)
    assert tampered.code == 1 and "message 1 fails authentication" in tampered.err


_HANDLER = """
def handle(message):
    with open("seen.txt", "ab") as out:
        out.write(message.payload + b"\\n")
    if message.payload == b"bad":
        raise ValueError("bad payload")
"""


def test_worker_takes_the_key_from_a_file(tmp_path: Path, key_file: Path) -> None:
    queue = tmp_path / "q"
    (tmp_path / "tasks.py").write_text(_HANDLER)
    with ledgerq.open(queue, encryption_key=KEY) as q:
        q.enqueue_batch([SECRET, b"bad", b"last"])
    args = ("worker", queue, "tasks:handle", "--until-empty", "--json", "-o", "max_retries=1")
    missing = run(*args, cwd=tmp_path)
    assert missing.code != 0 and "is encrypted" in missing.err and "--key-file" in missing.err
    report = run(*args, "--key-file", key_file, cwd=tmp_path)
    assert report.code == 0, report
    assert (report.json()["processed"], report.json()["dead_lettered"]) == (2, 1)
    assert sorted((tmp_path / "seen.txt").read_bytes().splitlines()) == [b"bad", SECRET, b"last"]
    assert files_holding(queue, SECRET) == [] and files_holding(queue, b"bad payload") == []
    with ledgerq.open(queue, encryption_key=KEY) as q:  # the dead letter: sealed, readable
        (dead,) = q.dlq.peek(5)
        assert (
            dead.payload == b"bad"
            and dead.headers["dlq.failure_reason"] == "ValueError: bad payload"
        )


def test_serve_with_an_encryption_key_file(tmp_path: Path, key_file: Path) -> None:
    pytest.importorskip("pymemcache")
    from pymemcache.client.base import Client

    data = tmp_path / "data"
    with ServerProcess(data, "--encryption-key-file", str(key_file)) as server:
        client = Client(("127.0.0.1", server.port), timeout=20, default_noreply=False)
        try:
            assert client.set("jobs", SECRET) is True
            assert client.set("jobs", b"two") is True
            assert client.get("jobs") == SECRET
        finally:
            client.close()
        assert KEY.hex() not in server.stderr
    assert files_holding(data, SECRET) == []
    with ledgerq.open(data / "jobs", encryption_key=KEY) as q:
        assert [m.payload for m in q.dequeue_batch(5)] == [b"two"]


def test_serve_refuses_two_key_files_holding_different_keys(tmp_path: Path, key_file: Path) -> None:
    other = tmp_path / "other.bin"
    other.write_bytes(OTHER_KEY)
    data = tmp_path / "data"
    refused = run("serve", data, "--key-file", key_file, "--encryption-key-file", other)
    assert refused.code == 2 and "different key" in refused.err, refused
    assert KEY.hex() not in refused.err and OTHER_KEY.hex() not in refused.err
    assert not data.exists()  # refused before anything was created


def test_config_never_shows_the_key(tmp_path: Path, key_file: Path) -> None:
    queue = tmp_path / "q"
    assert run("enqueue", queue, "x", "--key-file", key_file).code == 0
    shown = run("config", queue, "--json")
    assert shown.code == 0 and "encryption_key" not in shown.json()["options"]
    refused = run("config", queue, "--set", "max_retries=5")
    assert refused.code != 0 and "is encrypted" in refused.err
    stored = run("config", queue, "--set", "max_retries=5", "--key-file", key_file, "--json")
    assert stored.code == 0, stored
    assert stored.json()["set"] == {"max_retries": 5}
    assert KEY.hex() not in stored.out and "encryption_key" not in stored.out
