"""The benchmark report's charts: drawn from the saved results, shown by the report.

``docs/benchmarks.md`` and its charts (``docs/img/bench-*.svg``) are what
``benchmarks/run.py --report-from docs/benchmarks.json`` renders: re-rendering into a
temporary directory gives the same files, so the committed pictures cannot drift from
the committed numbers.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

from tests._child import REPO, child_environment

DOCS = REPO / "docs"


def test_the_report_shows_charts_rendered_from_the_saved_run(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    subprocess.run(
        [
            sys.executable,
            "benchmarks/run.py",
            "--report-from",
            str(DOCS / "benchmarks.json"),
            "--write",
            str(out),
        ],
        cwd=REPO,
        env=child_environment(),
        check=True,
        capture_output=True,
        timeout=120,
    )
    text = out.read_text()
    linked = re.findall(r"!\[[^\]]+\]\((img/bench-[^)]+\.svg)\)", text)
    assert len(linked) >= 10  # 8 throughput tables, threads, shared mode
    assert text == (DOCS / "benchmarks.md").read_text(), "re-render docs/benchmarks.md"
    for link in linked:
        drawn = (tmp_path / link).read_text()
        assert drawn == (DOCS / link).read_text(), f"re-render {link}"
        root = ElementTree.fromstring(drawn)  # well-formed SVG
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
    # A throughput chart names every queue of its table and ledgerq's median.
    chart = (tmp_path / "img" / "bench-enqueue_one-100.svg").read_text()
    for name in ("ledgerq", "plain SQLite (WAL)", "diskcache Deque", "litequeue LiteQueue"):
        assert f">{name}<" in chart
    # ledgerq's median, as the chart writes it (from the committed run, not a constant).
    saved = json.loads((DOCS / "benchmarks.json").read_text())
    runs = saved["results"]["throughput/enqueue_one/100/kill9/ledgerq"]
    median = statistics.median(r["rate"] for r in runs)
    assert f">{median / 1e3:.0f}k<" in chart
