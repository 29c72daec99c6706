"""Producing events to the log with an idempotent Kafka producer.

Keyed by customer_id so one customer's events stay ordered in one partition;
`enable.idempotence` with `acks=all` means a retry never writes a record twice.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from warehouse import registry
from warehouse.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class ProduceSummary:
    produced: int = 0
    failed: int = 0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.produced / self.seconds if self.seconds else 0.0

    def describe(self) -> str:
        return (
            f"produced {self.produced}, failed {self.failed}, "
            f"{self.seconds:.1f} s, {self.rate:,.0f} events/s"
        )


def producer_config(settings: Settings) -> dict[str, Any]:
    return {
        "bootstrap.servers": settings.kafka_bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "compression.type": "lz4",
        "linger.ms": 20,
        "batch.num.messages": 10000,
    }


def produce(settings: Settings, events: Iterable[dict[str, Any]]) -> ProduceSummary:
    """Send each event as JSON, keyed by its customer_id; wait until all are acknowledged."""
    summary = ProduceSummary()
    producer = Producer(producer_config(settings))

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is None:
            summary.produced += 1
        else:
            summary.failed += 1
            log.error("delivery failed: %s", err)

    started = time.monotonic()
    for event in events:
        payload = json.dumps(event, separators=(",", ":")).encode()
        while True:
            try:
                producer.produce(
                    registry.TOPIC,
                    key=str(event["customer_id"]).encode(),
                    value=payload,
                    on_delivery=on_delivery,
                )
                break
            except BufferError:
                producer.poll(0.1)  # local queue full: let deliveries drain
        producer.poll(0)
    remaining = producer.flush(60)
    summary.failed += remaining
    summary.seconds = time.monotonic() - started
    return summary


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
