"""``ledgerq ui --key-file``: an encrypted queue beside a plain one, as a real console.

With the key, the encrypted queue's messages and dead letters show and its actions work
(the DLQ stays sealed); without it, or with another key, the queue is listed with its
figures and marked, its message views say the key is needed (423, never a 500, never a
byte of ciphertext), and nothing is written to it.  The plain queue works in all three.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pytest

import ledgerq
from ledgerq.segment.readonly import LogTail
from ledgerq.ui._figures import QueueFiles
from tests._child import Children
from tests.encryption._files import KEY, OTHER_KEY, files_holding, snapshot

from ._console import Client, act, open_console

SECRET = b"card 4111-1111-1111-1111 of ada"
HEADER = "customer-ada-lovelace"
DEAD = b"refund 9999 for grace"
REASON = "gateway said no to grace"


def _tree(root: Path) -> None:
    """``vault``: encrypted - 3 waiting (the first with a header), 1 dead letter;
    ``plain``: 2 waiting, no key."""
    with ledgerq.open(root / "vault", encryption_key=KEY, max_retries=1) as q:
        q.enqueue(DEAD)
        q.enqueue(SECRET, headers={"customer": HEADER})
        q.enqueue_batch([b"second secret", b"third secret"])
        m = q.dequeue()
        assert m is not None and m.payload == DEAD
        q.nack(m.id, REASON)  # max_retries=1: to the DLQ (id 1 there)
    with ledgerq.open(root / "plain") as q:
        q.enqueue_batch([b"plain one", b"plain two"])


def _key_file(tmp_path: Path, key: bytes, name: str) -> Path:
    path = tmp_path / name
    path.write_text(key.hex() + "\n")
    return path


def _ciphertexts(queue: Path) -> list[bytes]:
    """The sealed payloads of ``queue``'s log, as stored (read without the key)."""
    tail = LogTail(str(queue))
    try:
        found = []
        while (entry := tail.next_entry()) is not None:
            found.append(entry.payload)
        return found
    finally:
        tail.close()


def _shows_no_ciphertext(text: str, sealed: list[bytes]) -> None:
    """``text`` (a page or JSON) holds no sealed payload in any form a preview takes."""
    for blob in sealed:
        head, body = blob[:16], blob[16:32]  # a hex dump's first two lines
        for form in (
            head.hex(" "),  # the start of a table row's preview, and of a hex dump
            body.hex(" "),
            body.hex(),
            base64.b64encode(blob).decode()[8:40],  # the JSON payload of a binary one
            body.decode("latin-1"),
        ):
            assert form not in text and form not in html.unescape(text)


def _queues(client: Client) -> dict[str, dict[str, object]]:
    reply = client.get("/api/queues")
    assert reply.status == 200
    return {q["name"]: q for q in reply.json()}


def _plain_queue_works(client: Client) -> None:
    one = client.get("/message?q=plain&id=1")
    assert one.status == 200 and "plain one" in one.text
    assert [m["preview"] for m in client.get("/api/messages?q=plain").json()] == [
        "plain one",
        "plain two",
    ]


def test_with_the_key_the_encrypted_queue_shows_and_its_dead_letters_requeue(
    tmp_path: Path, children: Children
) -> None:
    root = tmp_path / "queues"
    _tree(root)
    key_file = _key_file(tmp_path, KEY, "key.hex")
    client = open_console(children, root, "--key-file", str(key_file))

    queues = _queues(client)
    assert sorted(queues) == ["plain", "vault"]
    vault, plain = queues["vault"], queues["plain"]
    assert (vault["encrypted"], vault["locked"], vault["key_problem"]) == (True, False, None)
    assert (plain["encrypted"], plain["locked"], plain["key_problem"]) == (False, False, None)
    assert (vault["pending"], vault["dlq"]) == (3, 1)

    # The message view: the plaintext payload preview and the headers.
    page = client.get("/message?q=vault&id=2")
    assert page.status == 200
    assert html.escape(SECRET.decode()) in page.text and HEADER in page.text
    one = client.get("/api/message?q=vault&id=2").json()
    assert one["payload"] == SECRET.decode() and one["headers"] == {"customer": HEADER}
    assert "second secret" in client.get("/queue?q=vault").text  # the next messages
    assert [m["preview"] for m in client.get("/api/messages?q=vault").json()] == [
        SECRET.decode(),
        "second secret",
        "third secret",
    ]
    _plain_queue_works(client)

    # The dead letters: listed with their reason, filtered, then requeued.
    dlq_page = client.get("/dlq?q=vault&reason=grace")
    assert dlq_page.status == 200 and REASON in dlq_page.text and "refund 9999" in dlq_page.text
    assert client.get("/api/dlq/count?q=vault&reason=grace").json() == {"matching": 1}
    asked, landed = act(
        client, client.csrf(), [("q", "vault"), ("do", "requeue:matching"), ("reason", "grace")]
    )
    assert "Requeue 1 dead letter?" in asked and "requeued 1 message to vault" in landed
    with ledgerq.open(root / "vault", encryption_key=KEY) as q:
        assert [m.payload for m in q.dequeue_batch(10)] == [
            SECRET,
            b"second secret",
            b"third secret",
            DEAD,  # requeued: a new message at the end, readable with the key
        ]
        assert q.dlq.peek(10) == []
    # Sealed throughout: the queue and its DLQ hold no plaintext, and no page the key.
    for needle in (SECRET, DEAD, HEADER.encode(), REASON.encode()):
        assert files_holding(root / "vault", needle) == [], needle
    for path in ("/", "/queue?q=vault", "/dlq?q=vault", "/api/queues", "/api/jobs"):
        text = client.get(path).text
        assert KEY.hex() not in text and KEY.hex().upper() not in text, path


def test_without_the_key_the_encrypted_queue_is_listed_marked_and_locked(
    tmp_path: Path, children: Children
) -> None:
    root = tmp_path / "queues"
    _tree(root)
    sealed = _ciphertexts(root / "vault") + _ciphertexts(root / "vault" / "dlq")
    client = open_console(children, root)

    # Listed, with the figures (they need no key), and marked.
    queues = _queues(client)
    assert sorted(queues) == ["plain", "vault"]
    vault = queues["vault"]
    assert (vault["encrypted"], vault["locked"], vault["key_problem"]) == (True, True, "key needed")
    assert (vault["pending"], vault["dlq"], vault["last_id"]) == (3, 1, 4)
    assert vault["oldest_pending_age"] > 0 and vault["problem"] is None
    assert queues["plain"]["locked"] is False
    overview = client.get("/")
    assert overview.status == 200 and "encrypted: key needed" in overview.text

    # Pages that would show messages say the key is needed; no 500, no ciphertext.
    for path in ("/message?q=vault&id=2", "/message?q=vault&id=1&dlq=1", "/payload?q=vault&id=2"):
        reply = client.get(path)
        assert reply.status == 423, (path, reply.status)
        assert "key needed" in reply.text and "--key-file" in reply.text, path
        assert 'class="payload"' not in reply.text
        _shows_no_ciphertext(reply.text, sealed)
    for path in (
        "/api/message?q=vault&id=2",
        "/api/messages?q=vault",
        "/api/dlq?q=vault",
        "/api/dlq/count?q=vault",
    ):
        reply = client.get(path)
        assert reply.status == 423, (path, reply.status)
        answer = reply.json()
        assert answer["locked"] is True and answer["key_problem"] == "key needed", path
        assert "payload" not in answer and "messages" not in answer
        _shows_no_ciphertext(reply.text, sealed)
    # The queue and dead-letter pages: figures, and why the messages are not listed.
    for path in ("/queue?q=vault", "/dlq?q=vault"):
        reply = client.get(path)
        assert reply.status == 200 and "encrypted: key needed" in reply.text, path
        assert "--key-file" in reply.text and "/dlq/action" not in reply.text
        _shows_no_ciphertext(reply.text, sealed)
    # An action is refused before the queue is opened.
    token = client.csrf()
    refused = client.post(
        "/dlq/action", [("csrf", token), ("q", "vault"), ("do", "purge:all"), ("confirmed", "1")]
    )
    assert refused.status == 423 and "key needed" in refused.text
    with ledgerq.open(root / "vault", encryption_key=KEY) as q:
        assert len(q.dlq.peek(10)) == 1
    _plain_queue_works(client)


def test_with_a_wrong_key_it_is_marked_and_nothing_is_written(
    tmp_path: Path, children: Children
) -> None:
    root = tmp_path / "queues"
    _tree(root)
    before = snapshot(root / "vault")
    wrong = _key_file(tmp_path, OTHER_KEY, "other.hex")
    client = open_console(children, root, "--key-file", str(wrong))

    vault = _queues(client)["vault"]
    assert (vault["locked"], vault["key_problem"]) == (True, "wrong key")
    assert "encrypted: wrong key" in client.get("/").text
    for path in ("/queue?q=vault", "/dlq?q=vault", "/api/queue?q=vault"):
        assert client.get(path).status == 200, path
    for path in ("/message?q=vault&id=2", "/api/dlq?q=vault", "/api/message?q=vault&id=1&dlq=1"):
        reply = client.get(path)
        assert reply.status == 423 and "wrong key" in reply.text, path
    token = client.csrf()
    for scope in ("all", "selected"):
        refused = client.post(
            "/dlq/action",
            [("csrf", token), ("q", "vault"), ("do", f"requeue:{scope}"), ("id", "1")],
        )
        assert refused.status == 423, scope
    _plain_queue_works(client)
    for path in ("/", "/queue?q=vault", "/api/queues"):
        assert OTHER_KEY.hex() not in client.get(path).text
    # Looked at every way, refused every change: every byte and mtime as it was.
    assert snapshot(root / "vault") == before


def test_figures_need_no_key(tmp_path: Path) -> None:
    root = tmp_path / "queues"
    _tree(root)
    with ledgerq.open(root / "vault", encryption_key=KEY) as q:
        stats = q.stats()
    for key in (None, KEY, OTHER_KEY):
        figures = QueueFiles(str(root / "vault"), encryption_key=key).figures()
        got = (figures.pending, figures.in_flight, figures.dlq, figures.last_id)
        assert got == (stats.pending, stats.in_flight, 1, 4), key
        assert figures.encrypted and figures.problem is None
        assert figures.oldest_pending_age > 0
    assert QueueFiles(str(root / "plain"), encryption_key=KEY).figures().encrypted is False


def test_a_key_of_the_wrong_size_is_refused_at_start(tmp_path: Path) -> None:
    from ledgerq.ui import create_app

    with pytest.raises(ledgerq.ConfigError, match="exactly 32 bytes"):
        create_app(str(tmp_path), encryption_key=b"short")
    with pytest.raises(TypeError, match="must be bytes"):
        create_app(str(tmp_path), encryption_key=KEY.hex())  # type: ignore[arg-type]
