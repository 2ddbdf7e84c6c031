"""W3C trace context: an enqueue inside a span carries ``traceparent``, and a pool's
handler runs in a span whose parent is the producer's (OpenTelemetry's SDK installed);
without OpenTelemetry nothing is imported and nothing is added."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

import ledgerq
from ledgerq.workers import run
from tests.workers import _handlers


@pytest.fixture(scope="module")
def tracer() -> trace.Tracer:
    # The global provider is set once per process (later sets are refused): the SDK's.
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    return trace.get_tracer("tests")


def _traceparent(span: trace.Span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def test_an_enqueue_inside_a_span_carries_its_context(tmp_path: Path, tracer: trace.Tracer) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        q.enqueue(b"outside")
        with tracer.start_as_current_span("produce") as span:
            q.enqueue(b"inside")
            q.enqueue(b"with headers", headers={"k": "v"})
            q.enqueue(
                b"its own", headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
            )
            q.enqueue_batch([b"batch", ledgerq.Item(b"item", headers={"k": "w"})])
        expected = _traceparent(span)
        headers = [m.headers for m in q.peek(10)]
    assert headers == [
        {},
        {"traceparent": expected},
        {"k": "v", "traceparent": expected},
        {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},  # the caller's kept
        {"traceparent": expected},
        {"k": "w", "traceparent": expected},
    ]


def test_the_handler_continues_the_producers_trace(
    tmp_path: Path, done_log: Path, tracer: trace.Tracer
) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path) as q:
        with tracer.start_as_current_span("produce") as span:
            traced_id = q.enqueue(b"traced")
        plain_id = q.enqueue(b"plain")
    run(path, _handlers.traced, processes=1, until_empty=True)
    lines = {int(line.split()[0]): line.split()[1:] for line in done_log.read_text().splitlines()}
    context = span.get_span_context()
    assert lines[traced_id] == [
        f"{context.trace_id:032x}",
        f"{context.span_id:016x}",
        "ledgerq_task",
    ]
    assert lines[plain_id] == ["0" * 32, "-", "-"]  # no trace: no span made


_WITHOUT = """
import sys
sys.modules["opentelemetry"] = None  # as if opentelemetry-api were not installed
import ledgerq, ledgerq.workers
from tests.workers import _handlers
with ledgerq.open(sys.argv[1]) as q:
    q.enqueue(b"plain")
    q.enqueue(b"traced", headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
report = ledgerq.workers.run(sys.argv[1], _handlers.announce, processes=1, until_empty=True)
with ledgerq.open(sys.argv[1]) as q:
    assert q.stats().acked == 2 and report.processed == 2, report
print(sorted(m for m, v in sys.modules.items() if m.startswith("opentelemetry") and v))
"""

_UNUSED = """
import sys, ledgerq
with ledgerq.open(sys.argv[1]) as q:
    q.enqueue(b"x")
    q.enqueue_batch([b"y"])
    q.ack(q.dequeue().id)
print(sorted(m for m, v in sys.modules.items() if m.startswith("opentelemetry") and v))
"""


@pytest.mark.parametrize("script", [_WITHOUT, _UNUSED], ids=["not installed", "not imported"])
def test_without_opentelemetry_nothing_is_imported_or_added(
    tmp_path: Path, done_log: Path, script: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "q")],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"
