"""A real ``ledgerq ui`` process for the tests, and a small HTTP client to talk to it.

The console runs as the CLI starts it (``python -m ledgerq.cli ui ROOT --port 0``) in
a child process (``tests._child``: watched, killed and reaped at the end of the test);
the test waits for its ready line, which names the port the system picked.  The client
is ``urllib`` with an optional cookie jar and without following redirects, so a test
sees every status and header the console sends; :func:`act` posts a dead-letter action
and confirms it as its confirmation page does.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from tests._child import Child, Children

__all__ = ["Client", "Reply", "act", "start_console"]


def start_console(children: Children, root: Path, *args: str) -> tuple[Child, str]:
    """Start ``ledgerq ui ROOT ARGS`` on a port of the system's choosing; return the
    child and the console's base URL (``http://127.0.0.1:PORT``) once it serves."""
    child = children.start(
        ["-m", "ledgerq.cli", "ui", str(root), "--port", "0", "--interval", "0.2", *args],
        stdin=False,
    )
    line = child.wait_for("serving ")
    match = re.search(r"(http://[^/ ]+)/", line)
    assert match, line
    return child, match.group(1)


def open_console(children: Children, root: Path, *args: str) -> Client:
    """Start ``ledgerq ui ROOT ARGS`` (as :func:`start_console`) and return a client of it."""
    _, base = start_console(children, root, *args)
    return Client(base)


@dataclass
class Reply:
    """One HTTP answer."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.body)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Client:
    """Requests to one console, with its cookies kept (a browser's memory, in short)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.cookies = http.cookiejar.CookieJar()
        self._opener = urllib.request.build_opener(
            _NoRedirects(), urllib.request.HTTPCookieProcessor(self.cookies)
        )

    def request(
        self,
        method: str,
        path: str,
        *,
        form: list[tuple[str, str]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        data = None if form is None else urlencode(form).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if form is not None:
            req.add_header("Content-Type", "application/x-www-form-urlencoded")
        for key, value in (headers or {}).items():
            req.add_header(key, value)
        try:
            with self._opener.open(req, timeout=30) as resp:
                return Reply(
                    resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
                )
        except urllib.error.HTTPError as exc:
            return Reply(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read())

    def get(self, path: str, **kwargs: Any) -> Reply:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, form: list[tuple[str, str]], **kwargs: Any) -> Reply:
        return self.request("POST", path, form=form, **kwargs)

    def csrf(self, path: str = "/") -> str:
        """The CSRF token a page of the console carries (what its forms send)."""
        match = re.search(r'<meta name="csrf-token" content="([^"]+)"', self.get(path).text)
        assert match, "no CSRF token in the page"
        return match.group(1)


def act(client: Client, token: str, fields: list[tuple[str, str]]) -> tuple[str, str]:
    """Post an action, then confirm it as the confirmation page does; return the
    confirmation page and the page the browser lands on afterwards."""
    first = client.post("/dlq/action", [("csrf", token), *fields])
    assert first.status == 200, first
    hidden = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', first.text)
    unescape = {"&#34;": '"', "&#39;": "'", "&lt;": "<", "&gt;": ">", "&amp;": "&"}

    def plain(text: str) -> str:
        return re.sub("&#34;|&#39;|&lt;|&gt;|&amp;", lambda m: unescape[m.group(0)], text)

    second = client.post("/dlq/action", [(k, plain(v)) for k, v in hidden])
    assert second.status == 303, second
    landed = client.get(second.headers["location"])
    assert landed.status == 200
    return first.text, landed.text
