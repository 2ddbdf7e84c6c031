"""One soak run: start a server process, load and abuse it, then drain and account.

Phases (:func:`run_soak`):

1. start ``ledgerq serve`` (the CLI, as a user would) on a fresh data directory, with a
   256 KiB item limit and 4 MiB segments (so rotation and retirement of consumed
   segments happen all the time), and open the idle connections;
2. run every client on its own thread for ``seconds`` while a sampler reads the
   server's RSS and descriptor count from ``/proc`` and pings idle connections;
3. stop the clients, close the idle connections, and ask the server (``stats``) until
   only the checking connection is left: every open read of a vanished client must be
   given back by then, and each queue must hold exactly the items stored and not
   closed (give or take the unconfirmed sets of vanished senders);
4. drain every queue with plain gets, stop the server (SIGTERM: exit code 0, no
   traceback), start it again on the same directory and check every queue is empty -
   no closed item came back;
5. account: every STORED item delivered-and-closed exactly once, nothing unknown.
"""

from __future__ import annotations

import math
import os
import random
import resource
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.server._harness import GUARD_S, Raw, ServerProcess
from tests.soak._clients import (
    ABUSES,
    Client,
    Context,
    Unanswered,
    abuser,
    check_value,
    consumer,
    dribbler,
    producer,
    reset,
    run_client,
)
from tests.soak._ledger import Ledger, Tally, account

__all__ = ["SoakConfig", "SoakReport", "run_soak"]

MIB = 1 << 20
SAMPLE_EVERY_S = 0.25


@dataclass(frozen=True, slots=True)
class SoakConfig:
    """What one run does; the defaults are the long run's."""

    seconds: float
    seed: int = 1
    queues: int = 3
    producers: int = 2
    consumers: int = 3
    dribblers: int = 1
    abusers: int = 2
    idle_connections: int = 300
    max_item_size: int = 256 << 10
    segment_size: int = 4 << 20
    backlog: int = 3000  # producers pause while this many items wait for a consumer
    # RSS may grow this much after the warm-up; see docs/reliability.md for the budget.
    rss_growth_limit_bytes: int = 32 * MIB

    @property
    def warmup_s(self) -> float:
        """The first part of the run, when the server's heap is still finding its size."""
        return min(max(self.seconds * 0.2, 3.0), 30.0)

    @property
    def queue_names(self) -> tuple[str, ...]:
        return tuple(f"soak-{i}" for i in range(self.queues))


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at the server process."""

    at_s: float  # since the load started
    rss_bytes: int
    fds: int


@dataclass
class SoakReport:
    """The figures of one run and every broken promise (``problems``; empty when it held)."""

    config: SoakConfig
    load_s: float = 0.0
    total_s: float = 0.0
    server_connections: int = 0
    stored: int = 0
    maybe: int = 0
    maybe_delivered: int = 0
    closed: int = 0
    opened: int = 0
    drained: int = 0
    idle_pings: int = 0
    tally: Tally = field(default_factory=Tally)
    samples: list[Sample] = field(default_factory=list)
    rss_end_bytes: int = 0
    rss_hwm_bytes: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def rss_after_warmup(self) -> int:
        """RSS at the first sample after the warm-up (the baseline of the growth check)."""
        later = [s.rss_bytes for s in self.samples if s.at_s >= self.config.warmup_s]
        return later[0] if later else 0

    def rss_peak_after_warmup(self) -> int:
        later = [s.rss_bytes for s in self.samples if s.at_s >= self.config.warmup_s]
        return max([*later, self.rss_end_bytes])

    def rss_by_minute(self) -> str:
        """The highest RSS of each minute of the load, in MiB: a leak is a staircase."""
        peaks: dict[int, int] = {}
        for sample in self.samples:
            minute = int(sample.at_s // 60)
            peaks[minute] = max(peaks.get(minute, 0), sample.rss_bytes)
        return ", ".join(f"{peaks[m] / MIB:.1f}" for m in sorted(peaks))

    def summary(self) -> str:
        """The figures docs/reliability.md quotes, one topic a line."""
        cfg, counts, samples = self.config, self.tally.counts, self.samples
        abuse = ", ".join(f"{counts[k]} {k}" for k in ABUSES)
        reliable = counts["closes"] + counts["dribbled reliable reads"]
        lines = [
            f"server soak: {self.load_s:.0f} s of load (seed {cfg.seed}), "
            f"{self.total_s:.0f} s in all",
            f"  clients: {cfg.producers} producers, {cfg.consumers} consumers, {cfg.dribblers} "
            f"slow, {cfg.abusers} abusers, {cfg.idle_connections} idle connections "
            f"({self.idle_pings} pings); {counts['connections']} connections made, "
            f"server total_connections {self.server_connections}",
            f"  items: {self.stored} STORED ({counts['sets']} single, {counts['sets (pipelined)']} "
            f"pipelined, {counts['sets (noreply)']} noreply, {counts['dribbled sets']} dribbled), "
            f"{self.maybe} sent by vanished senders ({self.maybe_delivered} of them delivered)",
            f"  delivered-and-closed: {self.closed} ({counts['plain gets']} plain gets asked, "
            f"{reliable} /close, {counts['close/open chains']} of them /close/open, "
            f"{self.drained} by the final drain); {self.opened} open reads, "
            f"{counts['aborts']} /abort, {counts['quit with an open read']} quits with one open",
            f"  abuse: {abuse}, {counts['vanished with an item open']} items held by vanished "
            f"clients, {counts['dribbled sets']} sets and {counts['dribbled reliable reads']} "
            f"reliable reads sent a byte at a time",
            f"  server RSS: start {_mib(samples[0].rss_bytes if samples else 0)}, after warm-up "
            f"({cfg.warmup_s:.0f} s) {_mib(self.rss_after_warmup())}, peak after warm-up "
            f"{_mib(self.rss_peak_after_warmup())}, end {_mib(self.rss_end_bytes)}, "
            f"high-water {_mib(self.rss_hwm_bytes)} "
            f"(growth limit {_mib(cfg.rss_growth_limit_bytes)})",
            f"  server RSS, peak of each minute: {self.rss_by_minute()}",
            f"  server descriptors: start {samples[0].fds if samples else 0}, "
            f"peak {max((s.fds for s in samples), default=0)}, "
            f"end {samples[-1].fds if samples else 0}",
        ]
        for op in ("set", "set/sync", "get"):
            lines.append(f"  latency {op}: {_percentiles(self.tally.latencies_s.get(op, []))}")
        lines.append("  result: " + ("OK" if self.ok else f"{len(self.problems)} problem(s)"))
        lines.extend(f"    {p}" for p in self.problems[:30])
        return "\n".join(lines)


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


def _percentiles(values: list[float]) -> str:
    if not values:
        return "no samples"
    ordered = sorted(values)

    def rank(q: float) -> float:  # nearest rank
        return ordered[max(math.ceil(q * len(ordered)) - 1, 0)] * 1000

    return (
        f"p50 {rank(0.5):.2f} ms, p99 {rank(0.99):.2f} ms, max {ordered[-1] * 1000:.1f} ms "
        f"(n={len(ordered)})"
    )


# ---------------------------------------------------------------------- the server process


def _status(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) of ``pid`` in bytes, or None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
    except OSError:
        return None
    if "VmRSS" not in fields:  # a zombie: exited, not reaped yet
        return None
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def _fd_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


class Sampler(threading.Thread):
    """Reads the server's RSS and descriptor count every quarter second until stopped."""

    def __init__(self, server: ServerProcess, started: float, ledger: Ledger) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.server = server
        self.started = started
        self.ledger = ledger
        self.samples: list[Sample] = []
        self.halt = threading.Event()
        self.died = threading.Event()

    def sample(self) -> Sample | None:
        status = _status(self.server.pid)
        if status is None or not self.server.is_running:
            if not self.died.is_set():
                self.died.set()
                self.ledger.problem("the server process exited during the run")
            return None
        found = Sample(time.monotonic() - self.started, status[0], _fd_count(self.server.pid))
        self.samples.append(found)
        return found

    def run(self) -> None:
        while not self.halt.wait(SAMPLE_EVERY_S):
            self.sample()


def _server_flags(config: SoakConfig) -> list[str]:
    return [
        "--max-item-size",
        str(config.max_item_size),
        "--max-connections",
        str(config.idle_connections + 1000),
        "-o",
        f"segment_size={config.segment_size}",
    ]


def _raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


# ---------------------------------------------------------------------- the run


Progress = Callable[[str], None]


def run_soak(config: SoakConfig, workdir: Path, progress: Progress | None = None) -> SoakReport:
    """Run one soak in ``workdir`` (which must be empty); return its report."""
    say = progress or (lambda _text: None)
    report = SoakReport(config)
    ledger = Ledger()
    began = time.monotonic()
    _raise_fd_limit(config.idle_connections + 2000)
    data = workdir / "data"
    server = ServerProcess(data, *_server_flags(config)).start()
    try:
        say(f"server pid {server.pid} on port {server.port}; loading for {config.seconds:.0f} s")
        _load(server, config, ledger, report, say)
        if server.is_running:  # else the sampler said so; the restart shows what is left
            try:
                _settle_and_drain(server, config, ledger, report, say)
            except (OSError, EOFError, AssertionError, Unanswered) as exc:
                ledger.problem(f"checking and draining the queues failed: {exc!r}")
        _stop(server, ledger, "at the end of the run")
        leftover = _check_restart(data, config, ledger)
    finally:
        server.stop()
    problems = ledger.problems + account(ledger, leftover)
    problems += _rss_problems(report)
    report.problems = problems
    report.stored = len(ledger.stored)
    report.maybe = len(ledger.maybe - ledger.stored)
    report.maybe_delivered = sum(1 for n in ledger.maybe - ledger.stored if ledger.closed[n])
    report.closed = ledger.closes
    report.opened = sum(ledger.opened.values())
    report.total_s = time.monotonic() - began
    return report


def _clients(config: SoakConfig) -> list[tuple[str, Client]]:
    kinds: list[tuple[str, Client, int]] = [
        ("producer", producer, config.producers),
        ("consumer", consumer, config.consumers),
        ("slow", dribbler, config.dribblers),
        ("abuser", abuser, config.abusers),
    ]
    return [(f"{label}{i}", client) for label, client, n in kinds for i in range(n)]


def _load(
    server: ServerProcess,
    config: SoakConfig,
    ledger: Ledger,
    report: SoakReport,
    say: Progress,
) -> None:
    """Phases 1 and 2: idle connections, every client, the sampler; until time is up."""
    rng = random.Random(config.seed)
    stop = threading.Event()
    ctx = Context(
        server.port, config.queue_names, config.max_item_size, config.backlog, ledger, stop
    )
    idle = [Raw(server.port) for _ in range(config.idle_connections)]
    report.tally.count("connections", len(idle))
    started = time.monotonic()
    sampler = Sampler(server, started, ledger)
    sampler.sample()
    sampler.start()
    tallies: list[Tally] = []
    threads = []
    for n, (who, client) in enumerate(_clients(config)):
        tally = Tally()
        tallies.append(tally)
        seed = config.seed * 1000 + n
        thread = threading.Thread(
            target=run_client, args=(client, ctx, who, seed, tally), name=who, daemon=True
        )
        threads.append(thread)
        thread.start()
    deadline = started + config.seconds
    next_report = started + 30
    try:
        while time.monotonic() < deadline and not sampler.died.is_set():
            if stop.wait(min(1.0, max(deadline - time.monotonic(), 0))):
                break
            report.idle_pings += _ping_idle(idle, rng, ledger)
            if time.monotonic() >= next_report:
                next_report += 30
                say(
                    f"  {time.monotonic() - started:.0f} s: {len(ledger.stored)} stored, "
                    f"{ledger.closes} closed, {len(ledger.problems)} problems, "
                    f"RSS {_mib(sampler.samples[-1].rss_bytes if sampler.samples else 0)}"
                )
    finally:
        stop.set()
        report.load_s = time.monotonic() - started
        for thread in threads:
            thread.join(GUARD_S * 2)
            if thread.is_alive():
                ledger.problem(f"client {thread.name} did not stop within {GUARD_S * 2:.0f} s")
        for i, raw in enumerate(idle):
            if i % 2:  # half of them reset, as by a client killed mid-connection
                reset(raw.sock)
            raw.close()
        sampler.halt.set()
        sampler.join()
    for tally in tallies:
        report.tally.merge(tally)
    report.samples = sampler.samples


def _ping_idle(idle: list[Raw], rng: random.Random, ledger: Ledger) -> int:
    """Ask a few idle connections for the version: each must still answer."""
    chosen = rng.sample(idle, min(3, len(idle)))
    for raw in chosen:
        try:
            line = raw.call(b"version\r\n")
            if not line.startswith(b"VERSION "):
                ledger.problem(f"an idle connection answered version with {line!r}")
        except (OSError, EOFError) as exc:
            ledger.problem(f"an idle connection failed: {exc!r}")
    return len(chosen)


# ---------------------------------------------------------------------- after the load


def _settle_and_drain(
    server: ServerProcess,
    config: SoakConfig,
    ledger: Ledger,
    report: SoakReport,
    say: Progress,
) -> None:
    """Phases 3 and 4a: every client gone, every open read back, then an empty server."""
    with Raw(server.port) as checker:
        deadline = time.monotonic() + GUARD_S
        while (stats := checker.stats())["curr_connections"] != "1":
            if time.monotonic() > deadline:
                ledger.problem(f"{stats['curr_connections']} connections still open at the end")
                break
        report.server_connections = int(stats["total_connections"])
        for queue in config.queue_names:
            open_reads = int(stats.get(f"queue_{queue}_open_transactions", "0"))
            if open_reads:
                ledger.problem(f"{queue}: {open_reads} open reads after every client left")
            items = int(stats.get(f"queue_{queue}_items", "0"))
            low, high = ledger.unclosed(queue)
            if not low <= items <= high:
                ledger.problem(f"{queue} holds {items} items; the clients left {low} to {high}")
        say(f"draining {sum(ledger.unclosed(q)[0] for q in config.queue_names)} items")
        report.drained = sum(
            _drain(checker, queue, ledger, ledger.record_closed) for queue in config.queue_names
        )
        stats = checker.stats()
        for queue in config.queue_names:
            if stats.get(f"queue_{queue}_items", "0") != "0":
                ledger.problem(f"{queue} still holds items after the drain: {stats}")
    status = _status(server.pid)
    if status is not None:
        report.rss_end_bytes, report.rss_hwm_bytes = status
        report.samples.append(Sample(report.load_s, status[0], _fd_count(server.pid)))


DRAIN_BATCH = 64


def _drain(client: Raw, queue: str, ledger: Ledger, record: Callable[[str], None]) -> int:
    """Take every item of ``queue`` with plain gets (pipelined), ``record`` each; how many."""
    drained = 0
    key = queue.encode()
    while True:
        client.send(b"get %b\r\n" % key * DRAIN_BATCH)
        got = 0
        for _ in range(DRAIN_BATCH):
            for value in client.values():
                record(check_value(ledger, value, [key], False))
                got += 1
        drained += got
        if got < DRAIN_BATCH:  # nobody else takes items now: the queue is empty
            return drained


def _stop(server: ServerProcess, ledger: Ledger, when: str) -> None:
    """SIGTERM the server: it must exit 0, with no traceback or failure logged."""
    code = server.stop()
    if code != 0:
        ledger.problem(f"the server exited with {code} {when}")
    logged = [
        line
        for line in server.stderr.splitlines()
        if "Traceback" in line or "failed" in line or "ERROR" in line
    ]
    if logged:
        ledger.problem(f"the server logged {len(logged)} failure line(s) {when}: {logged[:3]}")


def _check_restart(data: Path, config: SoakConfig, ledger: Ledger) -> Counter[str]:
    """Phase 4b: a restarted server has nothing left; return what it had (should be none).

    After a crash of the server what it had are the items still queued: counted, then.
    """
    leftover: Counter[str] = Counter()
    try:
        server = ServerProcess(data, *_server_flags(config)).start()
    except AssertionError as exc:
        ledger.problem(f"the server did not restart on the soaked data: {exc}")
        return leftover
    try:
        with Raw(server.port) as client:
            for queue in config.queue_names:
                _drain(client, queue, ledger, lambda name: leftover.update((name,)))
    except (OSError, EOFError, AssertionError, Unanswered) as exc:
        ledger.problem(f"reading the queues after the restart failed: {exc!r}")
    finally:
        _stop(server, ledger, "after the restart")
    if leftover:
        ledger.problem(f"after a restart the queues held {sum(leftover.values())} item(s)")
    return leftover


def _rss_problems(report: SoakReport) -> list[str]:
    samples = [s for s in report.samples if s.at_s >= report.config.warmup_s]
    if not samples:
        return ["no RSS sample after the warm-up"]
    growth = report.rss_peak_after_warmup() - report.rss_after_warmup()
    problems = []
    if growth > report.config.rss_growth_limit_bytes:
        problems.append(
            f"server RSS grew {_mib(growth)} after the warm-up "
            f"(limit {_mib(report.config.rss_growth_limit_bytes)})"
        )
    if samples[-1].fds > samples[0].fds:
        problems.append(
            f"the server holds {samples[-1].fds} descriptors with one client, "
            f"{samples[0].fds} after the warm-up with {report.config.idle_connections}+ clients"
        )
    return problems
