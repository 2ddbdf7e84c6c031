"""Issue 25 item 1: an encrypted queue delivers only entries sealed under its key.

The attacker can write the queue's directory and has no key (``_forge``): every entry
it leaves has a valid CRC-32C.  Each attack changes the real bytes of a real queue
directory, then every way of reading the queue is asked for its messages - the queue's
own dequeue, batch, peek and named reader in exclusive and in shared mode, the
lock-free views (``ledgerq.follow``, ``tools.iter_messages`` under ``ledgerq dump``,
the lock-free ``peek``) and the Spark scan: each must deliver exactly the genuine
messages the attack left alone, skip the rest (logged on the ``ledgerq`` logger, and
counted in ``stats().corrupt_skipped`` when a dequeue meets it), and deliver no forged
byte.  The DLQ, ``requeue_dlq``, ``verify``, ``ship``, the command line, the console and
the Celery transport follow.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import ledgerq
from ledgerq import tools
from ledgerq.cli import _readonly
from tests._child import Children
from tests.cli._run import run
from tests.encryption import _forge
from tests.encryption._files import KEY, segment_bytes, set_encryption_block

Delivered = list[tuple[int, bytes, dict[str, str]]]
HEADERS = {"h": "genuine header"}
GENUINE = {i: b"genuine %d" % i for i in range(1, 6)}  # ids 1-5; the same size each


def _fill(path: Path, payloads: dict[int, bytes] = GENUINE, **options: object) -> None:
    with ledgerq.open(path, encryption_key=KEY, **options) as q:  # type: ignore[arg-type]
        for message_id, payload in payloads.items():
            assert q.enqueue(payload, headers=HEADERS) == message_id


# ---------------------------------------------------------------- the attacks


@dataclass(frozen=True)
class Attack:
    """``apply(queue, scratch)`` changes the queue's files; afterwards the readers must
    deliver the genuine messages ``kept`` and skip ``skipped`` (corrupt)."""

    apply: Callable[[Path, Path], object]
    kept: tuple[int, ...]
    skipped: tuple[int, ...]


def _transplant(queue: Path, scratch: Path) -> None:
    """Message 3 of another queue sealed under the same key, at the same id and size."""
    other = scratch / "other"
    _fill(other, {i: b"planted %d" % i for i in range(1, 6)})
    _forge.transplant(other, queue, 3)


ATTACKS = {
    # A plain entry (flags 0, the next id, a right CRC) appended to the last segment.
    "forged_at_the_tail": Attack(lambda q, _: _forge.forge_tail(q), (1, 2, 3, 4, 5), (6,)),
    # The same with visible headers (HAS_HEADERS): a forged task with its metadata.
    "forged_with_headers": Attack(
        lambda q, _: _forge.forge_tail(q, headers=HEADERS), (1, 2, 3, 4, 5), (6,)
    ),
    "forged_batch": Attack(lambda q, _: _forge.forge_tail(q, count=3), (1, 2, 3, 4, 5), (6, 7, 8)),
    # A genuine entry replaced by a plain one of the same id and size.
    "forged_in_place": Attack(lambda q, _: _forge.forge_in_place(q, 3), (1, 2, 4, 5), (3,)),
    # ENCRYPTED cleared, CRC fixed: would deliver nonce + ciphertext + tag as the payload.
    "seal_stripped": Attack(lambda q, _: _forge.strip_seal(q, 2), (1, 3, 4, 5), (2,)),
    # A genuine sealed entry under another id: the associated data holds the id.
    "moved_to_another_id": Attack(lambda q, _: _forge.move_to_next_id(q, 2), (1, 2, 3, 4, 5), (6,)),
    # A visible field changed: the associated data holds every byte before the blob.
    "visible_field_changed": Attack(lambda q, _: _forge.retime(q, 2), (1, 3, 4, 5), (2,)),
    # Another queue's genuine entry (same key, same id): the queue identity tells them apart.
    "from_another_queue": Attack(_transplant, (1, 2, 4, 5), (3,)),
    # A genuine entry copied in again after the last one: its id does not increase, so
    # it is no entry of this log (the queue's recovery cuts it as a torn tail).
    "replayed": Attack(lambda q, _: _forge.replay(q, 2), (1, 2, 3, 4, 5), ()),
}


# ---------------------------------------------------------------- the read paths


def _messages(found: list[ledgerq.Message]) -> Delivered:
    return [(m.id, m.payload, m.headers) for m in found]


def _dequeue_one_by_one(q: ledgerq.Queue) -> Delivered:
    got = []
    while (m := q.dequeue()) is not None:  # timeout=0: the dequeue fast path
        got.append(m)
    return _messages(got)


def _dequeue_batches(q: ledgerq.Queue) -> Delivered:
    got: list[ledgerq.Message] = []
    while batch := q.dequeue_batch(2):
        got.extend(batch)
    return _messages(got)


def _named_reader(q: ledgerq.Queue) -> Delivered:
    return _messages(q.reader("audit").dequeue_batch(20))


QUEUE_PATHS: dict[str, Callable[[ledgerq.Queue], Delivered]] = {
    "dequeue": _dequeue_one_by_one,
    "dequeue_batch": _dequeue_batches,
    "named_reader": _named_reader,
    "peek": lambda q: _messages(q.peek(20)),
}


def _follow(path: Path) -> Delivered:
    with ledgerq.follow(path, timeout=0, encryption_key=KEY) as follower:
        return _messages(list(follower))


def _spark_scan(path: Path) -> Delivered:
    pytest.importorskip("pyspark", reason="the Spark scan needs ledgerq[spark]")
    from ledgerq.spark._plan import Pushed, ReadOptions, plan_tasks
    from ledgerq.spark._scan import scan_segment

    tasks = plan_tasks(ReadOptions(paths=(str(path),), encryption_key=KEY), Pushed())
    rows = [row for task in tasks for row in scan_segment(task, arrow=False)]
    return [(row[1], row[6], dict(row[5])) for row in rows]


VIEW_PATHS: dict[str, Callable[[Path], Delivered]] = {
    "follow": _follow,
    "iter_messages": lambda p: _messages(list(tools.iter_messages(p, encryption_key=KEY))),
    "lock_free_peek": lambda p: _messages(_readonly.peek(str(p), 20, KEY)),
    "spark_scan": _spark_scan,
}


def _attacked(tmp_path: Path, attack: Attack) -> Path:
    queue = tmp_path / "q"
    _fill(queue)
    attack.apply(queue, tmp_path)
    return queue


def _expected(attack: Attack) -> Delivered:
    return [(i, GENUINE[i], HEADERS) for i in attack.kept]


def _skips_logged(caplog: pytest.LogCaptureFixture, attack: Attack) -> None:
    for message_id in attack.skipped:
        assert any(
            r.name == "ledgerq" and f"skipping message {message_id} " in r.getMessage()
            for r in caplog.records
        ), (message_id, [r.getMessage() for r in caplog.records])


@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
@pytest.mark.parametrize("path_name", sorted(QUEUE_PATHS))
@pytest.mark.parametrize("attack_name", sorted(ATTACKS))
def test_the_queue_delivers_only_genuine_messages(
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    attack_name: str,
    path_name: str,
    shared: bool,
) -> None:
    attack = ATTACKS[attack_name]
    queue = _attacked(tmp_path, attack)
    caplog.set_level(logging.WARNING, logger="ledgerq")
    with ledgerq.open(queue, encryption_key=KEY, shared=shared) as q:
        got = QUEUE_PATHS[path_name](q)
        corrupt = q.stats().corrupt_skipped
    assert got == _expected(attack)
    if path_name != "peek":  # a peek skips it; the delivery that meets it counts it
        assert corrupt == len(attack.skipped)
        _skips_logged(caplog, attack)


@pytest.mark.parametrize("path_name", sorted(VIEW_PATHS))
@pytest.mark.parametrize("attack_name", sorted(ATTACKS))
def test_the_views_show_only_genuine_messages(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, attack_name: str, path_name: str
) -> None:
    attack = ATTACKS[attack_name]
    queue = _attacked(tmp_path, attack)
    caplog.set_level(logging.WARNING, logger="ledgerq")
    assert VIEW_PATHS[path_name](queue) == _expected(attack)
    _skips_logged(caplog, attack)


def test_entries_forged_beside_live_shared_handles_are_never_delivered(tmp_path: Path) -> None:
    """Forged while a shared handle holds the queue, then read by it and by another process.

    The forged ids collide with the handle's own next ids: the genuine entry it writes
    after them is lost (docs/encryption.md says so) - but nothing forged is delivered."""
    queue = tmp_path / "q"
    _fill(queue)
    with ledgerq.open(queue, encryption_key=KEY, shared=True) as q:
        _forge.forge_tail(queue, count=2)  # ids 6 and 7, beside a live handle
        later = q.enqueue(b"genuine later", headers=HEADERS)
        child = _run_child(queue)
        mine = [[m.id, m.payload.decode()] for m in q.dequeue_batch(20)]
    genuine = [[i, GENUINE[i].decode()] for i in GENUINE] + [[later, "genuine later"]]
    delivered = sorted(child + mine)
    assert all(m in genuine for m in delivered), delivered
    assert [m for m in delivered if m[0] <= 5] == genuine[:5]  # each exactly once


_CHILD = """
import json, sys, ledgerq
with ledgerq.open(sys.argv[1], shared=True, encryption_key=bytes.fromhex(sys.argv[2])) as q:
    got = q.dequeue_batch(20)
    for m in got:
        q.ack(m.id)
    print(json.dumps([[m.id, m.payload.decode()] for m in got]))
"""


def _run_child(queue: Path) -> object:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(queue), KEY.hex()],
        capture_output=True,
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    return json.loads(done.stdout)


def test_the_stripped_seal_is_never_delivered_as_the_payload(tmp_path: Path) -> None:
    """The issue's third case: what a reader trusting the cleared flag would deliver."""
    queue = tmp_path / "q"
    _fill(queue)
    blob = _forge.strip_seal(queue, 2)
    assert blob in segment_bytes(queue)  # still there, now as a "plain" payload
    with ledgerq.open(queue, encryption_key=KEY) as q:
        payloads = [m.payload for m in q.dequeue_batch(10)]
    assert blob not in payloads and payloads == [GENUINE[i] for i in (1, 3, 4, 5)]


# ---------------------------------------------------------------- the DLQ and requeue_dlq


def _with_dead_letters(path: Path) -> None:
    """Two dead letters (DLQ ids 1 and 2) of messages 1 and 2."""
    with ledgerq.open(path, encryption_key=KEY, max_retries=1) as q:
        for i in (1, 2):
            q.enqueue(GENUINE[i], headers=HEADERS)
        for m in q.dequeue_batch(2):
            q.nack(m.id, "failed")
        assert q.stats().dead_lettered == 2


@pytest.mark.parametrize("shared", [False, True], ids=["exclusive", "shared"])
def test_forged_dead_letters_are_never_listed_nor_requeued(tmp_path: Path, shared: bool) -> None:
    path = tmp_path / "q"
    _with_dead_letters(path)
    dlq = path / "dlq"
    _forge.forge_tail(dlq, headers={"dlq.original_id": "99", "dlq.failure_reason": "x"})
    # The DLQ's view, lock-free (the console and `ledgerq dlq list` read it so).
    assert [m.payload for m in tools.iter_messages(dlq, encryption_key=KEY)] == [
        GENUINE[1],
        GENUINE[2],
    ]
    with ledgerq.open(path, encryption_key=KEY, shared=shared) as q:
        assert [m.payload for m in q.dlq.peek(10)] == [GENUINE[1], GENUINE[2]]
        assert q.requeue_dlq() == 2
        got = q.dequeue_batch(10)
        assert [(m.payload, m.headers) for m in got] == [(GENUINE[i], HEADERS) for i in (1, 2)]
        assert _forge.FORGED not in segment_bytes(path)  # nothing forged moved over
        assert q.dlq.dequeue() is None


def test_a_dead_letter_stripped_of_its_seal_is_not_requeued(tmp_path: Path) -> None:
    path = tmp_path / "q"
    _with_dead_letters(path)
    _forge.strip_seal(path / "dlq", 1)  # its dlq.* headers are sealed: only ENCRYPTED shows
    with ledgerq.open(path, encryption_key=KEY) as q:
        assert q.requeue_dlq() == 1
        assert [m.payload for m in q.dequeue_batch(10)] == [GENUINE[2]]


def test_entries_swapped_between_a_queue_and_its_dlq_fail_authentication(tmp_path: Path) -> None:
    """The DLQ shares the key, not the identity: each one's entries 1 and 2 in the other."""
    path = tmp_path / "q"
    _with_dead_letters(path)  # the main log holds ids 1 and 2; so does the DLQ's
    main_log, dlq_log = _forge.last_log(path), _forge.last_log(path / "dlq")
    main_bytes, dlq_bytes = main_log.read_bytes(), dlq_log.read_bytes()
    main_log.write_bytes(dlq_bytes)
    dlq_log.write_bytes(main_bytes)
    with ledgerq.open(path, encryption_key=KEY) as q:
        assert q.reader("fresh").dequeue_batch(10) == []  # a reader that starts before them
        assert q.dlq.dequeue_batch(10) == []
        assert q.stats().corrupt_skipped == 2 and q.dlq.stats().corrupt_skipped == 2


# ---------------------------------------------------------------- verify and the CLI


@pytest.mark.parametrize("attack_name", ["forged_at_the_tail", "forged_in_place", "seal_stripped"])
def test_verify_reports_unsealed_entries_without_the_key(tmp_path: Path, attack_name: str) -> None:
    attack = ATTACKS[attack_name]
    queue = _attacked(tmp_path, attack)
    report = tools.verify(queue)
    unsealed = [p for p in report.problems if p.kind == tools.UNSEALED]
    assert [p.message.split()[1] for p in unsealed] == [str(i) for i in attack.skipped]
    assert all(p.file.endswith(".log") and p.offset is not None for p in unsealed)
    assert not report.ok


def test_verify_of_a_genuine_encrypted_queue_is_clean(tmp_path: Path) -> None:
    queue = tmp_path / "q"
    _fill(queue, compression="zstd")
    assert tools.verify(queue).ok


@pytest.mark.parametrize(
    "attack_name", ["forged_at_the_tail", "seal_stripped", "from_another_queue"]
)
def test_the_cli_dumps_only_genuine_messages_and_verify_fails(
    tmp_path: Path, attack_name: str
) -> None:
    attack = ATTACKS[attack_name]
    queue = _attacked(tmp_path, attack)
    key_file = tmp_path / "key"
    key_file.write_text(KEY.hex())
    dump = run("dump", queue, "--key-file", key_file)
    assert dump.code == 0, dump
    assert [line["id"] for line in dump.json_lines()] == list(attack.kept)
    assert "FORGED" not in dump.out
    for skipped in attack.skipped:
        assert f"skipping message {skipped} " in dump.err
    verify = run("verify", queue, "--key-file", key_file, "--json")
    assert verify.code == 1, verify
    named = verify.out + verify.err
    for skipped in attack.skipped:
        assert f"message {skipped} " in named


# ---------------------------------------------------------------- ship


def test_ship_copies_a_forged_entry_as_it_is_and_says_so(tmp_path: Path) -> None:
    from ledgerq.ship import ship_queue

    src = tmp_path / "orders"
    _fill(src)
    _forge.forge_tail(src)
    report = ship_queue(src, tmp_path / "hub", "edge-1")
    dest = tmp_path / "hub" / "edge-1.orders"
    assert report.messages == 6  # byte-exact: the copy is what the source holds
    assert segment_bytes(dest) == segment_bytes(src)
    assert any("unsealed entries" in note and "(id 6)" in note for note in report.notes)
    with ledgerq.open(dest, encryption_key=KEY) as hub:  # the hub's readers skip it
        assert [m.id for m in hub.dequeue_batch(10)] == [1, 2, 3, 4, 5]
        assert hub.stats().corrupt_skipped == 1


# ---------------------------------------------------------------- what is not detected


def test_a_rolled_back_reader_state_redelivers_genuine_messages_only(tmp_path: Path) -> None:
    """docs/encryption.md: reader journals are not authenticated - an old copy brings
    acked messages back (at-least-once), but never a forged one."""
    queue = tmp_path / "q"
    _fill(queue)
    saved = tmp_path / "readers-before"
    shutil.copytree(queue / "readers", saved)
    with ledgerq.open(queue, encryption_key=KEY) as q:
        for m in q.dequeue_batch(10):
            q.ack(m.id)
    shutil.rmtree(queue / "readers")
    shutil.copytree(saved, queue / "readers")
    with ledgerq.open(queue, encryption_key=KEY) as q:
        assert [(m.id, m.payload) for m in q.dequeue_batch(10)] == list(GENUINE.items())


def test_another_queues_identity_under_the_same_key_fails_every_entry(tmp_path: Path) -> None:
    """meta.json's encryption object swapped for another queue's (same key): the key check
    passes, and the queue's own entries no longer authenticate."""
    queue, other = tmp_path / "q", tmp_path / "other"
    _fill(queue)
    _fill(other, {1: b"other"})
    block = json.loads((other / "meta.json").read_text())["encryption"]
    set_encryption_block(queue, block)
    with ledgerq.open(queue, encryption_key=KEY) as q:
        assert q.dequeue_batch(10) == []
        assert q.stats().corrupt_skipped == len(GENUINE)


def test_a_consumed_segment_put_back_is_not_delivered_again(tmp_path: Path) -> None:
    """Old genuine entries copied in again as a whole file, after retention deleted it:
    a reader past them does not take them again (one that starts earlier would: they
    are genuine - docs/encryption.md)."""
    queue = tmp_path / "q"
    payloads = {i: b"genuine %02d" % i for i in range(1, 15)}
    _fill(queue, payloads, segment_size=400)
    first = min((queue / "segments").glob("*.log"))
    saved = {p: p.read_bytes() for p in (first, first.with_suffix(".idx"))}
    with ledgerq.open(queue, encryption_key=KEY, segment_size=400) as q:
        consumed = [m.id for m in q.dequeue_batch(7)]
        for message_id in consumed:
            q.ack(message_id)
    assert not first.exists()  # consumed: retention deleted it
    for file, data in saved.items():
        file.write_bytes(data)
    with ledgerq.open(queue, encryption_key=KEY) as q:
        assert [m.id for m in q.dequeue_batch(20)] == list(range(8, 15))
        assert q.stats().corrupt_skipped == 0


def test_a_stripped_encryption_block_refuses_the_key(tmp_path: Path) -> None:
    """A downgrade (meta.json and options.json made to say plain) is refused at open."""
    queue = tmp_path / "q"
    _fill(queue)
    for name in ("meta.json", "options.json"):
        file = queue / name
        if file.exists():
            value = json.loads(file.read_text())
            value.pop("encryption", None)
            value["version"] = 2 if name == "meta.json" else 1
            file.write_text(json.dumps(value))
    with pytest.raises(ledgerq.ConfigError, match="is not encrypted"):
        ledgerq.open(queue, encryption_key=KEY)


# ---------------------------------------------------------------- the console


def test_the_console_shows_and_requeues_only_genuine_messages(
    tmp_path: Path, children: Children
) -> None:
    from tests.ui._console import Client, act, start_console

    root = tmp_path / "queues"
    vault = root / "vault"
    _with_dead_letters(vault)  # DLQ ids 1 and 2
    _forge.forge_tail(vault / "dlq", headers={"dlq.original_id": "9", "dlq.failure_reason": "x"})
    _fill(vault, {3: GENUINE[3], 4: GENUINE[4]})
    forged = _forge.forge_tail(vault)  # id 5
    _forge.strip_seal(vault, 4)
    key_file = tmp_path / "key"
    key_file.write_text(KEY.hex())
    _, base = start_console(children, root, "--key-file", str(key_file))
    client = Client(base)

    listed = client.get("/api/messages?q=vault").json()
    assert [(m["id"], m["preview"]) for m in listed] == [(3, GENUINE[3].decode())]
    for message_id in (4, *forged):
        assert client.get(f"/api/message?q=vault&id={message_id}").status == 404
        page = client.get(f"/message?q=vault&id={message_id}")
        assert page.status == 404 and "FORGED" not in page.text
    dead = client.get("/api/dlq?q=vault").json()["messages"]
    assert [m["id"] for m in dead] == [1, 2]
    assert client.get("/api/message?q=vault&dlq=1&id=3").status == 404
    _, landed = act(client, client.csrf(), [("q", "vault"), ("do", "requeue:all")])
    assert "requeued 2 messages to vault" in landed
    with ledgerq.open(vault, encryption_key=KEY) as q:
        assert [m.payload for m in q.dequeue_batch(10)] == [GENUINE[3], GENUINE[1], GENUINE[2]]
        assert q.stats().corrupt_skipped == 2


# ---------------------------------------------------------------- Celery


def _kombu_entry(root: Path, body: str) -> tuple[bytes, dict[str, str]]:
    """The payload and headers the ledgerq transport stores for a message ``body``
    published to queue ``celery`` of a plain broker at ``root``."""
    import kombu  # the transport is registered (the test imported ledgerq.celery)

    with kombu.Connection(f"ledgerq://{root}") as conn:
        conn.Producer().publish(body, routing_key="celery", declare=[kombu.Queue("celery")])
    ((_, entry),) = _forge.entries(_forge.last_log(root / "queues" / "celery"))
    return entry.payload, dict(entry.headers or {})


def test_a_forged_task_never_reaches_an_encrypted_brokers_consumer(tmp_path: Path) -> None:
    """Task injection: a message the transport would take for a task, written as a plain
    entry into an encrypted broker's queue, is skipped as corrupt."""
    kombu = pytest.importorskip("kombu", reason="the Celery transport needs ledgerq[celery]")
    import ledgerq.celery  # registers the transport with kombu

    url = f"ledgerq://{tmp_path / 'broker'}"
    options = {"encryption_key": KEY}

    def publish(body: str) -> None:
        with kombu.Connection(url, transport_options=options) as conn:
            conn.Producer().publish(body, routing_key="celery", declare=[kombu.Queue("celery")])

    publish("genuine first")
    payload, headers = _kombu_entry(tmp_path / "plain", "FORGED task")
    queue = tmp_path / "broker" / "queues" / "celery"
    _forge.forge_tail(queue, payload, headers=headers or None)
    publish("genuine second")
    with kombu.Connection(url, transport_options=options) as conn:
        simple = conn.SimpleQueue("celery")
        try:
            got = []
            for _ in range(2):
                message = simple.get(timeout=10)
                message.ack()
                got.append(message.payload)
        finally:
            simple.close()
    assert got == ["genuine first", "genuine second"]
    with ledgerq.open(queue, encryption_key=KEY, shared=True) as q:
        assert q.stats().corrupt_skipped == 1
        assert q.dequeue() is None
