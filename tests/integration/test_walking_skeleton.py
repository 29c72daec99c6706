"""Events produced to Kafka land in bronze (Spark + Delta) and Trino counts them."""

import logging
import uuid

from spark_jobs import producer
from spark_jobs.engine import ingest
from warehouse.base.registry import BRONZE_EVENTS
from warehouse.ops import pipeline
from warehouse.sql import trino_client


def _count_tagged(settings, run_id):
    return trino_client.scalar(
        settings,
        f"SELECT count(*) FROM {BRONZE_EVENTS.trino_name} WHERE strpos(from_utf8(value), ?) > 0",
        [f'"event_id":"{run_id}-'],
    )


def test_produced_events_reach_trino_through_bronze(stack, settings, spark, caplog):
    first = f"it-{uuid.uuid4().hex[:8]}"
    sent = producer.produce_sample(settings, 500, first)
    assert (sent.produced, sent.failed) == (500, 0)

    pipeline.ingest_once(spark, settings)
    total = ingest.counts(spark, settings)[BRONZE_EVENTS.key]
    assert _count_tagged(settings, first) == 500
    assert (
        trino_client.scalar(settings, f"SELECT count(*) FROM {BRONZE_EVENTS.trino_name}") == total
    )
    partitions = trino_client.scalar(
        settings,
        f"SELECT count(DISTINCT partition) FROM {BRONZE_EVENTS.trino_name} "
        "WHERE strpos(from_utf8(value), ?) > 0",
        [f'"event_id":"{first}-'],
    )
    assert partitions == settings.kafka_partitions  # keyed by customer: spread over all

    # A new Delta commit is visible to the very next Trino query.
    second = f"it-{uuid.uuid4().hex[:8]}"
    producer.produce_sample(settings, 300, second)
    pipeline.ingest_once(spark, settings)
    assert ingest.counts(spark, settings)[BRONZE_EVENTS.key] == total + 300
    assert _count_tagged(settings, second) == 300

    # Ingesting again with nothing new in Kafka adds nothing (exactly once): the
    # shop's last batch ended at Kafka's end offsets, so no query even starts.
    caplog.set_level(logging.INFO, logger=pipeline.__name__)
    pipeline.ingest_once(spark, settings)
    said = [r.getMessage() for r in caplog.records if r.name == pipeline.__name__]
    assert "shop: its last batch ended at Kafka's end offsets; nothing to ingest" in said
    assert ingest.counts(spark, settings)[BRONZE_EVENTS.key] == total + 300
    assert _count_tagged(settings, first) == 500
