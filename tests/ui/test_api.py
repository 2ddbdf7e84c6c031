"""``ledgerq ui`` as a process: its pages and ``/api/`` over a tree of real queues."""

from __future__ import annotations

import base64
from pathlib import Path

import ledgerq
from tests._child import Children

from ._console import open_console


def _tree(root: Path) -> None:
    """orders (5 pending, 2 dead letters), billing/eu (a leased one), billing/us (empty)."""
    with ledgerq.open(root / "orders", max_retries=1) as q:
        q.enqueue_batch([b'{"n": %d}' % i for i in range(7)])
        for reason in ("timeout", "bad input"):
            m = q.dequeue()
            assert m is not None
            q.nack(m.id, reason)
    with ledgerq.open(root / "billing" / "eu") as q:
        q.enqueue_batch([b"a", b"b\xff"])
        q.dequeue()
    with ledgerq.open(root / "billing" / "us"):
        pass
    (root / "not-a-queue").mkdir()
    (root / "not-a-queue" / "notes.txt").write_text("hello")


def test_api_queues_lists_every_queue_with_the_contract_fields(
    tmp_path: Path, children: Children
) -> None:
    _tree(tmp_path)
    client = open_console(children, tmp_path)
    reply = client.get("/api/queues")
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    queues = {q["name"]: q for q in reply.json()}
    assert sorted(queues) == ["billing/eu", "billing/us", "orders"]
    picked = {
        name: {k: q[k] for k in ("pending", "in_flight", "delayed", "dlq")}
        for name, q in queues.items()
    }
    assert picked == {
        "billing/eu": {"pending": 2, "in_flight": 0, "delayed": 0, "dlq": 0},  # closed: returned
        "billing/us": {"pending": 0, "in_flight": 0, "delayed": 0, "dlq": 0},
        "orders": {"pending": 5, "in_flight": 0, "delayed": 0, "dlq": 2},
    }
    # A queue made while the console runs is found.
    with ledgerq.open(tmp_path / "late") as q:
        q.enqueue(b"x")
    names = [q["name"] for q in client.get("/api/queue?q=late").json()["readers"]]
    assert names == ["default"]
    assert "late" in [q["name"] for q in client.get("/api/queues").json()]


def test_a_single_queue_is_served_under_its_own_name(tmp_path: Path, children: Children) -> None:
    _tree(tmp_path)
    client = open_console(children, tmp_path / "orders")
    assert [q["name"] for q in client.get("/api/queues").json()] == ["orders"]
    assert client.get("/queue?q=orders").status == 200


def test_pages_and_json_of_one_queue(tmp_path: Path, children: Children) -> None:
    _tree(tmp_path)
    client = open_console(children, tmp_path)
    for path in ("/", "/queue?q=orders", "/dlq?q=orders", "/message?q=orders&id=3"):
        page = client.get(path)
        assert page.status == 200, path
        assert page.headers["content-type"].startswith("text/html"), path
    assert "billing/eu" in client.get("/").text
    messages = client.get("/api/messages?q=orders&limit=2").json()
    assert [m["id"] for m in messages] == [3, 4]
    one = client.get("/api/message?q=billing/eu&id=2").json()
    assert one["payload_encoding"] == "base64" and base64.b64decode(one["payload"]) == b"b\xff"
    dead = client.get("/api/dlq?q=orders").json()
    assert [m["headers"]["dlq.failure_reason"] for m in dead["messages"]] == [
        "timeout",
        "bad input",
    ]
    assert client.get("/api/dlq/count?q=orders&reason=TIME").json() == {"matching": 1}
    assert client.get("/api/dlq/count?q=orders&reason=t.*t&regex=1").json() == {"matching": 1}
    download = client.get("/payload?q=orders&id=1&dlq=1")
    assert download.body == b'{"n": 0}'
    assert download.headers["content-disposition"].startswith("attachment")
    assert client.get("/message?q=orders&id=1&dlq=1").status == 200


def test_names_outside_the_tree_and_missing_things_are_404(
    tmp_path: Path, children: Children
) -> None:
    _tree(tmp_path / "served")
    outside = tmp_path / "secret"
    with ledgerq.open(outside) as q:
        q.enqueue(b"do not show")
    client = open_console(children, tmp_path / "served")
    for name in ("../secret", str(outside), "orders/../../secret", "not-a-queue", "orders/dlq", ""):
        for path in ("/queue", "/api/queue", "/dlq", "/api/dlq"):
            reply = client.get(f"{path}?q={name}")
            assert reply.status == 404, (path, name, reply)
            assert b"do not show" not in reply.body
    assert client.get("/message?q=orders&id=99").status == 404
    assert "has not been written" in client.get("/message?q=orders&id=99").text
    assert client.get("/message?q=orders&id=x").status == 400
    assert client.get("/api/message?q=billing/us&id=1").status == 404
    assert client.get("/static/../_app.py").status == 404
    assert client.get("/api/dlq?q=orders&older_than=soon").status == 400


def test_the_queue_page_and_api_show_periodic_jobs(tmp_path: Path, children: Children) -> None:
    with ledgerq.open(tmp_path / "jobs") as q:
        q.add_periodic("nightly", b"report", cron="0 3 * * *")
        q.add_periodic("heartbeat", b"ping", every=30)
    client = open_console(children, tmp_path)
    jobs = client.get("/api/queue?q=jobs").json()["periodic"]
    assert [(j["name"], j["schedule"], j["last_run"]) for j in jobs] == [
        ("heartbeat", "every 30s", None),
        ("nightly", "cron 0 3 * * *", None),
    ]
    page = client.get("/queue?q=jobs").text
    assert "Periodic jobs" in page and "cron 0 3 * * *" in page and "not yet" in page
