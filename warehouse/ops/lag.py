"""How far ingest is behind Kafka: records, and how long the oldest of them has waited.

Records behind say how much is left; the oldest record's age says whether it
is moving. A partition 10,000 records behind whose oldest record is 2 s old is
busy; one 3 behind whose oldest is 10 minutes old has stalled. `regauge
status` shows both, and the audit fails on the second (`ingest_lag_alert_s`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from warehouse.base import kafka_conf, registry
from warehouse.base.settings import Settings

if TYPE_CHECKING:
    from confluent_kafka import Consumer


@dataclass(frozen=True)
class Lag:
    partition: int
    # Records Kafka holds that bronze has not copied.
    behind: int
    # Seconds the oldest of them has waited (None when nothing is behind).
    age_s: float | None

    def __str__(self) -> str:
        if not self.behind:
            return f"p{self.partition} caught up"
        age = "" if self.age_s is None else f", oldest waiting {self.age_s:,.0f} s"
        return f"p{self.partition} {self.behind:,} behind{age}"


@contextlib.contextmanager
def _consumer(settings: Settings, given: Consumer | None = None) -> Iterator[Consumer]:
    """`given`, left open, or a consumer of its own, closed after.

    One per question, not one per partition: each one logs in (a SCRAM exchange) and
    looks up its group's coordinator, and one closed before that lookup ends makes
    librdkafka log a "SASL authentication error" line. The view host asks every
    `exporter.LAG_EVERY_S` for each source."""
    if given is not None:
        yield given
        return
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            **kafka_conf.client_conf(settings),
            "group.id": "regauge-lag",
            "enable.auto.commit": False,
            # It reads one record a partition, one partition after another: a fetch
            # that long-polls Kafka (500 ms by default) would hold up the next.
            "fetch.wait.max.ms": 10,
        }
    )
    try:
        yield consumer
    finally:
        consumer.close()


def first_record_ms(
    settings: Settings,
    partition: int,
    offset: int,
    topic: str | None = None,
    consumer: Consumer | None = None,
) -> int | None:
    """The Kafka timestamp (ms) of the partition's first record at or after `offset`
    in `topic` (the shop's by default), or None if Kafka has none there (yet)."""
    from confluent_kafka import TopicPartition

    with _consumer(settings, consumer) as c:
        c.assign([TopicPartition(topic or registry.TOPIC, partition, offset)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            msg = c.poll(1.0)
            if msg is not None and not msg.error():
                return int(msg.timestamp()[1])
    return None


def uncopied_age_s(
    settings: Settings,
    partition: int,
    first_uncopied: int,
    topic: str | None = None,
    consumer: Consumer | None = None,
) -> float | None:
    """How long the oldest record ingest has not copied has waited, in seconds."""
    ms = first_record_ms(settings, partition, first_uncopied, topic, consumer)
    return None if ms is None else max(0.0, time.time() - ms / 1000)


def kafka_watermarks(
    settings: Settings,
    timeout: float = 30,
    topic: str | None = None,
    consumer: Consumer | None = None,
) -> dict[int, tuple[int, int]]:
    """(low, high) per partition of `topic` (the shop's by default): the offsets Kafka
    still holds are [low, high)."""
    from confluent_kafka import TopicPartition

    name = topic or registry.TOPIC
    with _consumer(settings, consumer) as c:
        meta = c.list_topics(name, timeout=timeout).topics[name]
        return {
            p: c.get_watermark_offsets(TopicPartition(name, p), timeout=timeout)
            for p in sorted(meta.partitions)
        }


def ingest_lag(settings: Settings, copied: dict[int, int], topic: str | None = None) -> list[Lag]:
    """Per partition of `topic` (the shop's by default): `copied` is the next offset
    ingest will read (0 if none yet)."""
    lags = []
    with _consumer(settings) as consumer:
        # Short timeouts: `regauge status` should answer quickly even when Kafka is slow.
        marks = kafka_watermarks(settings, timeout=10, topic=topic, consumer=consumer)
        for p, (low, high) in marks.items():
            start = max(low, copied.get(p, 0))
            behind = max(0, high - start)
            waited = uncopied_age_s(settings, p, start, topic, consumer) if behind else None
            lags.append(Lag(p, behind, waited))
    return lags


def copied_by_source(status: dict[str, Any]) -> dict[str, dict[int, int]]:
    """From ingest's status file (`ingest_ctl.read_status`): per source its ingest
    query reported, the next offset it will read per partition."""
    found = {}
    for query, entry in status.items():
        source = registry.ingested_source(query)
        copied = (entry or {}).get("copied")
        if source is not None and copied:
            found[source] = {int(p): int(o) for p, o in copied.items()}
    return found
