"""Who may use the console, and what a page may do: the checks every request passes.

* **Where it listens.** 127.0.0.1 unless told; any address that is not loopback needs
  a token (:func:`check_listen_address` refuses to start without one).
* **The token.** With one, every request carries it: the header
  ``Authorization: Bearer TOKEN``, or the cookie a visit to ``/?token=TOKEN`` sets
  (HttpOnly, SameSite=Strict; the page then reloads without the token in its address,
  so it stays out of the history and of any Referer).  Compared in constant time.
* **The Host header.** Without a token, only the loopback names and the address it
  listens on are answered: a web page elsewhere that points a DNS name at 127.0.0.1
  (DNS rebinding) gets a 421, not the console.
* **Changes are POSTs with a CSRF token**, a random value made at start and put in
  every form; a POST without it (or from another Origin) is refused with a 403.
  Pages can be read only by the console's own origin, so no other site learns it.
* **Every response** forbids framing, sniffing, caching and referrers to other sites, and its
  Content-Security-Policy lets the page load only the console's own script and
  stylesheet (no inline script, nothing from elsewhere).
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

__all__ = [
    "CSRF_FIELD",
    "CSRF_HEADER",
    "TOKEN_COOKIE",
    "Guard",
    "InsecureAddressError",
    "check_listen_address",
    "is_loopback",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TOKEN_COOKIE = "ledgerq_ui_token"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]", "::1")

SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]


class InsecureAddressError(ValueError):
    """Listening where others can connect, without a token."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine only."""
    if host.strip("[]") in ("localhost", "::1"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen_address(host: str, token: str | None) -> None:
    """Refuse (``InsecureAddressError``) a non-loopback ``host`` without a ``token``."""
    if not is_loopback(host) and not token:
        raise InsecureAddressError(
            f"refusing to listen on {host} without a token: anyone who can reach it could "
            "requeue and purge messages; give --token (or LEDGERQ_UI_TOKEN), or listen "
            "on 127.0.0.1"
        )


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _host_name(host_header: str) -> str:
    """The name part of a Host header (``[::1]:8642`` -> ``[::1]``)."""
    if host_header.startswith("["):
        return host_header.split("]", 1)[0] + "]"
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class Guard:
    """ASGI middleware applying the checks of the module around ``app``.

    ``csrf_token`` is the value forms carry; ``token`` the access token (None: none
    needed, loopback only); ``listen_host`` the address it listens on.
    """

    def __init__(
        self, app: ASGIApp, *, token: str | None, listen_host: str, csrf_token: str | None = None
    ) -> None:
        self.app = app
        self.token = token or None
        self.csrf_token = csrf_token or secrets.token_urlsafe(24)
        # The cookie holds a value derived from the token, not the token itself: any
        # token text fits in a cookie, and the cookie jar never holds the secret.
        self._cookie_value = (
            None
            if self.token is None
            else hmac.new(self.token.encode(), b"ledgerq ui cookie", "sha256").hexdigest()
        )
        self._hosts = {*LOOPBACK_NAMES, listen_host, f"[{listen_host}]"}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal(scope, receive, send_with_headers)
            return
        if scope["method"] == "POST" and not await self._csrf_ok(scope, receive):
            await _plain(403, "refused: this change did not come from the console's own page")(
                scope, receive, send_with_headers
            )
            return
        body = scope.pop("ledgerq.body", None)
        await self.app(scope, receive if body is None else _replay(body), send_with_headers)

    # ------------------------------------------------------------------ checks

    def _refusal(self, scope: Scope) -> ASGIApp | None:
        host = _header(scope, b"host") or ""
        if self.token is None and _host_name(host) not in self._hosts:
            return _plain(421, f"this console answers only to 127.0.0.1 and localhost, not {host}")
        if self.token is None:
            return None
        query = parse_qsl(bytes(scope.get("query_string", b"")).decode("latin-1"))
        given = [v for k, v in query if k == "token"]
        if given and scope["method"] == "GET":
            if not _same(given[0], self.token):
                return _plain(401, "wrong token")
            assert self._cookie_value is not None
            return _login(scope, query, self._cookie_value)
        authorization = _header(scope, b"authorization") or ""
        if authorization.startswith("Bearer ") and _same(authorization[7:], self.token):
            scope["ledgerq.by_header"] = True
            return None
        cookies = SimpleCookie()
        try:
            cookies.load(_header(scope, b"cookie") or "")
        except Exception:  # a malformed Cookie header: as if there were none
            cookies = SimpleCookie()
        morsel = cookies.get(TOKEN_COOKIE)
        if morsel is not None and _same(morsel.value, self._cookie_value or ""):
            return None
        return _plain(
            401,
            "this console needs its token: open it as http://HOST:PORT/?token=TOKEN once "
            "(a cookie keeps you in), or send the header 'Authorization: Bearer TOKEN'",
        )

    async def _csrf_ok(self, scope: Scope, receive: Receive) -> bool:
        origin = _header(scope, b"origin")
        host = _header(scope, b"host") or ""
        if origin is not None and origin.split("://", 1)[-1] != host:
            return False
        if scope.get("ledgerq.by_header"):
            return True  # no browser sends an Authorization header to another site
        if _same(_header(scope, CSRF_HEADER.encode()), self.csrf_token):
            return True
        body = await _read_body(receive)
        scope["ledgerq.body"] = body
        content_type = _header(scope, b"content-type") or ""
        if not content_type.startswith("application/x-www-form-urlencoded"):
            return False
        fields = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        return any(k == CSRF_FIELD and _same(v, self.csrf_token) for k, v in fields)


def _replay(body: bytes) -> Receive:
    """A ``receive`` that hands the app the body the guard already read."""
    sent = False

    async def receive_again() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive_again


async def _read_body(receive: Receive, limit: int = 1 << 20) -> bytes:
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            break  # a form of the console is a few KB; more is not one of its forms
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _plain(status: int, text: str) -> ASGIApp:
    async def respond(scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8")],
            }
        )
        await send({"type": "http.response.body", "body": (text + "\n").encode()})

    return respond


def _login(scope: Scope, query: list[tuple[str, str]], cookie_value: str) -> ASGIApp:
    """Set the token cookie and send the browser to the same page without the token."""
    rest = [(k, v) for k, v in query if k != "token"]
    location = scope.get("path", "/") + (f"?{urlencode(rest)}" if rest else "")
    cookie = f"{TOKEN_COOKIE}={cookie_value}; Path=/; HttpOnly; SameSite=Strict"

    async def respond(scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 303,
                "headers": [
                    (b"location", location.encode("latin-1", "replace")),
                    (b"set-cookie", cookie.encode("latin-1")),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b""})

    return respond
