"""Safe by default: loopback unless a token is given, the token on every request,
CSRF on every change, the Host header checked, payloads escaped and cut short."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ledgerq
from tests._child import Children, child_environment

from ._console import Client, open_console, start_console

SECURITY_HEADERS = ("content-security-policy", "x-frame-options", "x-content-type-options")


def _ui(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerq.cli", "ui", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_environment(),
        check=False,
    )


def test_another_address_needs_a_token(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "192.0.2.10", "::"):
        refused = _ui(str(tmp_path), "--host", host, "--port", "0")
        assert refused.returncode == 2, refused
        assert "without a token" in refused.stderr and "--token" in refused.stderr
        assert refused.stdout == ""
    missing = _ui(str(tmp_path / "nothing"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_with_a_token_every_request_needs_it(tmp_path: Path, children: Children) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        q.enqueue(b"x")
    _, base = start_console(children, tmp_path, "--token", "s3cret token")
    anonymous = Client(base)
    for path in ("/", "/api/queues", "/queue?q=q", "/static/app.css"):
        reply = anonymous.get(path)
        assert reply.status == 401, path
        assert "?token=" in reply.text
    assert anonymous.get("/?token=wrong").status == 401
    header = anonymous.get("/api/queues", headers={"Authorization": "Bearer s3cret token"})
    assert header.status == 200 and header.json()[0]["name"] == "q"
    # The login link sets a cookie and sends the browser on without the token in the URL.
    browser = Client(base)
    login = browser.get("/queue?q=q&token=s3cret+token")
    assert login.status == 303 and login.headers["location"] == "/queue?q=q"
    cookie = login.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "s3cret" not in cookie
    assert browser.get("/queue?q=q").status == 200
    assert browser.get("/api/queues").status == 200


def test_changes_need_the_csrf_token_and_the_same_origin(
    tmp_path: Path, children: Children
) -> None:
    with ledgerq.open(tmp_path / "q", max_retries=1) as q:
        q.enqueue(b"x")
        m = q.dequeue()
        assert m is not None
        q.nack(m.id, "boom")
    client = open_console(children, tmp_path)
    action = [("q", "q"), ("do", "purge:all"), ("confirmed", "1")]
    forged = client.post("/dlq/action", action)
    assert forged.status == 403
    wrong = client.post("/dlq/action", [*action, ("csrf", "guess")])
    assert wrong.status == 403
    token = client.csrf()
    elsewhere = client.post(
        "/dlq/action", [*action, ("csrf", token)], headers={"Origin": "http://evil.example"}
    )
    assert elsewhere.status == 403
    with ledgerq.open(tmp_path / "q") as q:
        assert len(q.dlq) == 1  # nothing was purged
    done = client.post("/dlq/action", [*action, ("csrf", token)])
    assert done.status == 303
    with ledgerq.open(tmp_path / "q") as q:
        assert len(q.dlq) == 0
    # GET never changes anything.
    assert client.get("/dlq/action?q=q&do=purge:all&confirmed=1").status == 405


def test_only_loopback_names_are_answered_without_a_token(
    tmp_path: Path, children: Children
) -> None:
    client = open_console(children, tmp_path)
    port = client.base.rsplit(":", 1)[1]
    rebound = client.get("/api/queues", headers={"Host": f"attacker.example:{port}"})
    assert rebound.status == 421
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
        assert client.get("/api/queues", headers={"Host": host}).status == 200
    page = client.get("/")
    for name in SECURITY_HEADERS:
        assert name in page.headers, name
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"


def test_payloads_are_escaped_and_cut_short(tmp_path: Path, children: Children) -> None:
    evil = b'<script>alert("x")</script><img src=x onerror=alert(1)>'
    with ledgerq.open(tmp_path / "q", max_retries=1) as q:
        q.enqueue(evil, headers={"<b>key</b>": "<i>value</i>"})
        q.enqueue(b"A" * 100_000)
        m = q.dequeue()
        assert m is not None
        q.nack(m.id, "<script>reason()</script>")
    client = open_console(children, tmp_path)
    for path in ("/message?q=q&id=1&dlq=1", "/dlq?q=q", "/queue?q=q"):
        html = client.get(path).text
        assert "<script>alert" not in html and "<script>reason" not in html, path
        assert "<img src=x" not in html and "<b>key</b>" not in html, path
    shown = client.get("/message?q=q&id=1&dlq=1&view=text").text
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in shown
    assert "&lt;script&gt;reason()&lt;/script&gt;" in client.get("/dlq?q=q").text
    big = client.get("/message?q=q&id=2").text
    assert "Showing the first 16,384 of 100,000 bytes" in big
    assert big.count("A" * 1000) <= 17


# Characters that rewrite what a page around them says: a right-to-left override, an
# isolate, a zero-width joiner, ESC (a terminal colour), a backspace, a line separator.
_REWRITERS = ("\u202e", "\u2067", "\u200d", "\x1b", "\x08", "\u2028")


def test_headers_reasons_and_names_show_their_control_characters_escaped(
    tmp_path: Path, children: Children
) -> None:
    name = "evil\u202eeuq"  # a queue directory whose name holds an override too
    with ledgerq.open(tmp_path / name, max_retries=1) as q:
        q.enqueue(
            b"x",
            headers={"evil\u202ekey": "val\u202eue \x1b[31m", "zw\u200dj": "bs\x08\u2067"},
            group="g\u202er",
        )
        q.enqueue(b"pending", headers={"evil\u202ekey": "second"}, group="g\u202er")
        m = q.dequeue()
        assert m is not None
        q.nack(m.id, "boom \x1b[2J\u2028cleared")
    client = open_console(children, tmp_path)
    q = "evil%E2%80%AEeuq"
    pages = {
        "overview": "/",
        "queue": f"/queue?q={q}",
        "message": f"/message?q={q}&id=2",
        "dead letters": f"/dlq?q={q}",
        "dead letter": f"/message?q={q}&id=1&dlq=1",
        "filtered": f"/dlq?q={q}&reason=%E2%80%AE&header=evil%E2%80%AEkey%3Dval",
    }
    for what, path in pages.items():
        reply = client.get(path)
        assert reply.status == 200, (what, reply)
        raw = [hex(ord(c)) for c in _REWRITERS if c in reply.text]
        assert raw == [], f"the {what} page sends {raw} as they are"
    dead = client.get(pages["dead letter"]).text
    assert "evil\\u202ekey" in dead and "val\\u202eue \\x1b[31m" in dead
    assert "zw\\u200dj" in dead and "bs\\x08\\u2067" in dead
    assert "boom \\x1b[2J\\u2028cleared" in dead
    assert "boom \\x1b[2J\\u2028cleared" in client.get(pages["dead letters"]).text
    assert "g\\u202er" in client.get(pages["message"]).text
    assert "evil\\u202eeuq" in client.get("/").text
    # A form posts the name and the filter back as they are (character references,
    # which the browser turns back into the characters), not as they are shown.
    filtered = client.get(pages["filtered"]).text
    assert 'name="q" value="evil&#x202e;euq"' in filtered
    assert 'name="reason" value="&#x202e;"' in filtered
