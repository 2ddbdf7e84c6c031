"""The dead letters' pages and JSON: a page of them with filters, requeue and purge
(confirmed first, then run as a job), and the jobs' pages.

A filter that is not valid shows the page with the error (400) rather than refusing
it; an action is asked with one post and done with a second (``confirmed=1``), so a
click never requeues or purges anything without the count it will act on.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from ledgerq import tools
from ledgerq.ui import _browse
from ledgerq.ui._actions import Action, ActionRefused, Verb
from ledgerq.ui._actions import Scope as ActionScope
from ledgerq.ui._console import (
    MAX_PAGE_SIZE,
    Console,
    NotFound,
    form_fields,
    int_param,
    job_from,
    message_json,
)
from ledgerq.ui._filters import url
from ledgerq.ui._forms import FilterForm, FormError, parse_ids, parse_positive
from ledgerq.ui._preview import short
from ledgerq.ui._security import CSRF_FIELD

__all__ = [
    "api_dlq",
    "api_dlq_count",
    "api_jobs",
    "dlq_action",
    "dlq_page",
    "job_cancel",
    "job_page",
]

PAGE_SIZE = 50  # dead letters per page
ACTION_WAIT_S = 3.0  # how long an action's request waits for its job before reporting


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
    after = int_param(request, "after", 0, 0)
    limit = int_param(request, "limit", PAGE_SIZE, MAX_PAGE_SIZE)
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
        report=job_from(console, request),
    )


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
        after=int_param(request, "after", 0, 0),
        limit=int_param(request, "limit", PAGE_SIZE, MAX_PAGE_SIZE),
    )
    return JSONResponse(
        {
            "messages": [message_json(None, m) for m in page_.messages],
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
    pairs = form_fields(request)
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
    job = job_from(console, request, "id")
    if job is None:
        raise NotFound("there is no such job (the console was restarted, or it is long done)")
    return console.render("job.html", title="Job", job=job)


def job_cancel(console: Console, request: Request) -> Response:
    """``POST /job/cancel``: stop a running job after its current slice."""
    pairs = form_fields(request)
    job = console.jobs.get(dict(pairs).get("job", ""))
    if job is None:
        raise NotFound("there is no such job")
    job.cancel.set()
    job.ended.wait(ACTION_WAIT_S)
    return RedirectResponse(url("/dlq", ("q", job.action.queue), job=job.id), status_code=303)


def api_jobs(console: Console, request: Request) -> Response:
    """``GET /api/jobs``: every job the console remembers, newest first."""
    return JSONResponse([job.as_json() for job in console.jobs.all()])
