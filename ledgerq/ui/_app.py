"""The console's pages and JSON: Starlette routes over the catalog, the views and the jobs.

Pages are rendered on the server (Jinja2, autoescaped) and work without script; the
one script (``static/app.js``) refreshes the live parts in place, fills in counts that
take a scan, and asks nothing the server does not check again.  Every handler is a
plain function that Starlette runs in its thread pool: they read files, and a slow
disk must not stall the event loop.

A queue is named in the query string (``?q=orders/eu``), never in the path, so any
name - slashes, dots, spaces - means one thing, and it is looked up among the queues
the catalog found (``_catalog``), or answered with a 404.

An encrypted queue the console has no key for (or another key) is listed with its
figures and marked; a page or JSON answer that would show its messages answers 423
(Locked) saying why and what to do (``_encryption``).
"""

from __future__ import annotations

import base64
import contextlib
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode

import jinja2
import markupsafe
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import ledgerq
from ledgerq import tools
from ledgerq.ui import _browse, _pool
from ledgerq.ui._actions import Action, ActionRefused, Job, JobBoard, Verb
from ledgerq.ui._actions import Scope as ActionScope
from ledgerq.ui._catalog import Catalog
from ledgerq.ui._charts import Series, chart, format_rate, span_text, sparkline
from ledgerq.ui._encryption import KeyNeeded, check_console_key
from ledgerq.ui._figures import DEFAULT_READER, QueueFigures, QueueFiles
from ledgerq.ui._forms import FilterForm, FormError, parse_ids, parse_positive
from ledgerq.ui._history import KEEP_S
from ledgerq.ui._preview import PREVIEW_BYTES, PreviewKind, preview, printable, short
from ledgerq.ui._security import CSRF_FIELD, Guard

__all__ = ["Console", "create_app"]

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE_SIZE = 50  # dead letters per page
MAX_PAGE_SIZE = 500
NEXT_MESSAGES = 20  # on the queue page
REFRESH_S = 2  # how often the script refreshes a live page
ACTION_WAIT_S = 3.0  # how long an action's request waits for its job before reporting
JOBS_STOP_S = 10.0  # how long stopping the console waits for its running jobs
LOCKED = 423  # HTTP 423 Locked: the messages of an encrypted queue the key does not open


class NotFound(Exception):
    """A queue or message the request names that is not there."""


class Console:
    """One console: the queues under ``root``, their jobs, its pages and its sampler.

    ``encryption_key``: the key its encrypted queues are read and changed with.
    """

    def __init__(
        self,
        root: str,
        *,
        token: str | None,
        host: str,
        sample_interval_s: float = 2.0,
        history_s: float = KEEP_S,
        encryption_key: bytes | None = None,
    ) -> None:
        self.catalog = Catalog(root, history_s=history_s, encryption_key=encryption_key)
        self.history_s = history_s
        self.jobs = JobBoard(self.catalog)
        self.sample_interval_s = sample_interval_s
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(os.path.join(HERE, "templates")),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            finalize=shown_text,
        )
        self.templates.filters.update(
            age=format_age,
            bytes=format_bytes,
            count=format_count,
            field=field_value,
            rate=format_rate,
            when=format_time,
        )
        self.token = token
        self.host = host
        # Built by create_app, which needs the Console first (the guard knows the token).
        self.csrf_token = ""

    # ------------------------------------------------------------------ sampling

    def start_sampling(self) -> None:
        """Sample every queue's figures every ``sample_interval_s`` in a thread."""
        if self._sampler is not None or self.sample_interval_s <= 0:
            return
        self._stop.clear()
        self._sampler = threading.Thread(
            target=self._sample, name="ledgerq-ui-sampler", daemon=True
        )
        self._sampler.start()

    def stop_sampling(self) -> None:
        """Stop the sampler thread (and wait for it)."""
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=10)
            self._sampler = None

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.catalog.sample_all()
            self._stop.wait(self.sample_interval_s)

    # ------------------------------------------------------------------ helpers

    def render(self, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        """The page ``template`` with ``context`` and the values every page uses."""
        page = self.templates.get_template(template).render(
            csrf_field=CSRF_FIELD,
            csrf_token=self.csrf_token,
            root=self.catalog.root,
            version=ledgerq.__version__,
            refresh_s=REFRESH_S,
            history_text=span_text(self.history_s),
            url=url,
            **context,
        )
        return HTMLResponse(page, status_code=status)

    def files(self, request: Request) -> tuple[str, QueueFiles]:
        """The queue the request names (``?q=``), or :class:`NotFound`."""
        name = request.query_params.get("q", "")
        files = self.catalog.get(name) if name else None
        if files is None:
            raise NotFound(f"there is no queue called {name!r} under {self.catalog.root}")
        return name, files

    def figures(self, name: str) -> QueueFigures:
        """The queue's figures (fresh within a second)."""
        figures = self.catalog.figures(name)
        if figures is None:
            raise NotFound(f"there is no queue called {name!r} under {self.catalog.root}")
        return figures

    def queue_row(self, name: str, now: float) -> dict[str, Any]:
        """One queue as the overview and ``/api/queues`` show it."""
        figures = self.figures(name)
        rates = self.catalog.history.rates(name)
        return {
            "name": name,
            "figures": figures,
            "enqueue_rate": rates.enqueued,
            "ack_rate": rates.acked_by(DEFAULT_READER),
            "spark": sparkline(
                self.catalog.history.series(name, "pending"),
                now=now,
                span_s=self.history_s,
                label=f"pending messages of {name} over the last {span_text(self.history_s)}",
            ),
        }


# ---------------------------------------------------------------------- formatting


def shown_text(value: Any) -> Any:
    """What a template shows of ``value`` (the environment's ``finalize``, applied to
    every ``{{ ... }}``): text with its control and bidirectional-override characters
    escaped (``_preview.printable``), so nothing a queue holds - a header, a failure
    reason, a group, a queue's name - can reorder or recolour the page around it.
    Markup (the charts, the macros, :func:`field_value`) is the console's own and
    passes as it is; autoescaping then applies as always."""
    if isinstance(value, str) and not isinstance(value, markupsafe.Markup):
        return printable(value)
    return value


def field_value(value: Any) -> markupsafe.Markup:
    """``value`` for a form field's ``value=""`` (the ``field`` filter): HTML-escaped,
    and its control and format characters written as character references
    (``&#x202e;``), so the page holds none of them raw while the browser still posts
    the very text back - a queue name or a filter is the same text, not its shown form."""
    text = str(markupsafe.escape(value))
    if printable(text) != text:
        text = "".join(
            ch if ch in "\n\t" or printable(ch) == ch else f"&#x{ord(ch):x};" for ch in text
        )
    return markupsafe.Markup(text)


def format_age(seconds: float | None) -> str:
    """``3725.0`` -> ``"1h 2m"``: two units at most; ``"-"`` for nothing."""
    if seconds is None or seconds <= 0:
        return "\u2014"
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    total = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if total >= size:
            parts.append(f"{total // size}{unit}")
            total %= size
        if len(parts) == 2:
            break
    return " ".join(parts)


def format_bytes(size: int) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - the loop returns


def format_count(value: int) -> str:
    """``12345`` -> ``"12,345"``."""
    return f"{value:,}"


def format_time(ns: int | None) -> str:
    """Nanoseconds since the epoch as local time to the second (``"-"`` for None)."""
    if not ns:
        return "\u2014"
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S")


def url(path: str, *pairs: tuple[str, Any], **params: Any) -> str:
    """``path`` with a query string of ``pairs`` and ``params`` (None values left out)."""
    items = [(k, v) for k, v in [*pairs, *params.items()] if v is not None and v != ""]
    return path + ("?" + urlencode(items) if items else "")


def _message_json(view: _browse.MessageView | None, message: ledgerq.Message) -> dict[str, Any]:
    value: dict[str, Any] = {
        "id": message.id,
        "timestamp": message.timestamp,
        "expires_at": message.expires_at,
        "priority": int(message.priority),
        "size": len(message.payload),
        "headers": message.headers,
        "preview": short(message.payload),
    }
    if view is not None:
        value.update(
            status=view.status,
            attempts=view.attempts,
            group=view.group,
            not_before=view.not_before,
        )
    return value


def _figures_json(
    name: str, figures: QueueFigures, rates: tuple[float | None, float | None]
) -> dict[str, Any]:
    return {
        "name": name,
        "pending": figures.pending,
        "in_flight": figures.in_flight,
        "delayed": figures.delayed,
        "dlq": figures.dlq,
        "acked": figures.acked,
        "nacked": figures.nacked,
        "dead_lettered": figures.dead_lettered,
        "expired": figures.expired,
        "oldest_pending_age": round(figures.oldest_pending_age, 3),
        "first_id": figures.first_id,
        "last_id": figures.last_id,
        "segments": figures.segments,
        "disk_bytes": figures.disk_bytes,
        "is_open": figures.is_open,
        "enqueue_rate": rates[0],
        "ack_rate": rates[1],
        "problem": figures.problem,
        "encrypted": figures.encrypted,
        "locked": figures.is_locked,
        "key_problem": figures.key_problem,
    }


# ---------------------------------------------------------------------- the routes


def create_app(
    root: str,
    *,
    token: str | None = None,
    host: str = "127.0.0.1",
    sample_interval_s: float = 2.0,
    history_s: float = KEEP_S,
    encryption_key: bytes | None = None,
) -> Guard:
    """The console over the queues at or under ``root`` as an ASGI application.

    ``token``: required of every request when given (see ``_security``); ``host``:
    the address it will listen on (its name is accepted in Host headers);
    ``sample_interval_s``: how often the charts' samples are taken (0: only when a
    page asks); ``history_s``: how far back the charts go; ``encryption_key`` (32
    bytes): the key of the encrypted queues among them - used for those only, never
    shown.  The application starts and stops its sampler with its lifespan.

    Raises ``TypeError`` or :class:`ledgerq.ConfigError` for a key that is not 32 bytes.
    """
    console = Console(
        root,
        token=token,
        host=host,
        sample_interval_s=sample_interval_s,
        history_s=history_s,
        encryption_key=check_console_key(encryption_key),
    )

    def page(
        handler: Callable[[Console, Request], Response],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            # The body (a form) is read here, on the event loop; the handler, which reads
            # files, runs in the thread pool.
            body = await request.body() if request.method == "POST" else b""
            request.state.form = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
            return await run_in_threadpool(handle, request)

        def handle(request: Request) -> Response:
            try:
                return handler(console, request)
            except NotFound as exc:
                if request.url.path.startswith("/api/"):
                    return JSONResponse({"error": str(exc)}, status_code=404)
                return console.render("error.html", 404, title="Not found", message=str(exc))
            except FormError as exc:
                if request.url.path.startswith("/api/"):
                    return JSONResponse({"error": str(exc)}, status_code=400)
                return console.render("error.html", 400, title="Bad request", message=str(exc))
            except KeyNeeded as exc:
                return _locked(console, request, exc)

        return endpoint

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        console.start_sampling()
        try:
            yield
        finally:
            console.stop_sampling()
            # Stopping (SIGTERM, Ctrl-C): a paced job ends after its current slice,
            # with the queue closed, rather than be cut off with the process.
            await run_in_threadpool(console.jobs.stop_all, JOBS_STOP_S)

    routes = [
        Route("/", page(overview_page)),
        Route("/queue", page(queue_page)),
        Route("/message", page(message_page)),
        Route("/payload", page(payload_download)),
        Route("/dlq", page(dlq_page)),
        Route("/dlq/action", page(dlq_action), methods=["POST"]),
        Route("/job", page(job_page)),
        Route("/job/cancel", page(job_cancel), methods=["POST"]),
        Route("/api/queues", page(api_queues)),
        Route("/api/queue", page(api_queue)),
        Route("/api/messages", page(api_messages)),
        Route("/api/message", page(api_message)),
        Route("/api/dlq", page(api_dlq)),
        Route("/api/dlq/count", page(api_dlq_count)),
        Route("/api/jobs", page(api_jobs)),
        Mount("/static", StaticFiles(directory=os.path.join(HERE, "static")), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    guard = Guard(app, token=token, listen_host=host)
    console.csrf_token = guard.csrf_token
    return guard


def _locked(console: Console, request: Request, exc: KeyNeeded) -> Response:
    """The answer to a request for the messages of a queue the key does not open."""
    name = request.query_params.get("q") or dict(_form(request)).get("q", "")
    message = f"The queue {name} is encrypted: {exc}."
    wants_json = "application/json" in request.headers.get("accept", "")
    if request.url.path.startswith("/api/") or wants_json:
        return JSONResponse(
            {
                "error": message,
                "encrypted": True,
                "locked": True,
                "key_problem": exc.state.problem,
            },
            status_code=LOCKED,
        )
    return console.render(
        "error.html",
        LOCKED,
        title=f"{name}: encrypted, {exc.state.problem}",
        message=message,
        back=url("/queue", q=name),
    )


# ---------------------------------------------------------------------- overview


def overview_page(console: Console, request: Request) -> Response:
    """Every queue: figures, rates and a sparkline each."""
    now = time.time()
    rows = [console.queue_row(name, now) for name in console.catalog.names()]
    totals = {
        key: sum(getattr(r["figures"], key) for r in rows)
        for key in ("pending", "in_flight", "delayed", "dlq")
    }
    return console.render(
        "overview.html", title="Queues", rows=rows, totals=totals, jobs=console.jobs.running()
    )


def api_queues(console: Console, request: Request) -> Response:
    """``GET /api/queues``: every queue with its figures (a JSON array)."""
    now = time.time()
    rows = [console.queue_row(name, now) for name in console.catalog.names()]
    return JSONResponse(
        [_figures_json(r["name"], r["figures"], (r["enqueue_rate"], r["ack_rate"])) for r in rows]
    )


# ---------------------------------------------------------------------- one queue


def _queue_context(console: Console, name: str, files: QueueFiles) -> dict[str, Any]:
    now = time.time()
    figures = console.figures(name)
    history = console.catalog.history
    rates = history.rates(name)
    counts = chart(
        [
            Series("pending", "pending", history.series(name, "pending")),
            Series("in flight", "inflight", history.series(name, "in_flight")),
            Series("dead letters", "dlq", history.series(name, "dlq")),
        ],
        now=now,
        span_s=console.history_s,
        unit="messages",
    )
    rate_series = [Series("enqueued", "enqueued", history.series(name, "enqueued"))]
    for reader in figures.readers:
        rate_series.append(
            Series(
                f"acked ({reader.name})" if reader.name != DEFAULT_READER else "acked",
                "acked" if reader.name == DEFAULT_READER else "reader",
                history.series(name, "acked", reader.name),
            )
        )
    return {
        "name": name,
        "figures": figures,
        "rates": rates,
        "rate_limit": _pool.rate_limit(files.path),
        "periodic": tools.periodic_jobs(files.path),
        "count_chart": counts,
        "rate_chart": chart(
            rate_series, now=now, span_s=console.history_s, unit="messages per second"
        ),
    }


def queue_page(console: Console, request: Request) -> Response:
    """One queue: figures, charts, readers, the next messages, a lookup by id."""
    name, files = console.files(request)
    context = _queue_context(console, name, files)
    if context["figures"].is_locked:
        next_up = leased = []  # the page says why instead (queue.html)
    else:
        next_up = _browse.next_messages(files, NEXT_MESSAGES)
        leased = _browse.in_flight_messages(files, NEXT_MESSAGES)
    reports = _pool.progress_of(files.path, DEFAULT_READER, [(v.id, v.attempts) for v in leased])
    return console.render(
        "queue.html",
        title=name,
        next_up=[(v, short(v.message.payload)) for v in next_up],
        leased=[(v, short(v.message.payload), reports.get(v.id)) for v in leased],
        **context,
    )


def api_queue(console: Console, request: Request) -> Response:
    """``GET /api/queue?q=NAME``: the queue's figures, rates, readers and periodic jobs."""
    name, files = console.files(request)
    figures = console.figures(name)
    rates = console.catalog.history.rates(name)
    value = _figures_json(name, figures, (rates.enqueued, rates.acked_by(DEFAULT_READER)))
    value["readers"] = [
        {
            "name": r.name,
            "head": r.head,
            "pending": r.pending,
            "in_flight": r.in_flight,
            "delayed": r.delayed,
            "acked": r.acked,
            "nacked": r.nacked,
            "dead_lettered": r.dead_lettered,
            "expired": r.expired,
            "ack_rate": rates.acked_by(r.name),
        }
        for r in figures.readers
    ]
    value["periodic"] = [
        {
            "name": job.name,
            "schedule": job.schedule,
            "every": job.every,
            "cron": job.cron,
            "next_run": job.next_run_ns,
            "last_run": job.last_run_ns,
        }
        for job in tools.periodic_jobs(files.path)
    ]
    limit = _pool.rate_limit(files.path)
    value["rate_limit"] = None if limit is None else limit.json()
    if figures.is_locked:
        value["in_flight_progress"] = []
    else:
        leased = _browse.in_flight_messages(files, NEXT_MESSAGES)
        reports = _pool.progress_of(
            files.path, DEFAULT_READER, [(v.id, v.attempts) for v in leased]
        )
        value["in_flight_progress"] = [
            {"id": v.id, "attempts": v.attempts, **_pool.progress_json(reports[v.id])}
            for v in leased
            if v.id in reports
        ]
    return JSONResponse(value)


def api_messages(console: Console, request: Request) -> Response:
    """``GET /api/messages?q=NAME&limit=N``: the next messages to be delivered."""
    _, files = console.files(request)
    limit = _int_param(request, "limit", NEXT_MESSAGES, MAX_PAGE_SIZE)
    return JSONResponse([_message_json(v, v.message) for v in _browse.next_messages(files, limit)])


# ---------------------------------------------------------------------- one message


def _message_files(console: Console, request: Request) -> tuple[str, QueueFiles, QueueFiles, int]:
    """(queue name, its files, the files the message is in - the DLQ's with ``dlq=1`` -, id)."""
    name, files = console.files(request)
    raw_id = request.query_params.get("id", "").strip()
    if not raw_id.isdigit():
        raise FormError(f"{raw_id!r} is not a message id")
    where = files
    if request.query_params.get("dlq"):
        dlq = files.dlq()
        if dlq is None:
            raise NotFound(f"the queue {name} has no dead-letter queue")
        where = dlq
    return name, files, where, int(raw_id)


def message_page(console: Console, request: Request) -> Response:
    """One message by id: its fields, headers and a payload preview."""
    name, files, where, message_id = _message_files(console, request)
    in_dlq = where is not files
    view = _browse.find_message(where, message_id)
    if view is None:
        retained = where.retained()
        why = (
            "it has not been written yet"
            if message_id > retained.last_id
            else "no segment holds it any more (consumed and deleted, or never written)"
        )
        where_text = f"the dead-letter queue of {name}" if in_dlq else name
        raise NotFound(f"there is no message {message_id} in {where_text}: {why}")
    kinds: dict[str, PreviewKind] = {"json": "json", "text": "text", "hex": "hex"}
    shown = preview(view.message.payload, kinds.get(request.query_params.get("view", "")))
    return console.render(
        "message.html",
        title=f"{name} #{message_id}",
        name=name,
        view=view,
        in_dlq=in_dlq,
        shown=shown,
        preview_limit=PREVIEW_BYTES,
        readers=[] if in_dlq else _browse.reader_statuses(files, message_id),
        headers=[(k, v, _header_time(k, v)) for k, v in sorted(view.message.headers.items())],
        dead=_dead_letter_facts(view.message) if in_dlq else None,
    )


# Headers whose value is a time in ns since the epoch (as text): shown as a time too.
_TIME_HEADERS = frozenset({"dlq.last_failure"})


def _header_time(key: str, value: str) -> str | None:
    """The local time a time header says (None for any other header, or a value that
    is not a time)."""
    if key not in _TIME_HEADERS or not value.isdigit():
        return None
    return format_time(int(value))


def _dead_letter_facts(message: ledgerq.Message) -> dict[str, Any]:
    """What the ``dlq.*`` headers of a dead letter say, for its page."""
    headers = message.headers
    last = headers.get("dlq.last_failure", "")
    return {
        "reason": headers.get("dlq.failure_reason", ""),
        "last_failure": int(last) if last.isdigit() else None,
        "retries": headers.get("dlq.retry_count", ""),
        "original_id": headers.get("dlq.original_id", ""),
    }


def payload_download(console: Console, request: Request) -> Response:
    """The whole payload of one message, as a download (never rendered by the browser)."""
    name, _, where, message_id = _message_files(console, request)
    view = _browse.find_message(where, message_id)
    if view is None:
        raise NotFound(f"there is no message {message_id} in {name}")
    filename = f"{os.path.basename(name)}-{message_id}.bin"
    return Response(
        view.message.payload,
        media_type="application/octet-stream",
        headers={"content-disposition": f'attachment; filename="{filename}"'},
    )


def api_message(console: Console, request: Request) -> Response:
    """``GET /api/message?q=NAME&id=N[&dlq=1]``: one message, payload included."""
    name, _, where, message_id = _message_files(console, request)
    view = _browse.find_message(where, message_id)
    if view is None:
        raise NotFound(f"there is no message {message_id} in {name}")
    value = _message_json(view, view.message)
    payload = view.message.payload
    try:
        value["payload"], value["payload_encoding"] = payload.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        value["payload"] = base64.b64encode(payload).decode("ascii")
        value["payload_encoding"] = "base64"
    return JSONResponse(value)


# ---------------------------------------------------------------------- dead letters


def _int_param(request: Request, key: str, default: int, most: int) -> int:
    text = request.query_params.get(key, "")
    if not text:
        return default
    if not text.isdigit():
        raise FormError(f"{key}: {text!r} is not a whole number")
    return max(1, min(int(text), most)) if key == "limit" else int(text)


def dlq_page(console: Console, request: Request) -> Response:
    """The dead letters of one queue: filters, a page of them, and the actions."""
    name, files = console.files(request)
    form = FilterForm.from_pairs(request.query_params.multi_items())
    error = None
    try:
        chosen = form.parsed()
    except FormError as exc:
        error, chosen = str(exc), None
    figures = console.figures(name)
    after = _int_param(request, "after", 0, 0)
    limit = _int_param(request, "limit", PAGE_SIZE, MAX_PAGE_SIZE)
    dlq = files.dlq()
    page_ = None
    if chosen is not None and dlq is not None and not figures.is_locked:
        page_ = _browse.dead_letter_page(dlq, chosen, after=after, limit=limit)
    now_ns = time.time_ns()
    rows = []
    for message in page_.messages if page_ is not None else ():
        headers = message.headers
        rows.append(
            {
                "message": message,
                "original_id": headers.get("dlq.original_id", ""),
                "reason": headers.get("dlq.failure_reason", ""),
                "retries": headers.get("dlq.retry_count", ""),
                "age": max(0.0, (now_ns - message.timestamp) / 1e9),
                "preview": short(message.payload),
                "other_headers": sorted(
                    (k, v) for k, v in headers.items() if not k.startswith("dlq.")
                ),
            }
        )
    return console.render(
        "dlq.html",
        400 if error else 200,
        title=f"{name}: dead letters",
        name=name,
        figures=figures,
        form=form,
        filtered=chosen is not None and not chosen.is_empty,
        described=chosen.describe() if chosen is not None else "",
        error=error,
        rows=rows,
        page=page_,
        after=after,
        limit=limit,
        jobs=console.jobs.running(name),
        report=_job_from(console, request),
    )


def _job_from(console: Console, request: Request, key: str = "job") -> Job | None:
    job_id = request.query_params.get(key, "")
    return console.jobs.get(job_id) if job_id else None


def api_dlq(console: Console, request: Request) -> Response:
    """``GET /api/dlq?q=NAME[&filters][&after=ID][&limit=N]``: a page of dead letters."""
    _, files = console.files(request)
    chosen = FilterForm.from_pairs(request.query_params.multi_items()).parsed()
    dlq = files.dlq()
    if dlq is None:
        return JSONResponse({"messages": [], "next_after": None})
    page_ = _browse.dead_letter_page(
        dlq,
        chosen,
        after=_int_param(request, "after", 0, 0),
        limit=_int_param(request, "limit", PAGE_SIZE, MAX_PAGE_SIZE),
    )
    return JSONResponse(
        {
            "messages": [_message_json(None, m) for m in page_.messages],
            "next_after": page_.next_after,
            "scanned_through": page_.scanned_through,
            "budget_spent": page_.budget_spent,
        }
    )


def api_dlq_count(console: Console, request: Request) -> Response:
    """``GET /api/dlq/count?q=NAME[&filters]``: how many dead letters match (reads them all)."""
    _, files = console.files(request)
    chosen = FilterForm.from_pairs(request.query_params.multi_items()).parsed()
    dlq = files.dlq()
    matching = 0 if dlq is None else len(_browse.matching_dead_letters(dlq, chosen))
    return JSONResponse({"matching": matching})


def _form(request: Request) -> list[tuple[str, str]]:
    """The fields of the posted form (read by the endpoint wrapper)."""
    pairs: list[tuple[str, str]] = request.state.form
    return pairs


def _action_from(name: str, pairs: Iterable[tuple[str, str]]) -> Action:
    pairs = list(pairs)
    values = dict(pairs)
    verbs: dict[str, Verb] = {"requeue": "requeue", "purge": "purge"}
    scopes: dict[str, ActionScope] = {"selected": "selected", "matching": "matching", "all": "all"}
    # The page's buttons say both at once (do=requeue:matching); API clients may too,
    # or give action= and scope=.
    verb_text, _, scope_text = values.get("do", "").partition(":")
    verb = verbs.get(verb_text or values.get("action", ""))
    scope = scopes.get(scope_text or values.get("scope", ""))
    if verb is None or scope is None:
        raise FormError("choose requeue or purge, of the selected, matching or all dead letters")
    ids = parse_ids(v for k, v in pairs if k == "id") if scope == "selected" else ()
    if scope == "selected" and not ids:
        raise FormError("no dead letter was selected: tick the ones to act on first")
    rate = delay = None
    if verb == "requeue":
        if values.get("rate", "").strip():
            rate = parse_positive(values["rate"].strip(), "rate")
        if values.get("delay", "").strip():
            delay = parse_positive(values["delay"].strip(), "delay")
    chosen = (
        FilterForm.from_pairs(pairs).parsed() if scope == "matching" else tools.DeadLetterFilter()
    )
    return Action(name, verb, scope, ids, chosen, rate, delay)


def dlq_action(console: Console, request: Request) -> Response:
    """``POST /dlq/action``: confirm an action (first post), then do it (``confirmed=1``)."""
    pairs = _form(request)
    name = dict(pairs).get("q", "")
    files = console.catalog.get(name) if name else None
    if files is None:
        raise NotFound(f"there is no queue called {name!r} under {console.catalog.root}")
    action = _action_from(name, pairs)
    form = FilterForm.from_pairs(pairs)
    back = url("/dlq", ("q", name), *form.query())
    if dict(pairs).get("from") == "message" and len(action.ids) == 1:
        back = url("/message", q=name, id=action.ids[0], dlq=1)  # asked from its page
    wants_json = "application/json" in request.headers.get("accept", "")
    files.key_for_open()  # KeyNeeded: not even a confirmation for a queue it cannot open
    if dict(pairs).get("confirmed") != "1":
        dlq = files.dlq()
        if action.scope == "selected":
            count = len(set(action.ids))
        elif dlq is None:
            count = 0
        elif action.scope == "matching":
            count = len(_browse.matching_dead_letters(dlq, action.chosen))
        else:
            count = dlq.pending_count()
        return console.render(
            "confirm.html",
            title=f"{action.verb.capitalize()} dead letters of {name}?",
            name=name,
            action=action,
            count=count,
            described=action.describe(count),
            pairs=[(k, v) for k, v in pairs if k != CSRF_FIELD],
            back=back,
        )
    try:
        job = console.jobs.start(action)
    except ActionRefused as exc:
        if wants_json:
            return JSONResponse({"error": str(exc)}, status_code=409)
        return console.render("error.html", 409, title="Not done", message=str(exc), back=back)
    job.ended.wait(ACTION_WAIT_S)
    if wants_json:
        return JSONResponse(job.as_json(), status_code=200 if not job.is_running else 202)
    return RedirectResponse(url("/dlq", ("q", name), *form.query(), job=job.id), status_code=303)


def job_page(console: Console, request: Request) -> Response:
    """One job's progress or outcome (``/job?id=JOB``)."""
    job = _job_from(console, request, "id")
    if job is None:
        raise NotFound("there is no such job (the console was restarted, or it is long done)")
    return console.render("job.html", title="Job", job=job)


def job_cancel(console: Console, request: Request) -> Response:
    """``POST /job/cancel``: stop a running job after its current slice."""
    pairs = _form(request)
    job = console.jobs.get(dict(pairs).get("job", ""))
    if job is None:
        raise NotFound("there is no such job")
    job.cancel.set()
    job.ended.wait(ACTION_WAIT_S)
    return RedirectResponse(url("/dlq", ("q", job.action.queue), job=job.id), status_code=303)


def api_jobs(console: Console, request: Request) -> Response:
    """``GET /api/jobs``: every job the console remembers, newest first."""
    return JSONResponse([job.as_json() for job in console.jobs.all()])
