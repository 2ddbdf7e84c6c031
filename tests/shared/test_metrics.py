"""Metrics in shared mode: a scrape of any handle reports the queue's figures.

A Prometheus collector registered on one process's handle must count what every process
did (counters are the queue's, the same from every handle), and keep growing across the
other processes' comings and goings - ``rate()`` needs counters that never go back.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import ledgerq
from ledgerq.metrics import QueueCollector
from tests._child import Children

from ._procs import start
from ._worker import payload


def scrape(registry: CollectorRegistry) -> dict[str, float]:
    """The unlabelled-by-reader queue series: name -> value."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            if "reader" not in sample.labels and sample.name.startswith("ledgerq_"):
                values[sample.name] = sample.value
    return values


def test_a_scrape_counts_what_every_process_did(tmp_path: Path, children: Children) -> None:
    path = tmp_path / "q"
    with ledgerq.open(path, shared=True, dedup_window=60.0, max_retries=1) as q:
        registry = CollectorRegistry()
        registry.register(QueueCollector(q))
        q.enqueue(payload(900), dedup_id="k")
        q.enqueue(payload(901), dedup_id="k")  # a duplicate
        producer = start(children, "produce", path, "count=10", "dedup_window=60.0")
        producer.wait_for("BYE")
        consumer = start(
            children,
            "consume",
            path,
            "count=6",
            "nack=0.5",
            "seed=3",
            "dedup_window=60.0",
            "max_retries=1",
        )
        lines = []
        while not (line := consumer.line()).startswith("BYE"):
            lines.append(line)
        acked = sum(1 for line in lines if line.startswith("A "))
        nacked = sum(1 for line in lines if line.startswith("N "))
        assert acked and nacked
        before = scrape(registry)
        stats = q.stats()
        assert before["ledgerq_enqueued_total"] == stats.enqueued == 11
        assert before["ledgerq_duplicates_total"] == stats.duplicates == 1
        assert before["ledgerq_acked_total"] == stats.acked == acked
        assert before["ledgerq_nacked_total"] == stats.nacked == nacked
        # (max_retries=1: each nack moved its message to the DLQ)
        assert before["ledgerq_dead_lettered_total"] == stats.dead_lettered == nacked
        assert before["ledgerq_pending"] == 11 - acked - nacked
        assert before["ledgerq_in_flight"] == 0
        # Another process's work after the first scrape: every counter only grows.
        producer = start(children, "produce", path, "base=100", "count=5", "dedup_window=60.0")
        producer.wait_for("BYE")
        after = scrape(registry)
        assert after["ledgerq_enqueued_total"] == 16
        assert all(after[name] >= value for name, value in before.items() if "_total" in name)
