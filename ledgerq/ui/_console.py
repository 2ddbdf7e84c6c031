"""The console every route serves: its queues, jobs, templates and sampler, and what
every route reads of a request.

A route is a plain function of (:class:`Console`, request) that Starlette runs in its
thread pool (``_app.create_app`` wraps each one); it names what is missing with
:class:`NotFound` (a 404) and what is malformed with ``FormError`` (a 400).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

import ledgerq
from ledgerq.ui import _browse
from ledgerq.ui._actions import Job, JobBoard
from ledgerq.ui._catalog import Catalog
from ledgerq.ui._charts import format_rate, span_text, sparkline
from ledgerq.ui._figures import DEFAULT_READER, QueueFigures, QueueFiles
from ledgerq.ui._filters import (
    field_value,
    format_age,
    format_bytes,
    format_count,
    format_time,
    shown_text,
    url,
)
from ledgerq.ui._forms import FormError
from ledgerq.ui._history import KEEP_S
from ledgerq.ui._preview import short
from ledgerq.ui._security import CSRF_FIELD

__all__ = [
    "HERE",
    "MAX_PAGE_SIZE",
    "Console",
    "NotFound",
    "form_fields",
    "int_param",
    "job_from",
    "message_json",
]

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_PAGE_SIZE = 500  # the most messages one listing answers (``limit=``)
REFRESH_S = 2  # how often the script refreshes a live page


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


# ---------------------------------------------------------------------- requests


def form_fields(request: Request) -> list[tuple[str, str]]:
    """The fields of the posted form (read by the endpoint wrapper)."""
    pairs: list[tuple[str, str]] = request.state.form
    return pairs


def int_param(request: Request, key: str, default: int, most: int) -> int:
    """The whole number ``key`` of the query string (``default`` when absent); a
    ``limit`` is kept between 1 and ``most``.  ``FormError`` for anything else."""
    text = request.query_params.get(key, "")
    if not text:
        return default
    if not text.isdigit():
        raise FormError(f"{key}: {text!r} is not a whole number")
    return max(1, min(int(text), most)) if key == "limit" else int(text)


def job_from(console: Console, request: Request, key: str = "job") -> Job | None:
    """The job the query string's ``key`` names, if the console still has it."""
    job_id = request.query_params.get(key, "")
    return console.jobs.get(job_id) if job_id else None


def message_json(view: _browse.MessageView | None, message: ledgerq.Message) -> dict[str, Any]:
    """One message as the JSON answers list it (with its delivery status from ``view``)."""
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
