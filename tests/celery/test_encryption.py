"""An encrypted broker: ``broker_transport_options`` with ``encryption_key`` or
``encryption_key_file``.

A real prefork worker (its key from a file) runs a task sent with the key in bytes; no
file of the broker holds the task's argument in clear, and every queue the transport
made - the task queue and the worker's control queue - is encrypted.  A producer or a
worker without the key, or with another one, stops at connection time with an error
naming the option; the key never appears in it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kombu
import pytest
from celery import Celery

import ledgerq
from tests._child import REPO, child_environment
from tests.celery._worker import Broker, Worker, wait_until
from tests.encryption._files import KEY, OTHER_KEY, files_holding, snapshot

WAIT = 30.0
SECRET_ARG = "sealed-arg-4111-1111"


def _is_encrypted(queue_dir: Path) -> bool:
    return bool(json.loads((queue_dir / "meta.json").read_text()).get("encryption"))


def _publish(url: str, queue: str, body: object, **options: object) -> None:
    with kombu.Connection(url, transport_options=options) as conn:
        conn.Producer().publish(body, routing_key=queue, declare=[kombu.Queue(queue)])


def _take(url: str, queue: str, **options: object) -> object:
    with kombu.Connection(url, transport_options=options) as conn:
        simple = conn.SimpleQueue(queue)
        try:
            message = simple.get(timeout=5)
            message.ack()
            return message.payload
        finally:
            simple.close()


def test_a_worker_runs_a_task_through_an_encrypted_broker(tmp_path: Path) -> None:
    key_file = tmp_path / "broker.key"
    key_file.write_bytes(KEY)  # the raw form; the client below gives the key as bytes
    broker = Broker(tmp_path, key_file=key_file)
    worker = Worker(broker, tmp_path / "worker.log", name="sealed")
    try:
        worker.wait_ready()
        client = Celery(
            "client", broker=broker.url, broker_transport_options={"encryption_key": KEY}
        )
        try:
            client.send_task("tasksapp.record", args=[SECRET_ARG])
            wait_until(lambda: broker.events(SECRET_ARG, "done"), WAIT, "the task")
        finally:
            client.close()
        # While the worker runs (its control queue is auto-delete: it goes with it).
        queues = sorted(p for p in (broker.dir / "queues").iterdir() if (p / "meta.json").exists())
        assert {p.name for p in queues} >= {"celery", "sealed@" + _hostname() + ".celery.pidbox"}
        assert all(_is_encrypted(p) for p in queues), [p.name for p in queues]
    finally:
        worker.stop()
    assert len(broker.events(SECRET_ARG, "done")) == 1
    # The task's message is still in the segments (acked, not yet retained away): sealed.
    assert files_holding(broker.dir, SECRET_ARG.encode()) == []
    assert files_holding(broker.dir, b"tasksapp.record") == []  # the task name too
    with ledgerq.open(broker.dir / "queues" / "celery", encryption_key=KEY, shared=True) as q:
        assert q.stats().acked == 1


def _hostname() -> str:
    import socket

    return socket.gethostname()


def test_a_producer_or_worker_without_the_key_stops_naming_the_option(tmp_path: Path) -> None:
    key_file = tmp_path / "broker.key"
    key_file.write_text(KEY.hex() + "\n")
    url = f"ledgerq://{tmp_path / 'broker'}"
    _publish(url, "celery", "first", encryption_key_file=str(key_file))
    before = snapshot(tmp_path / "broker" / "queues")

    send = (
        "import sys\nfrom celery import Celery\n"
        "app = Celery(broker=sys.argv[1], broker_transport_options=eval(sys.argv[2]))\n"
        "app.send_task('tasksapp.record', args=['no key'])\n"
    )
    for options, says in (
        ({}, "is encrypted: give the transport its key"),
        ({"encryption_key": OTHER_KEY}, "is not the key of the broker's queue"),
    ):
        sent = subprocess.run(
            [sys.executable, "-c", send, url, repr(options)],
            cwd=REPO,
            env=child_environment(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert sent.returncode != 0, sent
        assert "ConfigError" in sent.stderr and says in sent.stderr, sent.stderr
        assert "encryption_key" in sent.stderr and "encryption_key_file" in sent.stderr
        assert OTHER_KEY.hex() not in sent.stderr and repr(OTHER_KEY) not in sent.stderr

    # A worker without the key stops at startup with the same error, instead of retrying.
    worker = Worker(Broker(tmp_path), tmp_path / "keyless.log", name="keyless")
    try:
        assert worker.proc.wait(60) != 0
    finally:
        worker.stop()
    assert "is encrypted: give the transport its key" in worker.log_text()
    assert "encryption_key_file" in worker.log_text()
    # Refused before anything was opened: every byte and mtime of the queues as it was.
    assert snapshot(tmp_path / "broker" / "queues") == before
    assert _take(url, "celery", encryption_key=KEY.hex()) == "first"


@pytest.mark.parametrize(
    "value",
    [KEY, KEY.hex(), KEY.hex().upper() + "\n", KEY.hex().encode()],
    ids=["bytes", "hex str", "hex str, upper case, newline", "hex bytes"],
)
def test_the_key_option_takes_bytes_or_hex(tmp_path: Path, value: object) -> None:
    url = f"ledgerq://{tmp_path / 'broker'}"
    _publish(url, "jobs", {"n": 1}, encryption_key=value)
    assert _is_encrypted(tmp_path / "broker" / "queues" / "jobs")
    assert _take(url, "jobs", encryption_key=KEY) == {"n": 1}


@pytest.mark.parametrize("raw", [True, False])
def test_the_key_file_option_reads_like_key_file(tmp_path: Path, raw: bool) -> None:
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY if raw else (KEY.hex() + "\n").encode())
    url = f"ledgerq://{tmp_path / 'broker'}"
    _publish(url, "jobs", "x", encryption_key_file=str(key_file))
    assert _is_encrypted(tmp_path / "broker" / "queues" / "jobs")
    assert _take(url, "jobs", encryption_key=KEY) == "x"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"encryption_key": b"short"}, "encryption_key must be the key: 32 bytes"),
        ({"encryption_key": "k" * 32}, "a str of 64 hexadecimal digits (got a str of length 32)"),
        ({"encryption_key": 42}, "got a int"),
        ({"encryption_key_file": "/nonexistent/key"}, "encryption_key_file: cannot read key file"),
        (
            {"encryption_key": KEY, "encryption_key_file": "/k"},
            "given 2 times (encryption_key, encryption_key_file): give it once",
        ),
        (
            {"encryption_key": KEY, "queue_options": {"encryption_key": KEY}},
            "queue_options['encryption_key']",
        ),
    ],
    ids=["short", "32 characters", "int", "missing file", "key and file", "key twice"],
)
def test_a_bad_key_option_is_refused_without_showing_it(
    tmp_path: Path, options: dict[str, object], says: str
) -> None:
    with (
        pytest.raises(ledgerq.ConfigError) as info,
        kombu.Connection(f"ledgerq://{tmp_path / 'broker'}", transport_options=options) as conn,
    ):
        conn.connect()
    assert says in str(info.value)
    assert KEY.hex() not in str(info.value) and "kkkk" not in str(info.value)


def test_a_key_for_a_plain_broker_is_refused(tmp_path: Path) -> None:
    url = f"ledgerq://{tmp_path / 'broker'}"
    _publish(url, "jobs", "plain")
    with (
        pytest.raises(ledgerq.ConfigError, match=r"is not encrypted.*new, empty directory"),
        kombu.Connection(url, transport_options={"encryption_key": KEY}) as conn,
    ):
        conn.connect()
    assert _take(url, "jobs") == "plain"


def test_a_queue_made_later_without_the_key_says_which_option_to_set(tmp_path: Path) -> None:
    # A connection made before any encrypted queue existed meets one when it publishes.
    url = f"ledgerq://{tmp_path / 'broker'}"
    with kombu.Connection(url) as keyless:
        keyless.connect()
        _publish(url, "late", "sealed", encryption_key=KEY)
        producer = keyless.Producer()
        with pytest.raises(
            ledgerq.ConfigError, match=r"give the transport its key, as .*encryption_key"
        ):
            producer.publish("x", routing_key="late", declare=[kombu.Queue("late")])
