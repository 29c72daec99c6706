"""`make bench` (WIP, issue 9): each figure next to a baseline measured in the same run.

Built so far: the producer against a bare confluent-kafka loop, Trino's
serving-view latency against `SELECT 1`, the stack's peak resident memory
(sampled in the background for the whole run), and the target check. Still to
build: ingest rate with p95 micro-batch time, a 1M-event replay against
DuckDB, produce-to-visible freshness, the PNG chart and docs/BENCHMARKS.md.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from warehouse.settings import Settings

# Issue 9's targets on 2 cores: (figure, comparison, bound).
TARGETS: list[tuple[str, str, float]] = [
    ("producer_events_per_s", ">=", 100_000),
    ("producer_vs_baseline", ">=", 0.5),
    ("ingest_events_per_s", ">=", 30_000),
    ("replay_events_per_s", ">=", 500_000),
    ("replay_vs_duckdb_time", "<=", 3.0),
    ("freshness_p95_s", "<=", 10.0),
    ("serving_query_p50_ms", "<=", 500.0),
    ("stack_peak_gib", "<=", 12.0),
]


@dataclass
class Result:
    figures: dict[str, float] = field(default_factory=dict)
    baselines: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def verdicts(figures: dict[str, float]) -> list[tuple[str, float | None, str, float, bool | None]]:
    """Each target with the measured figure and whether it was met (None: not measured)."""
    out: list[tuple[str, float | None, str, float, bool | None]] = []
    for name, op, bound in TARGETS:
        value = figures.get(name)
        met = None if value is None else (value >= bound if op == ">=" else value <= bound)
        out.append((name, value, op, bound, met))
    return out


def percentile(samples: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; the bench's one definition."""
    if not samples:
        raise ValueError("no samples")
    if len(samples) == 1:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[int(q) - 1]


# -- measurements (need the stack) -------------------------------------------------
def producer_rate(settings: Settings, count: int) -> tuple[float, float]:
    """(regauge's producer events/s, a bare confluent-kafka loop's events/s), same payloads."""
    from confluent_kafka import Producer

    from spark_jobs import generator, producer
    from warehouse import registry

    records = generator.records(1, count)
    payloads = [(r.key, r.value) for r in records]
    summary, _ = producer.produce_records(settings, payloads)
    bare = Producer(producer.producer_config(settings))
    started = time.monotonic()
    for key, value in payloads:
        while True:
            try:
                bare.produce(registry.TOPIC, key=key, value=value)
                break
            except BufferError:
                bare.poll(0.05)
    bare.flush(60)
    return summary.rate, count / (time.monotonic() - started)


def query_latency(settings: Settings, sql: str, runs: int) -> list[float]:
    """Wall-clock milliseconds of `runs` executions of sql through the trino client."""
    from warehouse import trino_client

    out = []
    for _ in range(runs):
        started = time.perf_counter()
        trino_client.query(settings, sql)
        out.append((time.perf_counter() - started) * 1000)
    return out


class PeakMemory:
    """Samples the stack's resident memory every second; `peak` in bytes."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bench-memory")

    def _sample(self) -> int:
        from warehouse.stack import process, services

        total = 0
        for svc in services.services(self.settings):
            for pid in svc.live_pids().values():
                if pid is not None:
                    total += process.group_rss_bytes(pid)
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(1.0)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)
