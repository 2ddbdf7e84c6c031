"""Requeue and purge from the console: confirmed first, done exactly, reported;
refused clearly when another process holds the queue; paced jobs can be cancelled."""

from __future__ import annotations

import re
import time
from pathlib import Path

import ledgerq
from tests._child import Child, Children

from ._console import Client, act, open_console

REASONS = ["timeout talking to db", "ValueError: bad", "timeout again", "ValueError: worse", "oom"]


def _build(path: Path, n: int = 5) -> None:
    with ledgerq.open(path, max_retries=1) as q:
        q.enqueue_batch(
            [ledgerq.Item(b"job %d" % i, headers={"tenant": "ab"[i % 2]}) for i in range(n)]
        )
        for i in range(n):
            m = q.dequeue()
            assert m is not None
            q.nack(m.id, REASONS[i % len(REASONS)])


def _state(path: Path) -> tuple[list[bytes], list[bytes]]:
    """(payloads waiting in the queue, payloads waiting in its DLQ)."""
    with ledgerq.open(path) as q:
        return [m.payload for m in q.peek(100)], [m.payload for m in q.dlq.peek(100)]


def test_requeue_selected_matching_and_all(tmp_path: Path, children: Children) -> None:
    path = tmp_path / "q"
    _build(path)
    client = open_console(children, tmp_path)
    token = client.csrf()

    asked, landed = act(
        client, token, [("q", "q"), ("do", "requeue:selected"), ("id", "2"), ("id", "5")]
    )
    assert "Requeue 2 dead letters?" in asked
    assert "requeued 2 messages to q" in landed
    assert _state(path) == ([b"job 1", b"job 4"], [b"job 0", b"job 2", b"job 3"])

    filters = [("reason", "^timeout"), ("regex", "1")]
    asked, landed = act(client, token, [("q", "q"), ("do", "requeue:matching"), *filters])
    assert "Requeue 2 dead letters?" in asked and "reason matching /^timeout/" in asked
    assert "requeued 2 messages to q" in landed
    assert _state(path) == ([b"job 1", b"job 4", b"job 0", b"job 2"], [b"job 3"])

    asked, landed = act(client, token, [("q", "q"), ("do", "requeue:all")])
    assert "Requeue 1 dead letter?" in asked
    assert _state(path) == ([b"job 1", b"job 4", b"job 0", b"job 2", b"job 3"], [])


def _waiting_badge(page: str) -> str:
    match = re.search(r'data-live="dlq-count">([^<]*)<', page)
    assert match, "no waiting badge on the page"
    return match.group(1)


def test_the_page_an_action_lands_on_counts_what_is_left(
    tmp_path: Path, children: Children
) -> None:
    # Issue 25: the badge showed the figures the sampler had read while the job ran.
    path = tmp_path / "q"
    _build(path)
    client = open_console(children, tmp_path)
    token = client.csrf()
    assert _waiting_badge(client.get("/dlq?q=q").text) == "5 waiting"
    for fields, left in (
        ([("do", "requeue:selected"), ("id", "1"), ("id", "2")], "3 waiting"),
        ([("do", "purge:selected"), ("id", "3")], "2 waiting"),
        ([("do", "requeue:all")], "0 waiting"),
    ):
        _, landed = act(client, token, [("q", "q"), *fields])
        assert _waiting_badge(landed) == left, fields
        assert f"Dead letters ({left.split()[0]})" in client.get("/queue?q=q").text


def test_a_dead_letter_s_page_requeues_or_purges_it_when_confirmed(
    tmp_path: Path, children: Children
) -> None:
    path = tmp_path / "q"
    _build(path)
    with ledgerq.open(path) as q:
        failed_at = {m.id: int(m.headers["dlq.last_failure"]) for m in q.dlq.peek(5)}
    client = open_console(children, tmp_path)
    token = client.csrf()
    page = client.get("/message?q=q&id=2&dlq=1").text
    # When it failed, as a time (the header's nanoseconds beside it), and why.
    shown = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(failed_at[2] // 10**9))
    assert re.search(rf"<th>Failed</th><td>{shown}</td>", page), page
    assert f'{failed_at[2]} <span class="muted small">({shown})</span>' in page
    assert "ValueError: bad" in page
    # Its own form, with the console's CSRF token: asks first, then does it.
    form = re.search(r'<form method="post" action="/dlq/action"[^>]*>(.*?)</form>', page, re.S)
    assert form, "no action form on the dead letter's page"
    fields = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', form.group(1))
    assert ("csrf", token) in fields and ("id", "2") in fields
    buttons = re.findall(r'name="do" value="([^"]+)"', form.group(1))
    assert buttons == ["requeue:selected", "purge:selected"]
    without_token = [(k, v) for k, v in fields if k != "csrf"]
    refused = client.post("/dlq/action", [*without_token, ("do", "purge:selected")])
    assert refused.status == 403
    asked = client.post("/dlq/action", [*fields, ("do", "purge:selected")])
    assert "Purge 1 dead letter?" in asked.text
    assert 'href="/message?q=q&amp;id=2&amp;dlq=1">Cancel' in asked.text  # back to it
    assert _state(path)[1] == [b"job %d" % i for i in range(5)]  # asking changed nothing
    _, landed = act(client, token, [*without_token, ("do", "requeue:selected")])
    assert "requeued 1 message to q" in landed
    _, landed = act(
        client, token, [("q", "q"), ("id", "4"), ("from", "message"), ("do", "purge:selected")]
    )
    assert "purged 1 message from the dead-letter queue of q" in landed
    assert _state(path) == ([b"job 1"], [b"job 0", b"job 2", b"job 4"])


def test_purge_asks_first_and_deletes_only_what_it_said(tmp_path: Path, children: Children) -> None:
    path = tmp_path / "q"
    _build(path)
    client = open_console(children, tmp_path)
    token = client.csrf()
    asked = client.post(
        "/dlq/action",
        [("csrf", token), ("q", "q"), ("do", "purge:matching"), ("header", "tenant=a")],
    )
    assert "Purge 3 dead letters?" in asked.text and "deleted for good" in asked.text
    assert _state(path)[1] == [b"job 0", b"job 1", b"job 2", b"job 3", b"job 4"]  # asked only
    _, landed = act(client, token, [("q", "q"), ("do", "purge:matching"), ("header", "tenant=a")])
    assert "purged 3 messages from the dead-letter queue of q" in landed
    assert _state(path) == ([], [b"job 1", b"job 3"])
    refused = client.post("/dlq/action", [("csrf", token), ("q", "q"), ("do", "purge:selected")])
    assert refused.status == 400 and "no dead letter was selected" in refused.text


_HOLDER = """
import sys, ledgerq
q = ledgerq.open(sys.argv[1], **({"shared": True} if sys.argv[2] == "shared" else {}))
print("holding", flush=True)
sys.stdin.readline()
"""


def _console_beside_a_holder(
    tmp_path: Path, children: Children, mode: str
) -> tuple[Path, Child, Client]:
    """The queue ``q`` built by ``_build``, a process that holds it open (``mode``:
    shared or exclusive) until it is finished, then a console's client of them."""
    path = tmp_path / "q"
    _build(path)
    holder = children.start(["-c", _HOLDER, str(path), mode])
    holder.wait_for("holding")
    return path, holder, open_console(children, tmp_path)


def test_an_action_on_a_queue_held_elsewhere_is_refused_and_changes_nothing(
    tmp_path: Path, children: Children
) -> None:
    # An exclusive holder excludes the console's shared open.
    path, holder, client = _console_beside_a_holder(tmp_path, children, "exclusive")
    token = client.csrf()
    reply = client.post(
        "/dlq/action", [("csrf", token), ("q", "q"), ("do", "purge:all"), ("confirmed", "1")]
    )
    assert reply.status == 303
    landed = client.get(reply.headers["location"]).text
    assert "the queue q is open in another process" in landed and "nothing was changed" in landed
    holder.finish()
    assert _state(path) == ([], [b"job %d" % i for i in range(5)])


def test_with_shared_mode_an_action_works_beside_a_shared_holder(
    tmp_path: Path, children: Children
) -> None:
    path, holder, client = _console_beside_a_holder(tmp_path, children, "shared")
    _, landed = act(client, client.csrf(), [("q", "q"), ("do", "requeue:selected"), ("id", "1")])
    assert "requeued 1 message to q" in landed
    holder.finish()
    assert _state(path) == ([b"job 0"], [b"job %d" % i for i in range(1, 5)])


def test_a_paced_requeue_runs_on_and_can_be_cancelled(tmp_path: Path, children: Children) -> None:
    path = tmp_path / "q"
    _build(path, 30)
    client = open_console(children, tmp_path)
    token = client.csrf()
    started = client.post(
        "/dlq/action",
        [("csrf", token), ("q", "q"), ("do", "requeue:all"), ("rate", "2"), ("confirmed", "1")],
        headers={"Accept": "application/json"},
    )
    assert started.status == 202  # still running after the request's wait
    job = started.json()
    assert job["state"] == "running" and job["total"] == 30 and 0 < job["done"] < 30
    listed = client.get("/api/jobs").json()
    assert [j["id"] for j in listed] == [job["id"]]
    assert "requeued" in client.get(f"/job?id={job['id']}").text
    cancelled = client.post("/job/cancel", [("csrf", token), ("job", job["id"])])
    assert cancelled.status == 303
    final = client.get("/api/jobs").json()[0]
    assert final["state"] == "cancelled" and final["done"] < 30
    waiting, dead = _state(path)
    assert len(waiting) == final["done"] and len(dead) == 30 - final["done"]
    assert waiting == [b"job %d" % i for i in range(final["done"])]  # in order, none twice
