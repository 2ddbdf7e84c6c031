"""W3C trace context in a message's headers, when OpenTelemetry is in use.

An enqueue made inside a current, valid OpenTelemetry span carries that span's
context in the ``traceparent`` header (and ``tracestate`` when it has one), written
by the W3C propagator of ``opentelemetry-api``; a worker pool continues it
(``ledgerq.workers``: the handler runs in a span whose parent it is).

Off and free without OpenTelemetry: the queue's enqueue asks only whether the module
``opentelemetry.trace`` is imported (``TRACE_MODULE in sys.modules``, one dict
lookup) - nothing here imports it, so an application that does not use it pays no
import, and no current span can exist before it is imported anyway.  Where it is,
:func:`with_trace_context` costs one look at the current span, and adds nothing
outside a valid one.  Headers the caller gave that already hold a ``traceparent``
are kept as they are.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from ledgerq._types import Item

__all__ = ["TRACEPARENT", "TRACESTATE", "TRACE_MODULE", "traced_items", "with_trace_context"]

TRACE_MODULE = "opentelemetry.trace"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

_propagator: Any = None


def _w3c() -> Any:
    """The W3C propagator (imported once, from a module the application imported)."""
    global _propagator
    if _propagator is None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        _propagator = TraceContextTextMapPropagator()
    return _propagator


def with_trace_context(headers: Mapping[str, str] | None) -> Mapping[str, str] | None:
    """``headers`` with the current span's ``traceparent`` (a new dict), or as given
    outside a valid span, or when they hold a ``traceparent`` already."""
    trace = sys.modules.get(TRACE_MODULE)
    if trace is None:
        return headers
    if not trace.get_current_span().get_span_context().is_valid:
        return headers
    if headers is not None and TRACEPARENT in headers:
        return headers
    carrier: dict[str, str] = {} if headers is None else dict(headers)
    _w3c().inject(carrier)
    return carrier


def traced_items(
    items: Iterable[bytes | bytearray | memoryview | Item],
) -> Iterable[bytes | bytearray | memoryview | Item]:
    """A batch with the current span's context in each item's headers (as given
    outside a valid span)."""
    if with_trace_context(None) is None:
        return items
    traced: list[bytes | bytearray | memoryview | Item] = []
    for item in items:
        if isinstance(item, Item):
            traced.append(dataclasses.replace(item, headers=with_trace_context(item.headers)))
        else:
            traced.append(Item(item, headers=with_trace_context(None)))
    return traced
