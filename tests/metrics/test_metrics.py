"""ledgerq.metrics: the prometheus-client collector."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import ledgerq
from ledgerq.metrics import QueueCollector

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

QUEUE_GAUGES = {
    "ledgerq_pending": "pending",
    "ledgerq_in_flight": "in_flight",
    "ledgerq_delayed": "delayed",
    "ledgerq_segments": "segments",
    "ledgerq_disk_bytes": "disk_bytes",
    "ledgerq_next_id": "next_id",
}
QUEUE_COUNTERS = {
    "ledgerq_enqueued_total": "enqueued",
    "ledgerq_acked_total": "acked",
    "ledgerq_nacked_total": "nacked",
    "ledgerq_dead_lettered_total": "dead_lettered",
    "ledgerq_expired_total": "expired",
    "ledgerq_duplicates_total": "duplicates",
    "ledgerq_dropped_total": "dropped",
    "ledgerq_corrupt_skipped_total": "corrupt_skipped",
}
READER_SERIES = {
    "ledgerq_reader_pending": "pending",
    "ledgerq_reader_in_flight": "in_flight",
    "ledgerq_reader_delayed": "delayed",
    "ledgerq_reader_head": "head",
    "ledgerq_reader_acked_total": "acked",
    "ledgerq_reader_nacked_total": "nacked",
    "ledgerq_reader_expired_total": "expired",
    "ledgerq_reader_dead_lettered_total": "dead_lettered",
}


def scrape(registry: CollectorRegistry) -> tuple[Samples, dict[str, str]]:
    """Every sample by (name, labels), and every family's type, from the text exposition."""
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        types[family.name] = family.type
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = sample.value
    return samples, types


def busy_queue(path: Path) -> ledgerq.Queue:
    q = ledgerq.open(path, max_retries=2, dedup_window=60)
    q.enqueue_batch([b"%d" % i for i in range(6)])
    q.enqueue(b"dup", dedup_id="d")
    q.enqueue(b"dup", dedup_id="d")  # a duplicate
    q.enqueue(b"later", delay=3600)  # delayed: pending, counted in ledgerq_delayed
    for _ in range(3):
        msg = q.dequeue()
        assert msg is not None
        q.ack(msg.id)
    poison = q.dequeue()
    assert poison is not None
    q.nack(poison.id, "bad")
    again = q.dequeue()
    assert again is not None and again.id == poison.id
    q.nack(again.id, "still bad")  # second failure: dead-lettered
    leased = q.dequeue()
    assert leased is not None  # stays in flight
    audit = q.reader("audit")
    seen = audit.dequeue()
    assert seen is not None
    audit.ack(seen.id)
    audit.dequeue()  # in flight for the audit reader
    return q


def test_values_match_stats(tmp_path: Path) -> None:
    q = busy_queue(tmp_path / "jobs")
    try:
        registry = CollectorRegistry()
        registry.register(QueueCollector(q))
        samples, types = scrape(registry)
        stats = q.stats()
        assert (stats.acked, stats.nacked, stats.dead_lettered, stats.duplicates) == (3, 2, 1, 1)
        assert stats.in_flight == 1
        label = (("queue", "jobs"),)
        for name, field in QUEUE_GAUGES.items():
            assert samples[(name, label)] == getattr(stats, field), name
            assert types[name] == "gauge"
        for name, field in QUEUE_COUNTERS.items():
            assert samples[(name, label)] == getattr(stats, field), name
            assert types[name.removesuffix("_total")] == "counter"
        age = samples[("ledgerq_oldest_pending_age_seconds", label)]
        assert age >= 0.0
        assert types["ledgerq_oldest_pending_age_seconds"] == "gauge"

        assert set(stats.readers) == {"default", "audit"}
        for reader, rstats in stats.readers.items():
            labels = (("queue", "jobs"), ("reader", reader))
            for name, field in READER_SERIES.items():
                assert samples[(name, labels)] == getattr(rstats, field), (name, reader)
            assert ("ledgerq_reader_oldest_pending_age_seconds", labels) in samples
        audit = (("queue", "jobs"), ("reader", "audit"))
        assert samples[("ledgerq_reader_acked_total", audit)] == 1
        assert samples[("ledgerq_reader_in_flight", audit)] == 1
        # Every series is labelled with the queue, and only queue/reader.
        for _, series_labels in samples:
            assert dict(series_labels)["queue"] == "jobs"
            assert set(dict(series_labels)) <= {"queue", "reader"}
    finally:
        q.close()


def test_scrapes_follow_the_queue(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q:
        registry = CollectorRegistry()
        registry.register(QueueCollector(q, name="orders"))
        label = (("queue", "orders"),)
        samples, _ = scrape(registry)
        assert samples[("ledgerq_pending", label)] == 0
        q.enqueue_batch([b"a", b"b"])
        samples, _ = scrape(registry)
        assert samples[("ledgerq_pending", label)] == 2
        assert samples[("ledgerq_enqueued_total", label)] == 2
        msg = q.dequeue()
        assert msg is not None
        q.ack(msg.id)
        samples, _ = scrape(registry)
        assert samples[("ledgerq_pending", label)] == 1
        assert samples[("ledgerq_acked_total", label)] == 1


def test_closed_queue_yields_nothing(tmp_path: Path) -> None:
    q = ledgerq.open(tmp_path / "q")
    q.enqueue(b"x")
    collector = QueueCollector(q)
    registry = CollectorRegistry()
    registry.register(collector)
    assert scrape(registry)[0]
    q.close()
    assert list(collector.collect()) == []
    assert generate_latest(registry) == b""


@pytest.mark.parametrize("count", [2, 3])
def test_one_registry_serves_a_collector_per_queue(tmp_path: Path, count: int) -> None:
    names = ["orders", "mail", "audit"][:count]
    queues = [ledgerq.open(tmp_path / name) for name in names]
    try:
        for position, q in enumerate(queues):
            q.enqueue_batch([b"x"] * (position + 1))  # queue i holds i + 1 messages
            message = q.dequeue()
            assert message is not None
            q.ack(message.id)
        registry = CollectorRegistry()
        for q in queues:
            registry.register(QueueCollector(q))  # DuplicateTimeseries before the fix
        text = generate_latest(registry).decode()
        samples, types = scrape(registry)
        for position, name in enumerate(names):
            label = (("queue", name),)
            stats = queues[position].stats()
            assert samples[("ledgerq_pending", label)] == position == stats.pending
            assert samples[("ledgerq_enqueued_total", label)] == position + 1
            assert samples[("ledgerq_acked_total", label)] == 1
            reader = (("queue", name), ("reader", "default"))
            assert samples[("ledgerq_reader_acked_total", reader)] == 1
            assert f'ledgerq_pending{{queue="{name}"}} {float(position)}' in text
        assert {dict(labels)["queue"] for _, labels in samples} == set(names)
        assert types["ledgerq_pending"] == "gauge" and types["ledgerq_acked"] == "counter"
        queues[0].close()  # a closed queue drops out; the others go on
        samples, _ = scrape(registry)
        assert {dict(labels)["queue"] for _, labels in samples} == set(names[1:])
    finally:
        for q in queues:
            q.close()


def test_several_queues_through_one_collector(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "a") as a, ledgerq.open(tmp_path / "b") as b:
        a.enqueue(b"1")
        b.enqueue_batch([b"1", b"2"])
        collector = QueueCollector(a)
        collector.add(b)
        with pytest.raises(ValueError, match="already exported"):
            collector.add(b)
        registry = CollectorRegistry()
        registry.register(collector)
        samples, _ = scrape(registry)
        assert samples[("ledgerq_pending", (("queue", "a"),))] == 1
        assert samples[("ledgerq_pending", (("queue", "b"),))] == 2
        # One collector writes each family once, with every queue's samples in it.
        assert generate_latest(registry).decode().count("# TYPE ledgerq_pending gauge") == 1
        b.close()
        samples, _ = scrape(registry)
        assert ("ledgerq_pending", (("queue", "a"),)) in samples
        assert ("ledgerq_pending", (("queue", "b"),)) not in samples


def test_registering_does_not_call_stats(tmp_path: Path) -> None:
    q = ledgerq.open(tmp_path / "q")
    q.close()
    # The global-style registry (auto_describe) registers a collector of a closed queue.
    registry = CollectorRegistry(auto_describe=True)
    registry.register(QueueCollector(q))
    registry.register(QueueCollector(q, name="again"))
    assert list(QueueCollector(q).describe()) == []
    assert generate_latest(registry) == b""


def test_bad_names(tmp_path: Path) -> None:
    with ledgerq.open(tmp_path / "q") as q, pytest.raises(ValueError, match="name"):
        QueueCollector(q, name="")


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_importing_ledgerq_does_not_import_prometheus() -> None:
    result = run_python(
        """
        import sys
        import ledgerq
        assert "prometheus_client" not in sys.modules, "ledgerq imported prometheus_client"
        assert "ledgerq.metrics" not in sys.modules
        import ledgerq.aio
        assert "prometheus_client" not in sys.modules, "ledgerq.aio imported prometheus_client"
        import ledgerq.metrics
        assert "prometheus_client" in sys.modules
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_missing_prometheus_client_says_what_to_install() -> None:
    result = run_python(
        """
        import sys
        sys.modules["prometheus_client"] = None  # as if it were not installed
        import ledgerq
        try:
            import ledgerq.metrics
        except ImportError as exc:
            print(exc)
        else:
            raise SystemExit("imported without prometheus_client")
        """
    )
    assert result.returncode == 0, result.stderr
    assert 'pip install "ledgerq[metrics]"' in result.stdout
