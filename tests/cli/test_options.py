"""Queue options on the command line: ``-o`` for one command, ``ledgerq config`` to store.

``-o NAME=VALUE`` changes how one command works on a queue and never what the
application gets at its next ``ledgerq.open(path)``; ``ledgerq config QUEUE --set``
is the explicit way to change that.  A bad value is a usage error (exit 2), always.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import ledgerq

from ._run import fails, ok

STORED = {"max_retries": 5, "retention_max_age": 3600.0, "dedup_window": 60.0}


def _configured(path: Path) -> Path:
    with ledgerq.open(path, **STORED) as q:  # type: ignore[arg-type]
        q.enqueue(b"low", priority=ledgerq.Priority.LOW)
        q.enqueue(b"high", priority=ledgerq.Priority.HIGH)
    return path


def _stored(path: Path) -> dict[str, object]:
    with ledgerq.open(path) as q:
        return {name: getattr(q.options, name) for name in (*STORED, "priorities", "sync")}


EXPECTED = {**STORED, "priorities": False, "sync": "interval"}


@pytest.mark.parametrize(
    "command",
    [
        ["stats", "Q", "-o", "max_retries=1", "-o", "priorities=true"],
        ["compact", "Q", "-o", "retention_max_age=0"],
        ["peek", "Q", "-o", "sync=always"],
        ["dlq", "list", "Q", "-o", "max_retries=0"],
        ["enqueue", "Q", "more", "-o", "dedup_window=none"],
        ["dequeue", "Q", "-o", "max_retries=2", "--no-ack"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_an_override_is_for_one_command(tmp_path: Path, command: list[str]) -> None:
    q = _configured(tmp_path / "q")
    ok(*(q if arg == "Q" else arg for arg in command))
    assert _stored(q) == EXPECTED


def test_an_override_applies_to_its_command(tmp_path: Path) -> None:
    q = _configured(tmp_path / "q")
    fifo = ok("peek", q, "--json").json_lines()
    assert [m["payload"] for m in fifo] == ["low", "high"]
    ordered = ok("peek", q, "--json", "-o", "priorities=true").json_lines()
    assert [m["payload"] for m in ordered] == ["high", "low"]


def test_a_queue_made_by_the_command_line_stores_no_override(tmp_path: Path) -> None:
    q = tmp_path / "new"
    ok("enqueue", q, "x", "-o", "priorities=true", "-o", "max_retries=9")
    with ledgerq.open(q) as queue:
        assert queue.options == ledgerq.Options()


@pytest.mark.parametrize(
    "pair",
    [
        "max_retries=-1",
        "max_retries=many",
        "segment_size=0",
        "sync=sometimes",
        "compression=gzip",
        "compression_level=99",
        "sync_interval=nan",
        "visibility_timeout=0",
        "priorities=maybe",
        "colour=red",
        "max_retries",
    ],
)
def test_a_bad_option_is_a_usage_error(tmp_path: Path, pair: str) -> None:
    q = _configured(tmp_path / "q")
    for command in (["stats", q], ["enqueue", q, "x"], ["config", q, "--set"]):
        flag = [] if command[0] == "config" else ["-o"]
        result = fails(*command, *flag, pair, code=2)
        assert pair.partition("=")[0] in result.err
    assert _stored(q) == EXPECTED
    with ledgerq.open(q) as queue:
        assert len(queue) == 2  # the enqueues did not happen


def test_config_shows_the_stored_options(tmp_path: Path) -> None:
    q = _configured(tmp_path / "q")
    shown = ok("config", q, "--json").json()
    assert shown["queue"] == str(q) and shown["set"] == {}
    assert shown["options"]["max_retries"] == 5
    assert shown["options"]["dedup_window"] == 60.0
    assert shown["options"]["priorities"] is False
    # every stored option: all but the encryption key, which is never stored nor shown
    stored = {"segment_size", *ledgerq.OpenOptions.__annotations__} - {"encryption_key"}
    assert set(shown["options"]) == stored
    text = ok("config", q).out
    assert "max_retries           5\n" in text
    assert "priorities            false  (default)\n" in text
    with ledgerq.open(q) as queue:  # reading takes no lock
        assert ok("config", q, "--json").json()["options"]["max_retries"] == 5
        queue.enqueue(b"x")


def test_config_set_stores_what_the_application_gets(tmp_path: Path) -> None:
    q = _configured(tmp_path / "q")
    changed = ok("config", q, "--set", "max_retries=1", "--set", "priorities=true", "--json")
    value = changed.json()
    assert value["set"] == {"max_retries": 1, "priorities": True}
    assert value["options"]["max_retries"] == 1 and value["options"]["priorities"] is True
    assert _stored(q) == {**EXPECTED, "max_retries": 1, "priorities": True}
    with ledgerq.open(q) as queue:
        assert [m.payload for m in queue.peek(2)] == [b"high", b"low"]


def test_config_set_refuses_a_queue_open_elsewhere(tmp_path: Path) -> None:
    q = _configured(tmp_path / "q")
    with ledgerq.open(q):
        result = fails("config", q, "--set", "max_retries=1", code=1)
        assert "open elsewhere" in result.err and str(q) in result.err
    assert _stored(q) == EXPECTED


def test_config_never_creates_a_queue(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert "does not exist" in fails("config", missing, "--set", "max_retries=1", code=1).err
    assert not missing.exists()


@pytest.mark.parametrize(
    ("command", "value"),
    [
        (["enqueue", "Q", "x", "--ttl"], "nan"),
        (["enqueue", "Q", "x", "--ttl"], "inf"),
        (["enqueue", "Q", "x", "--ttl"], "0"),
        (["dequeue", "Q", "--timeout"], "nan"),
        (["dequeue", "Q", "--timeout"], "-1"),
        (["worker", "Q", "tasks:handle", "--task-timeout"], "nan"),
        (["ship", "Q", "DEST", "--client-id", "c", "--timeout"], "nan"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_a_bad_number_of_seconds_is_a_usage_error(
    tmp_path: Path, command: list[str], value: str
) -> None:
    q = _configured(tmp_path / "q")
    args = [q if a == "Q" else tmp_path / "dest" if a == "DEST" else a for a in command]
    result = fails(*args, value, code=2)
    assert "seconds" in result.err and value in result.err
    with ledgerq.open(q) as queue:
        assert len(queue) == 2


def test_dequeue_timeout_inf_still_waits_forever(tmp_path: Path) -> None:
    q = _configured(tmp_path / "q")
    assert ok("dequeue", q, "--timeout", "inf").out == "low\n"
