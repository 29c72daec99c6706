"""Producing events to the log with an idempotent Kafka producer.

Keyed by customer_id so one customer's events stay ordered in one partition;
`enable.idempotence` with `acks=all` means a retry never writes a record twice.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from spark_jobs import expectations, generator
from warehouse.base import kafka_conf, registry
from warehouse.base.settings import Settings

log = logging.getLogger(__name__)


# The producer's (librdkafka's default) cap, just under the broker's
# message.max.bytes of 1 MiB: anything larger the broker would refuse.
MAX_RECORD_BYTES = 1_000_000


@dataclass
class ProduceSummary:
    produced: int = 0
    failed: int = 0
    refused: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.produced / self.seconds if self.seconds else 0.0

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.refused == 0

    def describe(self) -> str:
        return (
            f"produced {self.produced:,}, failed {self.failed:,}, refused {self.refused:,}; "
            f"{self.seconds:.1f} s, {self.rate:,.0f} events/s"
        )

    def _error(self, message: str) -> None:
        # Keep the first few for the summary; all go to the log.
        log.error("%s", message)
        if len(self.errors) < 20:
            self.errors.append(message)


Position = tuple[int, int]  # (partition, offset)


def producer_config(settings: Settings) -> dict[str, Any]:
    return {
        **kafka_conf.client_conf(settings),
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "lz4",
        "linger.ms": 20,
        "batch.num.messages": 10000,
        "message.max.bytes": MAX_RECORD_BYTES,
    }


def produce_records(
    settings: Settings,
    records: Sequence[tuple[bytes, bytes]],
    *,
    rate: float | None = None,
    progress: bool = False,
    timestamps: Sequence[int | None] | None = None,
    topic: str = registry.TOPIC,
) -> tuple[ProduceSummary, list[Position | None]]:
    """Send (key, value) records in order; wait until all are acknowledged.

    Returns the summary and each record's (partition, offset), or None where it
    was refused or failed. `rate` caps events per second (None: as fast as possible).
    `timestamps` (ms since the epoch, per record) stand for the producer's clock;
    None lets librdkafka stamp the record with this machine's time. `topic`: the
    shop's by default; another source's is `registry.source_tables(S).topic`.
    """
    summary = ProduceSummary()
    positions: list[Position | None] = [None] * len(records)
    producer = Producer(producer_config(settings), logger=kafka_conf.client_logger("producer"))

    # Per record, so kept to the bone (`make bench` compares this loop with a bare
    # confluent-kafka one): the delivered count is taken from `positions` at the end.
    def on_delivery(i: int, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            positions[i] = (msg.partition(), msg.offset())  # type: ignore[assignment]
        else:
            summary.failed += 1
            summary._error(f"record {i}: delivery failed: {err.str()}")

    started = time.monotonic()
    # The loop makes two small objects per record and no cycles; without this, the
    # collector walks every live object (the caller's records too) over and over.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        with _progress_bar(len(records), enabled=progress) as advance:
            for i, (key, value) in enumerate(records):
                if len(key) + len(value) > MAX_RECORD_BYTES:
                    summary.refused += 1
                    summary._error(
                        f"record {i} is {len(key) + len(value):,} bytes; Kafka accepts at most "
                        f"{MAX_RECORD_BYTES:,} (message.max.bytes), so it was not sent"
                    )
                    continue
                if rate:
                    ahead = started + i / rate - time.monotonic()
                    if ahead > 0:
                        producer.poll(ahead)
                stamp = timestamps[i] if timestamps is not None else None
                _send(
                    producer,
                    summary,
                    topic,
                    i,
                    key,
                    value,
                    functools.partial(on_delivery, i),
                    stamp,
                )
                if i % 1000 == 999:
                    # Serve delivery reports in batches, not after every record.
                    producer.poll(0)
                    advance(i + 1 - summary.failed)
            remaining = producer.flush(60)
            advance(len(records) - summary.failed - summary.refused - remaining)
    finally:
        if gc_was_enabled:
            gc.enable()
    if remaining:
        summary.failed += remaining
        summary._error(f"{remaining} records were not acknowledged within 60 s")
    summary.seconds = time.monotonic() - started
    summary.produced = sum(1 for p in positions if p is not None)
    return summary, positions


def _send(
    producer: Producer,
    summary: ProduceSummary,
    topic: str,
    i: int,
    key: bytes,
    value: bytes,
    callback: Callable[[KafkaError | None, Message], None],
    timestamp: int | None = None,
) -> None:
    while True:
        try:
            producer.produce(
                topic, key=key, value=value, on_delivery=callback, timestamp=timestamp or 0
            )
            break
        except BufferError:
            producer.poll(0.1)  # local queue full: let deliveries drain
        except KafkaException as exc:
            summary.refused += 1
            summary._error(f"record {i} refused by the producer: {exc.args[0].str()}")
            break


@contextmanager
def _progress_bar(total: int, *, enabled: bool) -> Iterator[Callable[[int], None]]:
    if not enabled:
        yield lambda _done: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    ) as bar:
        task = bar.add_task(f"producing to {registry.TOPIC}", total=total)
        yield lambda done: bar.update(task, completed=done)


def produce(settings: Settings, events: Iterable[dict[str, Any]]) -> ProduceSummary:
    """Send each event as JSON, keyed by its customer_id."""
    records = [
        (str(e["customer_id"]).encode(), json.dumps(e, separators=(",", ":")).encode())
        for e in events
    ]
    return produce_records(settings, records)[0]


def sample_events(count: int, run_id: str) -> Iterator[dict[str, Any]]:
    """Simple valid cart events tagged with run_id (the walking skeleton's traffic)."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(count):
        yield {
            "event_id": f"{run_id}-{i}",
            "event_type": "cart_item_added",
            "event_time": (start + timedelta(seconds=i)).isoformat(timespec="milliseconds"),
            "customer_id": f"c{i % 97}",
            "schema_version": 1,
            "payload": {"product_id": f"p{i % 13}", "quantity": 1 + i % 3},
        }


def produce_sample(settings: Settings, count: int, run_id: str | None = None) -> ProduceSummary:
    run_id = run_id or uuid.uuid4().hex[:12]
    log.info("producing %d sample events tagged %s to %s", count, run_id, registry.TOPIC)
    return produce(settings, sample_events(count, run_id))


@dataclass
class GeneratedRun:
    """A generator run as sent: the records, where Kafka put them, and what must follow."""

    seed: int
    records: list[generator.Record]
    positions: list[Position | None]
    summary: ProduceSummary

    def __add__(self, later: GeneratedRun) -> GeneratedRun:
        """Two runs as one: what must become of each record depends on all of them."""
        summary = ProduceSummary(
            produced=self.summary.produced + later.summary.produced,
            failed=self.summary.failed + later.summary.failed,
            refused=self.summary.refused + later.summary.refused,
            seconds=self.summary.seconds + later.summary.seconds,
            errors=self.summary.errors + later.summary.errors,
        )
        return GeneratedRun(
            self.seed, self.records + later.records, self.positions + later.positions, summary
        )

    def expected(self) -> expectations.Expected:
        return expectations.expected_outcome(
            (rec, *pos) for rec, pos in zip(self.records, self.positions, strict=True) if pos
        )

    def injected(self) -> Counter[str]:
        """How many records of each kind (event, resend, conflicting, each bad kind...)."""
        return Counter(r.kind for r in self.records)

    def report(self) -> dict[str, Any]:
        exp = self.expected()
        return {
            "seed": self.seed,
            "summary": {
                "produced": self.summary.produced,
                "failed": self.summary.failed,
                "refused": self.summary.refused,
                "seconds": round(self.summary.seconds, 3),
            },
            "injected": dict(sorted(self.injected().items())),
            "expected": {
                "silver": len(exp.silver),
                "quarantine_by_reason": dict(sorted(exp.by_reason().items())),
                "exact_duplicates": len(exp.duplicates),
                "silver_event_id_checksum": expectations.id_checksum(exp.silver),
                "per_partition": {str(p): n for p, n in sorted(exp.per_partition().items())},
            },
        }


def produce_generated(
    settings: Settings,
    *,
    seed: int,
    count: int,
    chaos: bool = False,
    rate: float | None = None,
    start: datetime = generator.DEFAULT_START,
    days: float = 7.0,
    progress: bool = False,
    source: str = registry.SHOP_SOURCE,
    follows: int | None = None,
) -> GeneratedRun:
    """Generate `count` records of `source` for `seed` (`generator.GENERATORS`), send,
    and report. `follows` (the web's only): the shop run of that many records, same
    seed and chaos, whose customers and carts the web's browsing follows.

    The customers and products they name are the caller's to seed into the
    reference data (`warehouse.ops.pipeline.produce` does both).
    """
    make = generator.GENERATORS.get(source)
    if make is None:
        raise ValueError(
            f"regauge has no traffic generator for source {source!r} (it has: "
            f"{', '.join(sorted(generator.GENERATORS))}); produce its records yourself"
        )
    if follows is None:
        records = make(seed, count, chaos=chaos, start=start, days=days)
    elif source != "web":
        raise ValueError(f"--follows is for the web's traffic, not {source!r}'s")
    else:
        shop = generator.clean_count(follows, chaos=chaos)
        records = generator.web_records(
            seed, count, chaos=chaos, start=start, days=days, follows=shop
        )
    topic = registry.source_tables(source).topic
    log.info(
        "producing %d %s records (seed %d) to %s",
        count,
        "chaos" if chaos else "clean",
        seed,
        topic,
    )
    return produce_run(settings, seed, records, rate=rate, progress=progress, topic=topic)


def produce_run(
    settings: Settings,
    seed: int,
    records: list[generator.Record],
    *,
    rate: float | None = None,
    progress: bool = False,
    topic: str = registry.TOPIC,
) -> GeneratedRun:
    """Send generator records with a producer of their own (a new idempotence session)."""
    summary, positions = produce_records(
        settings,
        [(r.key, r.value) for r in records],
        rate=rate,
        progress=progress,
        timestamps=[r.timestamp_ms for r in records],
        topic=topic,
    )
    return GeneratedRun(seed, records, positions, summary)


def save_report(settings: Settings, run: GeneratedRun) -> Path:
    """Keep the run's expectations beside the stack's state, for audits and the demo."""
    runs = settings.state_dir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / f"s{run.seed}-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(run.report(), indent=2) + "\n")
    return path
