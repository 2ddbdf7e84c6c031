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

Here: the application and the pages of the queues and their messages.  The dead
letters' pages and the jobs' are in ``_dlq_pages``; the :class:`Console` the routes
serve, and what they read of a request, in ``_console``; what a template shows of a
value in ``_filters``.
"""

from __future__ import annotations

import base64
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

import ledgerq
from ledgerq import tools
from ledgerq.ui import _browse, _pool
from ledgerq.ui._charts import Series, chart
from ledgerq.ui._console import (
    HERE,
    MAX_PAGE_SIZE,
    Console,
    NotFound,
    form_fields,
    int_param,
    message_json,
)
from ledgerq.ui._dlq_pages import (
    api_dlq,
    api_dlq_count,
    api_jobs,
    dlq_action,
    dlq_page,
    job_cancel,
    job_page,
)
from ledgerq.ui._encryption import KeyNeeded, check_console_key
from ledgerq.ui._figures import DEFAULT_READER, QueueFigures, QueueFiles
from ledgerq.ui._filters import format_time, url
from ledgerq.ui._forms import FormError
from ledgerq.ui._history import KEEP_S
from ledgerq.ui._preview import PREVIEW_BYTES, PreviewKind, preview, short
from ledgerq.ui._security import Guard

__all__ = ["Console", "create_app"]

NEXT_MESSAGES = 20  # on the queue page
JOBS_STOP_S = 10.0  # how long stopping the console waits for its running jobs
LOCKED = 423  # HTTP 423 Locked: the messages of an encrypted queue the key does not open


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
    name = request.query_params.get("q") or dict(form_fields(request)).get("q", "")
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
    limit = int_param(request, "limit", NEXT_MESSAGES, MAX_PAGE_SIZE)
    return JSONResponse([message_json(v, v.message) for v in _browse.next_messages(files, limit)])


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
    value = message_json(view, view.message)
    payload = view.message.payload
    try:
        value["payload"], value["payload_encoding"] = payload.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        value["payload"] = base64.b64encode(payload).decode("ascii")
        value["payload_encoding"] = "base64"
    return JSONResponse(value)
